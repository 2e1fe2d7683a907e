// tests/nn/chain.test.cpp: chain<...> end to end. The plan (kernels, names, costs); the fused
// chain against the same chain run one kernel per layer; whole-chain gradients against central
// finite differences; training the digits MLP to the accuracy bar; bitwise-equal training on 1
// and 2 threads; parameter files; run-time errors.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/cost.hpp"
#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/layer_norm.hpp"
#include "solder/nn/state.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"
#include "solder/optim/sgd.hpp"
#include "support/chain_gradients.hpp"
#include "support/data.hpp"
#include "support/temp_dir.hpp"

namespace {

using solder::test::bit_differences;

using namespace solder;

using mlp_layers = std::tuple<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 128>, nn::relu,
                              nn::dropout<0.1f>, nn::linear<128, 10>>;
template <template <class...> class C, class T>
struct apply_layers;
template <template <class...> class C, class... Ls>
struct apply_layers<C, std::tuple<Ls...>> {
  using type = C<Ls...>;
};
using mlp = apply_layers<nn::chain, mlp_layers>::type;
using mlp_unfused = apply_layers<nn::unfused_chain, mlp_layers>::type;

static_assert(mlp::kernels == 3);
static_assert(mlp_unfused::kernels == 7);
static_assert(mlp::in_features == 64 && mlp::out_features == 10);
static_assert(cost<mlp>::params == 64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
static_assert(cost<mlp>::params == cost<mlp_unfused>::params);
// Activations kept per sample: the three kernel outputs; the unfused chain stores every layer's.
static_assert(cost<mlp>::activation_floats == 256 + 128 + 10);
static_assert(cost<mlp_unfused>::activation_floats == 3 * 256 + 3 * 128 + 10);
static_assert(cost<mlp>::forward_flops == cost<mlp_unfused>::forward_flops);

std::vector<std::int32_t> labels_for(std::size_t n, int classes) {
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((i * 7 + 3) % std::size_t(classes));
  return y;
}

}  // namespace

TEST_CASE("chain: the plan names its kernels and prints", "[chain]") {
  CHECK(mlp::kernel_name<std::tuple_element_t<0, mlp::groups>>() == "linear+relu+dropout");
  CHECK(mlp::kernel_name<std::tuple_element_t<2, mlp::groups>>() == "linear");
  std::ostringstream p, s;
  p << plan_report<mlp>{};
  s << summary<mlp>{};
  CHECK(p.str().find("3 kernels") != std::string::npos);
  CHECK(s.str().find("50826 parameters") != std::string::npos);
  using odd = nn::chain<nn::relu, nn::linear<5, 7>, nn::bias<7>, nn::tanh, nn::linear<7, 2, false>>;
  static_assert(odd::kernels == 4);  // relu alone; linear; bias+tanh (a bias has parameters); linear
  static_assert(odd::in_features == 5);
}

TEST_CASE("chain: the profile times each kernel and prints a table", "[chain]") {
  mlp model(1);
  const std::size_t batch = 8;
  std::vector<float> x(batch * mlp::in_features, 0.25f);
  std::vector<float> dy(batch * mlp::out_features, 0.5f);
  model.enable_profiling();
  for (int i = 0; i < 2; ++i) {
    model.forward(mlp::input_ref(x.data(), batch));
    model.backward(mlp::output_ref(dy.data(), batch));
  }
  REQUIRE(model.profile().size() == 3);
  for (const nn::profile_entry& e : model.profile()) {
    CHECK(e.forward_calls == 2);
    CHECK(e.backward_calls == 2);
    CHECK(e.forward_seconds > 0);
    CHECK(e.forward_flops > 0);
  }
  std::ostringstream os;
  model.print_profile(os);
  std::vector<std::string> lines;
  std::istringstream in(os.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 1 + 3 + 3);  // header, each kernel forward, then backward in reverse
  // The columns: the name left-aligned in 34, then time/call in 14, share in 10, rate in 17.
  CHECK(lines[0] == "  kernel" + std::string(28, ' ') + "     time/call     share             rate");
  CHECK(lines[1].rfind("  linear+relu+dropout (fwd)", 0) == 0);
  CHECK(lines[3].rfind("  linear (fwd)", 0) == 0);
  CHECK(lines[4].rfind("  linear (bwd)", 0) == 0);
  CHECK(lines[6].rfind("  linear+relu+dropout (bwd)", 0) == 0);
  double share = 0;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    INFO(l);
    CHECK(l.size() == 2 + 34 + 11 + 3 + 8 + 2 + 10 + 8);
    CHECK(l.substr(l.size() - 8) == " GFLOP/s");
    CHECK(l.substr(2 + 34 + 11, 3) == " us");
    share += std::stod(l.substr(2 + 34 + 11 + 3, 8));
  }
  CHECK(share == Approx(100.0).margin(0.5));  // the shares, rounded to 0.1 each, add up to 100
}

TEST_CASE("chain: parameters carry PyTorch's names and shapes", "[chain]") {
  mlp model(1);
  const auto params = model.params();
  REQUIRE(params.size() == 6);
  CHECK(params[0].name == "0.weight");
  CHECK(params[0].dims == std::vector<std::size_t>{256, 64});
  CHECK(params[1].name == "0.bias");
  CHECK(params[2].name == "3.weight");
  CHECK(params[4].name == "6.weight");
  CHECK(params[5].dims == std::vector<std::size_t>{10});
}

TEST_CASE("chain: fused and one-kernel-per-layer chains compute the same", "[chain]") {
  mlp fused(7);
  mlp_unfused unfused(7);  // the same seed: the same weights and dropout streams
  tensor<float, shape<dyn, 64>> x(45);
  solder::test::fill_uniform(x, 0, 1, 201);
  const auto y = labels_for(45, 10);
  for (int step = 0; step < 3; ++step) {
    const auto a = fused.forward(x);
    const auto b = unfused.forward(x);
    INFO("step " << step);
    CHECK(bit_differences(a.data(), b.data(), a.size()) == 0);
    auto ga = fused.output_grad();
    auto gb = unfused.output_grad();
    nn::softmax_cross_entropy(a, y, ga);
    nn::softmax_cross_entropy(b, y, gb);
    fused.backward(ga);
    unfused.backward(gb);
    const auto pa = fused.params(), pb = unfused.params();
    for (std::size_t k = 0; k < pa.size(); ++k) {
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < pa[k].grad.size(); ++i) {
        worst = std::max(worst, double(std::fabs(pa[k].grad[i] - pb[k].grad[i])));
        scale = std::max(scale, double(std::fabs(pb[k].grad[i])));
      }
      INFO(pa[k].name);
      CHECK(worst <= 1e-6 * scale);
    }
  }
}

TEST_CASE("chain: whole-chain gradients against central finite differences", "[chain]") {
  // Smooth activations (no kink for the differences to straddle); eval mode: no dropout.
  nn::chain<nn::linear<6, 9>, nn::tanh, nn::dropout<0.2f>, nn::linear<9, 5>, nn::bias<5>, nn::sigmoid, nn::linear<5, 3>> model(3);
  model.eval();
  model.train();  // dropout drawn in training; the check below is in eval mode
  model.eval();
  tensor<float, shape<dyn, 6>> x(4);
  tensor<float, shape<dyn, 3>> r(4);
  solder::test::fill_uniform(x, -1, 1, 211);
  solder::test::fill_uniform(r, -1, 1, 212);
  solder::test::check_chain_gradients(model, x, r, {.stride = 3, .h = 1e-2f, .margin = 2e-4, .epsilon = 2e-3});
}

TEST_CASE("chain: training the digits MLP reaches 97% held-out accuracy", "[chain][slow]") {
  data::labeled_dataset all = data::load_labeled_csv(SOLDER_DIGITS_CSV, 64, 64);
  data::divide_features(all, 16.0f);
  const auto [train, test] = data::train_test_split(all, 0.2, 2026);
  mlp model(1);
  optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, 32, data::last_batch::drop);
  const int epochs = 30;
  const std::int64_t total = epochs * std::int64_t(loader.size());
  const auto schedule = optim::warmup_cosine_lr(2e-3, total / 20 + 1, total, 0.1);
  std::int64_t t = 0;
  double first = 0, last = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.shuffle(2026, std::uint64_t(epoch));
    double sum = 0;
    for (const data::batch_view b : loader) {
      opt.set_lr(schedule(t++));
      sum += model.train_step(b.features_as<64>(), b.y, opt);
    }
    (epoch == 0 ? first : last) = sum / double(loader.size());
  }
  model.eval();
  const double acc = nn::accuracy(model.forward(tensor_ref<const float, shape<dyn, 64>>(test.x.data(), test.size())), test.y);
  INFO("loss " << first << " -> " << last << ", held-out accuracy " << acc);
  CHECK(last < 0.1 * first);
  CHECK(acc >= 0.97);
}

TEST_CASE("chain: training is bitwise the same on 1 and 2 threads", "[chain]") {
  tensor<float, shape<dyn, 64>> x(300);
  solder::test::fill_uniform(x, 0, 1, 221);
  const auto y = labels_for(300, 10);
  auto run = [&](int threads) {
    const int before = solder::num_threads();
    solder::set_num_threads(threads);
    mlp model(11);
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

TEST_CASE("chain: parameters round-trip through a file; a bad file leaves the model unchanged", "[chain]") {
  const solder::test::temp_dir tmp("chain");
  const auto dir = tmp.path;
  const auto path = dir / "mlp.safetensors";
  mlp a(1), b(2);
  nn::save(a, path);
  nn::load(b, path);
  const auto pa = a.params(), pb = b.params();
  for (std::size_t k = 0; k < pa.size(); ++k) CHECK(bit_differences(pa[k].value.data(), pb[k].value.data(), pa[k].value.size()) == 0);
  // A file of another model: 3.weight has the wrong shape.
  nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 64>, nn::relu, nn::dropout<0.1f>, nn::linear<64, 10>> other(3);
  nn::save(other, dir / "other.safetensors");
  mlp c(4);
  const std::vector<float> before(c.params()[0].value.begin(), c.params()[0].value.end());
  CHECK_THROWS_WITH(nn::load(c, dir / "other.safetensors"), Catch::Contains("3.weight"));
  CHECK(bit_differences(before.data(), c.params()[0].value.data(), before.size()) == 0);
}

TEST_CASE("chain: run-time errors name the problem", "[chain]") {
  mlp model(1);
  tensor<float, shape<dyn, 64>> x(5);
  model.forward(x);
  tensor<float, shape<dyn, 10>> dy(4);
  CHECK_THROWS_WITH(model.backward(dy.ref()), Catch::Contains("5"));
  const auto y = labels_for(5, 12);  // labels past the 10 classes
  optim::adamw opt(model.params());
  CHECK_THROWS_AS(model.train_step(x, y, opt), solder::error);
}

TEST_CASE("chain: layers are reached by the index they were written at", "[chain]") {
  using model_t = nn::chain<nn::linear<6, 9>, nn::relu, nn::dropout<0.25f>, nn::linear<9, 5>, nn::layer_norm<5>,
                            nn::bias<5>, nn::tanh>;
  static_assert(model_t::kernels == 4);  // linear+relu+dropout, linear, layer_norm, bias+tanh
  model_t model(5);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<0>())>, nn::linear<6, 9>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<1>())>, nn::relu>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<2>())>, nn::dropout<0.25f>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<3>())>, nn::linear<9, 5>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<4>())>, nn::layer_norm<5>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<5>())>, nn::bias<5>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(model.layer<6>())>, nn::tanh>);
  // The same objects the parameter list views, under the same names.
  const auto params = model.params();
  CHECK(params[0].name == "0.weight");
  CHECK(params[0].value.data() == model.layer<0>().weight.data());
  CHECK(params[2].name == "3.weight");
  CHECK(params[2].value.data() == model.layer<3>().weight.data());
  CHECK(params[4].name == "4.weight");
  CHECK(params[4].value.data() == model.layer<4>().weight.data());
  CHECK(params[6].name == "5.bias");
  CHECK(params[6].value.data() == model.layer<5>().value.data());
  // Editing a layer through its index changes the model.
  tensor<float, shape<dyn, 6>> x(3);
  solder::test::fill_uniform(x, -1, 1, 231);
  model.eval();
  const auto before = model.forward(x);
  model.layer<5>().value.fill(1.0f);
  const auto after = model.forward(x);
  CHECK(bit_differences(before.data(), after.data(), before.size()) > 0);
  const model_t& view = model;
  CHECK(view.layer<5>().value[0] == 1.0f);
}

TEST_CASE("chain: a batch passed as a temporary is kept for backward", "[chain][asan]") {
  // forward(make_batch()) then backward: the chain holds the batch (dW of the first layer reads
  // it), so the gradients equal those of the same batch held by the caller.
  auto make_batch = [] {
    tensor<float, shape<dyn, 64>> x(23);
    solder::test::fill_uniform(x, -1, 1, 241);
    return x;
  };
  mlp a(9), b(9);
  a.eval();
  b.eval();
  tensor<float, shape<dyn, 10>> dy(23);
  solder::test::fill_uniform(dy, -1, 1, 242);
  const auto ya = a.forward(make_batch());
  make_batch();  // reuses the heap block of the first temporary in most allocators
  a.backward(dy);
  const auto x = make_batch();
  const auto yb = b.forward(x);
  b.backward(dy);
  CHECK(bit_differences(ya.data(), yb.data(), ya.size()) == 0);
  const auto pa = a.params(), pb = b.params();
  for (std::size_t k = 0; k < pa.size(); ++k) {
    INFO(pa[k].name);
    CHECK(bit_differences(pa[k].grad.data(), pb[k].grad.data(), pa[k].grad.size()) == 0);
  }
  // A temporary of a static batch shape is kept too.
  tensor<float, shape<23, 64>> xs;
  std::memcpy(xs.data(), x.data(), x.size() * sizeof(float));
  const auto yc = a.forward(tensor<float, shape<23, 64>>(xs));
  a.backward(dy);
  CHECK(bit_differences(yc.data(), yb.data(), yc.size()) == 0);
  CHECK(bit_differences(a.params()[0].grad.data(), pb[0].grad.data(), pb[0].grad.size()) == 0);
}

TEST_CASE("chain: a result the caller holds never changes or dangles", "[chain][asan]") {
  mlp model(13);
  model.eval();
  tensor<float, shape<dyn, 64>> small(2), large(300);
  solder::test::fill_uniform(small, -1, 1, 251);
  solder::test::fill_uniform(large, -1, 1, 252);
  const auto first = model.forward(small);
  const std::vector<float> copy(first.begin(), first.end());
  const auto second = model.forward(large);  // the chain's buffers grow: 300 rows
  REQUIRE(first.batch() == 2);
  CHECK(bit_differences(first.data(), copy.data(), copy.size()) == 0);
  CHECK(second.batch() == 300);
  // forward_into writes the same values into the caller's tensor, without allocating.
  tensor<float, shape<dyn, 10>> out(300);
  model.forward_into(large, out.ref());
  CHECK(bit_differences(out.data(), second.data(), out.size()) == 0);
  tensor<float, shape<dyn, 10>> wrong(3);
  CHECK_THROWS_WITH(model.forward_into(large, wrong.ref()), Catch::Contains("300"));
}

TEST_CASE("chain: train_step takes any loss of the library", "[chain]") {
  using reg = nn::chain<nn::linear<6, 16>, nn::tanh, nn::linear<16, 3>>;
  tensor<float, shape<dyn, 6>> x(32);
  tensor<float, shape<dyn, 3>> target(32), probs(32);
  solder::test::fill_uniform(x, -1, 1, 261);
  solder::test::fill_uniform(target, -1, 1, 262);
  solder::test::fill_uniform(probs, 0, 1, 263);
  // One step with a loss equals forward, that loss by hand, backward and the optimizer's step.
  auto same_as_by_hand = [&](auto loss, const auto& t) {
    reg a(3), b(3);
    optim::sgd oa(a.params(), {.lr = 0.1f}), ob(b.params(), {.lr = 0.1f});
    const float la = a.train_step(x, t, oa, loss);
    const auto y = b.forward(x);
    tensor<float, shape<dyn, 3>> dy(32);
    const float lb = loss(y, t, dy);
    b.backward(dy);
    ob.step();
    CHECK(la == lb);
    const auto pa = a.params(), pb = b.params();
    for (std::size_t k = 0; k < pa.size(); ++k) CHECK(bit_differences(pa[k].value.data(), pb[k].value.data(), pa[k].value.size()) == 0);
  };
  same_as_by_hand(nn::mse_loss{}, target);
  same_as_by_hand(nn::bce_with_logits_loss{}, probs);
  const auto labels = labels_for(32, 3);
  same_as_by_hand(nn::cross_entropy_loss{0.1f}, std::span<const std::int32_t>(labels));
  // And the loss goes down over a few steps of each.
  reg m(4);
  optim::adamw opt(m.params(), {.lr = 1e-2f});
  const float l0 = m.train_step(x, target, opt, nn::mse_loss{});
  float l = l0;
  for (int i = 0; i < 50; ++i) l = m.train_step(x, target, opt, nn::mse_loss{});
  CHECK(l < 0.8f * l0);
}
