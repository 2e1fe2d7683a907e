// tests/nn/linear_batch_norm.test.cpp: the planner's rewrite linear -> batch_norm (torch's
// BatchNorm1d on [C] samples) in nn::linear_block. The plan and PyTorch's names; training
// bitwise the same as the chain run one kernel per layer; whole-chain gradients against central
// finite differences; the eval-mode fold against the unfolded block, the unfused chain and a
// double reference; the fold made again when parameters change; running statistics through a
// parameter file; backward after a folded forward.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/cost.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/state.hpp"
#include "solder/optim/sgd.hpp"
#include "support/chain_gradients.hpp"
#include "support/data.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace solder;
using solder::test::bit_differences;

// The model of the rewrite: linear + batch_norm + relu is one block, then a linear one.
using bn_mlp = nn::chain<nn::linear<64, 128>, nn::batch_norm<128>, nn::relu, nn::linear<128, 10>>;
using bn_mlp_unfused = nn::unfused_chain<nn::linear<64, 128>, nn::batch_norm<128>, nn::relu, nn::linear<128, 10>>;
using bn_block = nn::linear_block<nn::linear<64, 128>, nn::batch_norm<128>, nn::relu>;
static_assert(bn_mlp::kernels == 2);
static_assert(bn_mlp_unfused::kernels == 4);
static_assert(std::is_same_v<std::tuple_element_t<0, bn_mlp::blocks_type>, bn_block>);
static_assert(std::is_same_v<std::tuple_element_t<1, bn_mlp::blocks_type>, nn::linear_block<nn::linear<128, 10>>>);
static_assert(bn_block::has_norm && bn_block::tail_first == 2 && bn_block::tail_size == 1);
static_assert(bn_block::keeps_preactivation);
static_assert(cost<bn_mlp>::params == (64 * 128 + 128) + 2 * 128 + (128 * 10 + 10));
static_assert(cost<bn_mlp>::params == cost<bn_mlp_unfused>::params);
// A block without a batch_norm is what it was.
static_assert(!nn::linear_block<nn::linear<64, 128>, nn::relu>::has_norm);
static_assert(nn::linear_block<nn::linear<64, 128>, nn::relu>::tail_first == 1);
static_assert(!nn::linear_block<nn::linear<64, 128>, nn::relu>::keeps_preactivation);

// A dropout after the activation (its stream must be the unfused chain's), a bias-free linear
// before a batch_norm with nothing after it (a block that is not the first: its dx is used).
using deep_layers = std::tuple<nn::linear<24, 40>, nn::batch_norm<40>, nn::relu, nn::dropout<0.25f>,
                               nn::linear<40, 16, false>, nn::batch_norm<16>, nn::linear<16, 5>>;
template <template <class...> class C, class T>
struct apply_layers;
template <template <class...> class C, class... Ls>
struct apply_layers<C, std::tuple<Ls...>> {
  using type = C<Ls...>;
};
using deep = apply_layers<nn::chain, deep_layers>::type;
using deep_unfused = apply_layers<nn::unfused_chain, deep_layers>::type;
static_assert(deep::kernels == 3);
static_assert(std::is_same_v<std::tuple_element_t<1, deep::blocks_type>,
                             nn::linear_block<nn::linear<40, 16, false>, nn::batch_norm<16>>>);

// Smooth tails for finite differences and for the tails whose derivative needs their input.
using smooth_layers = std::tuple<nn::linear<6, 5>, nn::batch_norm<5>, nn::tanh, nn::linear<5, 4, false>,
                                 nn::batch_norm<4>, nn::gelu, nn::linear<4, 3>>;
using smooth = apply_layers<nn::chain, smooth_layers>::type;
using smooth_unfused = apply_layers<nn::unfused_chain, smooth_layers>::type;
static_assert(smooth::kernels == 3);

std::vector<std::int32_t> labels_for(std::size_t n, int classes) {
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((i * 7 + 3) % std::size_t(classes));
  return y;
}

/// Every parameter and every buffer of a model, in order, as one list of floats.
template <class Model>
std::vector<float> state_of(Model& model) {
  std::vector<float> s;
  for (auto& p : model.params()) s.insert(s.end(), p.value.begin(), p.value.end());
  for (auto& b : model.buffers()) s.insert(s.end(), b.value.begin(), b.value.end());
  return s;
}
template <class Model>
std::vector<float> grads_of(Model& model) {
  std::vector<float> g;
  for (auto& p : model.params()) g.insert(g.end(), p.grad.begin(), p.grad.end());
  return g;
}

/// The largest |a - b| and the largest |b|.
struct spread {
  double worst = 0, scale = 0;
};
template <class A, class B>
spread compare(const A& a, const B& b, std::size_t n) {
  spread s;
  for (std::size_t i = 0; i < n; ++i) {
    s.worst = std::max(s.worst, std::fabs(double(a[i]) - double(b[i])));
    s.scale = std::max(s.scale, std::fabs(double(b[i])));
  }
  return s;
}

/// bn_mlp in evaluation mode in double, from its float parameters and running statistics:
/// relu(((x W0^T + b0) - mean) / sqrt(var + eps) gamma + beta) W3^T + b3.
std::vector<double> reference_eval(bn_mlp& model, const tensor<float, shape<dyn, 64>>& x) {
  const auto& fc0 = model.layer<0>();
  const auto& bn = model.layer<1>();
  const auto& fc3 = model.layer<3>();
  const std::size_t batch = x.batch();
  std::vector<double> out(batch * 10);
  std::vector<double> a(128);
  for (std::size_t n = 0; n < batch; ++n) {
    for (std::size_t j = 0; j < 128; ++j) {
      double z = fc0.bias[j];
      for (std::size_t i = 0; i < 64; ++i) z += double(x(n, i)) * double(fc0.weight(j, i));
      const double v = (z - double(bn.running_mean[j])) / std::sqrt(double(bn.running_var[j]) + bn.eps) *
                           double(bn.weight[j]) +
                       double(bn.bias[j]);
      a[j] = v > 0 ? v : 0.0;
    }
    for (std::size_t k = 0; k < 10; ++k) {
      double y = fc3.bias[k];
      for (std::size_t j = 0; j < 128; ++j) y += a[j] * double(fc3.weight(k, j));
      out[n * 10 + k] = y;
    }
  }
  return out;
}

// Folded against unfolded (and against the double reference): the fold rounds W s and
// (b - mean) s + beta to float once, the unfolded form rounds the GEMM's sums, then
// (z - mean) rstd gamma + beta. Each is a few u of |W||x| s per hidden feature (64-term sums,
// s = gamma / sqrt(var) of order 1 to 10); the logits add 128 such terms: 1e-5 of their scale.
constexpr double fold_tolerance = 1e-5;

TEST_CASE("linear batch_norm: the plan puts linear, batch_norm and relu in one block", "[chain][batch_norm]") {
  bn_mlp model(1);
  std::ostringstream plan;
  plan << plan_report<bn_mlp>{};
  INFO(plan.str());
  CHECK(plan.str().find("linear+batch_norm+relu (GEMM, BN folded in eval)") != std::string::npos);
  CHECK(plan.str().find("batch_norm folded into the GEMM") != std::string::npos);
  CHECK(plan.str().find("2 kernels") != std::string::npos);
  // Layers by the index they were written at.
  auto& block = std::get<0>(model.blocks);
  CHECK(&model.layer<0>() == &block.linear);
  CHECK(&model.layer<1>() == &block.norm);
  CHECK(&model.layer<2>() == &std::get<0>(block.tail.layers));
  CHECK(&std::as_const(model).layer<1>() == &block.norm);
  // PyTorch's names and shapes, so a state_dict of nn.Sequential loads as is.
  const auto params = model.params();
  REQUIRE(params.size() == 6);
  CHECK(params[0].name == "0.weight");
  CHECK(params[0].dims == std::vector<std::size_t>{128, 64});
  CHECK(params[1].name == "0.bias");
  CHECK(params[2].name == "1.weight");
  CHECK(params[2].dims == std::vector<std::size_t>{128});
  CHECK(params[3].name == "1.bias");
  CHECK(params[4].name == "3.weight");
  CHECK(params[4].dims == std::vector<std::size_t>{10, 128});
  CHECK(params[5].name == "3.bias");
  const auto buffers = model.buffers();
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].name == "1.running_mean");
  CHECK(buffers[1].name == "1.running_var");
  // Torch's starting values, and the same linear weights as the unfused chain.
  bn_mlp_unfused unfused(1);
  CHECK(bit_differences(state_of(model).data(), state_of(unfused).data(), state_of(model).size()) == 0);
  CHECK(model.layer<1>().weight[5] == 1.0f);
  CHECK(model.layer<1>().running_var[5] == 1.0f);
}

TEST_CASE("linear batch_norm: training is bitwise the unfused chain's", "[chain][batch_norm]") {
  SECTION("linear + batch_norm + relu") {
    bn_mlp model(3);
    bn_mlp_unfused reference(3);
    tensor<float, shape<dyn, 64>> x(32);
    solder::test::fill_uniform(x, -1, 1, 11);
    const auto labels = labels_for(32, 10);
    const auto y = model.forward(x), y_ref = reference.forward(x);
    CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);
    optim::sgd opt_a(model.params(), {.lr = 0.05f}), opt_b(reference.params(), {.lr = 0.05f});
    for (int step = 0; step < 3; ++step) {
      const float la = model.train_step(x, labels, opt_a), lb = reference.train_step(x, labels, opt_b);
      CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
    }
    // Every gradient, parameter and running statistic after the steps.
    const auto ga = grads_of(model), gb = grads_of(reference);
    CHECK(bit_differences(ga.data(), gb.data(), ga.size()) == 0);
    const auto sa = state_of(model), sb = state_of(reference);
    CHECK(bit_differences(sa.data(), sb.data(), sa.size()) == 0);
    CHECK(model.layer<1>().num_batches_tracked == 4);
  }
  SECTION("dropout after the activation, a bias-free linear, a batch_norm with no tail") {
    deep model(5);
    deep_unfused reference(5);
    tensor<float, shape<dyn, 24>> x(19);
    solder::test::fill_uniform(x, -1, 1, 12);
    const auto labels = labels_for(19, 5);
    optim::sgd opt_a(model.params(), {.lr = 0.05f}), opt_b(reference.params(), {.lr = 0.05f});
    for (int step = 0; step < 3; ++step) {
      const auto y = model.forward(x), y_ref = reference.forward(x);  // fresh dropout masks, the same in both
      CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);
      model.train_step(x, labels, opt_a);
      reference.train_step(x, labels, opt_b);
    }
    const auto ga = grads_of(model), gb = grads_of(reference);
    CHECK(bit_differences(ga.data(), gb.data(), ga.size()) == 0);
    const auto sa = state_of(model), sb = state_of(reference);
    CHECK(bit_differences(sa.data(), sb.data(), sa.size()) == 0);
  }
}

TEST_CASE("linear batch_norm: whole-chain gradients against central finite differences", "[chain][batch_norm]") {
  // In training the normalization uses the batch's statistics, so the loss is a smooth function
  // of every parameter (the running statistics are updated but not read). The linear biases
  // before a batch_norm cancel in its mean: their gradient is 0, and so is the difference.
  smooth model(4);
  tensor<float, shape<dyn, 6>> x(16);
  tensor<float, shape<dyn, 3>> r(16);
  solder::test::fill_uniform(x, -1, 1, 21);
  solder::test::fill_uniform(r, -1, 1, 22);
  // Float forward passes differenced at h = 1e-3: the loss (48 terms of order 1) is rounded to
  // about 1e-6, 5e-4 over 2h; a smaller batch variance bends the loss sharply (at h = 1e-2 the
  // h^2 term of this model's normalization is 2% of some gradients, at 1e-3 below 0.1%).
  solder::test::check_chain_gradients(model, x, r, {.stride = 1, .h = 1e-3f, .margin = 5e-4, .epsilon = 5e-3});
  // The same gradients as the unfused chain's, bit for bit.
  smooth_unfused reference(4);
  reference.forward(x);
  reference.backward(r);
  model.forward(x);
  model.backward(r);
  const auto ga = grads_of(model), gb = grads_of(reference);
  CHECK(bit_differences(ga.data(), gb.data(), ga.size()) == 0);
}

TEST_CASE("linear batch_norm: folded into the linear layer in eval mode, the unfolded outputs", "[chain][batch_norm]") {
  // Train a while so the running statistics and the affine parameters are far from their
  // starting values, then compare in eval mode: folded, unfolded in the same block, the chain
  // with one kernel per layer, and the model in double.
  bn_mlp model(9);
  bn_mlp_unfused reference(9);
  tensor<float, shape<dyn, 64>> x(40);
  solder::test::fill_uniform(x, -1, 1, 31);
  const auto labels = labels_for(40, 10);
  optim::sgd opt_a(model.params(), {.lr = 0.05f}), opt_b(reference.params(), {.lr = 0.05f});
  for (int step = 0; step < 20; ++step) {
    model.train_step(x, labels, opt_a);
    reference.train_step(x, labels, opt_b);
  }
  model.eval();
  reference.eval();
  auto& block = std::get<0>(model.blocks);
  const auto folded = model.forward(x);
  block.fold_in_eval = false;
  const auto unfolded = model.forward(x);
  block.fold_in_eval = true;
  const auto unfused = reference.forward(x);
  const auto exact = reference_eval(model, x);

  const spread fu = compare(folded, unfolded, folded.size());
  INFO("folded - unfolded: " << fu.worst << " of " << fu.scale);
  CHECK(fu.worst <= fold_tolerance * fu.scale);
  CHECK(bit_differences(unfolded.data(), unfused.data(), unfolded.size()) == 0);
  const spread fe = compare(folded, exact, folded.size()), ue = compare(unfolded, exact, unfolded.size());
  INFO("folded - double: " << fe.worst << ", unfolded - double: " << ue.worst << " of " << fe.scale);
  CHECK(fe.worst <= fold_tolerance * fe.scale);
  CHECK(ue.worst <= fold_tolerance * ue.scale);
  // The same predictions.
  for (std::size_t n = 0; n < 40; ++n) {
    std::size_t a = 0, b = 0;
    for (std::size_t k = 1; k < 10; ++k) {
      if (folded(n, k) > folded(n, a)) a = k;
      if (unfolded(n, k) > unfolded(n, b)) b = k;
    }
    CHECK(a == b);
  }

  // The folded forward reads W' and b', made when the model was frozen: a running statistic
  // changed without parameters_changed() leaves it as it was, and the unfolded form moves.
  model.layer<1>().running_mean[3] += 0.5f;
  const auto stale = model.forward(x);
  CHECK(bit_differences(stale.data(), folded.data(), folded.size()) == 0);
  // parameters_changed() folds again: the outputs follow the new parameters.
  model.layer<1>().bias[0] += 0.5f;
  model.layer<0>().weight(7, 2) += 0.25f;
  model.parameters_changed();
  const auto refolded = model.forward(x);
  block.fold_in_eval = false;
  const auto unfolded2 = model.forward(x);
  block.fold_in_eval = true;
  const auto exact2 = reference_eval(model, x);
  CHECK(bit_differences(refolded.data(), folded.data(), folded.size()) != 0);
  const spread ru = compare(refolded, unfolded2, refolded.size()), re = compare(refolded, exact2, refolded.size());
  INFO("refolded - unfolded: " << ru.worst << ", refolded - double: " << re.worst << " of " << ru.scale);
  CHECK(ru.worst <= fold_tolerance * ru.scale);
  CHECK(re.worst <= fold_tolerance * re.scale);

  // Back to training: the batch's statistics again, bitwise the unfused chain's.
  model.train();
  reference.train();
  reference.layer<1>().running_mean[3] += 0.5f;  // the same edits, for the same state
  reference.layer<1>().bias[0] += 0.5f;
  reference.layer<0>().weight(7, 2) += 0.25f;
  const auto ya = model.forward(x), yb = reference.forward(x);
  CHECK(bit_differences(ya.data(), yb.data(), ya.size()) == 0);
}

TEST_CASE("linear batch_norm: running statistics go through a parameter file", "[chain][batch_norm]") {
  bn_mlp model(2);
  tensor<float, shape<dyn, 64>> x(16);
  solder::test::fill_uniform(x, -1, 1, 41);
  const auto labels = labels_for(16, 10);
  optim::sgd opt(model.params(), {.lr = 0.05f});
  for (int step = 0; step < 3; ++step) model.train_step(x, labels, opt);
  model.eval();
  const auto y = model.forward(x);

  const solder::test::temp_dir dir("linear_batch_norm");
  const auto path = dir.path / "bn_mlp.safetensors";
  nn::save(model, path);
  bn_mlp loaded(5);
  CHECK(bit_differences(state_of(loaded).data(), state_of(model).data(), state_of(model).size()) != 0);
  nn::load(loaded, path);
  const auto a = state_of(model), b = state_of(loaded);
  REQUIRE(a.size() == b.size());
  CHECK(bit_differences(a.data(), b.data(), a.size()) == 0);
  CHECK(std::memcmp(loaded.layer<1>().running_var.data(), model.layer<1>().running_var.data(), 128 * sizeof(float)) == 0);
  loaded.eval();
  const auto y_loaded = loaded.forward(x);
  CHECK(bit_differences(y.data(), y_loaded.data(), y.size()) == 0);

  // Loading into a model already in eval mode folds the loaded parameters (load calls
  // parameters_changed()).
  bn_mlp frozen(7);
  frozen.eval();
  const auto before = frozen.forward(x);
  nn::load(frozen, path);
  const auto after = frozen.forward(x);
  CHECK(bit_differences(before.data(), y.data(), y.size()) != 0);
  CHECK(bit_differences(after.data(), y.data(), y.size()) == 0);
}

TEST_CASE("linear batch_norm: eval backward after a folded forward is the unfolded one's", "[chain][batch_norm]") {
  // Backward in eval mode makes again what the folded forward did not keep (the product's output,
  // the normalization's state, the tail's input) as the unfolded forward makes them: the same
  // gradients within the fold's rounding of y, which only the relu gate reads (and gelu's is
  // made from the recomputed input). The unfolded form is bitwise the unfused chain's.
  auto check = [](auto& model, auto& reference, const auto& x, const auto& dy, const char* what) {
    model.eval();
    reference.eval();
    auto grads = [&](bool fold) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((std::get<I>(model.blocks).fold_in_eval = fold), ...);
      }(std::make_index_sequence<std::remove_cvref_t<decltype(model)>::kernels>{});
      model.forward(x);
      model.backward(dy);
      return grads_of(model);
    };
    const auto folded = grads(true), unfolded = grads(false);
    reference.forward(x);
    reference.backward(dy);
    const auto unfused = grads_of(reference);
    REQUIRE(folded.size() == unfolded.size());
    const spread s = compare(folded, unfolded, folded.size());
    INFO(what << ": largest difference " << s.worst << " of " << s.scale);
    CHECK(s.worst <= fold_tolerance * s.scale);
    CHECK(bit_differences(unfolded.data(), unfused.data(), unfolded.size()) == 0);
    // The gradients of the linear bias before a batch_norm vanish in training only: in eval
    // mode the normalization is an affine map, so they are its scale times the next gradient.
    CHECK(std::any_of(model.params()[1].grad.begin(), model.params()[1].grad.end(), [](float g) { return g != 0.0f; }));
  };
  SECTION("relu and dropout after the normalization; a batch_norm with no tail") {
    deep model(6);
    deep_unfused reference(6);
    tensor<float, shape<dyn, 24>> x(12);
    tensor<float, shape<dyn, 5>> dy(12);
    solder::test::fill_uniform(x, -1, 1, 51);
    solder::test::fill_uniform(dy, -1, 1, 52);
    const auto labels = labels_for(12, 5);
    // The same steps give the same state (tested above): the same dropout masks, the same bits.
    optim::sgd opt_a(model.params(), {.lr = 0.05f}), opt_b(reference.params(), {.lr = 0.05f});
    for (int step = 0; step < 4; ++step) {
      model.train_step(x, labels, opt_a);
      reference.train_step(x, labels, opt_b);
    }
    check(model, reference, x, dy, "deep");
  }
  SECTION("tanh and gelu after the normalization") {
    smooth model(8);
    smooth_unfused reference(8);
    tensor<float, shape<dyn, 6>> x(9);
    tensor<float, shape<dyn, 3>> dy(9);
    solder::test::fill_uniform(x, -1, 1, 53);
    solder::test::fill_uniform(dy, -1, 1, 54);
    for (int pass = 0; pass < 5; ++pass) {  // running statistics away from their start
      model.forward(x);
      reference.forward(x);
    }
    check(model, reference, x, dy, "smooth");
  }
}

TEST_CASE("linear batch_norm: run-time errors name the problem", "[chain][batch_norm]") {
  bn_block block(3);
  tensor<float, shape<dyn, 64>> x(4), dx(4);
  tensor<float, shape<dyn, 128>> y(4), dy(4), y5(5), dy5(5);
  solder::test::fill_uniform(x, -1, 1, 61);
  CHECK_THROWS_WITH(block.forward(x, y5), Catch::Contains("batch sizes"));
  block.forward(x, y);
  CHECK_THROWS_WITH(block.backward(x, y, dy5, dx), Catch::Contains("batch sizes"));
  tensor<float, shape<dyn, 64>> x1(1);
  tensor<float, shape<dyn, 128>> y1(1);
  // torch's rule: training needs more than one value per channel.
  CHECK_THROWS_WITH(block.forward(x1, y1), Catch::Contains("more than 1 value per channel"));
}

}  // namespace
