// tests/expr/map.test.cpp: elementwise expressions through the fused CPU loop: every operator
// and named function against a double loop on static, rank-3 and dynamic shapes; broadcasting
// (also against xtensor); scalar operands; masks; NaN and Inf; aliasing; batch mismatches.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xtensor.hpp>

#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinULP;
using solder::dyn;
using solder::shape;
using solder::tensor;
namespace ref = solder::test::ref;

constexpr float infty = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

/// How close a float result must be to its double reference: within `ulps` of the reference
/// rounded to float, or within `abs` of it.
struct tolerance {
  std::uint64_t ulps;
  double abs;
};
/// + - * /, sqrt, abs, neg, min, max, clamp, relu, where, dropout, masks: one IEEE operation
/// (or none) per element, and a double reference of float operands rounded to float is that
/// same value (53 >= 2 * 24 + 2 bits, so double rounding is innocuous): results must be equal.
constexpr tolerance exact{0, 0.0};
/// exp, log, rsqrt, tanh, elu, leaky_relu: xsimd's and glibc's float functions are each within
/// 1 ulp (measured on [-6, 6]); 2 leaves room for the other backend.
constexpr tolerance libm{2, 0.0};
/// sigmoid, silu, softplus: an exp and 2-4 rounded steps around it; measured <= 3 ulps.
constexpr tolerance composite{6, 0.0};
/// gelu, gelu_tanh on [-4, 4]: for x < 0, Phi's argument is rounded to float and Phi's
/// condition number there (about x^2) magnifies that half ulp up to 16-fold; measured <= 21
/// ulps over 64K points (AVX-512 and AVX2); the absolute term covers the zero at x = 0.
constexpr tolerance conditioned{64, 1e-12};
/// exp(tanh(x)) * z: three results within 1 ulp each, tanh's error passed on 1:1 by exp.
constexpr tolerance chained{6, 0.0};
/// Special inputs: results below FLT_MIN may be flushed to 0 by a batch exp (ops/arithmetic.hpp),
/// and silu multiplies such a value by x (|x| <= 100 among the special inputs).
constexpr double flushed = 1e-35;

/// got meets want under t: NaN for NaN, the same infinity for an infinite (rounded) reference.
bool close(float got, double want, tolerance t) {
  const float w = static_cast<float>(want);
  if (std::isnan(w)) return std::isnan(got);
  if (std::isinf(w) || (t.ulps == 0 && t.abs == 0.0)) return got == w;
  return (WithinULP(w, t.ulps) || WithinAbs(want, t.abs)).match(got);
}

/// One assertion per tensor: every element close to want(i); the first mismatch is reported.
template <class Want>
void check_elements(const std::string& what, const float* got, std::size_t n, Want want, tolerance t) {
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < n; ++i) {
    const double w = want(i);
    if (close(got[i], w, t)) continue;
    if (bad++ == 0)
      first << std::setprecision(9) << "element " << i << ": got " << got[i] << ", want " << w << " (" << t.ulps
            << " ulps, abs " << t.abs << ")";
  }
  INFO(what << " over " << n << " elements; " << bad << " off; first: " << first.str());
  CHECK(bad == 0);
}

template <class S>
std::string shape_name(std::size_t batch) {
  return solder::to_string<S>(batch);
}

/// Every operator and named function, evaluated into tensors of shape S, against a double
/// loop over the same inputs. The writes are grouped into four fused passes (assign_all) to
/// keep this file's compile time down; each output is checked on its own.
template <class S>
void check_every_op(std::size_t batch) {
  auto x = make<S>(batch), z = make<S>(batch), pos = make<S>(batch);
  solder::test::fill_uniform(x, -4, 4, 101);
  solder::test::fill_away(z, -4, 4, 102, {0.0}, 0.25);  // a divisor away from 0
  solder::test::fill_uniform(pos, 0.01, 8, 103);        // the domain of log, sqrt, rsqrt
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; i += 5)  // ties, for == and the <=, >= edges
    if (std::fabs(x[i]) >= 0.25f) z[i] = x[i];
  const std::string at = " on " + shape_name<S>(batch);

  std::vector<tensor<float, S>> y(11, make<S>(batch));
  auto reset = [&] {
    for (auto& t : y) t.fill(qnan);  // an element a pass skips is caught
  };
  auto check = [&](const char* what, std::size_t k, auto want, tolerance t) {
    check_elements(what + at, y[k].data(), n, want, t);
  };
  auto X = [&](std::size_t i) { return double(x[i]); };
  auto Z = [&](std::size_t i) { return double(z[i]); };
  auto P = [&](std::size_t i) { return double(pos[i]); };
  using solder::write;

  // Operators; comparisons store 1 and 0.
  reset();
  solder::assign_all(write(y[0], x + z), write(y[1], x - z), write(y[2], x * z), write(y[3], x / z), write(y[4], -x),
                     write(y[5], x < z), write(y[6], x <= z), write(y[7], x > z), write(y[8], x >= z),
                     write(y[9], x == z), write(y[10], x != z));
  check("x + z", 0, [&](auto i) { return ref::add(X(i), Z(i)); }, exact);
  check("x - z", 1, [&](auto i) { return ref::sub(X(i), Z(i)); }, exact);
  check("x * z", 2, [&](auto i) { return ref::mul(X(i), Z(i)); }, exact);
  check("x / z", 3, [&](auto i) { return ref::div(X(i), Z(i)); }, exact);
  check("-x", 4, [&](auto i) { return ref::neg(X(i)); }, exact);
  check("x < z", 5, [&](auto i) { return X(i) < Z(i) ? 1.0 : 0.0; }, exact);
  check("x <= z", 6, [&](auto i) { return X(i) <= Z(i) ? 1.0 : 0.0; }, exact);
  check("x > z", 7, [&](auto i) { return X(i) > Z(i) ? 1.0 : 0.0; }, exact);
  check("x >= z", 8, [&](auto i) { return X(i) >= Z(i) ? 1.0 : 0.0; }, exact);
  check("x == z", 9, [&](auto i) { return X(i) == Z(i) ? 1.0 : 0.0; }, exact);
  check("x != z", 10, [&](auto i) { return X(i) != Z(i) ? 1.0 : 0.0; }, exact);

  // Named functions, first half.
  reset();
  solder::assign_all(write(y[0], solder::abs(x)), write(y[1], solder::exp(x)), write(y[2], solder::log(pos)),
                     write(y[3], solder::sqrt(pos)), write(y[4], solder::rsqrt(pos)), write(y[5], solder::tanh(x)),
                     write(y[6], solder::sigmoid(x)), write(y[7], solder::relu(x)),
                     write(y[8], solder::leaky_relu(x, 0.2f)));
  check("abs", 0, [&](auto i) { return ref::abs(X(i)); }, exact);
  check("exp", 1, [&](auto i) { return ref::exp(X(i)); }, libm);
  check("log", 2, [&](auto i) { return ref::log(P(i)); }, libm);
  check("sqrt", 3, [&](auto i) { return ref::sqrt(P(i)); }, exact);
  check("rsqrt", 4, [&](auto i) { return ref::rsqrt(P(i)); }, libm);
  check("tanh", 5, [&](auto i) { return ref::tanh(X(i)); }, libm);
  check("sigmoid", 6, [&](auto i) { return ref::sigmoid(X(i)); }, composite);
  check("relu", 7, [&](auto i) { return ref::relu(X(i)); }, exact);
  // The slope as the float the op holds, so the reference multiplies by the same number.
  check("leaky_relu", 8, [&](auto i) { return ref::leaky_relu(X(i), double(0.2f)); }, libm);

  // Named functions, second half.
  reset();
  solder::assign_all(write(y[0], solder::elu(x, 1.5f)), write(y[1], solder::gelu(x)), write(y[2], solder::gelu_tanh(x)),
                     write(y[3], solder::silu(x)), write(y[4], solder::softplus(x)),
                     write(y[5], solder::softplus(x, 2.0f, 3.0f)), write(y[6], solder::clamp(x, -1.0f, 2.5f)),
                     write(y[7], solder::minimum(x, z)), write(y[8], solder::maximum(x, z)));
  check("elu", 0, [&](auto i) { return ref::elu(X(i), 1.5); }, libm);
  check("gelu", 1, [&](auto i) { return ref::gelu(X(i)); }, conditioned);
  check("gelu_tanh", 2, [&](auto i) { return ref::gelu_tanh(X(i)); }, conditioned);
  check("silu", 3, [&](auto i) { return ref::silu(X(i)); }, composite);
  check("softplus", 4, [&](auto i) { return ref::softplus(X(i)); }, composite);
  check("softplus beta 2 threshold 3", 5, [&](auto i) { return ref::softplus(X(i), 2.0, 3.0); }, composite);
  check("clamp", 6, [&](auto i) { return ref::clamp(X(i), -1.0, 2.5); }, exact);
  check("minimum", 7, [&](auto i) { return ref::min(X(i), Z(i)); }, exact);
  check("maximum", 8, [&](auto i) { return ref::max(X(i), Z(i)); }, exact);

  // Selection, dropout, scalar operands on either side (integers become floats), chains.
  // Dropout: the mask of (seed, offset, row-major index) and the scale of the rounded p.
  const solder::test::dropout_rule rule1{0.1, 42, 7}, rule5{0.5, 43, 0};
  reset();
  solder::assign_all(write(y[0], solder::where(x > z, x, z * 2.0f)),
                     write(y[1], solder::dropout(x, 0.1f, solder::philox_state{42, 7})),
                     write(y[2], solder::dropout(x, 0.5f, solder::philox_state{43, 0})),
                     write(y[3], 2.0f * x + 1.0f), write(y[4], 1.5f - x), write(y[5], 1.0f / z), write(y[6], x / 4),
                     write(y[7], solder::where(x > 0.0f, 1.0f, x)), write(y[8], solder::maximum(0.5f, x)),
                     write(y[9], solder::exp(solder::tanh(x)) * z), write(y[10], solder::relu((x + 1.0f) * z)));
  check("where(x > z, x, 2 z)", 0, [&](auto i) { return X(i) > Z(i) ? X(i) : 2 * Z(i); }, exact);
  check("dropout p = 0.1", 1, [&](auto i) { return rule1.keep(i) ? double(x[i] * rule1.scale()) : 0.0; }, exact);
  check("dropout p = 0.5", 2, [&](auto i) { return rule5.keep(i) ? double(x[i] * rule5.scale()) : 0.0; }, exact);
  check("2 * x + 1", 3, [&](auto i) { return double(2.0f * x[i] + 1.0f); }, exact);  // 2 x is exact
  check("1.5 - x", 4, [&](auto i) { return 1.5 - X(i); }, exact);
  check("1 / z", 5, [&](auto i) { return 1.0 / Z(i); }, exact);
  check("x / 4", 6, [&](auto i) { return X(i) / 4; }, exact);
  check("where(x > 0, 1, x)", 7, [&](auto i) { return X(i) > 0 ? 1.0 : X(i); }, exact);
  check("maximum(0.5, x)", 8, [&](auto i) { return ref::max(0.5, X(i)); }, exact);
  check("exp(tanh(x)) * z", 9, [&](auto i) { return ref::exp(ref::tanh(X(i))) * Z(i); }, chained);
  check("relu((x + 1) * z)", 10, [&](auto i) { return ref::relu(double((x[i] + 1.0f) * z[i])); }, exact);
}

/// One expression per assignment (the plain `y = e;` path), on shape S: an arithmetic op of
/// two operands, and the ops a tail's padding lanes could upset (log(0) = -inf in the padding,
/// a mask, a dropout mask read past the segment).
template <class S>
void check_single_assignments(std::size_t batch) {
  auto x = make<S>(batch), z = make<S>(batch), y = make<S>(batch);
  solder::test::fill_uniform(x, -4, 4, 111);
  solder::test::fill_away(z, -4, 4, 112, {0.0}, 0.25);
  const std::string at = " on " + shape_name<S>(batch);
  y.fill(qnan);
  y = (x - 1.0f) / z;
  check_elements("y = (x - 1) / z" + at, y.data(), y.size(), [&](std::size_t i) { return double((x[i] - 1.0f) / z[i]); },
                 exact);
  y = solder::log(x);  // NaN for x < 0, and the tail's padding lanes go through log(0)
  check_elements("y = log(x)" + at, y.data(), y.size(), [&](std::size_t i) { return ref::log(double(x[i])); }, libm);
  y = x > 0.5f;
  check_elements("y = x > 0.5" + at, y.data(), y.size(), [&](std::size_t i) { return x[i] > 0.5f ? 1.0 : 0.0; }, exact);
  const solder::test::dropout_rule rule{0.25, 9, 2};
  y = solder::dropout(x, 0.25f, solder::philox_state{9, 2});
  check_elements("y = dropout(x)" + at, y.data(), y.size(),
                 [&](std::size_t i) { return rule.keep(i) ? double(x[i] * rule.scale()) : 0.0; }, exact);
}

}  // namespace

// The full list on a flat run with a tail ([3, 37]: 111 elements) and on a dynamic batch (up
// to 240 x 37 = 8880 elements: a run over several of the loop's segments, which are 256 or
// 4096 elements long); the other shapes get the tail-sensitive subset (the full list costs
// ~7 s of compile time per shape).
TEST_CASE("map: every operator and function matches a double loop", "[expr]") {
  check_every_op<shape<3, 37>>(1);
  check_single_assignments<shape<3, 37>>(1);
}

TEST_CASE("map: every operator and function with a dynamic batch", "[expr]") {
  const std::size_t batch = GENERATE(1, 3, 240);
  check_every_op<shape<dyn, 37>>(batch);
  check_single_assignments<shape<dyn, 37>>(batch);
}

TEMPLATE_TEST_CASE_SIG("map: single elements, exact vectors, long rows, several segments", "[expr]",
                       ((int B, int N), B, N), (1, 1), (1, 257), (4, 16), (17, 255)) {
  check_single_assignments<shape<B, N>>(1);
}

TEST_CASE("map: a rank-3 shape", "[expr]") { check_single_assignments<shape<2, 3, 5>>(1); }

// ---- broadcasting ----

namespace {

/// A copy of a solder tensor as an xtensor of the same extents (the batch filled in).
template <class S>
xt::xtensor<float, S::rank> to_xt(const tensor<float, S>& t) {
  std::array<std::size_t, S::rank> extents = S::extents;
  if constexpr (S::dynamic) extents[0] = t.batch();
  xt::xtensor<float, S::rank> out(extents);
  std::copy(t.begin(), t.end(), out.begin());
  return out;
}

/// Equal element for element (NaN where the other is NaN), in row-major order.
template <class S, class X>
void check_same_as_xt(const std::string& what, const tensor<float, S>& got, const X& want) {
  REQUIRE(want.size() == got.size());
  std::size_t bad = 0;
  auto w = want.begin();
  for (std::size_t i = 0; i < got.size(); ++i, ++w)
    if (!close(got[i], double(*w), exact)) ++bad;
  INFO(what << ": " << bad << " of " << got.size() << " elements differ from xtensor");
  CHECK(bad == 0);
}

template <int B, int N>
void check_bias_broadcast() {
  tensor<float, shape<B, N>> x, y;
  tensor<float, shape<N>> b;
  solder::test::fill_uniform(x, -2, 2, 201);
  solder::test::fill_uniform(b, -1, 1, 202);
  const std::string name = shape_name<shape<B, N>>(1);

  y = solder::relu(x + b);
  check_elements("relu(x + b) on " + name, y.data(), y.size(),
                 [&](std::size_t i) { return ref::relu(double(x[i] + b[i % N])); }, exact);
  check_same_as_xt("relu(x + b) on " + name, y, xt::eval(xt::maximum(to_xt(x) + to_xt(b), 0.0f)));

  y = b * (x - 1.0f);  // the bias first
  check_elements("b * (x - 1) on " + name, y.data(), y.size(),
                 [&](std::size_t i) { return double(b[i % N] * (x[i] - 1.0f)); }, exact);
  check_same_as_xt("b * (x - 1) on " + name, y, xt::eval(to_xt(b) * (to_xt(x) - 1.0f)));
}

}  // namespace

TEST_CASE("map: a bias [N] broadcast over the rows of [B, N]", "[expr]") {
  check_bias_broadcast<3, 37>();
  check_bias_broadcast<1, 257>();
  check_bias_broadcast<17, 255>();
  check_bias_broadcast<4, 16>();
}

TEST_CASE("map: a bias [N] over a dynamic batch", "[expr]") {
  constexpr std::size_t N = 37;
  const std::size_t batch = GENERATE(1, 5, 64);
  tensor<float, shape<dyn, N>> x(batch), y(batch);
  tensor<float, shape<N>> b;
  solder::test::fill_uniform(x, -2, 2, 211);
  solder::test::fill_uniform(b, -1, 1, 212);
  y = solder::relu(x + b);
  check_elements("relu(x + b) on " + shape_name<shape<dyn, N>>(batch), y.data(), y.size(),
                 [&](std::size_t i) { return ref::relu(double(x[i] + b[i % N])); }, exact);
  check_same_as_xt("relu(x + b), dynamic", y, xt::eval(xt::maximum(to_xt(x) + to_xt(b), 0.0f)));
  // [1, N] broadcasts over the batch as well.
  tensor<float, shape<1, N>> row;
  solder::test::fill_uniform(row, -1, 1, 213);
  y = x * row;
  check_same_as_xt("x * row, dynamic", y, xt::eval(to_xt(x) * to_xt(row)));
}

TEST_CASE("map: columns, rows and their outer combination", "[expr]") {
  constexpr int B = 17, N = 37;
  tensor<float, shape<B, N>> x, y;
  tensor<float, shape<B, 1>> col;
  tensor<float, shape<1, N>> row;
  solder::test::fill_uniform(x, -2, 2, 221);
  solder::test::fill_uniform(col, -1, 1, 222);
  solder::test::fill_uniform(row, -1, 1, 223);

  y = x - col;  // one value per row, splatted along it
  check_elements("x - col", y.data(), y.size(), [&](std::size_t i) { return double(x[i] - col[i / N]); }, exact);
  check_same_as_xt("x - col", y, xt::eval(to_xt(x) - to_xt(col)));

  y = col + row;  // neither operand has the output's shape
  check_elements("col + row", y.data(), y.size(), [&](std::size_t i) { return double(col[i / N] + row[i % N]); }, exact);
  check_same_as_xt("col + row", y, xt::eval(to_xt(col) + to_xt(row)));

  y = solder::where(col > row, x, col * row);
  check_same_as_xt("where(col > row, x, col * row)", y,
                   xt::eval(xt::where(to_xt(col) > to_xt(row), to_xt(x), to_xt(col) * to_xt(row))));
}

TEST_CASE("map: per-channel [C, 1, 1] and per-row [H, 1] over [C, H, W]", "[expr]") {
  constexpr int C = 3, H = 5, W = 37;
  tensor<float, shape<C, H, W>> x, y;
  tensor<float, shape<C, 1, 1>> scale, shift;
  tensor<float, shape<H, 1>> per_row;
  tensor<float, shape<W>> per_col;
  solder::test::fill_uniform(x, -2, 2, 231);
  solder::test::fill_uniform(scale, 0.5, 2, 232);
  solder::test::fill_uniform(shift, -1, 1, 233);
  solder::test::fill_uniform(per_row, -1, 1, 234);
  solder::test::fill_uniform(per_col, -1, 1, 235);

  // (x + shift) * scale: an add then a multiply, which no compiler contracts into an fma.
  y = (x + shift) * scale;
  check_elements("(x + shift) * scale", y.data(), y.size(),
                 [&](std::size_t i) { return double((x[i] + shift[i / (H * W)]) * scale[i / (H * W)]); }, exact);
  check_same_as_xt("(x + shift) * scale", y, xt::eval((to_xt(x) + to_xt(shift)) * to_xt(scale)));

  y = x - per_row;
  check_elements("x - per_row", y.data(), y.size(),
                 [&](std::size_t i) { return double(x[i] - per_row[(i / W) % H]); }, exact);
  check_same_as_xt("x - per_row", y, xt::eval(to_xt(x) - to_xt(per_row)));

  y = solder::maximum(x, per_col) / scale;
  check_same_as_xt("maximum(x, per_col) / scale", y, xt::eval(xt::maximum(to_xt(x), to_xt(per_col)) / to_xt(scale)));
}

TEST_CASE("map: assigning a smaller operand broadcasts it into the output", "[expr]") {
  tensor<float, shape<3, 37>> y;
  tensor<float, shape<37>> b;
  solder::test::fill_uniform(b, -1, 1, 245);
  y = b;
  check_elements("y = b", y.data(), y.size(), [&](std::size_t i) { return double(b[i % 37]); }, exact);
  tensor<float, shape<3, 37>> constructed = b * 2.0f;
  check_elements("tensor y = b * 2", constructed.data(), constructed.size(),
                 [&](std::size_t i) { return 2.0 * b[i % 37]; }, exact);
}

TEST_CASE("map: dropout with p = 0 keeps everything, with p = 1 nothing", "[expr]") {
  tensor<float, shape<3, 37>> x, y;
  solder::test::fill_uniform(x, -2, 2, 246);
  y = solder::dropout(x, 0.0f, solder::philox_state{1, 2});
  check_elements("dropout(x, 0)", y.data(), y.size(), [&](std::size_t i) { return double(x[i]); }, exact);
  y = solder::dropout(x, 1.0f, solder::philox_state{1, 2});
  check_elements("dropout(x, 1)", y.data(), y.size(), [](std::size_t) { return 0.0; }, exact);
}

TEST_CASE("map: scalar operands: numbers and rank-0 tensors", "[expr]") {
  tensor<float, shape<3, 37>> x, y;
  tensor<float, shape<>> s;
  solder::test::fill_uniform(x, -2, 2, 241);
  s[0] = 1.75f;
  y = (x - s) * s;
  check_elements("(x - s) * s", y.data(), y.size(), [&](std::size_t i) { return double((x[i] - 1.75f) * 1.75f); }, exact);
  check_same_as_xt("(x - s) * s", y, xt::eval((to_xt(x) - 1.75f) * 1.75f));

  // A rank-0 result: a scalar tensor assigned from scalar operands.
  tensor<float, shape<>> r;
  r = s * 2.0f + 1;
  CHECK(r[0] == 4.5f);
  r = solder::exp(s);
  CHECK_THAT(r[0], WithinULP(float(std::exp(1.75)), libm.ulps));
}

// ---- masks, NaN and Inf ----

TEST_CASE("map: masks are stored as 1 and 0", "[expr]") {
  tensor<float, shape<3, 37>> x, m;
  solder::test::fill_uniform(x, -1, 1, 301);
  x[5] = qnan;
  m = x > 0.0f;
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(m[i] == (x[i] > 0.0f ? 1.0f : 0.0f));
  m = x != x;  // true exactly at the NaN
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(m[i] == (i == 5 ? 1.0f : 0.0f));
  tensor<float, shape<3, 37>> constructed = x <= 0.0f;
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(constructed[i] == (x[i] <= 0.0f ? 1.0f : 0.0f));
}

TEST_CASE("map: NaN and Inf through every unary function, as the ops document", "[expr]") {
  // 33 special inputs (NaN, +-inf, +-0, subnormals, saturation points): two full vectors and
  // a tail on AVX-512, four and a tail on AVX2.
  const std::vector<float> sv = solder::test::special_values();
  REQUIRE(sv.size() == 33);
  tensor<float, shape<1, 33>> x, y;
  std::copy(sv.begin(), sv.end(), x.begin());
  auto check = [&](const char* what, auto want, tolerance t) {
    check_elements(what, y.data(), y.size(), [&](std::size_t i) { return want(double(sv[i])); }, {t.ulps, std::max(t.abs, flushed)});
  };
  y = -x;
  check("neg", [](double v) { return ref::neg(v); }, exact);
  y = solder::abs(x);
  check("abs", [](double v) { return ref::abs(v); }, exact);
  y = solder::exp(x);
  check("exp", [](double v) { return ref::exp(v); }, libm);
  y = solder::log(x);
  check("log", [](double v) { return ref::log(v); }, libm);
  y = solder::sqrt(x);
  check("sqrt", [](double v) { return ref::sqrt(v); }, exact);
  y = solder::rsqrt(x);
  check("rsqrt", [](double v) { return ref::rsqrt(v); }, libm);
  y = solder::tanh(x);
  check("tanh", [](double v) { return ref::tanh(v); }, libm);
  y = solder::sigmoid(x);
  check("sigmoid", [](double v) { return ref::sigmoid(v); }, composite);
  y = solder::relu(x);
  check("relu", [](double v) { return ref::relu(v); }, exact);
  y = solder::leaky_relu(x, 0.2f);
  check("leaky_relu", [](double v) { return ref::leaky_relu(v, double(0.2f)); }, libm);
  y = solder::elu(x);
  check("elu", [](double v) { return ref::elu(v); }, libm);
  y = solder::silu(x);
  check("silu", [](double v) { return ref::silu(v); }, composite);
  y = solder::softplus(x);
  check("softplus", [](double v) { return ref::softplus(v); }, composite);
  y = solder::clamp(x, -1.0f, 2.5f);
  check("clamp", [](double v) { return ref::clamp(v, -1.0, 2.5); }, exact);
  // gelu's x Phi(x) at x = -9 and -20 is below 1e-17, where its conditioning (x^2) leaves few
  // correct bits: those two are checked absolutely; NaN and Inf exactly as everywhere.
  y = solder::gelu(x);
  check("gelu", [](double v) { return ref::gelu(v); }, {conditioned.ulps, 1e-15});
  y = solder::gelu_tanh(x);
  check("gelu_tanh", [](double v) { return ref::gelu_tanh(v); }, {conditioned.ulps, 1e-15});

  // Signs of zeros the ops state: relu(-0) = +0, neg(+0) = -0, sqrt(-0) = -0.
  tensor<float, shape<1, 3>> zeros, out;
  zeros[0] = -0.0f;
  zeros[1] = 0.0f;
  zeros[2] = -0.0f;
  out = solder::relu(zeros);
  CHECK_FALSE(std::signbit(out[0]));
  out = -zeros;
  CHECK(std::signbit(out[1]));
  out = solder::sqrt(zeros);
  CHECK(std::signbit(out[2]));
  out = solder::rsqrt(zeros);
  CHECK(out[0] == -infty);
  CHECK(out[1] == infty);
}

TEST_CASE("map: NaN and Inf through the binary operators", "[expr]") {
  // Every pair of 8 values: x(i, j) = v[i], z(i, j) = v[j].
  const std::array<float, 8> v = {qnan, infty, -infty, 0.0f, -0.0f, 1.0f, -2.5f, 1e30f};
  tensor<float, shape<8, 8>> x, z, y;
  for (std::size_t i = 0; i < 8; ++i)
    for (std::size_t j = 0; j < 8; ++j) {
      x(i, j) = v[i];
      z(i, j) = v[j];
    }
  auto check = [&](const char* what, auto want) {
    check_elements(what, y.data(), y.size(), [&](std::size_t k) { return want(double(x[k]), double(z[k])); }, exact);
  };
  y = x + z;
  check("x + z", [](double a, double b) { return a + b; });
  y = x - z;
  check("x - z", [](double a, double b) { return a - b; });
  y = x * z;
  check("x * z", [](double a, double b) { return double(float(a) * float(b)); });
  y = x / z;  // x / 0 = +-infty, 0 / 0 = NaN
  check("x / z", [](double a, double b) { return double(float(a) / float(b)); });
  y = solder::minimum(x, z);  // NaN if either is NaN
  check("minimum", [](double a, double b) { return ref::min(a, b); });
  y = solder::maximum(x, z);
  check("maximum", [](double a, double b) { return ref::max(a, b); });
  // Comparisons with NaN are false, except !=.
  y = x < z;
  check("x < z", [](double a, double b) { return a < b ? 1.0 : 0.0; });
  y = x >= z;
  check("x >= z", [](double a, double b) { return a >= b ? 1.0 : 0.0; });
  y = x == z;  // -0 == +0
  check("x == z", [](double a, double b) { return a == b ? 1.0 : 0.0; });
  y = x != z;
  check("x != z", [](double a, double b) { return a != b ? 1.0 : 0.0; });
  // where takes the chosen operand only: a NaN in the other one never leaks.
  y = solder::where(x > z, x, z);
  check("where(x > z, x, z)", [](double a, double b) { return a > b ? a : b; });
  y = solder::where(x == x, x, qnan);
  check("where(x == x, x, NaN)", [](double a, double) { return a; });
}

TEST_CASE("map: several dropout streams in one pass each keep their own mask", "[expr]") {
  // A fused pass may read many masks (a chain of dropout layers, their backward); each must
  // be drawn from its own (seed, offset) stream, however many streams the pass reads.
  tensor<float, shape<4, 64>> x, y;
  x.fill(1.0f);
  const solder::philox_state s1{1, 0}, s2{2, 0}, s3{3, 0}, s4{4, 0}, s5{5, 0};
  auto want = [](std::size_t i, std::initializer_list<std::uint64_t> seeds) {
    double sum = 0;
    for (const std::uint64_t s : seeds) sum += solder::test::dropout_rule{0.5, s, 0}.keep(i) ? 2.0 : 0.0;
    return sum;
  };
  y = solder::dropout(x, 0.5f, s1) + solder::dropout(x, 0.5f, s2) + solder::dropout(x, 0.5f, s3);
  check_elements("three streams in one expression", y.data(), y.size(), [&](std::size_t i) { return want(i, {1, 2, 3}); },
                 exact);
  y = solder::dropout(x, 0.5f, s1) + solder::dropout(x, 0.5f, s2) + solder::dropout(x, 0.5f, s3) +
      solder::dropout(x, 0.5f, s4) + solder::dropout(x, 0.5f, s5);
  check_elements("five streams in one expression", y.data(), y.size(),
                 [&](std::size_t i) { return want(i, {1, 2, 3, 4, 5}); }, exact);
}

TEST_CASE("map: one stream read at two shapes in one pass", "[expr]") {
  // dropout(x, rng) [4, 64] times dropout(b, rng) [64] broadcast over the rows: element (r, c)
  // keeps by draw r * 64 + c of the stream and by draw c.
  tensor<float, shape<4, 64>> x, y;
  tensor<float, shape<64>> b;
  x.fill(1.0f);
  b.fill(1.0f);
  const solder::philox_state rng{7, 0};
  const solder::test::dropout_rule rule{0.5, 7, 0};
  y = solder::dropout(x, 0.5f, rng) * solder::dropout(b, 0.5f, rng);
  check_elements("dropout(x) * dropout(b), one stream", y.data(), y.size(),
                 [&](std::size_t i) { return rule.keep(i) && rule.keep(i % 64) ? 4.0 : 0.0; }, exact);
}

TEST_CASE("map: dropout removes NaN and Inf, and keeps them where kept", "[expr]") {
  tensor<float, shape<4, 257>> x, y;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = i % 2 ? qnan : -infty;
  const solder::test::dropout_rule rule{0.5, 3, 1};
  y = solder::dropout(x, 0.5f, solder::philox_state{3, 1});
  std::size_t kept = 0, bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (rule.keep(i)) {
      ++kept;
      bad += i % 2 ? !std::isnan(y[i]) : y[i] != -infty;
    } else {
      bad += y[i] != 0.0f || std::signbit(y[i]);  // +0, not NaN * 0
    }
  }
  CHECK(kept > 0);
  CHECK(kept < x.size());
  CHECK(bad == 0);
}

// ---- aliasing and errors ----

TEST_CASE("map: an output may also be an operand", "[expr]") {
  tensor<float, shape<17, 255>> y, before;
  tensor<float, shape<255>> b;
  solder::test::fill_uniform(y, -2, 2, 401);
  solder::test::fill_uniform(b, -1, 1, 402);
  before = y;
  y = y * 2.0f;
  check_elements("y = y * 2", y.data(), y.size(), [&](std::size_t i) { return 2.0 * before[i]; }, exact);
  y = solder::relu(y + b);  // broadcast operand next to the aliased one
  check_elements("y = relu(y + b)", y.data(), y.size(),
                 [&](std::size_t i) { return ref::relu(double(2.0f * before[i] + b[i % 255])); }, exact);
  tensor<float, shape<dyn, 37>> d(9), dbefore(9);
  solder::test::fill_uniform(d, -2, 2, 403);
  dbefore = d;
  d = (d - 1.0f) * d;
  check_elements("d = (d - 1) * d", d.data(), d.size(),
                 [&](std::size_t i) { return double((dbefore[i] - 1.0f) * dbefore[i]); }, exact);
}

TEST_CASE("map: mismatched batch sizes throw solder::error naming both", "[expr]") {
  using Catch::Matchers::Matches;
  using D = tensor<float, shape<dyn, 16>>;
  D a(6), b(9), y(6);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const solder::error& e) {
      return e.what();
    }
    return "(no solder::error)";
  };
  // Two operands of one expression.
  CHECK_THROWS_AS(a + b, solder::error);
  const std::string m1 = message([&] { (void)(a + b); });
  CHECK_THAT(m1, Matches(R"(.*\b6\b.*)") && Matches(R"(.*\b9\b.*)"));
  // An output and its expression.
  CHECK_THROWS_AS(y = solder::exp(b), solder::error);
  const std::string m2 = message([&] { y = solder::exp(b); });
  CHECK_THAT(m2, Matches(R"(.*\b6\b.*)") && Matches(R"(.*\b9\b.*)"));
  // Nested: the mismatch is found however deep the operands sit.
  CHECK_THROWS_AS(y = solder::relu(a * 2.0f) + solder::exp(b), solder::error);
  // Matching batches do not throw.
  CHECK_NOTHROW(y = a + a);
}
