// tests/nn/cnn_chain.test.cpp: chains over images: conv2d, batch_norm, pooling and flatten in
// nn::chain. The shapes the planner computes; the chain against its layers run one by one; the
// whole chain's gradients against central finite differences; PyTorch's parameter names; the
// digits CNN trains; training is bitwise the same on 1 and 2 threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/cost.hpp"
#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/pool.hpp"
#include "solder/nn/state.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/sgd.hpp"
#include "support/chain_gradients.hpp"
#include "support/data.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace solder;
using nn::sample_shape;
using solder::test::bit_differences;

// conv 3x3 pad 1 keeps 8x8; max pool 2 halves it; 8 channels of 4x4 are 128 features.
using digits_cnn = nn::chain<nn::input<1, 8, 8>, nn::conv2d<1, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu,
                             nn::max_pool2d<2>, nn::flatten<>, nn::linear<128, 10>>;
using W = digits_cnn::widths;
static_assert(W::shapes[0] == sample_shape(8, 8, 8));
static_assert(W::shapes[3] == sample_shape(8, 4, 4));
static_assert(W::shapes[4] == sample_shape(128));
static_assert(digits_cnn::in_features == 64 && digits_cnn::out_features == 10);
static_assert(cost<digits_cnn>::params == (8 * 9 + 8) + 2 * 8 + (128 * 10 + 10));
// Forward FLOPs of the convolution: 2 per multiply-add of each output element, plus its bias.
static_assert(nn::layer_info<nn::conv2d<1, 8, 3, 3, 1, 1>>::forward_flops(8 * 64) == 8 * 64 * (2 * 9 + 1));
// The planner's rewrite: conv2d, batch_norm and relu are one block; then the pool, the flatten,
// the linear layer. One kernel per layer when unfused.
static_assert(digits_cnn::kernels == 4);
static_assert(std::is_same_v<std::tuple_element_t<0, digits_cnn::blocks_type>,
                             nn::conv_block<nn::conv2d<1, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu>>);
using digits_cnn_unfused = nn::unfused_chain<nn::input<1, 8, 8>, nn::conv2d<1, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu,
                                             nn::max_pool2d<2>, nn::flatten<>, nn::linear<128, 10>>;
static_assert(digits_cnn_unfused::kernels == 6);

// Smooth layers for finite differences: tanh, average pooling, stride 2 and a 1x1 convolution.
using smooth_cnn = nn::chain<nn::input<2, 7, 6>, nn::conv2d<2, 4, 3, 3, 2, 1>, nn::batch_norm<4>, nn::tanh,
                             nn::conv2d<4, 3, 1, 1>, nn::avg_pool2d<3, 1, 1>, nn::adaptive_avg_pool2d<2, 2>,
                             nn::flatten<>, nn::linear<12, 3>>;
static_assert(smooth_cnn::widths::shapes[0] == sample_shape(4, 4, 3));
static_assert(smooth_cnn::widths::shapes[5] == sample_shape(3, 2, 2));

TEST_CASE("cnn chain: the chain computes what its layers compute one by one", "[chain][cnn]") {
  digits_cnn model(3);
  tensor<float, shape<dyn, 1, 8, 8>> x(5);
  solder::test::fill_uniform(x, 0, 1, 31);
  const auto y = model.forward(x);

  auto& conv = model.layer<0>();
  auto& bn = model.layer<1>();
  auto& pool = model.layer<3>();
  auto& fc = model.layer<5>();
  // The layers' own calls on copies (batch_norm's running statistics are updated once more,
  // which its forward in training mode does not read).
  tensor<float, shape<dyn, 8, 8, 8>> a(5), b(5);
  tensor<float, shape<dyn, 8, 4, 4>> p(5);
  tensor<float, shape<dyn, 10>> ref(5);
  conv.forward(x, a);
  bn.forward(a, b);
  for (std::size_t i = 0; i < b.size(); ++i) b.data()[i] = b.data()[i] > 0 ? b.data()[i] : 0.0f;
  pool.forward(b, p);
  nn::chain<nn::linear<128, 10>> head(1);
  std::memcpy(head.layer<0>().weight.data(), fc.weight.data(), fc.weight.size() * sizeof(float));
  std::memcpy(head.layer<0>().bias.data(), fc.bias.data(), fc.bias.size() * sizeof(float));
  const auto yh = head.forward(tensor_ref<const float, shape<dyn, 128>>(p.data(), 5));
  CHECK(bit_differences(y.data(), yh.data(), y.size()) == 0);

  std::ostringstream s, plan;
  s << summary<digits_cnn>{};
  CHECK(s.str().find("[-1, 8, 8, 8]") != std::string::npos);
  CHECK(s.str().find("[-1, 8, 4, 4]") != std::string::npos);
  plan << plan_report<digits_cnn>{};
  CHECK(plan.str().find("conv2d+batch_norm+relu") != std::string::npos);
  CHECK(plan.str().find("folded") != std::string::npos);
}

TEST_CASE("cnn chain: batch_norm folded into the convolution gives the unfolded outputs", "[chain][cnn]") {
  // Train a few steps so the running statistics and the affine parameters are far from their
  // starting values, then compare in eval mode: folded, unfolded in the same block, and the
  // chain with one kernel per layer (the same seed: the same parameters and steps).
  digits_cnn model(9);
  digits_cnn_unfused reference(9);
  tensor<float, shape<dyn, 1, 8, 8>> x(24);
  solder::test::fill_uniform(x, 0, 2, 61);
  std::vector<std::int32_t> labels(24);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t((i * 3) % 10);
  optim::sgd opt_a(model.params(), {.lr = 0.05f}), opt_b(reference.params(), {.lr = 0.05f});
  for (int step = 0; step < 4; ++step) {
    model.train_step(x, labels, opt_a);
    reference.train_step(x, labels, opt_b);
  }
  model.eval();
  reference.eval();
  const auto folded = model.forward(x);
  auto& block = std::get<0>(model.blocks);
  block.fold_in_eval = false;
  const auto unfolded = model.forward(x);
  const auto unfused = reference.forward(x);
  // Folding rounds W s and (b - mean) s + beta to float once; the unfolded form rounds the
  // convolution's sums, then (z - mean) rstd gamma + beta. Both are a few u of |W||x| per
  // output of the 9-term sums; the logits add 128 such terms: 1e-5 of their scale.
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < folded.size(); ++i) {
    worst = std::max(worst, double(std::fabs(folded[i] - unfolded[i])));
    scale = std::max(scale, double(std::fabs(unfolded[i])));
  }
  INFO("largest difference " << worst << " of " << scale);
  CHECK(worst <= 1e-5 * scale);
  CHECK(bit_differences(unfolded.data(), unfused.data(), unfolded.size()) == 0);
  // The same predictions.
  for (std::size_t n = 0; n < 24; ++n) {
    std::size_t a = 0, b = 0;
    for (std::size_t k = 1; k < 10; ++k) {
      if (folded(n, k) > folded(n, a)) a = k;
      if (unfolded(n, k) > unfolded(n, b)) b = k;
    }
    CHECK(a == b);
  }
  // The fold is made again when parameters change in eval mode.
  block.fold_in_eval = true;
  model.layer<1>().bias[0] += 0.5f;
  model.parameters_changed();
  const auto refolded = model.forward(x);
  block.fold_in_eval = false;
  const auto unfolded2 = model.forward(x);
  double worst2 = 0;
  for (std::size_t i = 0; i < refolded.size(); ++i) worst2 = std::max(worst2, double(std::fabs(refolded[i] - unfolded2[i])));
  CHECK(worst2 <= 1e-5 * scale);
  CHECK(bit_differences(refolded.data(), folded.data(), folded.size()) != 0);
}

TEST_CASE("cnn chain: running statistics go through a parameter file", "[chain][cnn]") {
  digits_cnn model(2);
  tensor<float, shape<dyn, 1, 8, 8>> x(16);
  solder::test::fill_uniform(x, 0, 1, 71);
  model.forward(x);  // moves the running statistics
  const auto buffers = model.buffers();
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].name == "1.running_mean");
  CHECK(buffers[1].name == "1.running_var");
  const solder::test::temp_dir dir("cnn_chain");
  const auto path = dir.path / "cnn.safetensors";
  nn::save(model, path);
  digits_cnn loaded(5);
  nn::load(loaded, path);
  CHECK(std::memcmp(loaded.layer<1>().running_mean.data(), model.layer<1>().running_mean.data(), 8 * sizeof(float)) == 0);
  CHECK(std::memcmp(loaded.layer<1>().running_var.data(), model.layer<1>().running_var.data(), 8 * sizeof(float)) == 0);
  CHECK(std::memcmp(loaded.layer<0>().weight.data(), model.layer<0>().weight.data(), 72 * sizeof(float)) == 0);
}

TEST_CASE("cnn chain: parameters carry PyTorch's names and shapes", "[chain][cnn]") {
  digits_cnn model(1);
  const auto params = model.params();
  REQUIRE(params.size() == 6);
  CHECK(params[0].name == "0.weight");
  CHECK(params[0].dims == std::vector<std::size_t>{8, 1, 3, 3});
  CHECK(params[1].name == "0.bias");
  CHECK(params[2].name == "1.weight");
  CHECK(params[3].name == "1.bias");
  CHECK(params[4].name == "5.weight");
  CHECK(params[4].dims == std::vector<std::size_t>{10, 128});
  // The seed decides every weight; another seed draws others.
  digits_cnn same(1), other(2);
  CHECK(std::memcmp(same.layer<0>().weight.data(), model.layer<0>().weight.data(), 72 * sizeof(float)) == 0);
  CHECK(std::memcmp(other.layer<0>().weight.data(), model.layer<0>().weight.data(), 72 * sizeof(float)) != 0);
}

TEST_CASE("cnn chain: whole-chain gradients against central finite differences", "[chain][cnn]") {
  // batch_norm in training mode normalizes with the batch's statistics, so the loss is a smooth
  // function of every parameter (its running statistics are updated but not read).
  smooth_cnn model(4);
  tensor<float, shape<dyn, 2, 7, 6>> x(3);
  tensor<float, shape<dyn, 3>> r(3);
  solder::test::fill_uniform(x, -1, 1, 41);
  solder::test::fill_uniform(r, -1, 1, 42);
  // Float forward passes differenced at h = 1e-2: about 1e-5 of noise per unit of loss over
  // 2h, and the h^2 term of the tanh and normalization curvature.
  solder::test::check_chain_gradients(model, x, r, {.stride = 2, .h = 1e-2f, .margin = 5e-4, .epsilon = 5e-3});
}

TEST_CASE("cnn chain: training the digits CNN reaches 97% held-out accuracy", "[chain][cnn][slow]") {
  data::labeled_dataset all = data::load_labeled_csv(SOLDER_DIGITS_CSV, 64, 64);
  data::divide_features(all, 16.0f);
  const auto [train, test] = data::train_test_split(all, 0.2, 2026);
  digits_cnn model(1);
  optim::adamw opt(model.params(), {.lr = 3e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, 32, data::last_batch::drop);
  double first = 0, last = 0;
  const int epochs = 12;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.shuffle(2026, std::uint64_t(epoch));
    double sum = 0;
    for (const data::batch_view b : loader) sum += model.train_step(b.features_as<64>(), b.y, opt);
    (epoch == 0 ? first : last) = sum / double(loader.size());
  }
  model.eval();
  const double acc = nn::accuracy(model.forward(tensor_ref<const float, shape<dyn, 64>>(test.x.data(), test.size())), test.y);
  INFO("loss " << first << " -> " << last << ", held-out accuracy " << acc);
  CHECK(last < 0.1 * first);
  CHECK(acc >= 0.97);
}

TEST_CASE("cnn chain: training is bitwise the same on 1 and 2 threads", "[chain][cnn]") {
  tensor<float, shape<dyn, 1, 8, 8>> x(40);
  solder::test::fill_uniform(x, 0, 1, 51);
  std::vector<std::int32_t> y(40);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t((i * 7) % 10);
  auto run = [&](int threads) {
    const int before = solder::num_threads();
    solder::set_num_threads(threads);
    digits_cnn model(11);
    optim::adamw opt(model.params());
    for (int step = 0; step < 3; ++step) model.train_step(x, y, opt);
    solder::set_num_threads(before);
    std::vector<float> w;
    for (auto& p : model.params()) w.insert(w.end(), p.value.begin(), p.value.end());
    return w;
  };
  const auto one = run(1), two = run(2);
  REQUIRE(one.size() == two.size());
  CHECK(bit_differences(one.data(), two.data(), one.size()) == 0);
}

}  // namespace

namespace {

TEST_CASE("cnn chain: the eval-mode block applies its activation in the convolution's stores", "[chain][cnn]") {
  // conv2d::forward_activated equals forward then the activation, bit for bit.
  nn::conv2d<3, 5, 3, 3, 1, 1> conv(4);
  nn::conv2d<4, 4, 3, 3, 2, 1, 1, 4> depthwise(5);
  tensor<float, shape<dyn, 3, 9, 7>> x(2);
  tensor<float, shape<dyn, 4, 9, 7>> xd(2);
  solder::test::fill_uniform(x, -1, 1, 81);
  solder::test::fill_uniform(xd, -1, 1, 82);
  tensor<float, shape<dyn, 5, 9, 7>> a(2), b(2);
  conv.forward(x, a);
  conv.forward_activated(std::as_const(x).ref(), b.ref(), ops::relu{});
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = ops::relu{}.forward(a.data()[i]);
  CHECK(bit_differences(a.data(), b.data(), a.size()) == 0);
  tensor<float, shape<dyn, 4, 5, 4>> c(2), d(2);
  depthwise.forward(xd, c);
  depthwise.forward_activated(std::as_const(xd).ref(), d.ref(), ops::relu{});
  for (std::size_t i = 0; i < c.size(); ++i) c.data()[i] = ops::relu{}.forward(c.data()[i]);
  CHECK(bit_differences(c.data(), d.data(), c.size()) == 0);

  // Backward after a fused eval forward: the gradients of the unfolded eval form, within the
  // fold's rounding (the tail's input is made again from the folded convolution).
  digits_cnn model(6);
  tensor<float, shape<dyn, 1, 8, 8>> xs(8);
  solder::test::fill_uniform(xs, 0, 1, 83);
  model.forward(xs);  // running statistics away from their start
  model.eval();
  tensor<float, shape<dyn, 10>> dy(8);
  solder::test::fill_uniform(dy, -1, 1, 84);
  auto grads = [&](bool fold) {
    std::get<0>(model.blocks).fold_in_eval = fold;
    model.forward(xs);
    model.backward(dy);
    std::vector<float> g;
    for (auto& p : model.params()) g.insert(g.end(), p.grad.begin(), p.grad.end());
    return g;
  };
  const auto folded = grads(true), unfolded = grads(false);
  REQUIRE(folded.size() == unfolded.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < folded.size(); ++i) {
    worst = std::max(worst, double(std::fabs(folded[i] - unfolded[i])));
    scale = std::max(scale, double(std::fabs(unfolded[i])));
  }
  INFO("largest difference " << worst << " of " << scale);
  CHECK(worst <= 1e-5 * scale);
}

}  // namespace
