// tests/ops/arithmetic.test.cpp: add, sub, mul, div, neg, abs, exp, log, sqrt, rsqrt on float,
// double and xsimd batches, against the double references of tests/support/reference.hpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/batch.hpp"
#include "solder/ops/arithmetic.hpp"
#include "support/op_check.hpp"
#include "support/reference.hpp"

namespace {

using namespace solder;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using Catch::Matchers::WithinULP;
using vecf = eval::cpu::vec<float>;
using namespace solder::test;  // tolerance, same, check_near, on_lanes, near_any

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

/// +, -, *, / and sqrt are correctly rounded in IEEE float on every backend, and the double
/// reference rounded to float is the same value (53 >= 2 * 24 + 2 bits: double rounding is
/// innocuous for these operations), so they must match exactly.
constexpr tolerance exact{0, 0.0};
/// exp, log: glibc and xsimd are each within 1 ulp (measured over their whole range).
constexpr tolerance libm{2, 0.0};
/// rsqrt = 1 / sqrt: two correctly rounded steps.
constexpr tolerance rsqrt_value{2, 0.0};
/// its gradient -g y^3 / 2: y's error tripled, plus three rounded products.
constexpr tolerance rsqrt_grad{8, 0.0};

/// Analytic derivative in double against central differences of the reference: truncation
/// (h^2 f''' / 6) and rounding (eps |f| / h) at fd_step stay below 1e-8 relative on the sampled
/// ranges; 1e-6 leaves room for functions with a large f''' / f' (log and rsqrt near 0).
constexpr double fd_rel = 1e-6;
/// ... or absolutely, where the derivative is itself near 0.
constexpr double fd_abs = 1e-9;

/// xsimd's exp returns 0 where the result is below FLT_MIN (x < -87.3), glibc a subnormal.
constexpr double flushed = 1e-37;

// The helpers are noinline: inlined into every TEST_CASE they double the compile time (more
// under the sanitizers) and gain nothing at run time.

/// Two float results that each meet t against the truth: NaN together, else within 2 t, or
/// both below what a batch exp may flush to 0.
[[gnu::noinline]] void check_lane(float lane, float scalar, tolerance t) {
  if (t.ulps == 0)
    CHECK(same(lane, scalar));
  else
    check_near(lane, scalar, {2 * t.ulps, std::max(2 * t.abs, flushed)});
}

// ---- unary ops ----

/// Forward on scalar float and batch lanes against ref at every x, and lane against scalar.
template <class Op, class Ref>
[[gnu::noinline]] void check_forward(const Op& op, Ref ref, const std::vector<float>& xs, tolerance t) {
  const auto lanes = on_lanes([&](const vecf& x) { return op.forward(x); }, xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    CAPTURE(x);
    const float y = op.forward(x);
    check_near(y, ref(x), t);
    check_near(lanes[i], ref(x), t);
    check_lane(lanes[i], y, t);
  }
}

/// Backward in double against g times central differences of ref (skipping points within
/// 1e-3 of a kink), then scalar float and batch lanes against the double gradient.
template <class Op, class Ref>
[[gnu::noinline]] void check_backward(const Op& op, Ref ref, const std::vector<float>& xs, tolerance t,
                    std::initializer_list<double> kinks = {}) {
  const auto gs = test::uniform(xs.size(), 0.5, 2.0, 99);
  const auto lanes = on_lanes([&](const vecf& x, const vecf& g) { return op.template backward<0>(x, op.forward(x), g); }, xs, gs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const float g = gs[i];
    if (near_any(x, kinks, 1e-3)) continue;
    CAPTURE(x, g);
    const double d = op.template backward<0>(double(x), op.forward(double(x)), double(g));
    const double fd = g * test::central_diff(ref, x, test::fd_step(x));
    CHECK_THAT(d, WithinRel(fd, fd_rel) || WithinAbs(fd, fd_abs));
    const tolerance tg{t.ulps, t.abs * g};
    check_near(op.template backward<0>(x, op.forward(x), g), d, tg);
    check_near(lanes[i], d, tg);
  }
}

/// Every special value (NaN, +-inf, +-0, subnormal, huge) on scalar float and in batch lanes
/// next to other specials: forward and backward agree lane by lane.
template <class Op>
[[gnu::noinline]] void check_special_lanes(const Op& op, tolerance t) {
  const auto xs = test::special_values();
  const std::vector<float> gs(xs.size(), 1.5f);
  const auto ys = on_lanes([&](const vecf& x) { return op.forward(x); }, xs);
  const auto ds = on_lanes([&](const vecf& x, const vecf& g) { return op.template backward<0>(x, op.forward(x), g); }, xs, gs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    CAPTURE(x);
    check_lane(ys[i], op.forward(x), t);
    check_lane(ds[i], op.template backward<0>(x, op.forward(x), 1.5f), t);
  }
}

/// Exact values (with the sign of zero) of forward and of the gradient for g = 1, on float,
/// double and batch: the NaN/Inf rules and kink conventions of docs/ops.md.
struct row {
  float x, y, dy;
};
template <class Op>
[[gnu::noinline]] void check_rows(const Op& op, std::initializer_list<row> rows) {
  for (const row& r : rows) {
    CAPTURE(r.x, r.y, r.dy);
    const float y = op.forward(r.x);
    CHECK(same(y, r.y));
    CHECK(same(op.template backward<0>(r.x, y, 1.0f), r.dy));
    const double y64 = op.forward(double(r.x));
    CHECK(same(static_cast<float>(y64), r.y));
    CHECK(same(static_cast<float>(op.template backward<0>(double(r.x), y64, 1.0)), r.dy));
    const vecf x(r.x);
    const vecf yb = op.forward(x);
    CHECK(same(yb.get(0), r.y));
    CHECK(same(op.template backward<0>(x, yb, vecf(1.0f)).get(0), r.dy));
  }
}

// ---- binary ops ----

/// Forward and both gradients of a binary op: scalar float and batch lanes against ref, double
/// gradients against central differences in each argument, float gradients against double.
template <class Op, class Ref>
[[gnu::noinline]] void check_binary(const Op& op, Ref ref, const std::vector<float>& as, const std::vector<float>& bs, tolerance t) {
  const auto gs = test::uniform(as.size(), 0.5, 2.0, 98);
  const auto ys = on_lanes([&](const vecf& a, const vecf& b) { return op.forward(a, b); }, as, bs);
  const auto da = on_lanes([&](const vecf& a, const vecf& b, const vecf& g) { return op.template backward<0>(a, b, op.forward(a, b), g); }, as, bs, gs);
  const auto db = on_lanes([&](const vecf& a, const vecf& b, const vecf& g) { return op.template backward<1>(a, b, op.forward(a, b), g); }, as, bs, gs);
  for (std::size_t i = 0; i < as.size(); ++i) {
    const float a = as[i], b = bs[i], g = gs[i];
    CAPTURE(a, b, g);
    const float y = op.forward(a, b);
    check_near(y, ref(a, b), t);
    check_near(ys[i], ref(a, b), t);
    check_lane(ys[i], y, t);

    const double y64 = op.forward(double(a), double(b));
    const double da64 = op.template backward<0>(double(a), double(b), y64, double(g));
    const double db64 = op.template backward<1>(double(a), double(b), y64, double(g));
    const double fda = g * test::central_diff([&](double v) { return ref(v, b); }, a, test::fd_step(a));
    const double fdb = g * test::central_diff([&](double v) { return ref(a, v); }, b, test::fd_step(b));
    CHECK_THAT(da64, WithinRel(fda, fd_rel) || WithinAbs(fda, fd_abs));
    CHECK_THAT(db64, WithinRel(fdb, fd_rel) || WithinAbs(fdb, fd_abs));
    const tolerance tg = t.ulps == 0 ? libm : t;  // a gradient can take two rounded steps (-(g / b) * y)
    check_near(op.template backward<0>(a, b, y, g), da64, tg);
    check_near(op.template backward<1>(a, b, y, g), db64, tg);
    check_near(da[i], da64, tg);
    check_near(db[i], db64, tg);
  }
}

/// Every pair of special values, on scalar float and in batch lanes: forward against the
/// reference (IEEE operations, so exactly), gradients lane against scalar, NaN for NaN.
template <class Op, class Ref>
[[gnu::noinline]] void check_special_pairs(const Op& op, Ref ref) {
  std::vector<float> as, bs;
  for (float a : test::special_values())
    for (float b : test::special_values()) as.push_back(a), bs.push_back(b);
  const std::vector<float> gs(as.size(), 1.5f);
  const auto ys = on_lanes([&](const vecf& a, const vecf& b) { return op.forward(a, b); }, as, bs);
  const auto da = on_lanes([&](const vecf& a, const vecf& b, const vecf& g) { return op.template backward<0>(a, b, op.forward(a, b), g); }, as, bs, gs);
  const auto db = on_lanes([&](const vecf& a, const vecf& b, const vecf& g) { return op.template backward<1>(a, b, op.forward(a, b), g); }, as, bs, gs);
  for (std::size_t i = 0; i < as.size(); ++i) {
    const float a = as[i], b = bs[i];
    CAPTURE(a, b);
    const float y = op.forward(a, b);
    check_near(y, ref(a, b), exact);
    CHECK(same(ys[i], y));
    CHECK(same(da[i], op.template backward<0>(a, b, y, 1.5f)));
    CHECK(same(db[i], op.template backward<1>(a, b, y, 1.5f)));
  }
}

}  // namespace

TEST_CASE("add: forward, gradients, special values", "[ops]") {
  const ops::add op;
  STATIC_REQUIRE(ops::add::arity == 2);
  check_binary(op, test::ref::add, test::uniform(257, -1e3, 1e3, 1), test::uniform(257, -1e3, 1e3, 2), exact);
  check_special_pairs(op, test::ref::add);
  CHECK(std::isnan(op.forward(inf, -inf)));
  CHECK(same(op.forward(-0.0f, -0.0f), -0.0f));
  CHECK(same(op.forward(-0.0f, 0.0f), 0.0f));
}

TEST_CASE("sub: forward, gradients, special values", "[ops]") {
  const ops::sub op;
  check_binary(op, test::ref::sub, test::uniform(37, -1e3, 1e3, 3), test::uniform(37, -1e3, 1e3, 4), exact);
  check_special_pairs(op, test::ref::sub);
  CHECK(std::isnan(op.forward(inf, inf)));
  CHECK(op.backward<1>(1.0f, 2.0f, -1.0f, 3.0f) == -3.0f);
}

TEST_CASE("mul: forward, gradients, special values", "[ops]") {
  const ops::mul op;
  check_binary(op, test::ref::mul, test::uniform(257, -1e3, 1e3, 5), test::uniform(257, -1e3, 1e3, 6), exact);
  check_special_pairs(op, test::ref::mul);
  CHECK(std::isnan(op.forward(0.0f, inf)));
  CHECK(std::isnan(op.backward<0>(2.0f, 0.0f, 0.0f, inf)));  // g * b = inf * 0, as in PyTorch
  CHECK(op.backward<1>(2.0f, 3.0f, 6.0f, 1.0f) == 2.0f);
}

TEST_CASE("div: forward, gradients, special values", "[ops]") {
  const ops::div op;
  // |b| >= 0.1 keeps the central difference in b away from the pole
  auto bs = test::uniform(257, 0.1, 1e2, 8);
  for (std::size_t i = 0; i < bs.size(); i += 2) bs[i] = -bs[i];
  check_binary(op, test::ref::div, test::uniform(257, -1e3, 1e3, 7), bs, exact);
  check_special_pairs(op, test::ref::div);
  CHECK(op.forward(1.0f, 0.0f) == inf);
  CHECK(op.forward(1.0f, -0.0f) == -inf);
  CHECK(std::isnan(op.forward(0.0f, 0.0f)));
  CHECK(op.backward<0>(1.0f, 0.0f, inf, 1.0f) == inf);
  CHECK(op.backward<1>(1.0f, 0.0f, inf, 1.0f) == -inf);          // -a / b^2 -> -inf
  CHECK(std::isnan(op.backward<1>(0.0f, 0.0f, qnan, 1.0f)));      // 0 / 0
  CHECK(same(op.backward<1>(0.0f, 2.0f, 0.0f, 1.0f), -0.0f));    // -0 / 4
  const float big = std::numeric_limits<float>::max();
  CHECK_THAT(op.backward<1>(big, big, 1.0f, 1.0f), WithinULP(-1.0f / big, 1));  // no overflow from b^2
}

TEST_CASE("neg: forward, gradient, special values", "[ops]") {
  const ops::neg op;
  const auto xs = test::uniform(100, -1e3, 1e3, 9);
  check_forward(op, test::ref::neg, xs, exact);
  check_backward(op, test::ref::neg, xs, exact);
  check_special_lanes(op, exact);
  check_rows(op, {{0.0f, -0.0f, -1.0f}, {-0.0f, 0.0f, -1.0f}, {inf, -inf, -1.0f}, {qnan, qnan, -1.0f}});
}

TEST_CASE("abs: forward, gradient, abs'(0) = 0, special values", "[ops]") {
  const ops::abs op;
  const auto xs = test::uniform(257, -1e3, 1e3, 10);
  check_forward(op, test::ref::abs, xs, exact);
  check_backward(op, test::ref::abs, xs, exact, {0.0});
  check_special_lanes(op, exact);
  check_rows(op, {{-3.0f, 3.0f, -1.0f},
                  {3.0f, 3.0f, 1.0f},
                  {0.0f, 0.0f, 0.0f},
                  {-0.0f, 0.0f, -0.0f},
                  {-inf, inf, -1.0f},
                  {inf, inf, 1.0f},
                  {qnan, qnan, qnan}});
}

TEST_CASE("exp: forward, gradient, special values", "[ops]") {
  const ops::exp op;
  auto xs = test::uniform(257, -87, 88, 11);
  check_forward(op, test::ref::exp, xs, libm);
  check_backward(op, test::ref::exp, test::uniform(257, -20, 20, 12), libm);
  check_special_lanes(op, libm);
  check_rows(op, {{0.0f, 1.0f, 1.0f},
                  {-0.0f, 1.0f, 1.0f},
                  {-inf, 0.0f, 0.0f},
                  {inf, inf, inf},
                  {100.0f, inf, inf},
                  {-1e4f, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
}

TEST_CASE("log: forward, gradient, special values", "[ops]") {
  const ops::log op;
  check_forward(op, test::ref::log, test::uniform(257, 1e-30, 1e30, 13), libm);
  check_forward(op, test::ref::log, test::uniform(61, 0.5, 2, 14), libm);  // near the zero at 1
  check_backward(op, test::ref::log, test::uniform(257, 0.01, 1e3, 15), libm);
  check_special_lanes(op, libm);
  check_rows(op, {{1.0f, 0.0f, 1.0f},
                  {0.0f, -inf, inf},
                  {-0.0f, -inf, -inf},
                  {-1.0f, qnan, -1.0f},  // gradient g / x also outside the domain (PyTorch)
                  {inf, inf, 0.0f},
                  {-inf, qnan, -0.0f},
                  {qnan, qnan, qnan}});
}

TEST_CASE("sqrt: forward, gradient, special values", "[ops]") {
  const ops::sqrt op;
  check_forward(op, test::ref::sqrt, test::uniform(257, 0, 1e30, 16), exact);
  check_backward(op, test::ref::sqrt, test::uniform(257, 0.01, 1e3, 17), libm);
  check_special_lanes(op, exact);
  check_rows(op, {{4.0f, 2.0f, 0.25f},
                  {0.0f, 0.0f, inf},
                  {-0.0f, -0.0f, -inf},
                  {-1.0f, qnan, qnan},
                  {inf, inf, 0.0f},
                  {qnan, qnan, qnan}});
  CHECK(std::isnan(op.backward<0>(0.0f, 0.0f, 0.0f)));  // 0 / 0, as in PyTorch
}

TEST_CASE("rsqrt: forward, gradient, special values", "[ops]") {
  const ops::rsqrt op;
  check_forward(op, test::ref::rsqrt, test::uniform(257, 1e-30, 1e30, 18), rsqrt_value);
  check_backward(op, test::ref::rsqrt, test::uniform(257, 0.01, 1e3, 19), rsqrt_grad);
  check_special_lanes(op, rsqrt_grad);
  check_rows(op, {{4.0f, 0.5f, -0.0625f},
                  {0.0f, inf, -inf},
                  {-0.0f, -inf, inf},
                  {-1.0f, qnan, qnan},
                  {inf, 0.0f, -0.0f},
                  {qnan, qnan, qnan}});
}
