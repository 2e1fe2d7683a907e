// tests/nn/loss.test.cpp: softmax_cross_entropy, mse, bce_with_logits and accuracy against
// double references written here from PyTorch's definitions: loss values and gradients, label
// smoothing, large logits, class counts with vector tails (3, 10, 37), batch 1, static and
// dynamic batches, finite differences of the loss-only forms, fixed known values, NaN and
// +-inf, results independent of the thread count, and the errors for bad input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/nn/loss.hpp"
#include "support/data.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

/// Float's unit roundoff. Summing n floats errs by at most (n - 1) u sum|x_i| in any order
/// (Higham 4.2); float exp and log add a few u, and x - max rounds with error u |x - max|.
constexpr double u = 0x1p-24;
/// Units of roundoff per row a softmax costs beyond its sum of C terms: exp (xsimd: <= 2 ulp),
/// log, the reciprocal of the sum and the products of the gradient.
constexpr double softmax_extra_u = 8;
/// The elementwise losses sum each 1024-element block in float vectors, at most 1024 / 8 = 128
/// terms per lane (AVX2), then across lanes: (128 + 8) u relative to the sum of |terms|.
constexpr double flat_sum_u = 136;
/// Finite differences of the float loss: step, and the error allowed. Truncation h^2 |f'''| / 6
/// < 2e-5 for these losses with |f'''| <= 1; the loss's float rounding (~1e-6 at most here)
/// over 2h adds 5e-5.
constexpr double fd_h = 1e-2;
constexpr double fd_tol = 1e-4;

std::vector<std::int32_t> random_labels(std::size_t rows, std::size_t classes, std::uint32_t seed) {
  std::vector<std::int32_t> y(rows);
  solder::test::fill_integers(y, 0, int(classes) - 1, seed);
  return y;
}

/// torch.nn.CrossEntropyLoss(label_smoothing=eps) in double: per row the target distribution
/// q = (1 - eps) onehot(y) + eps / C, loss = -sum_j q_j log softmax(x)_j, mean over rows; the
/// gradient of the mean is (softmax(x) - q) / B. `bound` is the error float arithmetic may
/// make in the mean loss, `gbound` in each gradient element.
struct ce_reference {
  double loss = 0, bound = 0, gbound = 0;
  std::vector<double> grad;
};

ce_reference ce_ref(const float* x, std::size_t rows, std::size_t classes, const std::vector<std::int32_t>& y,
                    double eps) {
  ce_reference r;
  r.grad.resize(rows * classes);
  double worst_gap = 0;
  for (std::size_t i = 0; i < rows; ++i) {
    const float* xi = x + i * classes;
    double m = -INFINITY;
    for (std::size_t j = 0; j < classes; ++j) m = std::max(m, double(xi[j]));
    double s = 0;
    for (std::size_t j = 0; j < classes; ++j) s += std::exp(double(xi[j]) - m);
    const double log_s = std::log(s);
    double row = 0, row_scale = 0;
    for (std::size_t j = 0; j < classes; ++j) {
      const double logp = double(xi[j]) - m - log_s;
      const double q = (j == std::size_t(y[i]) ? 1 - eps : 0.0) + eps / double(classes);
      if (q != 0) {  // a class without target weight adds nothing, even at logit -inf
        row -= q * logp;
        row_scale += q * (m - double(xi[j]));
      }
      if (std::isfinite(xi[j])) worst_gap = std::max(worst_gap, m - double(xi[j]));
      r.grad[i * classes + j] = (std::exp(logp) - q) / double(rows);
    }
    r.loss += row;
    r.bound += (double(classes) + softmax_extra_u) * u * (log_s + row_scale + 1);
  }
  r.loss /= double(rows);
  r.bound /= double(rows);
  // p_j = exp(-(m - x_j)) / s: the rounded gap errs by u (m - x_j), relative, in p_j.
  r.gbound = (worst_gap + double(classes) + softmax_extra_u) * u / double(rows);
  return r;
}

/// Counts gradient elements outside the bound (and reports the first).
std::size_t grad_mismatches(const float* got, const std::vector<double>& want, double bound) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(double(got[i]) - want[i]) <= bound)) {
      if (!bad) UNSCOPED_INFO("first gradient mismatch at " << i << ": " << got[i] << " vs " << want[i]);
      ++bad;
    }
  }
  return bad;
}

/// softmax_cross_entropy on shape S (batch rows for a dynamic S) with logits in [lo, hi).
template <class S>
void check_cross_entropy(std::size_t batch, double lo, double hi, float eps, std::uint32_t seed) {
  constexpr std::size_t C = S::last;
  auto x = make<S>(batch), g = make<S>(batch);
  const std::size_t rows = x.size() / C;
  solder::test::fill_uniform(x, lo, hi, seed);
  const auto y = random_labels(rows, C, seed + 1);
  INFO("shape " << solder::to_string<S>(batch) << ", logits in [" << lo << ", " << hi << "), eps = " << eps);

  const float loss = solder::nn::softmax_cross_entropy(x, y, g, eps);
  const ce_reference want = ce_ref(x.data(), rows, C, y, eps);
  CHECK_THAT(loss, WithinAbs(want.loss, want.bound));
  CHECK(grad_mismatches(g.data(), want.grad, want.gbound) == 0);
  // The loss-only form computes the same loss, bit for bit.
  const float eval = solder::nn::softmax_cross_entropy(x, y, eps);
  CHECK(std::memcmp(&eval, &loss, sizeof(float)) == 0);
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("loss: softmax_cross_entropy matches the double reference, static shapes", "[loss]",
                       ((int B, int C), B, C), (1, 3), (4, 10), (3, 37), (17, 16), (5, 1), (2, 130)) {
  using S = shape<B, C>;
  const float eps = GENERATE(0.0f, 0.1f, 1.0f);
  check_cross_entropy<S>(1, -5, 5, eps, 101);
}

TEMPLATE_TEST_CASE_SIG("loss: softmax_cross_entropy matches the double reference, dynamic batch", "[loss]",
                       ((int C), C), (3), (10), (37)) {
  using S = shape<dyn, C>;
  const std::size_t batch = GENERATE(1, 3, 64);
  const float eps = GENERATE(0.0f, 0.25f);
  check_cross_entropy<S>(batch, -8, 8, eps, 111);
}

TEST_CASE("loss: softmax_cross_entropy is stable for large logits", "[loss]") {
  // Logits near +-1000 overflow a naive exp; the loss must still be the double reference's.
  const float eps = GENERATE(0.0f, 0.1f);
  check_cross_entropy<shape<6, 10>>(1, 995, 1005, eps, 121);
  check_cross_entropy<shape<6, 10>>(1, -1005, -995, eps, 122);
  check_cross_entropy<shape<dyn, 37>>(5, -1000, 1000, eps, 123);

  // Known values: a confident right answer costs ~0, a confident wrong one the logit gap.
  tensor<float, shape<2, 3>> x, g;
  const float rows[6] = {1000, 0, -1000, 1000, 0, -1000};
  std::copy(rows, rows + 6, x.begin());
  const std::vector<std::int32_t> y = {0, 2};
  const float loss = solder::nn::softmax_cross_entropy(x, y, g);
  CHECK_THAT(loss, WithinRel(2000.0 / 2, 1e-6));  // (0 + 2000) / 2, the right row's e^-1000 term is lost
  CHECK_THAT(g(0, 0), WithinAbs(0.0, 1e-30));
  CHECK_THAT(g(1, 0), WithinAbs(0.5, u));  // (p = 1 - 0) / B
  CHECK_THAT(g(1, 2), WithinAbs(-0.5, u));  // (p = 0 - 1) / B
}

TEST_CASE("loss: cross-entropy of equal logits is log C, with or without smoothing", "[loss]") {
  constexpr std::size_t C = 37;
  tensor<float, shape<dyn, C>> x(5), g(5);
  const float level = GENERATE(0.0f, -3.5f, 250.0f);
  const float eps = GENERATE(0.0f, 0.3f);
  x.fill(level);
  const auto y = random_labels(5, C, 131);
  const float loss = solder::nn::softmax_cross_entropy(x, y, g, eps);
  CHECK_THAT(loss, WithinRel(std::log(double(C)), 4 * u));
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      const double q = (j == std::size_t(y[i]) ? 1.0 - eps : 0.0) + eps / double(C);
      CHECK_THAT(g(i, j), WithinAbs((1.0 / C - q) / 5, 4 * u / 5));
    }
}

TEST_CASE("loss: softmax_cross_entropy's gradient is the finite difference of its loss", "[loss]") {
  using S = shape<3, 5>;
  tensor<float, S> x, g;
  solder::test::fill_uniform(x, -2, 2, 141);
  const std::vector<std::int32_t> y = {4, 0, 2};
  const float eps = GENERATE(0.0f, 0.2f);
  solder::nn::softmax_cross_entropy(x, y, g, eps);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = float(saved + fd_h);
    const double up = solder::nn::softmax_cross_entropy(x, y, eps);
    x[i] = float(saved - fd_h);
    const double down = solder::nn::softmax_cross_entropy(x, y, eps);
    x[i] = saved;
    const double step = double(float(saved + fd_h)) - double(float(saved - fd_h));
    INFO("element " << i);
    CHECK_THAT(g[i], WithinAbs((up - down) / step, fd_tol));
  }
}

TEST_CASE("loss: static and dynamic shapes and views give the same bits", "[loss]") {
  constexpr std::size_t B = 7, C = 10;
  tensor<float, shape<B, C>> xs, gs;
  tensor<float, shape<dyn, C>> xd(B), gd(B);
  solder::test::fill_uniform(xs, -4, 4, 151);
  std::copy(xs.begin(), xs.end(), xd.begin());
  const auto y = random_labels(B, C, 152);
  const float ls = solder::nn::softmax_cross_entropy(xs, y, gs, 0.1f);
  // Views, const and not, in place of tensors.
  const tensor_ref<const float, shape<dyn, C>> xv = xd.ref();
  const float ld = solder::nn::softmax_cross_entropy(xv, y, gd.ref(), 0.1f);
  CHECK(std::memcmp(&ls, &ld, sizeof(float)) == 0);
  CHECK(std::memcmp(gs.data(), gd.data(), B * C * sizeof(float)) == 0);
}

TEST_CASE("loss: NaN and infinite logits follow PyTorch", "[loss]") {
  constexpr std::size_t C = 10;
  tensor<float, shape<dyn, C>> x(3), g(3);
  solder::test::fill_uniform(x, -2, 2, 161);
  const std::vector<std::int32_t> y = {1, 2, 3};

  SECTION("NaN makes its row's loss and gradient NaN, and the mean NaN") {
    x(1, 7) = qnan;
    CHECK(std::isnan(solder::nn::softmax_cross_entropy(x, y, g)));
    for (std::size_t j = 0; j < C; ++j) {
      CHECK(std::isnan(g(1, j)));
      CHECK(std::isfinite(g(0, j)));
      CHECK(std::isfinite(g(2, j)));
    }
  }
  SECTION("+inf gives NaN, as log_softmax does") {
    x(0, 0) = infty;
    CHECK(std::isnan(solder::nn::softmax_cross_entropy(x, y)));
  }
  SECTION("-inf masks a class: finite loss unless smoothing or the label weights it") {
    x(0, 5) = -infty;
    x(2, 9) = -infty;
    const float loss = solder::nn::softmax_cross_entropy(x, y, g);
    const ce_reference want = ce_ref(x.data(), 3, C, y, 0.0);
    CHECK(std::isfinite(loss));
    CHECK_THAT(loss, WithinAbs(want.loss, want.bound));
    CHECK(g(0, 5) == 0.0f);
    CHECK(grad_mismatches(g.data(), want.grad, want.gbound) == 0);
    CHECK(solder::nn::softmax_cross_entropy(x, y, 0.1f) == infty);  // eps / C weight on -inf
    x(1, 2) = -infty;                                                // row 1's label
    CHECK(solder::nn::softmax_cross_entropy(x, y) == infty);
  }
}

TEST_CASE("loss: softmax_cross_entropy is bitwise the same for any thread count", "[loss]") {
  // 8192 x 10 = 81920 elements: above the threshold where rows are spread over threads.
  constexpr std::size_t B = 8192, C = 10;
  tensor<float, shape<dyn, C>> x(B), g1(B), g2(B);
  solder::test::fill_uniform(x, -6, 6, 171);
  const auto y = random_labels(B, C, 172);
  const int saved = solder::num_threads();
  solder::set_num_threads(1);
  const float l1 = solder::nn::softmax_cross_entropy(x, y, g1, 0.1f);
  solder::set_num_threads(3);
  const float l3 = solder::nn::softmax_cross_entropy(x, y, g2, 0.1f);
  solder::set_num_threads(saved);
  CHECK(std::memcmp(&l1, &l3, sizeof(float)) == 0);
  CHECK(std::memcmp(g1.data(), g2.data(), B * C * sizeof(float)) == 0);
  const ce_reference want = ce_ref(x.data(), B, C, y, 0.1);
  CHECK_THAT(l1, WithinAbs(want.loss, want.bound));
  CHECK(grad_mismatches(g1.data(), want.grad, want.gbound) == 0);
}

TEST_CASE("loss: softmax_cross_entropy rejects bad labels and smoothing", "[loss]") {
  tensor<float, shape<dyn, 10>> x(4), g(4), g5(5);
  std::vector<std::int32_t> y = {0, 1, 2, 3};
  SECTION("a label out of range, named with its row") {
    y[3] = 12;
    g.fill(7.0f);
    CHECK_THROWS_WITH(solder::nn::softmax_cross_entropy(x, y, g),
                      "solder::nn::softmax_cross_entropy: label 12 of row 3 is outside [0, 10)");
    CHECK(g(0, 0) == 7.0f);  // checked before anything is written
    y[3] = -1;
    CHECK_THROWS_WITH(solder::nn::softmax_cross_entropy(x, y),
                      "solder::nn::softmax_cross_entropy: label -1 of row 3 is outside [0, 10)");
  }
  SECTION("a label count that is not the batch") {
    y.pop_back();
    CHECK_THROWS_WITH(solder::nn::softmax_cross_entropy(x, y, g),
                      "solder::nn::softmax_cross_entropy: got 3 labels for a batch of 4 rows; give one label per row");
  }
  SECTION("label smoothing outside [0, 1]") {
    CHECK_THROWS_WITH(solder::nn::softmax_cross_entropy(x, y, g, 1.5f),
                      Contains("label_smoothing must be in [0, 1], got 1.5"));
    CHECK_THROWS_WITH(solder::nn::softmax_cross_entropy(x, y, g, -0.1f), Contains("label_smoothing must be in [0, 1]"));
    CHECK_THROWS_AS(solder::nn::softmax_cross_entropy(x, y, g, qnan), solder::error);
  }
  SECTION("dlogits with another batch") {
    CHECK_THROWS_WITH(solder::nn::softmax_cross_entropy(x, y, g5),
                      "solder::nn::softmax_cross_entropy: dlogits has a batch of 5 rows but the input has 4");
  }
}

// ---- mse ------------------------------------------------------------------------------

namespace {

/// mse (torch.nn.MSELoss) in double: mean (x - t)^2 and its gradient 2 (x - t) / n.
template <class S>
void check_mse(std::size_t batch, std::uint32_t seed) {
  auto x = make<S>(batch), t = make<S>(batch), g = make<S>(batch);
  solder::test::fill_uniform(x, -3, 3, seed);
  solder::test::fill_uniform(t, -1, 1, seed + 1);
  const std::size_t n = x.size();
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += (double(x[i]) - t[i]) * (double(x[i]) - t[i]);
  INFO("shape " << solder::to_string<S>(batch));
  const float loss = solder::nn::mse(x, t, g);
  CHECK_THAT(loss, WithinRel(sum / double(n), flat_sum_u * u));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = 2 * (double(x[i]) - t[i]) / double(n);
    bad += !WithinRel(want, 4 * u).match(g[i]);  // x - t, 2 (x - t), times 1/n in float: 3 roundings
  }
  CHECK(bad == 0);
  CHECK(solder::nn::mse(x, t) == loss);
}

}  // namespace

TEST_CASE("loss: mse matches the double reference", "[loss]") {
  check_mse<shape<1, 1>>(1, 201);
  check_mse<shape<3, 37>>(1, 202);
  check_mse<shape<257>>(1, 203);
  check_mse<shape<dyn, 10>>(1, 204);
  check_mse<shape<dyn, 10>>(333, 205);      // several 1024-element blocks and a tail
  check_mse<shape<dyn, 4, 5>>(2, 206);      // any rank
  check_mse<shape<dyn, 1000>>(100, 207);    // 100000 elements: spread over threads
}

TEST_CASE("loss: mse known values, finite differences and NaN", "[loss]") {
  tensor<float, shape<2, 3>> x, t, g;
  solder::test::fill_uniform(t, -1, 1, 211);
  for (std::size_t i = 0; i < 6; ++i) x[i] = t[i] + (i % 2 ? 2.0f : -2.0f);
  CHECK_THAT(solder::nn::mse(x, t, g), WithinRel(4.0, 2 * u));
  for (std::size_t i = 0; i < 6; ++i) CHECK_THAT(g[i], WithinRel((i % 2 ? 4.0 : -4.0) / 6, 4 * u));

  solder::test::fill_uniform(x, -1, 1, 212);
  solder::nn::mse(x, t, g);
  for (std::size_t i = 0; i < 6; ++i) {
    const float saved = x[i];
    x[i] = float(saved + fd_h);
    const double up = solder::nn::mse(x, t);
    x[i] = float(saved - fd_h);
    const double down = solder::nn::mse(x, t);
    x[i] = saved;
    CHECK_THAT(g[i], WithinAbs((up - down) / (double(float(saved + fd_h)) - double(float(saved - fd_h))), fd_tol));
  }
  x[4] = qnan;
  CHECK(std::isnan(solder::nn::mse(x, t, g)));
  CHECK(std::isnan(g[4]));
  CHECK(std::isfinite(g[3]));
}

TEST_CASE("loss: mse rejects a batch mismatch", "[loss]") {
  tensor<float, shape<dyn, 10>> x(4), t(3), g(4), g2(2);
  CHECK_THROWS_WITH(solder::nn::mse(x, t, g), "solder::nn::mse: the target has a batch of 3 rows but the input has 4");
  CHECK_THROWS_WITH(solder::nn::mse(x, x, g2), "solder::nn::mse: the gradient has a batch of 2 rows but the input has 4");
}

// ---- bce_with_logits -----------------------------------------------------------------

namespace {

/// torch.nn.BCEWithLogitsLoss in double: mean of -(t log s(x) + (1 - t) log(1 - s(x))),
/// written with log1p so that it stays exact for large |x|; gradient (s(x) - t) / n.
double bce_elem(double x, double t) {
  const double log_s = -std::log1p(std::exp(-std::fabs(x))) + std::min(x, 0.0);    // log sigmoid(x)
  const double log_1ms = -std::log1p(std::exp(-std::fabs(x))) - std::max(x, 0.0);  // log sigmoid(-x)
  return -(t * log_s + (1 - t) * log_1ms);
}
double sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

template <class S>
void check_bce(std::size_t batch, double lo, double hi, std::uint32_t seed) {
  auto x = make<S>(batch), t = make<S>(batch), g = make<S>(batch);
  solder::test::fill_uniform(x, lo, hi, seed);
  solder::test::fill_uniform(t, 0, 1, seed + 1);
  const std::size_t n = x.size();
  double sum = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sum += bce_elem(x[i], t[i]);
    // The float formula max(x, 0) - x t + log1p(e^-|x|) errs relative to its parts' sizes.
    scale += std::max(double(x[i]), 0.0) + std::fabs(double(x[i]) * t[i]) + std::log1p(std::exp(-std::fabs(x[i])));
  }
  INFO("shape " << solder::to_string<S>(batch) << ", logits in [" << lo << ", " << hi << ")");
  const float loss = solder::nn::bce_with_logits(x, t, g);
  CHECK_THAT(loss, WithinAbs(sum / double(n), (flat_sum_u + 8) * u * scale / double(n)));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double s = sigmoid(x[i]);
    // s(x) from exp, a reciprocal and a product (~5 u), minus t, times 1/n.
    bad += !WithinAbs((s - t[i]) / double(n), 8 * u * (s + t[i]) / double(n)).match(g[i]);
  }
  CHECK(bad == 0);
  CHECK(solder::nn::bce_with_logits(x, t) == loss);
}

}  // namespace

TEST_CASE("loss: bce_with_logits matches the double reference", "[loss]") {
  check_bce<shape<1, 1>>(1, -4, 4, 301);
  check_bce<shape<3, 37>>(1, -4, 4, 302);
  check_bce<shape<dyn, 17>>(129, -6, 6, 303);
  check_bce<shape<dyn, 1000>>(70, -6, 6, 304);  // spread over threads
  check_bce<shape<5, 10>>(1, 80, 120, 305);      // large logits: no overflow
  check_bce<shape<5, 10>>(1, -1e4, 1e4, 306);
}

TEST_CASE("loss: bce_with_logits known values, finite differences and NaN", "[loss]") {
  tensor<float, shape<4>> x, t, g;
  // x = 0: log 2 whatever the target; gradient (1/2 - t) / 4.
  const float ts[4] = {0.0f, 1.0f, 0.5f, 0.25f};
  std::copy(ts, ts + 4, t.begin());
  CHECK_THAT(solder::nn::bce_with_logits(x, t, g), WithinRel(std::log(2.0), 4 * u));
  for (std::size_t i = 0; i < 4; ++i) CHECK_THAT(g[i], WithinAbs((0.5 - ts[i]) / 4, u));
  // +-100 with the wrong target costs 100; with the right one, e^-100.
  const float xs[4] = {100.0f, -100.0f, 100.0f, -100.0f};
  const float ts2[4] = {0.0f, 1.0f, 1.0f, 0.0f};
  std::copy(xs, xs + 4, x.begin());
  std::copy(ts2, ts2 + 4, t.begin());
  CHECK_THAT(solder::nn::bce_with_logits(x, t, g), WithinRel(200.0 / 4, 4 * u));
  CHECK_THAT(g[0], WithinRel(0.25, u));
  CHECK_THAT(g[1], WithinRel(-0.25, u));
  CHECK_THAT(g[2], WithinAbs(0.0, 1e-40));

  solder::test::fill_uniform(x, -3, 3, 311);
  solder::test::fill_uniform(t, 0, 1, 312);
  solder::nn::bce_with_logits(x, t, g);
  for (std::size_t i = 0; i < 4; ++i) {
    const float saved = x[i];
    x[i] = float(saved + fd_h);
    const double up = solder::nn::bce_with_logits(x, t);
    x[i] = float(saved - fd_h);
    const double down = solder::nn::bce_with_logits(x, t);
    x[i] = saved;
    CHECK_THAT(g[i], WithinAbs((up - down) / (double(float(saved + fd_h)) - double(float(saved - fd_h))), fd_tol));
  }
  x[2] = qnan;
  CHECK(std::isnan(solder::nn::bce_with_logits(x, t, g)));
  CHECK(std::isnan(g[2]));
  CHECK(std::isfinite(g[1]));
}

// ---- accuracy ------------------------------------------------------------------------

TEST_CASE("loss: accuracy against an argmax loop, ties and NaN", "[loss]") {
  constexpr std::size_t C = 37;
  tensor<float, shape<dyn, C>> x(50);
  solder::test::fill_integers(x, -3, 3, 401);  // small integers: many ties
  const auto y = random_labels(50, C, 402);
  std::size_t correct = 0;
  for (std::size_t i = 0; i < 50; ++i) {
    std::size_t best = 0;  // first index of the largest value
    for (std::size_t j = 0; j < C; ++j)
      if (x(i, j) > x(i, best)) best = j;
    correct += best == std::size_t(y[i]);
  }
  CHECK(solder::nn::accuracy(x, y) == float(double(correct) / 50));

  tensor<float, shape<4, 3>> k;
  const float v[12] = {1, 1, 0,  // tie: index 0
                       0, 2, 2,  // tie: index 1
                       0, qnan, 5,  // NaN counts as the largest: index 1
                       -infty, -infty, -infty};  // all equal: index 0
  std::copy(v, v + 12, k.begin());
  CHECK(solder::nn::accuracy(k, std::vector<std::int32_t>{0, 1, 1, 0}) == 1.0f);
  CHECK(solder::nn::accuracy(k, std::vector<std::int32_t>{1, 2, 2, 0}) == 0.25f);
  CHECK_THROWS_WITH(solder::nn::accuracy(k, std::vector<std::int32_t>{0, 1, 3, 0}),
                    "solder::nn::accuracy: label 3 of row 2 is outside [0, 3)");
}
