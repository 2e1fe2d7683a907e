// tests/support/reference.hpp: double-precision scalar references for solder's ops, central
// finite differences, and the seeded and special inputs the op tests feed to every backend.
//
// The references are written from the textbook formulas with plain <cmath>, independently of
// include/solder (no simd vocabulary, no shared code), and return the mathematical limit where
// a formula would give inf * 0 (gelu(-inf) = 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

namespace solder::test {

/// f(p, kh, kw, ho, wo, r, c) for every tap of a convolution's windows over `planes` planes, in
/// that order, by the definition: the tap reads row r = ho S + kh D - P and column
/// c = wo S + kw D - P of plane p, outside the image where r or c is negative or too large.
template <class F>
void for_each_conv_tap(std::size_t planes, std::size_t Kh, std::size_t Kw, std::size_t Ho, std::size_t Wo,
                       std::size_t S, std::size_t P, std::size_t D, F&& f) {
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t kh = 0; kh < Kh; ++kh)
      for (std::size_t kw = 0; kw < Kw; ++kw)
        for (std::size_t ho = 0; ho < Ho; ++ho)
          for (std::size_t wo = 0; wo < Wo; ++wo)
            f(p, kh, kw, ho, wo, long(ho * S + kh * D) - long(P), long(wo * S + kw * D) - long(P));
}

/// Elements of c [M, N] farther from sum_k a(m, k) b(k, n) (in double) than the float dot
/// product's bound (K + 1) u sum_k |a b| (Higham 3.1), u = 2^-24: a product against a double loop.
template <class GetA, class GetB>
std::size_t product_errors(const float* c, std::size_t M, std::size_t N, std::size_t K, GetA a, GetB b) {
  constexpr double float_u = 0x1p-24;
  std::size_t bad = 0;
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      double sum = 0, mag = 0;
      for (std::size_t k = 0; k < K; ++k) {
        sum += double(a(m, k)) * double(b(k, n));
        mag += std::fabs(double(a(m, k)) * double(b(k, n)));
      }
      bad += !(std::fabs(double(c[m * N + n]) - sum) <= double(K + 1) * float_u * mag + 1e-30);
    }
  return bad;
}

/// f'(x) by central differences, (f(x + h) - f(x - h)) / (the step actually taken). Error:
/// h^2 |f'''| / 6 from truncation plus about eps |f| / h from rounding (fd_step balances them).
template <class F>
double central_diff(F&& f, double x, double h) {
  const double hi = x + h;
  const double lo = x - h;  // x +- h are rounded; dividing by hi - lo, not 2h, removes that bias
  return (f(hi) - f(lo)) / (hi - lo);
}

/// A step for central_diff at x: about cbrt(double epsilon), where truncation and rounding
/// error meet, scaled by |x| above 1 so the step stays far above x's own rounding.
inline double fd_step(double x) { return 6e-6 * std::max(1.0, std::abs(x)); }

/// Reference values in double. Parameter names and defaults match the op structs.
namespace ref {

inline double add(double a, double b) { return a + b; }
inline double sub(double a, double b) { return a - b; }
inline double mul(double a, double b) { return a * b; }
inline double div(double a, double b) { return a / b; }
inline double neg(double x) { return -x; }
inline double abs(double x) { return std::fabs(x); }
inline double exp(double x) { return std::exp(x); }
inline double log(double x) { return std::log(x); }
inline double sqrt(double x) { return std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

inline double tanh(double x) { return std::tanh(x); }
inline double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);  // NaN lands here and stays NaN
  return e / (1.0 + e);
}
inline double relu(double x) { return x > 0 || std::isnan(x) ? x : 0.0; }
inline double leaky_relu(double x, double negative_slope = 0.01) { return x > 0 ? x : negative_slope * x; }
inline double elu(double x, double alpha = 1.0) { return x > 0 ? x : alpha * std::expm1(x); }
/// x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 (no cancellation in double for x << 0).
inline double gelu(double x) {
  if (std::isinf(x)) return x > 0 ? x : 0.0;
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
/// x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as x / (1 + e^(-2u)) since
/// 1 + tanh(u) cancels to 0 in double for x < -5.
inline double gelu_tanh(double x) {
  if (std::isinf(x)) return x > 0 ? x : 0.0;
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}
inline double silu(double x) {
  if (std::isinf(x)) return x > 0 ? x : 0.0;
  return x / (1.0 + std::exp(-x));
}
inline double softplus(double x, double beta = 1.0, double threshold = 20.0) {
  const double bx = beta * x;
  if (bx > threshold) return x;
  const double lse = bx > 0 ? bx + std::log1p(std::exp(-bx)) : std::log1p(std::exp(bx));
  return lse / beta;
}

/// The first operand wins a tie (max(-0, +0) = -0), as solder's max and min document.
inline double max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? b : a;
}
inline double min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return b < a ? b : a;
}
inline double clamp(double x, double lo, double hi) {
  if (std::isnan(x)) return x;
  return std::min(std::max(x, lo), hi);
}

}  // namespace ref

/// n floats uniform in [lo, hi), from a seeded mt19937 (whose output the standard fixes, unlike
/// std::uniform_real_distribution's), so every platform tests the same points.
inline std::vector<float> uniform(std::size_t n, double lo, double hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> out(n);
  for (auto& v : out) v = static_cast<float>(lo + (hi - lo) * (gen() >> 8) * 0x1p-24);
  return out;
}

/// Inputs every op is fed on every backend: NaN, +-inf, +-0, subnormals, the edges of float's
/// range and the points where float exp, tanh and sigmoid saturate. 33 values, so a batch of 8
/// or 16 lanes ends in a partial tail.
inline std::vector<float> special_values() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float big = std::numeric_limits<float>::max();
  constexpr float tiny = std::numeric_limits<float>::min();
  constexpr float sub = std::numeric_limits<float>::denorm_min();
  return {std::numeric_limits<float>::quiet_NaN(),
          inf,   -inf,  0.0f,   -0.0f,   sub,    -sub,    tiny,   -tiny, 1e-30f, -1e-30f,
          0.5f,  -0.5f, 1.0f,   -1.0f,   9.0f,   -9.0f,   20.0f,  -20.0f, 88.0f, -88.0f,
          90.0f, -90.0f, 100.0f, -100.0f, 1e4f, -1e4f,   1e20f,  -1e20f, big,   -big,   3.0f, -3.0f};
}

}  // namespace solder::test
