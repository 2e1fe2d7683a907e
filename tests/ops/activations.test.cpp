// tests/ops/activations.test.cpp: tanh, sigmoid, relu, leaky_relu, elu, gelu, gelu_tanh, silu,
// softplus on float, double and xsimd batches, against tests/support/reference.hpp; the
// gradients of relu, sigmoid and tanh from their output against their backward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/batch.hpp"
#include "solder/ops/activations.hpp"
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
constexpr double eps = std::numeric_limits<float>::epsilon();

/// Analytic derivative in double against central differences of the reference: truncation
/// (h^2 f''' / 6) and rounding (eps |f| / h) at fd_step stay below 1e-8 relative on the sampled
/// ranges; 1e-6 leaves room for functions with a large f''' / f' (log and rsqrt near 0).
constexpr double fd_rel = 1e-6;
/// ... or absolutely, where the derivative is itself near 0.
constexpr double fd_abs = 1e-9;

/// xsimd's exp returns 0 where the result is below FLT_MIN (x < -87.3), glibc a subnormal;
/// an op may scale that by |x| <= 100 (silu(-88) is -5e-37 on scalars, 0 on batches).
constexpr double flushed = 1e-35;
/// An elementary function at an exact point may be an ulp off on batches (xsimd's erfc(0) is
/// 1 - 2^-24), so exact table entries other than 0, inf and NaN allow this much.
constexpr std::uint64_t table_ulps = 2;

// Float tolerances, measured with their causes (the ulps are those of the correctly rounded
// reference; the absolute parts cover points near a zero of the function or derivative).

/// Exact: selects and one multiplication by a float slope.
constexpr tolerance piecewise{1, 0.0};
/// One glibc or xsimd elementary function (each within 2 ulp), times a constant.
constexpr tolerance one_libm{4, flushed};
/// Gradients formed from y, 1 - y^2 or y (1 - y): y carries half an ulp, which the
/// subtraction from 1 turns into up to eps absolute where y is near +-1.
constexpr tolerance from_y{8, eps};
/// gelu on [-3, 3]: xsimd's erfc is within 11 ulp there (glibc within 3).
constexpr tolerance gelu_core{16, 0.0};
/// gelu and gelu_tanh for 3 < |x| < 13: the rounding of the scaled argument is amplified about
/// x^2 times where Phi or the sigmoid is in its tail (measured up to 250 ulp at x = -12.8).
constexpr tolerance gelu_tail{512, flushed};
/// gelu_tanh on [-3, 3]: the cubic argument, one exp and a division (measured 12 ulp).
constexpr tolerance gelu_tanh_core{16, 0.0};
/// silu: one exp, a division and two products (measured 3 ulp).
constexpr tolerance silu_value{4, flushed};
/// Derivatives that are sums of O(1) terms of opposite sign (gelu: Phi + x phi, zero at -0.75;
/// silu: s + x s', zero at -1.28): near that zero the error is a few eps absolute.
constexpr tolerance cancelling_grad{16, 2 * eps};

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

/// Values of forward and of the gradient for g = 1 (zeros with their sign), on float, double
/// and batch: the NaN/Inf rules and kink conventions of docs/ops.md.
struct row {
  float x, y, dy;
};
/// A table entry: exact for 0 (with its sign), inf and NaN; within table_ulps otherwise.
[[gnu::noinline]] void check_entry(float got, float want) {
  if (want == 0 || !std::isfinite(want))
    CHECK(same(got, want));
  else
    CHECK_THAT(got, WithinULP(want, table_ulps));
}

template <class Op>
[[gnu::noinline]] void check_rows(const Op& op, std::initializer_list<row> rows) {
  for (const row& r : rows) {
    CAPTURE(r.x, r.y, r.dy);
    const float y = op.forward(r.x);
    check_entry(y, r.y);
    check_entry(op.template backward<0>(r.x, y, 1.0f), r.dy);
    const double y64 = op.forward(double(r.x));
    check_entry(static_cast<float>(y64), r.y);
    check_entry(static_cast<float>(op.template backward<0>(double(r.x), y64, 1.0)), r.dy);
    const vecf x(r.x);
    const vecf yb = op.forward(x);
    check_entry(yb.get(0), r.y);
    check_entry(op.template backward<0>(x, yb, vecf(1.0f)).get(0), r.dy);
  }
}

}  // namespace

TEST_CASE("tanh: forward, gradient, special values", "[ops]") {
  const ops::tanh op;
  check_forward(op, test::ref::tanh, test::uniform(257, -10, 10, 20), one_libm);
  check_backward(op, test::ref::tanh, test::uniform(257, -8, 8, 21), from_y);
  check_special_lanes(op, from_y);
  check_rows(op, {{0.0f, 0.0f, 1.0f},
                  {-0.0f, -0.0f, 1.0f},
                  {inf, 1.0f, 0.0f},
                  {-inf, -1.0f, 0.0f},
                  {1e20f, 1.0f, 0.0f},
                  {-1e20f, -1.0f, 0.0f},
                  {qnan, qnan, qnan}});
}

TEST_CASE("sigmoid: forward, gradient, no overflow in the tails", "[ops]") {
  const ops::sigmoid op;
  check_forward(op, test::ref::sigmoid, test::uniform(257, -80, 80, 22), one_libm);
  check_forward(op, test::ref::sigmoid, test::uniform(37, -4, 4, 23), one_libm);
  check_backward(op, test::ref::sigmoid, test::uniform(257, -30, 30, 24), from_y);
  check_special_lanes(op, from_y);
  check_rows(op, {{0.0f, 0.5f, 0.25f},
                  {-0.0f, 0.5f, 0.25f},
                  {inf, 1.0f, 0.0f},
                  {-inf, 0.0f, 0.0f},
                  {1e20f, 1.0f, 0.0f},
                  {-1e20f, 0.0f, 0.0f},
                  {-200.0f, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
  // full relative precision in the lower tail: 1 / (1 + e^80) is 1.8e-35, not 0
  CHECK_THAT(op.forward(-80.0f), WithinULP(static_cast<float>(test::ref::sigmoid(-80.0)), 4));
}

TEST_CASE("relu: forward, gradient, relu'(0) = 0, NaN kept", "[ops]") {
  const ops::relu op;
  const auto xs = test::uniform(257, -1e3, 1e3, 25);
  check_forward(op, test::ref::relu, xs, piecewise);
  check_backward(op, test::ref::relu, xs, piecewise, {0.0});
  check_special_lanes(op, piecewise);
  check_rows(op, {{1.5f, 1.5f, 1.0f},
                  {-1.5f, 0.0f, 0.0f},
                  {0.0f, 0.0f, 0.0f},
                  {-0.0f, 0.0f, 0.0f},  // relu(-0) = +0
                  {inf, inf, 1.0f},
                  {-inf, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
}

TEST_CASE("leaky_relu: forward, gradient, kink, negative_slope member", "[ops]") {
  const auto xs = test::uniform(257, -1e3, 1e3, 26);
  const ops::leaky_relu op;  // negative_slope = 0.01
  check_forward(op, [](double x) { return test::ref::leaky_relu(x, 0.01f); }, xs, piecewise);
  check_backward(op, [](double x) { return test::ref::leaky_relu(x, 0.01f); }, xs, piecewise, {0.0});
  check_special_lanes(op, piecewise);
  check_rows(op, {{2.0f, 2.0f, 1.0f},
                  {0.0f, 0.0f, 0.01f},  // the gradient at 0 is the slope, as in PyTorch
                  {-0.0f, -0.0f, 0.01f},
                  {inf, inf, 1.0f},
                  {-inf, -inf, 0.01f},
                  {qnan, qnan, qnan}});
  const ops::leaky_relu steep{0.25f};
  check_forward(steep, [](double x) { return test::ref::leaky_relu(x, 0.25); }, xs, piecewise);
  check_backward(steep, [](double x) { return test::ref::leaky_relu(x, 0.25); }, xs, piecewise, {0.0});
  check_rows(steep, {{-4.0f, -1.0f, 0.25f}, {4.0f, 4.0f, 1.0f}, {qnan, qnan, qnan}});
}

TEST_CASE("elu: forward, gradient, alpha member", "[ops]") {
  const auto xs = test::uniform(257, -20, 20, 27);
  const ops::elu op;  // alpha = 1
  check_forward(op, [](double x) { return test::ref::elu(x); }, xs, one_libm);
  check_backward(op, [](double x) { return test::ref::elu(x); }, xs, one_libm, {0.0});
  check_special_lanes(op, one_libm);
  check_rows(op, {{0.0f, 0.0f, 1.0f},
                  {-0.0f, -0.0f, 1.0f},
                  {inf, inf, 1.0f},
                  {-inf, -1.0f, 0.0f},
                  {-1e20f, -1.0f, 0.0f},
                  {1e20f, 1e20f, 1.0f},
                  {qnan, qnan, qnan}});
  const ops::elu half{0.5f};
  check_forward(half, [](double x) { return test::ref::elu(x, 0.5); }, xs, one_libm);
  check_backward(half, [](double x) { return test::ref::elu(x, 0.5); }, xs, one_libm, {0.0});
  check_rows(half, {{0.0f, 0.0f, 0.5f}, {-inf, -0.5f, 0.0f}, {2.0f, 2.0f, 1.0f}, {qnan, qnan, qnan}});
}

TEST_CASE("gelu: forward, gradient, exact in the lower tail", "[ops]") {
  const ops::gelu op;
  check_forward(op, test::ref::gelu, test::uniform(257, -3, 3, 28), gelu_core);
  check_forward(op, test::ref::gelu, test::uniform(257, -13, 13, 29), gelu_tail);
  check_backward(op, test::ref::gelu, test::uniform(257, -8, 8, 30), cancelling_grad);
  check_special_lanes(op, gelu_tail);
  check_rows(op, {{0.0f, 0.0f, 0.5f},
                  {-0.0f, -0.0f, 0.5f},
                  {inf, inf, 1.0f},
                  {-inf, 0.0f, 0.0f},
                  {1e20f, 1e20f, 1.0f},
                  {-1e20f, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
  // x Phi(x) keeps its relative precision where 1 + erf(x / sqrt 2) cancels (to 0 in float at -6)
  CHECK_THAT(op.forward(-6.0f), WithinRel(test::ref::gelu(-6.0), 1e-5));
}

TEST_CASE("gelu_tanh: forward, gradient, the tanh approximation without cancellation", "[ops]") {
  const ops::gelu_tanh op;
  check_forward(op, test::ref::gelu_tanh, test::uniform(257, -3, 3, 31), gelu_tanh_core);
  check_forward(op, test::ref::gelu_tanh, test::uniform(257, -13, 13, 32), gelu_tail);
  check_backward(op, test::ref::gelu_tanh, test::uniform(257, -8, 8, 33), cancelling_grad);
  check_special_lanes(op, gelu_tail);
  check_rows(op, {{0.0f, 0.0f, 0.5f},
                  {-0.0f, -0.0f, 0.5f},
                  {inf, inf, 1.0f},
                  {-inf, 0.0f, 0.0f},
                  {1e20f, 1e20f, 1.0f},
                  {-1e20f, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
  // close to the exact gelu, as the approximation should be (PyTorch documents ~1e-3)
  for (float x : test::uniform(101, -6, 6, 34)) CHECK_THAT(op.forward(x), WithinAbs(test::ref::gelu(x), 1e-3));
}

TEST_CASE("silu: forward, gradient, special values", "[ops]") {
  const ops::silu op;
  check_forward(op, test::ref::silu, test::uniform(257, -85, 85, 35), silu_value);
  check_backward(op, test::ref::silu, test::uniform(257, -40, 40, 36), cancelling_grad);
  check_special_lanes(op, silu_value);
  check_rows(op, {{0.0f, 0.0f, 0.5f},
                  {-0.0f, -0.0f, 0.5f},
                  {inf, inf, 1.0f},
                  {-inf, 0.0f, 0.0f},
                  {1e20f, 1e20f, 1.0f},
                  {-1e20f, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
}

TEST_CASE("softplus: forward, gradient, threshold, beta member", "[ops]") {
  const auto xs = test::uniform(257, -85, 85, 37);
  const ops::softplus op;  // beta = 1, threshold = 20
  const auto ref = [](double x) { return test::ref::softplus(x); };
  check_forward(op, ref, xs, one_libm);
  check_backward(op, ref, xs, one_libm, {20.0});
  check_special_lanes(op, one_libm);
  check_rows(op, {{inf, inf, 1.0f},
                  {-inf, 0.0f, 0.0f},
                  {30.0f, 30.0f, 1.0f},  // linear above the threshold
                  {1e20f, 1e20f, 1.0f},
                  {-1e20f, 0.0f, 0.0f},
                  {qnan, qnan, qnan}});
  const ops::softplus sharp{2.0f, 10.0f};
  const auto ref2 = [](double x) { return test::ref::softplus(x, 2.0, 10.0); };
  check_forward(sharp, ref2, xs, one_libm);
  check_backward(sharp, ref2, xs, one_libm, {5.0});
  check_rows(sharp, {{5.5f, 5.5f, 1.0f}, {-inf, 0.0f, 0.0f}, {qnan, qnan, qnan}});
}

// ---- gradients from the output ----------------------------------------------------------

static_assert(ops::DifferentiableFromOutput<ops::relu> && ops::ZeroAtZero<ops::relu>);
static_assert(ops::DifferentiableFromOutput<ops::sigmoid> && ops::ZeroAtZero<ops::sigmoid>);
static_assert(ops::DifferentiableFromOutput<ops::tanh> && !ops::ZeroAtZero<ops::tanh>);  // tanh'(0) = 1
static_assert(!ops::DifferentiableFromOutput<ops::gelu> && !ops::DifferentiableFromOutput<ops::leaky_relu>);
static_assert(ops::gradient_from_output<ops::sigmoid>::flops == ops::sigmoid::flops);
static_assert(ops::gradient_from_output<ops::relu, true>::flops == ops::relu::flops + ops::dropout::flops);

namespace {

/// Bitwise equality of doubles, NaN matching NaN.
bool same64(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

/// Inputs x and upstream gradients g: a sweep with random g, then every special x against
/// every special g (NaN, +-inf, +-0, huge).
struct grad_points {
  std::vector<float> xs, gs;
  explicit grad_points(double lo, double hi, std::uint32_t seed) {
    xs = test::uniform(257, lo, hi, seed);
    gs = test::uniform(257, -2.0, 2.0, seed + 1);
    const std::vector<float> special_g = {1.5f, -0.75f, 0.0f, -0.0f, inf, -inf, qnan, 1e30f};
    for (float x : test::special_values())
      for (float g : special_g) {
        xs.push_back(x);
        gs.push_back(g);
      }
  }
};

/// backward_from_output(y, g) against backward<0>(x, y, g) at y = forward(x), bit for bit, on
/// float, double and batch lanes.
template <class Op>
[[gnu::noinline]] void check_from_output(const Op& op, const grad_points& p) {
  const auto from_y = on_lanes([&](const vecf& x, const vecf& g) { return op.backward_from_output(op.forward(x), g); }, p.xs, p.gs);
  const auto from_x = on_lanes([&](const vecf& x, const vecf& g) { return op.template backward<0>(x, op.forward(x), g); }, p.xs, p.gs);
  for (std::size_t i = 0; i < p.xs.size(); ++i) {
    const float x = p.xs[i], g = p.gs[i];
    CAPTURE(x, g);
    const float y = op.forward(x);
    CHECK(same(op.backward_from_output(y, g), op.template backward<0>(x, y, g)));
    const double y64 = op.forward(double(x));
    CHECK(same64(op.backward_from_output(y64, double(g)), op.template backward<0>(double(x), y64, double(g))));
    CHECK(same(from_y[i], from_x[i]));
    // the map node's op gives the same
    CHECK(same(ops::gradient_from_output<Op>{op}.forward(y, g), op.backward_from_output(y, g)));
  }
}

/// With a dropout after the op: backward_from_output(y, g, scale) at y = keep ? scale f(x) : 0
/// against the mask-regenerating chain, the op's backward of keep ? g scale : 0 (dropout's
/// backward first). A zero y gives +0 whatever g holds: dropped elements (+0 from the mask too,
/// but for a NaN x, whose NaN the op's backward keeps) and kept ones where f'(x) = 0 (the chain
/// gives a zero too, or NaN from inf * 0 where g is not finite). Other kept elements give the
/// chain within `t` (bitwise where t.ulps is 0).
template <class Op>
[[gnu::noinline]] void check_from_output_dropout(const Op& op, const grad_points& p, float scale, tolerance t) {
  const ops::dropout drop{scale};
  const auto keep = [](std::size_t i) { return i % 3 != 0; };
  std::vector<float> ys(p.xs.size());
  for (std::size_t i = 0; i < p.xs.size(); ++i) ys[i] = drop.forward(keep(i), op.forward(p.xs[i]));
  const auto lanes = on_lanes([&](const vecf& y, const vecf& g) { return op.backward_from_output(y, g, vecf(scale)); }, ys, p.gs);
  for (std::size_t i = 0; i < p.xs.size(); ++i) {
    const float x = p.xs[i], g = p.gs[i], y = ys[i];
    CAPTURE(x, g, y, keep(i));
    const float got = op.backward_from_output(y, g, scale);
    CHECK(same(lanes[i], got));
    CHECK(same(ops::gradient_from_output<Op, true>{op, scale}.forward(y, g), got));
    const float chain = op.template backward<0>(x, op.forward(x), drop.backward<1>(keep(i), op.forward(x), y, g));
    if (y == 0.0f) {
      CHECK(same(got, 0.0f));
      if (keep(i) && std::isfinite(g)) CHECK(chain == 0.0f);
      continue;
    }
    if (t.ulps == 0 || !std::isfinite(g))
      CHECK(same(got, chain));
    else
      check_near(got, chain, {t.ulps, t.abs * std::fabs(g * scale)});
  }
}

}  // namespace

TEST_CASE("relu, sigmoid, tanh: the gradient from the output is backward's, bit for bit", "[ops]") {
  check_from_output(ops::relu{}, grad_points(-1e3, 1e3, 40));
  check_from_output(ops::sigmoid{}, grad_points(-30, 30, 42));
  check_from_output(ops::tanh{}, grad_points(-8, 8, 44));
}

TEST_CASE("relu, sigmoid: the gradient from the output after a dropout", "[ops]") {
  for (float scale : {1.0f / 0.9f, 2.0f, 1.0f / 0.3f}) {
    CAPTURE(scale);
    // relu: g scale or 0 selected by y's sign, exactly as the mask and x select them
    check_from_output_dropout(ops::relu{}, grad_points(-1e3, 1e3, 46), scale, {0, 0.0});
    // sigmoid: s = y / scale recovers sigmoid(x) to an ulp, which 1 - s turns into up to
    // 2 eps absolute where s is near 1 (from_y, twice over: y's rounding and the division's)
    check_from_output_dropout(ops::sigmoid{}, grad_points(-30, 30, 48), scale, {16, 2 * eps});
  }
}
