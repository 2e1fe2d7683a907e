// tests/optim/optim.test.cpp: SGD, Adam and AdamW over several steps against double
// references of torch.optim's update rules written here (weights and state), their known
// first steps, gradient-norm clipping, gradient accumulation, the learning-rate schedules at
// known steps (at run time and in constant expressions), a small training run, the errors
// for bad hyperparameters and parameters, and the per-element updates of ops/optimizer.hpp on
// float, double and the CPU vector type against the same references.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/batch.hpp"
#include "solder/nn/loss.hpp"
#include "solder/ops/optimizer.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/optim/schedule.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::optim::param;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

/// Float's unit roundoff.
constexpr double u = 0x1p-24;
/// Each step rounds every state value a handful of times (about 6 operations per element),
/// on values of size at most ~2 (weights in [-1, 1], gradients in [-1, 1], momentum <= 1 /
/// (1 - 0.9) times a gradient); over 5 steps that stays below 64 u (1 + |value|).
constexpr double step_tol_u = 64;
/// Adam's v is a sum of non-negative terms: relative error <= 3 u per step.
constexpr double adam_v_rel = 16 * u;

/// Tensor sizes of the parameters under test: tails of every vector width (1, 3, 37, 257) and
/// one of 70000 elements, above the size where the update is spread over threads.
const std::vector<std::size_t> sizes = {1, 3, 37, 257, 70000};

/// A model's parameters and gradients as flat tensors, with param views of them.
struct model {
  std::vector<tensor<float, shape<dyn>>> w, g;
  std::vector<param> params;
  explicit model(std::uint32_t seed) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back(sizes[k]);
      g.emplace_back(sizes[k]);
      solder::test::fill_uniform(w[k], -1, 1, seed + std::uint32_t(k));
    }
    for (std::size_t k = 0; k < sizes.size(); ++k)
      params.push_back(solder::optim::make_param("p" + std::to_string(k), w[k], g[k]));
  }
  /// Fresh gradients for step t, the same for solder and the reference.
  void draw_grads(int t) {
    for (std::size_t k = 0; k < g.size(); ++k) solder::test::fill_uniform(g[k], -1, 1, 1000 * std::uint32_t(t) + std::uint32_t(k));
  }
};

std::vector<double> to_double(const float* p, std::size_t n) { return std::vector<double>(p, p + n); }

/// Counts elements of got outside step_tol_u u (1 + |want|), reporting the first.
std::size_t mismatches(const float* got, const std::vector<double>& want, const char* what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= step_tol_u * u * (1 + std::fabs(want[i])))) {
      if (!bad) UNSCOPED_INFO(what << ": first mismatch at " << i << ": " << got[i] << " vs " << want[i]);
      ++bad;
    }
  return bad;
}

/// torch.optim.SGD's step for one parameter, in double (torch/optim/sgd.py, _single_tensor_sgd).
struct sgd_reference {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  std::vector<double> w, buf;
  bool has_buf = false;
  void step(const float* grad) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      double d = grad[i];
      if (weight_decay != 0) d += weight_decay * w[i];
      if (momentum != 0) {
        if (!has_buf)
          buf[i] = d;  // torch.clone(d_p): the first buffer is the gradient itself
        else
          buf[i] = momentum * buf[i] + (1 - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      w[i] -= lr * d;
    }
    has_buf = true;
  }
};

/// torch.optim.Adam / AdamW's step for one parameter, in double (_single_tensor_adam).
struct adam_reference {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  std::vector<double> w, m, v;
  int t = 0;
  void step(const float* grad) {
    ++t;
    const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
    for (std::size_t i = 0; i < w.size(); ++i) {
      double g = grad[i];
      if (decoupled)
        w[i] *= 1 - lr * weight_decay;
      else
        g += weight_decay * w[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
      w[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

}  // namespace

TEST_CASE("optim: sgd matches torch.optim.SGD's rule over 5 steps", "[optim]") {
  struct config {
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
  };
  const config c = GENERATE(config{0.1f, 0.0f, 0.0f, 0.0f, false},   // plain
                            config{0.1f, 0.9f, 0.0f, 0.0f, false},   // momentum
                            config{0.05f, 0.9f, 0.5f, 1e-2f, false},  // dampening, decay
                            config{0.1f, 0.9f, 0.0f, 1e-2f, true},   // Nesterov
                            config{0.2f, 0.0f, 0.0f, 0.1f, false});  // decay alone
  INFO("lr " << c.lr << ", momentum " << c.momentum << ", dampening " << c.dampening << ", weight_decay "
             << c.weight_decay << ", nesterov " << c.nesterov);
  model net(11);
  std::vector<sgd_reference> ref;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    ref.push_back({c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov, to_double(net.w[k].data(), sizes[k]),
                   std::vector<double>(sizes[k], 0.0)});
  solder::optim::sgd opt(net.params, {.lr = c.lr, .momentum = c.momentum, .dampening = c.dampening,
                                      .weight_decay = c.weight_decay, .nesterov = c.nesterov});
  for (int t = 0; t < 5; ++t) {
    net.draw_grads(t);
    opt.step();
    for (std::size_t k = 0; k < sizes.size(); ++k) ref[k].step(net.g[k].data());
    if (t == 0 && c.momentum != 0 && c.weight_decay == 0)
      for (std::size_t k = 0; k < sizes.size(); ++k)  // the first buffer is the gradient, undamped
        CHECK(std::memcmp(opt.momentum_buffer(k).data(), net.g[k].data(), sizes[k] * sizeof(float)) == 0);
  }
  CHECK(opt.steps() == 5);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    INFO("parameter " << k << " of " << sizes[k] << " elements");
    CHECK(mismatches(net.w[k].data(), ref[k].w, "weights") == 0);
    if (c.momentum != 0) CHECK(mismatches(opt.momentum_buffer(k).data(), ref[k].buf, "momentum") == 0);
  }
}

TEST_CASE("optim: adam and adamw match torch.optim's rules over 5 steps", "[optim]") {
  struct config {
    bool decoupled;
    float lr, beta1, beta2, eps, weight_decay;
  };
  const config c = GENERATE(config{false, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f},   // Adam
                            config{false, 1e-2f, 0.8f, 0.99f, 1e-6f, 0.1f},    // Adam, L2 decay
                            config{true, 1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f},   // AdamW
                            config{true, 3e-2f, 0.5f, 0.9f, 1e-3f, 0.5f});     // AdamW, strong decay
  INFO((c.decoupled ? "adamw" : "adam") << " lr " << c.lr << ", betas " << c.beta1 << ", " << c.beta2 << ", eps "
                                        << c.eps << ", weight_decay " << c.weight_decay);
  model net(21);
  std::vector<adam_reference> ref;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    ref.push_back({c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.decoupled, to_double(net.w[k].data(), sizes[k]),
                   std::vector<double>(sizes[k], 0.0), std::vector<double>(sizes[k], 0.0)});
  auto run = [&](auto& opt) {
    const float* m0 = opt.exp_avg(0).data();
    for (int t = 0; t < 5; ++t) {
      net.draw_grads(t);
      opt.step();
      for (std::size_t k = 0; k < sizes.size(); ++k) ref[k].step(net.g[k].data());
    }
    CHECK(opt.steps() == 5);
    CHECK(opt.exp_avg(0).data() == m0);  // state allocated once, at construction
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      INFO("parameter " << k << " of " << sizes[k] << " elements");
      CHECK(mismatches(net.w[k].data(), ref[k].w, "weights") == 0);
      CHECK(mismatches(opt.exp_avg(k).data(), ref[k].m, "exp_avg") == 0);
      std::size_t bad_v = 0;
      for (std::size_t i = 0; i < sizes[k]; ++i) bad_v += !WithinRel(ref[k].v[i], adam_v_rel).match(opt.exp_avg_sq(k)[i]);
      CHECK(bad_v == 0);
    }
  };
  if (c.decoupled) {
    solder::optim::adamw opt(net.params, {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay});
    run(opt);
  } else {
    solder::optim::adam opt(net.params, {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay});
    run(opt);
  }
}

TEST_CASE("optim: known first steps of adam, adamw and sgd", "[optim]") {
  tensor<float, shape<dyn>> w(4), g(4);
  const float w0[4] = {0.5f, -0.25f, 2.0f, -1.0f};
  const std::vector<param> params = {solder::optim::make_param("w", w, g)};

  SECTION("adam's first step moves every weight by lr against the gradient's sign") {
    // m^ = g, sqrt(v^) = |g|: the bias-corrected step is lr g / (|g| + eps).
    std::copy(w0, w0 + 4, w.begin());
    const float gs[4] = {3.0f, -1e-3f, 0.5f, -20.0f};
    std::copy(gs, gs + 4, g.begin());
    solder::optim::adam opt(params, {.lr = 0.1f, .eps = 0.0f});
    opt.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK_THAT(w[i], WithinAbs(w0[i] - (gs[i] > 0 ? 0.1 : -0.1), 4 * u));
  }
  SECTION("with zero gradients adamw only decays, adam's L2 decay moves by lr") {
    std::copy(w0, w0 + 4, w.begin());
    g.fill(0.0f);
    solder::optim::adamw decoupled(params, {.lr = 0.1f, .weight_decay = 0.5f});
    decoupled.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK_THAT(w[i], WithinRel(w0[i] * (1 - 0.1 * 0.5), 2 * u));
    std::copy(w0, w0 + 4, w.begin());
    solder::optim::adam coupled(params, {.lr = 0.1f, .eps = 0.0f, .weight_decay = 0.5f});
    coupled.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK_THAT(w[i], WithinAbs(w0[i] - (w0[i] > 0 ? 0.1 : -0.1), 4 * u));
  }
  SECTION("sgd: w - lr g, then momentum's second step adds mu times the first gradient") {
    std::copy(w0, w0 + 4, w.begin());
    g.fill(1.0f);
    solder::optim::sgd opt(params, {.lr = 0.5f, .momentum = 0.5f});
    opt.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK(w[i] == w0[i] - 0.5f);
    opt.step();  // buf = 0.5 * 1 + 1 = 1.5
    for (std::size_t i = 0; i < 4; ++i) CHECK(w[i] == w0[i] - 0.5f - 0.75f);
    opt.set_lr(0.0f);
    opt.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK(w[i] == w0[i] - 1.25f);
    CHECK(opt.lr() == 0.0f);
    CHECK(opt.steps() == 3);
  }
  SECTION("zero_grad") {
    g.fill(3.0f);
    solder::optim::sgd opt(params, {.lr = 0.1f});
    opt.zero_grad();
    for (float v : g) CHECK(v == 0.0f);
  }
}

TEST_CASE("optim: updates are bitwise the same for any thread count", "[optim]") {
  std::vector<float> results[2];
  for (int run = 0; run < 2; ++run) {
    const int saved = solder::num_threads();
    solder::set_num_threads(run == 0 ? 1 : 3);
    model net(31);
    solder::optim::adamw opt(net.params, {.lr = 1e-2f});
    for (int t = 0; t < 3; ++t) {
      net.draw_grads(t);
      opt.step();
    }
    solder::set_num_threads(saved);
    results[run].assign(net.w.back().begin(), net.w.back().end());
  }
  CHECK(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)) == 0);
}

TEST_CASE("optim: bad hyperparameters and parameters are errors", "[optim]") {
  tensor<float, shape<dyn>> w(4), g(4), g3(3);
  const std::vector<param> params = {solder::optim::make_param("fc.weight", w, g)};
  using solder::optim::adam;
  using solder::optim::adamw;
  using solder::optim::sgd;
  CHECK_THROWS_WITH(sgd({}, {.lr = 0.1f}), "solder::optim::sgd: got an empty parameter list");
  CHECK_THROWS_WITH(sgd(params, {.lr = -0.1f}), Contains("solder::optim::sgd: lr must be >= 0"));
  CHECK_THROWS_WITH(sgd(params, {.lr = qnan}), Contains("lr must be >= 0"));
  CHECK_THROWS_WITH(sgd(params, {.lr = 0.1f, .momentum = -1.0f}), Contains("momentum must be >= 0"));
  CHECK_THROWS_WITH(sgd(params, {.lr = 0.1f, .weight_decay = -1.0f}), Contains("weight_decay must be >= 0"));
  CHECK_THROWS_WITH(sgd(params, {.lr = 0.1f, .nesterov = true}),
                    "solder::optim::sgd: Nesterov momentum requires momentum > 0 and dampening = 0");
  CHECK_THROWS_WITH(sgd(params, {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}),
                    Contains("Nesterov momentum requires"));
  CHECK_THROWS_WITH(sgd(params, {.lr = 0.1f}).momentum_buffer(0), Contains("momentum is 0"));
  CHECK_THROWS_WITH(adam(params, {.beta1 = 1.0f}), Contains("solder::optim::adam: beta1 must be in [0, 1), got 1"));
  CHECK_THROWS_WITH(adamw(params, {.beta2 = -0.5f}), Contains("solder::optim::adamw: beta2 must be in [0, 1)"));
  CHECK_THROWS_WITH(adam(params, {.eps = -1.0f}), Contains("eps must be >= 0"));
  CHECK_THROWS_WITH(adamw(params, {.weight_decay = -1.0f}), Contains("weight_decay must be >= 0"));
  CHECK_THROWS_WITH(adam(params).exp_avg(1), Contains("parameter index 1 is out of range (1 parameters)"));
  adam opt(params);
  CHECK_THROWS_WITH(opt.set_lr(-1.0f), Contains("lr must be >= 0"));
  CHECK(opt.lr() == 1e-3f);
  CHECK(adamw(params).hyperparameters().weight_decay == 1e-2f);  // PyTorch's defaults
  CHECK(adam(params).hyperparameters().weight_decay == 0.0f);

  CHECK_THROWS_WITH(solder::optim::make_param("fc.bias", w, g3),
                    "solder::optim::make_param: 'fc.bias' has 4 values but 3 gradients");
  const std::vector<param> mismatched = {
      {"fc.bias", solder::tensor_ref<float, shape<dyn>>(w.data(), 4), solder::tensor_ref<float, shape<dyn>>(g3.data(), 3)}};
  CHECK_THROWS_WITH(adam(mismatched), "solder::optim::adam: parameter 'fc.bias' has 4 values but 3 gradients");
}

// ---- clip_grad_norm ---------------------------------------------------------------------

namespace {

/// torch.nn.utils.clip_grad_norm_ in double: the global norm, and the scale applied if < 1.
double total_norm(const model& net) {
  double s = 0;
  for (const auto& g : net.g)
    for (float v : g) s += double(v) * v;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("optim: clip_grad_norm scales all gradients to max_norm, as torch does", "[optim]") {
  model net(41);
  net.draw_grads(7);
  const double norm = total_norm(net);  // ~ sqrt(70298 / 3) ~ 153
  std::vector<std::vector<float>> before;
  for (const auto& g : net.g) before.emplace_back(g.begin(), g.end());

  SECTION("above max_norm: scaled by max_norm / (norm + 1e-6)") {
    const float got = solder::optim::clip_grad_norm(net.params, 10.0f);
    CHECK_THAT(got, WithinRel(norm, 4 * u));  // sums in double, one rounding to float
    const double scale = 10.0 / (norm + 1e-6);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::size_t bad = 0;
      for (std::size_t i = 0; i < sizes[k]; ++i) bad += !WithinRel(before[k][i] * scale, 2 * u).match(net.g[k][i]);
      CHECK(bad == 0);
    }
    CHECK_THAT(total_norm(net), WithinRel(10.0, 1e-5));
  }
  SECTION("below max_norm: untouched") {
    CHECK_THAT(solder::optim::clip_grad_norm(net.params, 1000.0f), WithinRel(norm, 4 * u));
    for (std::size_t k = 0; k < sizes.size(); ++k)
      CHECK(std::memcmp(before[k].data(), net.g[k].data(), sizes[k] * sizeof(float)) == 0);
  }
  SECTION("the norm is bitwise the same for any thread count") {
    const int saved = solder::num_threads();
    solder::set_num_threads(1);
    const float n1 = solder::optim::clip_grad_norm(net.params, 1000.0f);
    solder::set_num_threads(3);
    const float n3 = solder::optim::clip_grad_norm(net.params, 1000.0f);
    solder::set_num_threads(saved);
    CHECK(std::memcmp(&n1, &n3, sizeof(float)) == 0);
  }
  SECTION("a known norm: 3-4-5") {
    tensor<float, shape<dyn>> a(1), ga(1), b(1), gb(1);
    ga[0] = 3.0f;
    gb[0] = -4.0f;
    const std::vector<param> two = {solder::optim::make_param("a", a, ga), solder::optim::make_param("b", b, gb)};
    CHECK(solder::optim::clip_grad_norm(two, 1.0f) == 5.0f);
    CHECK_THAT(ga[0], WithinRel(3.0 / (5 + 1e-6), 2 * u));  // the scale and the product each round
    CHECK_THAT(gb[0], WithinRel(-4.0 / (5 + 1e-6), 2 * u));
  }
}

TEST_CASE("optim: clip_grad_norm on a non-finite norm", "[optim]") {
  model net(51);
  net.draw_grads(8);
  net.g[3][100] = qnan;
  CHECK_THROWS_WITH(solder::optim::clip_grad_norm(net.params, 1.0f),
                    "solder::optim::clip_grad_norm: the gradient norm is NaN; parameter 'p3' has a non-finite "
                    "gradient (pass error_if_nonfinite = false to clip anyway)");
  CHECK(net.g[0][0] != 0.0f);  // nothing scaled before the error
  net.g[3][100] = 0.0f;
  net.g[2][5] = -infty;
  CHECK_THROWS_WITH(solder::optim::clip_grad_norm(net.params, 1.0f), Contains("the gradient norm is infinite; parameter 'p2'"));
  // Opted out: torch's formula scales by max_norm / inf = 0 (and the inf itself becomes NaN).
  CHECK(solder::optim::clip_grad_norm(net.params, 1.0f, false) == infty);
  CHECK(net.g[0][0] == 0.0f);
  CHECK(std::isnan(net.g[2][5]));
  CHECK_THROWS_WITH(solder::optim::clip_grad_norm(net.params, -1.0f), Contains("max_norm must be >= 0"));
}

// ---- gradient accumulation --------------------------------------------------------------

TEST_CASE("optim: grad_accumulator averages N micro-batches' gradients", "[optim]") {
  model net(61);
  const int n = GENERATE(1, 2, 3);
  solder::optim::grad_accumulator acc(net.params, n);
  for (int round = 0; round < 2; ++round) {  // a second round starts afresh
    std::vector<std::vector<double>> sum;
    for (std::size_t k = 0; k < sizes.size(); ++k) sum.emplace_back(sizes[k], 0.0);
    for (int micro = 0; micro < n; ++micro) {
      net.draw_grads(10 * round + micro);
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) sum[k][i] += net.g[k][i];
      CHECK(acc.pending() == micro);
      CHECK(acc.accumulate() == (micro == n - 1));
    }
    CHECK(acc.pending() == 0);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::size_t bad = 0;  // n - 1 float additions and a division
      for (std::size_t i = 0; i < sizes[k]; ++i)
        bad += !WithinAbs(sum[k][i] / n, double(n + 1) * u * 1.0).match(net.g[k][i]);
      CHECK(bad == 0);
    }
  }
  CHECK_THROWS_WITH(solder::optim::grad_accumulator(net.params, 0), Contains("micro_batches must be >= 1, got 0"));
}

TEST_CASE("optim: accumulating 3 micro-batches gives the full batch's mean-loss gradient", "[optim]") {
  // A model that predicts the same row w [C] for every input; the loss is mse against targets
  // t [6, C]. dL/dw is the column sum of dL/dprediction (what a layer's backward would write).
  // The full batch's mean-loss gradient must equal the mean of three 2-row micro-batches'.
  constexpr std::size_t C = 5;
  tensor<float, shape<C>> w, w_grad;
  solder::test::fill_uniform(w, -1, 1, 71);
  tensor<float, shape<6, C>> t;
  solder::test::fill_uniform(t, -1, 1, 72);
  const auto column_sums = [&](const float* d, std::size_t rows) {
    for (std::size_t j = 0; j < C; ++j) {
      w_grad[j] = 0.0f;
      for (std::size_t r = 0; r < rows; ++r) w_grad[j] += d[r * C + j];
    }
  };

  tensor<float, shape<6, C>> pred_full, d_full;
  for (std::size_t i = 0; i < 6 * C; ++i) pred_full[i] = w[i % C];
  solder::nn::mse(pred_full, t, d_full);
  column_sums(d_full.data(), 6);
  const std::vector<float> want(w_grad.begin(), w_grad.end());

  solder::optim::grad_accumulator acc({solder::optim::make_param("w", w, w_grad)}, 3);
  tensor<float, shape<2, C>> pred, d;
  for (std::size_t i = 0; i < 2 * C; ++i) pred[i] = w[i % C];
  for (std::size_t m = 0; m < 3; ++m) {
    const solder::tensor_ref<const float, shape<2, C>> tm(t.data() + m * 2 * C);
    solder::nn::mse(pred, tm, d);
    column_sums(d.data(), 2);
    CHECK(acc.accumulate() == (m == 2));
  }
  // Gradients of size <= 4 / 30 per element, summed over 6 rows in float in both: a few u.
  for (std::size_t j = 0; j < C; ++j) CHECK_THAT(w_grad[j], WithinAbs(want[j], 16 * u));
}

// ---- schedules --------------------------------------------------------------------------

namespace {
using solder::optim::cosine_annealing_lr;
using solder::optim::exponential_lr;
using solder::optim::linear_lr;
using solder::optim::sequential_lr;
using solder::optim::step_lr;

// Schedules are constant expressions: known values checked at compile time.
static_assert(step_lr{0.1, 3, 0.5}(0) == 0.1f);
static_assert(step_lr{0.1, 3, 0.5}(2) == 0.1f);
static_assert(step_lr{0.1, 3, 0.5}(3) == 0.05f);
static_assert(step_lr{0.1, 3, 0.5}(7) == 0.025f);
static_assert(exponential_lr{1.0, 0.5}(4) == 0.0625f);
static_assert(cosine_annealing_lr{1.0, 10, 0.1}(0) == 1.0f);
static_assert(cosine_annealing_lr{1.0, 10, 0.1}(10) == 0.1f);
static_assert(cosine_annealing_lr{1.0, 10, 0.0}(5) == 0.5f);
static_assert(linear_lr{1.0, 0.25, 1.0, 4}(0) == 0.25f);
static_assert(linear_lr{1.0, 0.25, 1.0, 4}(2) == 0.625f);
static_assert(linear_lr{1.0, 0.25, 1.0, 4}(100) == 1.0f);
static_assert(solder::optim::warmup_cosine_lr(1.0, 4, 14, 0.0)(0) == 0.0f);
static_assert(solder::optim::warmup_cosine_lr(1.0, 4, 14, 0.0)(4) == 1.0f);
static_assert(solder::optim::warmup_cosine_lr(1.0, 4, 14, 0.0)(9) == 0.5f);
static_assert(solder::optim::warmup_cosine_lr(1.0, 4, 14, 0.0)(14) == 0.0f);

/// torch.optim.lr_scheduler's closed forms, in double, written from PyTorch's documentation.
double torch_cosine(double base, double eta_min, int t, int t_max) {
  return eta_min + (base - eta_min) * (1 + std::cos(std::numbers::pi * t / t_max)) / 2;
}

template <class Schedule, std::size_t N>
constexpr std::array<float, N> table(Schedule s) {
  std::array<float, N> a{};
  for (std::size_t t = 0; t < N; ++t) a[t] = s(std::int64_t(t));
  return a;
}

}  // namespace

TEST_CASE("optim: schedules match torch.optim.lr_scheduler's closed forms", "[optim]") {
  for (int t = 0; t < 40; ++t) {
    INFO("step " << t);
    CHECK_THAT((step_lr{0.3, 7, 0.2}(t)), WithinRel(0.3 * std::pow(0.2, t / 7), 2 * u));
    CHECK_THAT((exponential_lr{0.3, 0.95}(t)), WithinRel(0.3 * std::pow(0.95, t), 2 * u));
    CHECK_THAT((cosine_annealing_lr{0.3, 13, 0.01}(t)), WithinRel(torch_cosine(0.3, 0.01, t, 13), 2 * u));
    CHECK_THAT((linear_lr{0.3, 0.1, 1.0, 9}(t)), WithinRel(0.3 * (0.1 + 0.9 * std::min(t, 9) / 9.0), 2 * u));
    const auto warm = solder::optim::warmup_cosine_lr(0.3, 5, 30, 0.2, 0.01);
    const double want = t < 5 ? 0.3 * (0.2 + 0.8 * t / 5.0) : torch_cosine(0.3, 0.01, t - 5, 25);
    CHECK_THAT(warm(t), WithinRel(want, 2 * u));
  }
  // Past t_max the cosine rises again, as PyTorch's closed form does: back to base at 2 t_max.
  CHECK(cosine_annealing_lr{1.0, 10, 0.0}(20) == 1.0f);
  CHECK_THAT((cosine_annealing_lr{1.0, 10, 0.0}(15)), WithinAbs(0.5, 2 * u));
  // The compile-time cosine (a series) agrees with the run-time one (std::cos).
  constexpr cosine_annealing_lr cos_sched{0.7, 17, 0.003};
  constexpr auto at_compile_time = table<cosine_annealing_lr, 60>(cos_sched);
  for (std::size_t t = 0; t < 60; ++t) CHECK_THAT(at_compile_time[t], Catch::Matchers::WithinULP(cos_sched(std::int64_t(t)), 1));
  // A composite of any two schedules.
  const sequential_lr both{exponential_lr{1.0, 0.5}, step_lr{0.1, 2, 0.1}, 3};
  CHECK(both(2) == 0.25f);
  CHECK(both(3) == 0.1f);
  CHECK_THAT(both(5), WithinRel(0.01, 2 * u));
}

TEST_CASE("optim: bad schedule settings are errors", "[optim]") {
  CHECK_THROWS_WITH((step_lr{0.1, 0}(3)), "solder::optim::step_lr: step_size must be >= 1, got 0");
  CHECK_THROWS_WITH((exponential_lr{0.1, 0.9}(-1)), "solder::optim::exponential_lr: the step must be >= 0, got -1");
  CHECK_THROWS_WITH((cosine_annealing_lr{0.1, 0}(1)), Contains("t_max must be >= 1"));
  CHECK_THROWS_WITH((linear_lr{0.1, 0.5, 1.0, 0}(1)), Contains("total_iters must be >= 1"));
  CHECK_THROWS_WITH(solder::optim::warmup_cosine_lr(0.1, 10, 10, 0.0), Contains("total_steps must exceed warmup_steps"));
}

// ---- a training run ----------------------------------------------------------------------

TEST_CASE("optim: adamw with warmup and cosine fits free logits to their labels", "[optim]") {
  // The logits themselves are the parameters: cross-entropy must fall and accuracy reach 1.
  constexpr std::size_t B = 32, C = 10;
  tensor<float, shape<dyn, C>> logits(B), grad(B);
  solder::test::fill_uniform(logits, -1, 1, 81);
  std::vector<std::int32_t> labels(B);
  solder::test::fill_integers(labels, 0, C - 1, 82);
  solder::optim::adamw opt({solder::optim::make_param("logits", logits, grad)}, {.lr = 0.1f, .weight_decay = 1e-4f});
  const auto schedule = solder::optim::warmup_cosine_lr(0.1, 5, 100, 0.1);
  const float first = solder::nn::softmax_cross_entropy(logits, labels, grad);
  float loss = first;
  while (opt.steps() < 100) {
    opt.set_lr(schedule(opt.steps()));
    opt.step();
    loss = solder::nn::softmax_cross_entropy(logits, labels, grad);
  }
  CHECK(first > 1.5f);
  CHECK(loss < 0.05f);
  CHECK(solder::nn::accuracy(logits, labels) == 1.0f);
}

// ---- the per-element updates (ops/optimizer.hpp) on every value type ----------------------

namespace {

/// Up to four per-element values (weight, gradient, state...) of n elements.
using slots = std::array<std::vector<float>, 4>;

/// f on every element of `in`, with V = float or double one element at a time, or V a vector
/// type one vector at a time (the last one padded with 1); the results in double.
template <class V, class F>
std::array<std::vector<double>, 4> on_values(const F& f, const slots& in) {
  const std::size_t n = in[0].size();
  std::array<std::vector<double>, 4> out;
  for (auto& o : out) o.resize(n);
  if constexpr (std::is_arithmetic_v<V>) {
    for (std::size_t i = 0; i < n; ++i) {
      std::array<V, 4> x{V(in[0][i]), V(in[1][i]), V(in[2][i]), V(in[3][i])};
      f(x);
      for (std::size_t k = 0; k < 4; ++k) out[k][i] = double(x[k]);
    }
  } else {
    for (std::size_t i = 0; i < n; i += V::size) {
      const std::size_t m = std::min<std::size_t>(V::size, n - i);
      alignas(solder::alignment) float lanes[V::size];
      std::array<V, 4> x;
      for (std::size_t k = 0; k < 4; ++k) {
        std::fill_n(lanes, V::size, 1.0f);
        std::copy_n(in[k].begin() + std::ptrdiff_t(i), m, lanes);
        x[k] = V::load_aligned(lanes);
      }
      f(x);
      for (std::size_t k = 0; k < 4; ++k) {
        x[k].store_aligned(lanes);
        std::copy_n(lanes, m, out[k].begin() + std::ptrdiff_t(i));
      }
    }
  }
  return out;
}

/// Elements of got outside step_tol_u u (1 + |want|) of want.
std::size_t mismatches64(const std::vector<double>& got, const std::vector<double>& want) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) bad += !(std::fabs(got[i] - want[i]) <= step_tol_u * u * (1 + std::fabs(want[i])));
  return bad;
}

/// Random weights, gradients and state of a tail size (37: whole vectors and a tail).
slots random_slots(std::uint32_t seed) {
  slots s;
  for (std::size_t k = 0; k < 4; ++k) s[k] = solder::test::uniform(37, -1, 1, seed + std::uint32_t(k));
  for (float& v : s[3]) v = v * v;  // Adam's v is a sum of squares
  return s;
}

}  // namespace

TEST_CASE("optim: ops::sgd_update on float, double and vectors follows torch.optim.SGD", "[optim]") {
  namespace ops = solder::ops;
  using vecf = solder::eval::cpu::vec<float>;
  struct config {
    float lr, momentum, dampening, weight_decay;
    bool nesterov, first;
  };
  const config c = GENERATE(config{0.1f, 0.0f, 0.0f, 0.0f, false, false},   // plain
                            config{0.2f, 0.0f, 0.0f, 0.1f, false, true},     // decay, no buffer
                            config{0.1f, 0.9f, 0.0f, 0.0f, false, true},     // the first buffer is g
                            config{0.05f, 0.9f, 0.5f, 1e-2f, false, false},  // dampening, decay
                            config{0.1f, 0.9f, 0.0f, 1e-2f, true, false});   // Nesterov
  INFO("lr " << c.lr << ", momentum " << c.momentum << ", dampening " << c.dampening << ", weight_decay "
             << c.weight_decay << ", nesterov " << c.nesterov << ", first " << c.first);
  const slots in = random_slots(71);
  sgd_reference ref{c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov, to_double(in[0].data(), 37),
                    to_double(in[2].data(), 37)};
  ref.has_buf = !c.first;
  ref.step(in[1].data());
  const ops::sgd_update update(c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov, c.first);
  const auto f = [&](auto& x) {
    if (c.momentum != 0)
      update(x[0], x[1], x[2]);
    else
      update(x[0], x[1]);
  };
  for (const auto& got : {on_values<float>(f, in), on_values<double>(f, in), on_values<vecf>(f, in)}) {
    CHECK(mismatches64(got[0], ref.w) == 0);
    if (c.momentum != 0) CHECK(mismatches64(got[2], ref.buf) == 0);
  }
}

TEST_CASE("optim: ops::adam_update on float, double and vectors follows torch.optim.Adam and AdamW", "[optim]") {
  namespace ops = solder::ops;
  using vecf = solder::eval::cpu::vec<float>;
  const bool decoupled = GENERATE(false, true);
  const float weight_decay = GENERATE(0.0f, 0.1f);
  INFO((decoupled ? "adamw" : "adam") << ", weight_decay " << weight_decay);
  const slots in = random_slots(81);
  constexpr float lr = 1e-2f, beta1 = 0.8f, beta2 = 0.99f, eps = 1e-6f;
  adam_reference ref{lr, beta1, beta2, eps, weight_decay, decoupled, to_double(in[0].data(), 37),
                     to_double(in[2].data(), 37), to_double(in[3].data(), 37)};
  ref.t = 2;  // the update of step 3
  ref.step(in[1].data());
  const auto check = [&](const auto& update) {
    const auto f = [&](auto& x) { update(x[0], x[1], x[2], x[3]); };
    for (const auto& got : {on_values<float>(f, in), on_values<double>(f, in), on_values<vecf>(f, in)}) {
      CHECK(mismatches64(got[0], ref.w) == 0);
      CHECK(mismatches64(got[2], ref.m) == 0);
      std::size_t bad_v = 0;
      for (std::size_t i = 0; i < 37; ++i) bad_v += !WithinRel(ref.v[i], adam_v_rel).match(got[3][i]);
      CHECK(bad_v == 0);
    }
  };
  if (decoupled)
    check(ops::adam_update<true>(lr, beta1, beta2, eps, weight_decay, 3));
  else
    check(ops::adam_update<false>(lr, beta1, beta2, eps, weight_decay, 3));
}

TEST_CASE("optim: ops::clip_scale and ops::grad_fold", "[optim]") {
  namespace ops = solder::ops;
  using vecf = solder::eval::cpu::vec<float>;
  const ops::clip_scale clip(1.0f, 4.0);
  CHECK(clip.scales());
  CHECK(clip.coefficient == 1.0 / (4.0 + 1e-6));
  CHECK(clip.scale == float(1.0 / (4.0 + 1e-6)));
  CHECK_FALSE(ops::clip_scale(10.0f, 4.0).scales());
  CHECK(ops::clip_scale(1.0f, double(qnan)).scales());  // a NaN coefficient scales, as torch's clamp passes it on
  CHECK(ops::clip_scale(1.0f, double(infty)).scale == 0.0f);
  const slots in = random_slots(91);
  const auto scaled = on_values<vecf>([&](auto& x) { clip(x[1]); }, in);
  for (std::size_t i = 0; i < 37; ++i) CHECK(float(scaled[1][i]) == in[1][i] * clip.scale);

  // acc = g, acc + g, (acc + g) / N: the first fold never reads acc (NaN there stays unread)
  float acc = qnan;
  ops::grad_fold{3.0f, true, false}(acc, -0.0f);
  CHECK(std::signbit(acc));  // g itself, -0 kept (0 + -0 would give +0)
  acc = 1.5f;
  ops::grad_fold{3.0f, false, false}(acc, 2.0f);
  CHECK(acc == 3.5f);
  ops::grad_fold{3.0f, false, true}(acc, 2.5f);
  CHECK(acc == 2.0f);
  const auto folded = on_values<vecf>([](auto& x) { ops::grad_fold{4.0f, false, true}(x[0], x[1]); }, in);
  for (std::size_t i = 0; i < 37; ++i) CHECK(float(folded[0][i]) == (in[0][i] + in[1][i]) / 4.0f);
}
