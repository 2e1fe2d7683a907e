// tests/ops/layer_norm.test.cpp: ops::layer_norm on single rows (statistics, forward, backward
// with its dweight and dbias partial sums) run by the scalar walker on float and double and by
// the CPU's vector walker (executor<cpu>::row<N> and row<dyn>) against torch's formulas in long
// double: row lengths 1, 3, 17, 37 and 300, rows far from zero mean, constant rows, NaN and
// infinity.
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
#include "solder/ops/layer_norm.hpp"
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
constexpr double eps = 1e-5;

/// Roundoff allowed, in units u, as tests/nn/layer_norm.test.cpp states them. mean_u: x - mean
/// inherits the rounding of mean to T, u |mean| (the layer's inherent error far from 0).
constexpr double mean_u = 2;
/// The rest, relative to the magnitudes involved: float row sums err by about 20 u of their
/// terms (16 per lane in float, then across lanes, then double), a few more for the products;
/// in double (scalar walker) a sum of n terms errs by n u.
template <class T>
double units(std::size_t n) {
  return std::is_same_v<T, float> ? 24.0 : 8.0 + double(n);
}

struct stats {
  long double mean, rstd;
};
/// torch's statistics in long double: the mean and 1 / sqrt(biased variance + eps).
stats reference_stats(const std::vector<double>& x) {
  long double m = 0;
  for (double v : x) m += v;
  m /= x.size();
  long double var = 0;
  for (double v : x) var += (v - m) * (v - m);
  return {m, 1 / std::sqrt(var / x.size() + eps)};
}

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

/// Statistics, forward and backward of one row x through every walker, with weight w, bias b
/// and upstream gradient dy.
template <std::size_t N>
void check_row(const std::vector<double>& x, std::uint32_t seed) {
  std::vector<float> wf(N), bf(N), dyf(N);
  solder::test::fill_uniform(wf, -1.5, 1.5, seed);
  solder::test::fill_uniform(bf, -1, 1, seed + 1);
  solder::test::fill_uniform(dyf, -1, 1, seed + 2);
  const std::vector<double> w(wf.begin(), wf.end()), b(bf.begin(), bf.end()), dy(dyf.begin(), dyf.end());
  const stats st = reference_stats(x);
  on_every_walker<N>([&]<class R, class T>(const R& r, T) {
    const double u = unit<T>, k = units<T>(N);
    const double mean = double(st.mean), rstd = double(st.rstd);
    const std::vector<T> xt = as<T>(x), wt = as<T>(w), bt = as<T>(b), dyt = as<T>(dy);

    // Statistics: the mean to its rounding plus the shift's error relative to the spread, rstd
    // relative to itself.
    const auto got = solder::ops::layer_norm{}.statistics(r, xt.data(), eps);
    CHECK(std::fabs(double(got.mean) - mean) <= u * (mean_u * std::fabs(mean) + k / rstd));
    CHECK(std::fabs(double(got.rstd) - rstd) <= u * k * rstd);

    // Forward: y, and the statistics it returns are those of statistics().
    std::vector<T> y(N);
    const auto fst = solder::ops::layer_norm{}.forward(r, xt.data(), y.data(), wt.data(), bt.data(), eps);
    CHECK(std::memcmp(&fst, &got, sizeof got) == 0);
    for (std::size_t j = 0; j < N; ++j) {
      const long double xhat = (x[j] - st.mean) * st.rstd;
      const double want = double(xhat * w[j] + b[j]);
      const double bound = u * (std::fabs(w[j]) * (mean_u * rstd * std::fabs(mean) + k * (std::fabs(double(xhat)) + 1)) +
                                k * std::fabs(b[j]));
      CHECK(std::fabs(double(y[j]) - want) <= bound);
    }

    // Backward from the reference statistics rounded to T, adding into dw and db that start
    // at 1 and -1 (the caller's partial sums).
    const solder::ops::layer_norm_stats<T> ts{T(st.mean), T(st.rstd)};
    std::vector<T> dx(N), dw(N, T(1)), db(N, T(-1));
    solder::ops::layer_norm{}.backward(r, xt.data(), dyt.data(), wt.data(), ts, dx.data(), dw.data(), db.data());
    const long double m = (long double)ts.mean, rs = (long double)ts.rstd;
    long double mg = 0, mgx = 0, amg = 0, amgx = 0;
    for (std::size_t j = 0; j < N; ++j) {
      const long double xhat = (x[j] - m) * rs, g = (long double)dy[j] * w[j];
      mg += g / N;
      mgx += g * xhat / N;
      amg += std::fabs(g) / N;
      amgx += std::fabs(g * xhat) / N;
    }
    for (std::size_t j = 0; j < N; ++j) {
      const long double xhat = (x[j] - m) * rs, g = (long double)dy[j] * w[j];
      const double want_dx = double(rs * (g - mg - xhat * mgx));
      const double ax = std::fabs(double(xhat));
      const double bound_dx = u * double(rs) *
                              (k * (double(std::fabs(g)) + double(amg) + (ax + 1) * double(amgx)) +
                               mean_u * double(rs) * std::fabs(double(m)) * (double(amgx) + ax * double(amg)));
      CHECK(std::fabs(double(dx[j]) - want_dx) <= bound_dx);
      const double want_dw = double(1 + dy[j] * xhat);
      const double bound_dw =
          u * (4 * (1 + std::fabs(dy[j]) * ax) + mean_u * std::fabs(dy[j]) * double(rs) * std::fabs(double(m)));
      CHECK(std::fabs(double(dw[j]) - want_dw) <= bound_dw);
      CHECK(db[j] == T(T(-1) + dyt[j]));  // one addition, exactly rounded
    }
  });
}

template <std::size_t N>
std::vector<double> uniform_row(double lo, double hi, std::uint32_t seed) {
  std::vector<float> x(N);
  solder::test::fill_uniform(x, lo, hi, seed);
  return {x.begin(), x.end()};
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("ops::layer_norm: rows against the long double reference on every walker", "[ops][layer_norm]",
                       ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  SECTION("centered rows") { check_row<N>(uniform_row<N>(-2, 2, 11), 12); }
  SECTION("rows far from zero mean: |mean| / std up to about 5e4") {
    check_row<N>(uniform_row<N>(999, 1001, 13), 14);
    check_row<N>(uniform_row<N>(-300.01, -299.99, 15), 16);
  }
}

TEMPLATE_TEST_CASE_SIG("ops::layer_norm: a constant row normalizes to the bias exactly", "[ops][layer_norm]",
                       ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  const double level = GENERATE(0.1, -7.25, 3e5);
  const std::vector<double> x(N, double(float(level)));  // 0.1f is no sum of exact floats: the mean is corrected
  std::vector<float> bf(N);
  solder::test::fill_uniform(bf, -1, 1, 21);
  on_every_walker<N>([&]<class R, class T>(const R& r, T) {
    const std::vector<T> xt = as<T>(x), w(N, T(2)), b(bf.begin(), bf.end());
    std::vector<T> y(N);
    const auto st = solder::ops::layer_norm{}.forward(r, xt.data(), y.data(), w.data(), b.data(), eps);
    CHECK(st.mean == xt[0]);
    CHECK(st.rstd == T(1 / std::sqrt(eps)));
    for (std::size_t j = 0; j < N; ++j) CHECK(y[j] == b[j]);
  });
}

TEMPLATE_TEST_CASE_SIG("ops::layer_norm: NaN and infinity make the row NaN", "[ops][layer_norm]", ((std::size_t N), N),
                       (1), (3), (17), (37), (300)) {
  // As torch: the row's mean is NaN, so every y is; in backward a NaN dy reaches both row sums,
  // so every dx is NaN, and that column's dw and db alone.
  const std::size_t at = GENERATE(std::size_t(0), N / 2, N - 1);
  const double bad = GENERATE(Catch::Generators::as<double>{}, qnan, inf, -inf);
  std::vector<double> x = uniform_row<N>(-1, 1, 31);
  x[at] = bad;
  std::vector<float> dyf(N);
  solder::test::fill_uniform(dyf, -1, 1, 32);
  INFO("x[" << at << "] = " << bad);
  on_every_walker<N>([&]<class R, class T>(const R& r, T) {
    const std::vector<T> xt = as<T>(x), w(N, T(1)), b(N, T(0));
    std::vector<T> y(N);
    solder::ops::layer_norm{}.forward(r, xt.data(), y.data(), w.data(), b.data(), eps);
    for (std::size_t j = 0; j < N; ++j) CHECK(std::isnan(y[j]));

    const std::vector<T> xf = as<T>(uniform_row<N>(-1, 1, 33));
    std::vector<T> dy(dyf.begin(), dyf.end()), dx(N), dw(N, T(0)), db(N, T(0));
    dy[at] = T(qnan);
    const auto st = solder::ops::layer_norm{}.statistics(r, xf.data(), eps);
    solder::ops::layer_norm{}.backward(r, xf.data(), dy.data(), w.data(), st, dx.data(), dw.data(), db.data());
    for (std::size_t j = 0; j < N; ++j) {
      CHECK(std::isnan(dx[j]));
      CHECK(std::isnan(dw[j]) == (j == at));
      CHECK(std::isnan(db[j]) == (j == at));
    }
  });
}

TEMPLATE_TEST_CASE_SIG("ops::layer_norm: the vector walker gives the same bits with a static and a dynamic length",
                       "[ops][layer_norm]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  std::vector<float> x(N), w(N), b(N), dy(N);
  solder::test::fill_uniform(x, -3, 5, 41);
  solder::test::fill_uniform(w, -1.5, 1.5, 42);
  solder::test::fill_uniform(b, -1, 1, 43);
  solder::test::fill_uniform(dy, -1, 1, 44);
  std::vector<float> y1(N), y2(N), dx1(N), dx2(N), dw1(N, 0.5f), dw2(N, 0.5f), db1(N, 0.25f), db2(N, 0.25f);
  const solder::ops::layer_norm op;
  const auto s1 = op.forward(exec::row<N>{}, x.data(), y1.data(), w.data(), b.data(), eps);
  const auto s2 = op.forward(exec::row<dyn>(N), x.data(), y2.data(), w.data(), b.data(), eps);
  op.backward(exec::row<N>{}, x.data(), dy.data(), w.data(), s1, dx1.data(), dw1.data(), db1.data());
  op.backward(exec::row<dyn>(N), x.data(), dy.data(), w.data(), s2, dx2.data(), dw2.data(), db2.data());
  CHECK(std::memcmp(&s1, &s2, sizeof s1) == 0);
  CHECK(y1 == y2);
  CHECK(dx1 == dx2);
  CHECK(dw1 == dw2);
  CHECK(db1 == db2);
}

TEST_CASE("ops::layer_norm: traits", "[ops][layer_norm]") {
  STATIC_REQUIRE(!solder::ops::layer_norm::output_backward);
  STATIC_REQUIRE(solder::ops::layer_norm::backward_flops > solder::ops::layer_norm::forward_flops);
}
