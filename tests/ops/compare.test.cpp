// tests/ops/compare.test.cpp: less, less_equal, greater, greater_equal, equal, not_equal,
// where, min, max and clamp on float, double and xsimd batches, against <cmath> in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/batch.hpp"
#include "solder/ops/compare.hpp"
#include "support/op_check.hpp"
#include "support/reference.hpp"

namespace {

using namespace solder;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using vecf = eval::cpu::vec<float>;
using namespace solder::test;  // tolerance, same, check_near, on_lanes, near_any

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// Every op here selects, compares or halves: its float results are exact, so scalar, batch and
// the double reference rounded to float must agree bit for bit (the sign of zero included).

/// Analytic derivative in double against central differences of the reference, away from
/// kinks and ties: the ops are piecewise linear, so the difference is exact up to rounding.
constexpr double fd_rel = 1e-9;
constexpr double fd_abs = 1e-12;

// The helpers are noinline: inlined into every TEST_CASE they double the compile time (more
// under the sanitizers) and gain nothing at run time.

/// Pairs that hit every case: random, equal (ties), and every pair of special values.
struct pairs {
  std::vector<float> a, b;
};
pairs test_pairs() {
  pairs p{test::uniform(100, -10, 10, 40), test::uniform(100, -10, 10, 41)};
  for (std::size_t i = 0; i < 100; i += 5) p.b[i] = p.a[i];  // ties
  for (float x : test::special_values())
    for (float y : test::special_values()) p.a.push_back(x), p.b.push_back(y);
  return p;
}

/// A comparison: scalar float and double against the C++ operator on doubles (IEEE), batch
/// lanes against the scalar, at every pair including NaN, +-inf and +-0.
template <class Op, class Ref>
[[gnu::noinline]] void check_comparison(const Op& op, Ref ref) {
  STATIC_REQUIRE(Op::arity == 2);
  STATIC_REQUIRE(!Op::differentiable(0));
  STATIC_REQUIRE(!Op::differentiable(1));
  const auto p = test_pairs();
  const auto lanes = on_lanes([&](const vecf& a, const vecf& b) { return simd::select(op.forward(a, b), vecf(1), vecf(0)); }, p.a, p.b);
  for (std::size_t i = 0; i < p.a.size(); ++i) {
    const float a = p.a[i], b = p.b[i];
    CAPTURE(a, b);
    const bool want = ref(double(a), double(b));
    CHECK(op.forward(a, b) == want);
    CHECK(op.forward(double(a), double(b)) == want);
    CHECK(lanes[i] == (want ? 1.0f : 0.0f));
  }
}

/// max or min: forward exact against ref everywhere; both gradients against central
/// differences away from ties, g / 2 each at ties, NaN to both where the result is NaN; batch
/// lanes equal to the scalar.
template <class Op, class Ref>
[[gnu::noinline]] void check_extremum(const Op& op, Ref ref) {
  const auto p = test_pairs();
  const auto gs = test::uniform(p.a.size(), 0.5, 2.0, 42);
  const auto ys = on_lanes([&](const vecf& a, const vecf& b) { return op.forward(a, b); }, p.a, p.b);
  const auto da = on_lanes([&](const vecf& a, const vecf& b, const vecf& g) { return op.template backward<0>(a, b, op.forward(a, b), g); }, p.a, p.b, gs);
  const auto db = on_lanes([&](const vecf& a, const vecf& b, const vecf& g) { return op.template backward<1>(a, b, op.forward(a, b), g); }, p.a, p.b, gs);
  for (std::size_t i = 0; i < p.a.size(); ++i) {
    const float a = p.a[i], b = p.b[i], g = gs[i];
    CAPTURE(a, b, g);
    const float y = op.forward(a, b);
    const float want = static_cast<float>(ref(a, b));
    CHECK(same(y, want));  // also max(-0, +0) = -0: the first operand wins a tie
    CHECK(same(ys[i], y));
    const float ga = op.template backward<0>(a, b, y, g), gb = op.template backward<1>(a, b, y, g);
    CHECK(same(da[i], ga));
    CHECK(same(db[i], gb));
    CHECK(same(static_cast<float>(op.template backward<0>(double(a), double(b), double(y), double(g))), ga));
    if (std::isnan(y)) {
      CHECK(std::isnan(ga));
      CHECK(std::isnan(gb));
    } else if (a == b) {
      CHECK(ga == 0.5f * g);
      CHECK(gb == 0.5f * g);
    } else if (std::isfinite(a) && std::isfinite(b) && std::abs(a - b) > 1e-3f * std::max(1.0f, std::abs(a))) {
      const double fda = g * test::central_diff([&](double v) { return ref(v, b); }, a, test::fd_step(a));
      const double fdb = g * test::central_diff([&](double v) { return ref(a, v); }, b, test::fd_step(b));
      CHECK_THAT(ga, WithinRel(fda, fd_rel) || WithinAbs(fda, fd_abs));
      CHECK_THAT(gb, WithinRel(fdb, fd_rel) || WithinAbs(fdb, fd_abs));
    }
  }
}

}  // namespace

TEST_CASE("comparisons return masks, false for NaN except not_equal", "[ops]") {
  check_comparison(ops::less{}, [](double a, double b) { return a < b; });
  check_comparison(ops::less_equal{}, [](double a, double b) { return a <= b; });
  check_comparison(ops::greater{}, [](double a, double b) { return a > b; });
  check_comparison(ops::greater_equal{}, [](double a, double b) { return a >= b; });
  check_comparison(ops::equal{}, [](double a, double b) { return a == b; });
  check_comparison(ops::not_equal{}, [](double a, double b) { return a != b; });
  STATIC_REQUIRE(std::is_same_v<decltype(ops::less{}.forward(1.0f, 2.0f)), bool>);
  STATIC_REQUIRE(std::is_same_v<decltype(ops::less{}.forward(vecf(1.0f), vecf(2.0f))), simd::mask_t<vecf>>);
  CHECK(ops::not_equal{}.forward(qnan, qnan));
  CHECK_FALSE(ops::equal{}.forward(qnan, qnan));
  CHECK(ops::equal{}.forward(-0.0f, 0.0f));
  CHECK(xsimd::all(ops::not_equal{}.forward(vecf(qnan), vecf(qnan))));
}

TEST_CASE("where: selects, routes the gradient to the chosen operand only", "[ops]") {
  const ops::where op;
  STATIC_REQUIRE(ops::where::arity == 3);
  STATIC_REQUIRE(!ops::where::differentiable(0));
  STATIC_REQUIRE(ops::where::differentiable(1));
  STATIC_REQUIRE(ops::where::differentiable(2));
  const auto p = test_pairs();
  const auto cs = test::uniform(p.a.size(), -1, 1, 43);  // the condition is cs > 0
  const auto gs = test::uniform(p.a.size(), 0.5, 2.0, 44);
  const auto ys = on_lanes([&](const vecf& c, const vecf& a, const vecf& b) { return op.forward(c > vecf(0), a, b); }, cs, p.a, p.b);
  const auto da = on_lanes([&](const vecf& c, const vecf& a, const vecf& b, const vecf& g) {
    const auto m = c > vecf(0);
    return op.backward<1>(m, a, b, op.forward(m, a, b), g);
  }, cs, p.a, p.b, gs);
  const auto db = on_lanes([&](const vecf& c, const vecf& a, const vecf& b, const vecf& g) {
    const auto m = c > vecf(0);
    return op.backward<2>(m, a, b, op.forward(m, a, b), g);
  }, cs, p.a, p.b, gs);
  for (std::size_t i = 0; i < p.a.size(); ++i) {
    const bool c = cs[i] > 0;
    const float a = p.a[i], b = p.b[i], g = gs[i];
    CAPTURE(c, a, b, g);
    const float y = op.forward(c, a, b);
    CHECK(same(y, c ? a : b));
    CHECK(same(ys[i], y));
    CHECK(same(static_cast<float>(op.forward(c, double(a), double(b))), y));
    // the branch not taken gets +0, even where it holds NaN or inf
    CHECK(same(op.backward<1>(c, a, b, y, g), c ? g : 0.0f));
    CHECK(same(op.backward<2>(c, a, b, y, g), c ? 0.0f : g));
    CHECK(same(da[i], c ? g : 0.0f));
    CHECK(same(db[i], c ? 0.0f : g));
  }
  // where(x > 0, x, 0) with x = NaN: the condition is false, so the result is 0 (NaN filtered)
  CHECK(same(op.forward(qnan > 0.0f, qnan, 0.0f), 0.0f));
}

TEST_CASE("max: NaN propagates, ties split the gradient", "[ops]") {
  check_extremum(ops::max{}, test::ref::max);
  const ops::max op;
  CHECK(std::isnan(op.forward(qnan, 1.0f)));
  CHECK(std::isnan(op.forward(1.0f, qnan)));
  CHECK(std::isnan(simd::max(vecf(1.0f), vecf(qnan)).get(0)));
  CHECK(std::isnan(simd::max(vecf(qnan), vecf(1.0f)).get(0)));
  CHECK(op.forward(-inf, 3.0f) == 3.0f);
  CHECK(op.backward<0>(2.0f, 1.0f, 2.0f, 1.0f) == 1.0f);
  CHECK(op.backward<1>(2.0f, 1.0f, 2.0f, 1.0f) == 0.0f);
  CHECK(op.backward<0>(2.0f, 2.0f, 2.0f, 1.0f) == 0.5f);
  CHECK(op.backward<1>(inf, inf, inf, 1.0f) == 0.5f);
}

TEST_CASE("min: NaN propagates, ties split the gradient", "[ops]") {
  check_extremum(ops::min{}, test::ref::min);
  const ops::min op;
  CHECK(std::isnan(op.forward(qnan, 1.0f)));
  CHECK(std::isnan(op.forward(1.0f, qnan)));
  CHECK(std::isnan(simd::min(vecf(1.0f), vecf(qnan)).get(0)));
  CHECK(std::isnan(simd::min(vecf(qnan), vecf(1.0f)).get(0)));
  CHECK(op.backward<0>(2.0f, 1.0f, 1.0f, 1.0f) == 0.0f);
  CHECK(op.backward<1>(2.0f, 1.0f, 1.0f, 1.0f) == 1.0f);
  CHECK(op.backward<1>(-2.0f, -2.0f, -2.0f, 1.0f) == 0.5f);
}

TEST_CASE("clamp: bounds, gradient passes on lo <= x <= hi, NaN kept", "[ops]") {
  const ops::clamp op{-1.0f, 2.0f};
  STATIC_REQUIRE(ops::clamp::arity == 1);
  auto xs = test::uniform(257, -5, 5, 45);
  for (float x : test::special_values()) xs.push_back(x);
  xs.push_back(-1.0f);
  xs.push_back(2.0f);
  const auto gs = test::uniform(xs.size(), 0.5, 2.0, 46);
  const auto ys = on_lanes([&](const vecf& x) { return op.forward(x); }, xs);
  const auto ds = on_lanes([&](const vecf& x, const vecf& g) { return op.backward<0>(x, op.forward(x), g); }, xs, gs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i], g = gs[i];
    CAPTURE(x, g);
    const float y = op.forward(x);
    CHECK(same(y, static_cast<float>(test::ref::clamp(x, -1.0, 2.0))));
    CHECK(same(ys[i], y));
    CHECK(same(static_cast<float>(op.forward(double(x))), y));
    const float d = op.backward<0>(x, y, g);
    CHECK(same(ds[i], d));
    if (std::isnan(x))
      CHECK(std::isnan(d));
    else
      CHECK(same(d, x >= -1.0f && x <= 2.0f ? g : 0.0f));  // the bounds themselves pass (PyTorch)
    if (std::isfinite(x) && !near_any(x, {-1.0, 2.0}, 1e-3)) {
      const double fd = g * test::central_diff([](double v) { return test::ref::clamp(v, -1.0, 2.0); }, x, test::fd_step(x));
      CHECK_THAT(d, WithinRel(fd, fd_rel) || WithinAbs(fd, fd_abs));
    }
  }
  // the defaults are unbounded; lo > hi gives hi everywhere, with gradient 0 (as torch.clamp)
  const ops::clamp none;
  CHECK(none.forward(inf) == inf);
  CHECK(none.forward(-inf) == -inf);
  CHECK(none.backward<0>(inf, inf, 1.0f) == 1.0f);
  const ops::clamp crossed{2.0f, 1.0f};
  CHECK(crossed.forward(0.0f) == 1.0f);
  CHECK(crossed.forward(5.0f) == 1.0f);
  CHECK(crossed.backward<0>(1.5f, 1.0f, 1.0f) == 0.0f);
  const ops::clamp relu6{0, 6};
  CHECK(relu6.forward(7.0f) == 6.0f);
  CHECK(relu6.forward(-0.5f) == 0.0f);
}
