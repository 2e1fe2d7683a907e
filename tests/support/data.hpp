// tests/support/data.hpp: seeded test data: reproducible values in a range, kept away from
// kinks when asked, small integers whose sums are exact in float, and the dropout keep mask
// those values are dropped by; tensors of a test's shape, and bitwise comparison of results.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <random>
#include <type_traits>

#include "solder/random/philox.hpp"
#include "solder/tensor.hpp"

namespace solder::test {

/// A zero-filled tensor of shape S, with `batch` rows when S is dynamic.
template <class S>
tensor<float, S> make(std::size_t batch) {
  if constexpr (S::dynamic)
    return tensor<float, S>(batch);
  else
    return tensor<float, S>();
}

/// Elements where two results differ in any bit.
inline std::size_t bit_differences(const float* a, const float* b, std::size_t n) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < n; ++i) d += std::memcmp(a + i, b + i, sizeof(float)) != 0;
  return d;
}

/// Elements where two results differ in any bit, except that any two NaNs are equal: which NaN
/// an operation with two NaN operands returns (on x86 the first source's, sign included)
/// depends on the operand order the compiler picks for a commutative instruction such as an FMA.
inline std::size_t bit_differences_any_nan(const float* a, const float* b, std::size_t n) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < n; ++i) d += !(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(a + i, b + i, sizeof(float)) != 0;
  return d;
}

/// Elements where b is not a's value within 4e-6 relative, with a 1e-6 floor for results near
/// 0 of operands near 1 (NaN and infinities must match exactly): for results that pass through
/// exp, tanh or erf (libm, xsimd and CUDA differ by a few ulp) or a * b + c (one fused
/// multiply-add or two roundings, as the compiler contracts it), which agree to a few ulp.
inline std::size_t ulp_differences(const float* a, const float* b, std::size_t n) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isinf(a[i]))
      d += std::memcmp(a + i, b + i, sizeof(float)) != 0;
    else
      d += !(std::fabs(double(a[i]) - double(b[i])) <= 4e-6 * std::fabs(double(a[i])) + 1e-6);
  }
  return d;
}

namespace detail {
/// The element type of a range (a tensor, a tensor_ref, a std::vector).
template <class R>
using element_t = std::remove_reference_t<decltype(*std::begin(std::declval<R&>()))>;

/// One value uniform in [lo, hi) from 24 bits of mt19937 output, mapped by hand: the standard
/// fixes mt19937's sequence but not uniform_real_distribution's, so every platform agrees.
inline double draw(std::mt19937& gen, double lo, double hi) { return lo + (hi - lo) * double(gen() >> 8) * 0x1p-24; }
}  // namespace detail

/// Fills t with values uniform in [lo, hi), the same on every platform for a given seed.
template <class R>
void fill_uniform(R&& t, double lo, double hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  for (auto& v : t) v = static_cast<detail::element_t<R>>(detail::draw(gen, lo, hi));
}

/// As fill_uniform, but every value at least `margin` from each point of `kinks` (redrawn until
/// it is): a finite difference of half-width < margin then never straddles a kink.
template <class R>
void fill_away(R&& t, double lo, double hi, std::uint32_t seed, std::initializer_list<double> kinks, double margin) {
  std::mt19937 gen(seed);
  for (auto& v : t) {
    double x;
    bool near;
    do {
      x = static_cast<detail::element_t<R>>(detail::draw(gen, lo, hi));
      near = false;
      for (double k : kinks) near = near || std::fabs(x - k) < margin;
    } while (near);
    v = static_cast<detail::element_t<R>>(x);
  }
}

/// Fills t with integers uniform in [lo, hi]. While every partial sum stays below 2^24 in
/// magnitude, float sums of them are exact in any order: reductions can be compared bitwise.
template <class R>
void fill_integers(R&& t, int lo, int hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  const std::uint32_t span = std::uint32_t(hi - lo + 1);
  for (auto& v : t) v = static_cast<detail::element_t<R>>(lo + int(gen() % span));
}

/// The dropout rule as expr/random.hpp states it: p is rounded to t / 65536, t = round(p * 65536);
/// element i of stream (seed, offset) is kept when its 16 Philox bits (random::bits16, checked
/// against known answers in tests/random) reach t; kept elements are scaled by 1 / (1 - t / 65536).
struct dropout_rule {
  double p;
  std::uint64_t seed, offset;
  std::uint32_t rounds = solder::random::philox_default_rounds;  // the stream's Philox rounds
  /// p as the float the API takes, times 2^16, rounded half up.
  std::uint32_t threshold() const { return std::uint32_t(std::floor(double(float(p)) * 65536.0 + 0.5)); }
  bool keep(std::uint64_t i) const { return solder::random::bits16(seed, offset, i, rounds) >= threshold(); }
  /// The scale as the float the kernels multiply by.
  float scale() const { return float(65536.0 / (65536.0 - threshold())); }
};

}  // namespace solder::test
