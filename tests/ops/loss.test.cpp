// tests/ops/loss.test.cpp: the losses of ops/loss.hpp on single rows: softmax_cross_entropy
// (with label smoothing) and the elementwise mse and bce_with_logits summed by
// elementwise_loss_sum, run by the scalar walker on float and double and by the CPU's vector
// walker (executor<cpu>::row<N> and row<dyn>) against PyTorch's formulas in long double: row
// lengths 1, 3, 17, 37 and 300, labels in the first column and in the vector tail, logits near
// +-1000, -inf (masking), NaN and +inf; and the elementwise terms on scalars and vectors.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/walkers.hpp"
#include "solder/assign.hpp"
#include "solder/ops/loss.hpp"
#include "support/data.hpp"

namespace {

using solder::test::on_every_walker;
using solder::test::unit;

using solder::dyn;
using exec = solder::executor<solder::cpu>;
template <class T>
using scalar_row = solder::test::scalar_row<T>;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double qnan = std::numeric_limits<double>::quiet_NaN();

/// Roundoff allowed beyond a sum of n terms (n u in any order, Higham 4.2), in units u: exp
/// and log (xsimd within 2 ulp), the reciprocal of the sum, the gradient's products; float
/// vector sums err by about 20 u of their terms.
template <class T>
double units(std::size_t n) {
  return double(n) + (std::is_same_v<T, float> ? 24.0 : 8.0);
}
/// The gradient's scale: 1 / B for a batch of 4 rows.
constexpr double scale = 0.25;

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

template <std::size_t N>
std::vector<double> uniform_row(double lo, double hi, std::uint32_t seed) {
  std::vector<float> x(N);
  solder::test::fill_uniform(x, lo, hi, seed);
  return {x.begin(), x.end()};
}

/// The op for label smoothing eps over N classes, with the gradient scaled by `scale`.
solder::ops::softmax_cross_entropy ce_op(double eps, std::size_t n) {
  return {float(1 - eps), float(eps / double(n)), float(scale)};
}

/// torch.nn.CrossEntropyLoss(label_smoothing=eps) of one row in long double: the loss
/// -sum_j q_j log softmax(x)_j, q = keep onehot(y) + spread, and its gradient (softmax(x) - q)
/// * scale; with the error bounds of float or double arithmetic. The loss is taken as
/// log s + sum_j q_j (m - x_j), which is the same for weights summing to 1: the op's float
/// weights (keep, spread) do so only to float rounding, and the op, like torch, treats them as
/// if they did.
struct ce_reference {
  long double loss = 0;
  double bound = 0, gbound = 0;
  std::vector<long double> grad;
};
template <class T>
ce_reference ce_ref(const std::vector<double>& x, std::size_t y, const solder::ops::softmax_cross_entropy& op) {
  const std::size_t n = x.size();
  ce_reference r;
  r.grad.resize(n);
  long double m = -INFINITY;
  for (double v : x) m = std::max(m, (long double)v);
  long double s = 0;
  for (double v : x) s += std::exp(v - m);
  const long double log_s = std::log(s);
  double row_scale = 0, worst_gap = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const long double logp = x[j] - m - log_s;
    const long double q = (j == y ? (long double)op.keep : 0.0L) + op.spread;
    if (q != 0) {  // a class without target weight adds nothing, even at logit -inf
      r.loss += q * (m - x[j]);
      row_scale += double(q * (m - x[j]));
    }
    if (std::isfinite(x[j])) worst_gap = std::max(worst_gap, double(m - x[j]));
    r.grad[j] = (std::exp(logp) - q) * op.scale;
  }
  r.loss += log_s;
  r.bound = units<T>(n) * unit<T> * (double(log_s) + row_scale + 1);
  // p_j = exp(-(m - x_j)) / s: the rounded gap errs by u (m - x_j), relative, in p_j.
  r.gbound = (worst_gap + units<T>(n)) * unit<T> * op.scale;
  return r;
}

// The op calls, flattened as the loss entry points' are (nn/loss.hpp): the tests run the code
// the losses run, with exp and log1p inlined whatever the size of this translation unit.
template <bool Grad, class R, class T>
[[gnu::flatten, gnu::noinline, gnu::noclone]] double run_ce(const solder::ops::softmax_cross_entropy& op, const R& r,
                                                            const T* x, std::size_t y, T* g) {
  return op.row<Grad>(r, x, y, g);
}
template <bool Grad, class Op, class R, class T>
[[gnu::flatten, gnu::noinline, gnu::noclone]] double run_elementwise(const R& r, const T* x, const T* t, T* g) {
  return solder::ops::elementwise_loss_sum<Grad>(Op{}, r, x, t, g, T(scale));
}

/// The row's loss and gradient through walker r, as doubles; the loss-only form must give the
/// same loss bits (a NaN only the same NaN-ness: its sign depends on the instructions chosen).
template <class R, class T>
double ce_row(const R& r, T, const solder::ops::softmax_cross_entropy& op, const std::vector<double>& x, std::size_t y,
              std::vector<double>& g) {
  const std::vector<T> xt = as<T>(x);
  std::vector<T> gt(x.size());
  const double loss = run_ce<true>(op, r, xt.data(), y, gt.data());
  const double eval = run_ce<false>(op, r, xt.data(), y, (T*)nullptr);
  if (std::isnan(loss))
    CHECK(std::isnan(eval));
  else
    CHECK(std::memcmp(&loss, &eval, sizeof loss) == 0);
  g.assign(gt.begin(), gt.end());
  return loss;
}

template <std::size_t N>
void check_ce(const std::vector<double>& x) {
  for (const std::size_t y : {std::size_t(0), N / 2, N - 1}) {
    for (const double eps : {0.0, 0.1, 1.0}) {
      INFO("label " << y << ", label_smoothing " << eps);
      const auto op = ce_op(eps, N);
      on_every_walker<N>([&]<class R, class T>(const R& r, T t) {
        const ce_reference want = ce_ref<T>(x, y, op);
        std::vector<double> g;
        const double loss = ce_row(r, t, op, x, y, g);
        CHECK_THAT(loss, Catch::Matchers::WithinAbs(double(want.loss), want.bound));
        for (std::size_t j = 0; j < N; ++j) CHECK_THAT(g[j], Catch::Matchers::WithinAbs(double(want.grad[j]), want.gbound));
      });
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("ops::softmax_cross_entropy: rows against the long double reference on every walker",
                       "[ops][loss]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  SECTION("uniform logits") { check_ce<N>(uniform_row<N>(-8, 8, 11)); }
  SECTION("logits near +1000 and -1000") {
    check_ce<N>(uniform_row<N>(995, 1005, 12));
    check_ce<N>(uniform_row<N>(-1005, -995, 13));
  }
  SECTION("equal logits cost log N") { check_ce<N>(std::vector<double>(N, 250.0)); }
}

TEMPLATE_TEST_CASE_SIG("ops::softmax_cross_entropy: -inf masks a class; NaN and +inf make the row NaN", "[ops][loss]",
                       ((std::size_t N), N), (3), (17), (37), (300)) {
  on_every_walker<N>([&]<class R, class T>(const R& r, T t) {
    std::vector<double> x = uniform_row<N>(-2, 2, 21), g;
    x[N - 1] = -inf;  // in the vector tail
    // Label elsewhere, no smoothing: finite, and the masked class gets gradient 0.
    const double finite = ce_row(r, t, ce_op(0, N), x, 0, g);
    CHECK(std::isfinite(finite));
    CHECK(g[N - 1] == 0.0);
    const ce_reference want = ce_ref<T>(x, 0, ce_op(0, N));
    CHECK_THAT(finite, Catch::Matchers::WithinAbs(double(want.loss), want.bound));
    // Smoothing puts weight on every class, the label on its own: an infinite loss.
    CHECK(ce_row(r, t, ce_op(0.1, N), x, 0, g) == inf);
    CHECK(ce_row(r, t, ce_op(0, N), x, N - 1, g) == inf);

    for (const double bad : {qnan, inf}) {
      for (const std::size_t at : {std::size_t(0), N - 1}) {
        std::vector<double> xb = uniform_row<N>(-2, 2, 22);
        xb[at] = bad;
        INFO("x[" << at << "] = " << bad);
        CHECK(std::isnan(ce_row(r, t, ce_op(0.1, N), xb, 1, g)));
        CHECK(std::all_of(g.begin(), g.end(), [](double v) { return std::isnan(v); }));
      }
    }
  });
}

TEMPLATE_TEST_CASE_SIG("ops::softmax_cross_entropy: the vector walker gives the same bits with a static and a dynamic length",
                       "[ops][loss]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  const std::vector<double> x = uniform_row<N>(-6, 6, 31);
  std::vector<double> g1, g2;
  const auto op = ce_op(0.1, N);
  const double l1 = ce_row(exec::row<N>{}, 0.0f, op, x, N - 1, g1);
  const double l2 = ce_row(exec::row<dyn>(N), 0.0f, op, x, N - 1, g2);
  CHECK(std::memcmp(&l1, &l2, sizeof l1) == 0);
  CHECK(std::memcmp(g1.data(), g2.data(), N * sizeof(double)) == 0);
}

// ---- mse and bce_with_logits ------------------------------------------------------------

namespace {

/// (x - t)^2 and 2 (x - t), torch.nn.MSELoss's term.
long double mse_ref(long double x, long double t) { return (x - t) * (x - t); }
long double mse_slope(long double x, long double t) { return 2 * (x - t); }
/// -(t log s(x) + (1 - t) log(1 - s(x))), torch.nn.BCEWithLogitsLoss's term, written with
/// log1p so that it stays exact for large |x|; and its slope s(x) - t.
long double bce_ref(long double x, long double t) {
  const long double lp = std::log1p(std::exp(-std::fabs(x)));
  return -(t * (std::min(x, 0.0L) - lp) + (1 - t) * (-std::max(x, 0.0L) - lp));
}
long double sigmoid(long double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }
long double bce_slope(long double x, long double t) { return sigmoid(x) - t; }

/// elementwise_loss_sum of Op on a row of n elements (x in [lo, hi), targets t in [tlo, thi))
/// through walker r: the sum and each scaled slope against the references, and the loss-only
/// form's sum bit for bit.
template <class Op, class R, class T, class Ref, class Slope>
void check_elementwise(const R& r, T, std::size_t n, double lo, double hi, double tlo, double thi, Ref ref, Slope slope) {
  std::vector<float> xf(n), tf(n);
  solder::test::fill_uniform(xf, lo, hi, 41);
  solder::test::fill_uniform(tf, tlo, thi, 42);
  const std::vector<T> x(xf.begin(), xf.end()), t(tf.begin(), tf.end());
  std::vector<T> g(n);
  const double sum = run_elementwise<true, Op>(r, x.data(), t.data(), g.data());
  const double eval = run_elementwise<false, Op>(r, x.data(), t.data(), (T*)nullptr);
  CHECK(std::memcmp(&sum, &eval, sizeof sum) == 0);
  long double want = 0;
  double magnitude = 0;  // what the terms err relative to: each term and its parts (|x|, |x t|, 1)
  for (std::size_t i = 0; i < n; ++i) {
    const long double term = ref((long double)x[i], (long double)t[i]);
    want += term;
    magnitude += double(std::fabs(term)) + std::fabs(double(x[i])) * (1 + std::fabs(double(t[i]))) + 1;
  }
  CHECK_THAT(sum, Catch::Matchers::WithinAbs(double(want), units<T>(n) * unit<T> * magnitude));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const long double s = slope((long double)x[i], (long double)t[i]) * scale;
    // A few roundings (x - t or the sigmoid's exp, reciprocal and product, the scale),
    // relative to the parts of the slope.
    const double bound = 8 * unit<T> * (std::fabs(double(s)) + std::fabs(double(t[i])) * scale + scale * 1e-30);
    bad += !(std::fabs(double(g[i]) - double(s)) <= bound);
  }
  CHECK(bad == 0);
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("ops::mse, ops::bce_with_logits: elementwise_loss_sum against the long double reference on every walker",
                       "[ops][loss]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  on_every_walker<N>([&]<class R, class T>(const R& r, T t) {
    {
      INFO("mse");
      check_elementwise<solder::ops::mse>(r, t, N, -3, 3, -1, 1, mse_ref, mse_slope);
    }
    {
      INFO("bce_with_logits");
      check_elementwise<solder::ops::bce_with_logits>(r, t, N, -6, 6, 0, 1, bce_ref, bce_slope);
      check_elementwise<solder::ops::bce_with_logits>(r, t, N, -1e4, 1e4, 0, 1, bce_ref, bce_slope);  // no overflow
    }
  });
}

TEST_CASE("ops::mse, ops::bce_with_logits: the terms on scalars and vectors, NaN and large logits", "[ops][loss]") {
  using vec = exec::vec;
  const float nanf = std::numeric_limits<float>::quiet_NaN();
  // Scalars and every lane of a vector agree bit for bit with the double formula rounded, to
  // the tolerance of one exp, one log1p and a division.
  for (const float x : {-100.0f, -20.0f, -1.5f, -0.0f, 0.0f, 0.75f, 17.0f, 100.0f, 1e30f, -1e30f}) {
    for (const float t : {0.0f, 0.25f, 1.0f}) {
      INFO("x = " << x << ", t = " << t);
      const auto s = solder::ops::bce_with_logits{}.forward(x, t);
      const auto v = solder::ops::bce_with_logits{}.forward(vec(x), vec(t));
      CHECK_THAT(s.loss, Catch::Matchers::WithinAbs(double(bce_ref(x, t)), 4 * 0x1p-24 * (std::fabs(x) + 1)));
      CHECK_THAT(s.slope, Catch::Matchers::WithinAbs(double(bce_slope(x, t)), 4 * 0x1p-24));
      CHECK_THAT(v.loss.get(0), Catch::Matchers::WithinAbs(double(s.loss), 4 * 0x1p-24 * (std::fabs(x) + 1)));
      CHECK_THAT(v.slope.get(vec::size - 1), Catch::Matchers::WithinAbs(double(s.slope), 4 * 0x1p-24));
      const auto d = solder::ops::mse{}.forward(double(x), double(t));
      CHECK(d.loss == mse_ref(double(x), double(t)));
      CHECK(d.slope == mse_slope(double(x), double(t)));
    }
  }
  const auto bn = solder::ops::bce_with_logits{}.forward(nanf, 0.5f);
  CHECK(std::isnan(bn.loss));
  CHECK(std::isnan(bn.slope));
  const auto bv = solder::ops::bce_with_logits{}.forward(vec(nanf), vec(0.5f));
  CHECK(std::isnan(bv.loss.get(0)));
  CHECK(std::isnan(bv.slope.get(0)));
  const auto mn = solder::ops::mse{}.forward(nanf, 0.5f);
  CHECK(std::isnan(mn.loss));
  CHECK(std::isnan(mn.slope));
}

TEST_CASE("ops losses: traits", "[ops][loss]") {
  STATIC_REQUIRE(solder::ops::mse::flops > 0);
  STATIC_REQUIRE(solder::ops::bce_with_logits::flops > solder::ops::mse::flops);
  STATIC_REQUIRE(solder::ops::softmax_cross_entropy::flops > 0);
}
