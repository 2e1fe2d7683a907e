// tests/ops/softmax.test.cpp: ops::softmax and ops::log_softmax on single rows, forward and
// backward, run by the scalar walker on float and double and by the CPU's vector walker
// (executor<cpu>::row<N> and row<dyn>) against references in long double: row lengths 1, 3,
// 17, 37 and 300 (vector tails, several sum blocks), logits near +-1000, equal logits, -inf
// among finite logits, NaN and +inf rows; and the row walkers' own contract (each, sum, sums,
// max and once count the row's columns only, and write nothing past them).
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
#include "solder/ops/softmax.hpp"
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

/// Roundoff allowed beyond x - max's own (2 u |x - max|, counted separately), in units u.
/// Float: exp (glibc and xsimd within 2 ulp), the row sum (about 20 u on the vector walker:
/// 16 terms per lane in float, across the lanes, then double), the reciprocal or log of the
/// sum and the final product or difference, as tests/nn/softmax.test.cpp allows. Double: the
/// same few roundings plus a sum of n terms in double, n u.
template <class T>
double units(std::size_t n) {
  return std::is_same_v<T, float> ? 24.0 : 8.0 + double(n);
}

/// torch's softmax / log_softmax of one row in long double.
std::vector<long double> reference(bool log, const std::vector<double>& x) {
  long double m = -INFINITY;
  for (double v : x) m = std::max(m, (long double)v);
  long double s = 0;
  for (double v : x) s += std::exp(v - m);
  std::vector<long double> y(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) y[j] = log ? x[j] - m - std::log(s) : std::exp(x[j] - m) / s;
  return y;
}

/// max_j |got_j - want_j| / bound_j: at most 1 passes; a NaN result fails.
double worst(const std::vector<double>& got, const std::vector<long double>& want, const std::vector<double>& bound) {
  double w = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const double e = got[j] == double(want[j]) ? 0.0 : double(std::fabs(got[j] - want[j])) / bound[j];
    if (!(e <= w)) w = e;  // keeps a NaN
  }
  return w;
}

// The op calls, flattened as the layers' row kernels are (nn/softmax.hpp): the tests run the
// code the layers run, with exp inlined whatever the size of this translation unit.
template <class Op, class R, class T>
[[gnu::flatten, gnu::noinline, gnu::noclone]] void run_forward(const R& r, const T* x, T* y) {
  Op{}.forward(r, x, y);
}
template <class Op, class R, class T>
[[gnu::flatten, gnu::noinline, gnu::noclone]] void run_backward(const R& r, const T* y, const T* dy, T* dx) {
  Op{}.backward(r, y, dy, dx);
}

/// Op's forward on x (values representable in T) through walker r, as doubles.
template <class Op, class R, class T>
std::vector<double> forward(const R& r, T, const std::vector<double>& x) {
  std::vector<T> xt(x.begin(), x.end()), yt(x.size());
  run_forward<Op>(r, xt.data(), yt.data());
  return {yt.begin(), yt.end()};
}
template <class Op, class R, class T>
std::vector<double> backward(const R& r, T, const std::vector<double>& y, const std::vector<double>& dy) {
  std::vector<T> yt(y.begin(), y.end()), dyt(dy.begin(), dy.end()), dxt(y.size());
  run_backward<Op>(r, yt.data(), dyt.data(), dxt.data());
  return {dxt.begin(), dxt.end()};
}

/// Forward and backward of softmax and log_softmax on one row x through every walker.
template <std::size_t N>
void check_row(const std::vector<double>& x, std::uint32_t seed) {
  std::vector<double> dy(N);
  solder::test::fill_uniform(dy, -1, 1, seed);
  const double m = *std::max_element(x.begin(), x.end());
  on_every_walker<N>([&]<class R, class T>(const R& r, T t) {
    const double u = unit<T>, k = units<T>(N);
    for (const bool log : {false, true}) {
      INFO((log ? "log_softmax" : "softmax"));
      const std::vector<long double> want = reference(log, x);
      const std::vector<double> y = log ? forward<solder::ops::log_softmax>(r, t, x) : forward<solder::ops::softmax>(r, t, x);
      std::vector<double> bound(N);
      for (std::size_t j = 0; j < N; ++j) {
        const double gap = m - x[j], w = double(want[j]);
        bound[j] = log ? u * (k * (1 + std::fabs(w)) + 2 * gap) : u * w * (k + 2 * gap) + 1e-300;
      }
      CHECK(worst(y, want, bound) <= 1);

      // Backward, from the reference y rounded to T: dx against its formula in long double.
      std::vector<double> yr(N);
      for (std::size_t j = 0; j < N; ++j) yr[j] = double(T(want[j]));
      long double dot = 0, sdy = 0, adot = 0, asdy = 0;
      for (std::size_t j = 0; j < N; ++j) {
        dot += (long double)dy[j] * yr[j];
        sdy += dy[j];
        adot += std::fabs(dy[j] * yr[j]);
        asdy += std::fabs(dy[j]);
      }
      std::vector<long double> dx_want(N);
      for (std::size_t j = 0; j < N; ++j) {
        dx_want[j] = log ? dy[j] - std::exp((long double)yr[j]) * sdy : yr[j] * (dy[j] - dot);
        bound[j] = log ? u * (4 * std::fabs(dy[j]) + k * std::exp(yr[j]) * double(asdy)) + 1e-300
                       : u * std::fabs(yr[j]) * (4 * std::fabs(dy[j]) + k * double(adot)) + 1e-300;
      }
      const std::vector<double> dx =
          log ? backward<solder::ops::log_softmax>(r, t, yr, dy) : backward<solder::ops::softmax>(r, t, yr, dy);
      CHECK(worst(dx, dx_want, bound) <= 1);
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

TEMPLATE_TEST_CASE_SIG("ops::softmax, ops::log_softmax: rows against the long double reference on every walker",
                       "[ops][softmax]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  SECTION("uniform logits") { check_row<N>(uniform_row<N>(-8, 8, 11), 12); }
  SECTION("logits near +1000 and -1000: only x - max keeps exp finite") {
    check_row<N>(uniform_row<N>(990, 1010, 13), 14);
    check_row<N>(uniform_row<N>(-1010, -990, 15), 16);
  }
  SECTION("equal logits: 1 / N each") { check_row<N>(std::vector<double>(N, 0.3f), 17); }
  if constexpr (N >= 3) {
    SECTION("-inf among finite logits has probability 0") {
      std::vector<double> x = uniform_row<N>(-4, 4, 18);
      x[0] = -inf;
      x[N - 1] = -inf;  // in the vector tail
      on_every_walker<N>([&]<class R, class T>(const R& r, T t) {
        const std::vector<double> y = forward<solder::ops::softmax>(r, t, x), ly = forward<solder::ops::log_softmax>(r, t, x);
        const std::vector<long double> want = reference(false, x);
        for (std::size_t j = 0; j < N; ++j) {
          if (j == 0 || j == N - 1) {
            CHECK(y[j] == 0.0);
            CHECK(ly[j] == -inf);
          } else {
            CHECK_THAT(y[j], Catch::Matchers::WithinRel(double(want[j]), (units<T>(N) + 16) * unit<T>));  // gaps below 8
            CHECK(std::isfinite(ly[j]));
          }
        }
      });
    }
  }
}

TEMPLATE_TEST_CASE_SIG("ops::softmax, ops::log_softmax: NaN, +inf and an all -inf row make the whole row NaN",
                       "[ops][softmax]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  // As torch: a NaN reaches the sum; +inf is the max and inf - inf is NaN; a row of only -inf
  // has max -inf and -inf - -inf is NaN. Positions include the first column and the tail.
  const std::size_t at = GENERATE(std::size_t(0), N / 2, N - 1);
  const double bad = GENERATE(Catch::Generators::as<double>{}, qnan, inf);
  std::vector<double> x = uniform_row<N>(-2, 2, 21);
  x[at] = bad;
  std::vector<double> dy(N);
  solder::test::fill_uniform(dy, -1, 1, 22);
  INFO("x[" << at << "] = " << bad);
  on_every_walker<N>([&]<class R, class T>(const R& r, T t) {
    const auto all_nan = [](const std::vector<double>& v) {
      return std::all_of(v.begin(), v.end(), [](double e) { return std::isnan(e); });
    };
    CHECK(all_nan(forward<solder::ops::softmax>(r, t, x)));
    CHECK(all_nan(forward<solder::ops::log_softmax>(r, t, x)));
    CHECK(all_nan(forward<solder::ops::softmax>(r, t, std::vector<double>(N, -inf))));
    CHECK(all_nan(forward<solder::ops::log_softmax>(r, t, std::vector<double>(N, -inf))));
    // Backward: a NaN dy reaches the row's sum, and with it every dx.
    std::vector<double> y = forward<solder::ops::softmax>(r, t, uniform_row<N>(-2, 2, 23)), d = dy;
    d[at] = qnan;
    CHECK(all_nan(backward<solder::ops::softmax>(r, t, y, d)));
    CHECK(all_nan(backward<solder::ops::log_softmax>(r, t, y, d)));
  });
}

TEMPLATE_TEST_CASE_SIG("ops::softmax: the vector walker gives the same bits with a static and a dynamic length",
                       "[ops][softmax]", ((std::size_t N), N), (1), (3), (17), (37), (300)) {
  const std::vector<double> x = uniform_row<N>(-8, 8, 31);
  std::vector<double> dy(N);
  solder::test::fill_uniform(dy, -1, 1, 32);
  const auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
  };
  const std::vector<double> y = forward<solder::ops::softmax>(exec::row<N>{}, 0.0f, x);
  CHECK(same(y, forward<solder::ops::softmax>(exec::row<dyn>(N), 0.0f, x)));
  CHECK(same(forward<solder::ops::log_softmax>(exec::row<N>{}, 0.0f, x),
             forward<solder::ops::log_softmax>(exec::row<dyn>(N), 0.0f, x)));
  CHECK(same(backward<solder::ops::softmax>(exec::row<N>{}, 0.0f, y, dy),
             backward<solder::ops::softmax>(exec::row<dyn>(N), 0.0f, y, dy)));
  CHECK(same(backward<solder::ops::log_softmax>(exec::row<N>{}, 0.0f, y, dy),
             backward<solder::ops::log_softmax>(exec::row<dyn>(N), 0.0f, y, dy)));
}

TEST_CASE("ops::softmax, ops::log_softmax: traits", "[ops][softmax]") {
  STATIC_REQUIRE(solder::ops::softmax::output_backward);
  STATIC_REQUIRE(solder::ops::log_softmax::output_backward);
  STATIC_REQUIRE(solder::ops::softmax::forward_flops > 0);
  STATIC_REQUIRE(solder::ops::log_softmax::backward_flops > 0);
}

// ---- the walkers' contract ---------------------------------------------------------------

namespace {

/// The contract of ops/softmax.hpp's walker interface on walker r over rows of N floats:
/// every column visited once, nothing read or written past the row, reductions over the row's
/// columns only (padding lanes loaded as NaN or +inf must not reach them), NaN propagated.
template <std::size_t N, class R>
void check_walker(const R& r) {
  // Each buffer holds the row and then `past` canaries: a NaN read past the row would reach a
  // sum or a max, and a write past it would change a canary.
  constexpr std::size_t past = 32;
  const float nan = std::numeric_limits<float>::quiet_NaN(), pinf = std::numeric_limits<float>::infinity();
  // Small integers: float sums of them are exact in any order, so sums compare exactly.
  std::vector<float> row(N);
  solder::test::fill_integers(row, -50, 50, 41);
  std::vector<float> x(row);
  x.resize(N + past, nan);
  std::vector<float> out(N + past, -7.0f);
  r.each([&](auto at) { r.store(at, out.data(), r.load(at, x.data()) + 1.0f); });
  for (std::size_t j = 0; j < N; ++j) CHECK(out[j] == x[j] + 1.0f);
  for (std::size_t j = N; j < out.size(); ++j) CHECK(out[j] == -7.0f);

  double s = 0, s2 = 0;
  for (float v : row) {
    s += v;
    s2 += double(v) * v;
  }
  CHECK(r.sum([&](auto at) { return r.load(at, x.data(), nan); }) == s);
  const auto [t1, t2] = r.template sums<2>([&](auto at) {
    const auto v = r.load(at, x.data(), nan);
    return typename R::template terms<2>{v, v * v};
  });
  CHECK(t1 == s);
  CHECK(t2 == s2);
  CHECK(r.max([&](auto at) { return r.load(at, x.data(), pinf); }) == *std::max_element(row.begin(), row.end()));

  for (std::size_t p : {std::size_t(0), N / 2, N - 1}) {
    std::vector<float> xn = x;
    xn[p] = nan;
    CHECK(std::isnan(r.max([&](auto at) { return r.load(at, xn.data()); })));
    CHECK(std::isnan(r.sum([&](auto at) { return r.load(at, xn.data()); })));
  }
  std::vector<float> lows(N + past, nan);
  std::fill_n(lows.begin(), N, -pinf);
  CHECK(r.max([&](auto at) { return r.load(at, lows.data()); }) == -pinf);

  int calls = 0;
  r.once([&] { ++calls; });
  CHECK(calls == 1);
  CHECK(r.size() == N);
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("row walkers: each, sum, sums, max and once over the row's columns only", "[ops][softmax]",
                       ((std::size_t N), N), (1), (3), (8), (16), (17), (37), (300)) {
  SECTION("scalar walker") { check_walker<N>(scalar_row<float>{N}); }
  SECTION("vector walker, row<N>") { check_walker<N>(exec::row<N>{}); }
  SECTION("vector walker, row<dyn>") { check_walker<N>(exec::row<dyn>(N)); }
}
