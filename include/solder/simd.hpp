// simd.hpp: the small math vocabulary every op is written in, for scalars and (through
// eval/cpu/batch.hpp) xsimd batches; the scalar half is host+device code.
//
// Ops call `simd::exp(x)`, `simd::select(m, a, b)`, ... with V = float, double or an
// xsimd::batch. Each function forwards to `simd::vocab<V>`, a class template specialized per
// value type, so the batch specialization can live in a CPU-only header that nvcc never sees
// (specializations are found at instantiation, unlike overloads of a qualified name).
#pragma once

#include <math.h>

#include <cstddef>
#include <type_traits>

#include "solder/config.hpp"

namespace solder::simd {

/// The per-value-type implementation; see the float and double specializations below.
template <class V>
struct vocab;

/// The scalar type of V: float for float and for xsimd::batch<float, A>.
template <class V>
using scalar_t = typename vocab<V>::scalar;

/// The elements V holds: 1 for a scalar, the lanes of a batch.
template <class V>
inline constexpr std::size_t lanes = sizeof(V) / sizeof(scalar_t<V>);

/// The mask type comparisons of V produce: bool for scalars, xsimd::batch_bool for batches.
template <class V>
using mask_t = typename vocab<V>::mask;

// NaN and Inf rules of the vocabulary (tests check each of them on every backend):
// - exp, log, sqrt, tanh, erf, erfc, expm1, log1p follow IEEE/C99 Annex F (exp(-inf) = 0,
//   log(0) = -inf, log(x < 0) = NaN, sqrt(-1) = NaN, tanh(+-inf) = +-1, expm1(-0) = -0),
//   with one exception on batches: xsimd's exp returns 0 where the result is below FLT_MIN
//   (x < -87.3 in float), glibc and CUDA a subnormal.
// - max and min propagate NaN from either operand (as torch.maximum does); std::max and
//   the x86 max instruction do not agree with each other, so neither is used bare.
// - select(m, a, b) takes a where m holds and b elsewhere, whatever a and b contain.
// - Comparisons: a NaN operand makes <, <=, >, >=, == false on every value type. Do not use
//   a != b on batches: xsimd 8 compiles it as an ordered compare, false where either is NaN
//   (scalar != is true there); write !(a == b) for IEEE inequality and isnan(x) for x != x.
// - The composites (max, min, rsqrt, sign, keep_nan, sigmoid, softplus) are written once from
//   these primitives, so every value type gets the same NaN/Inf behaviour; each states its rule.

/// neg(x) = -x by flipping the sign bit: neg(+0) = -0 on every target (xsimd's AVX-512
/// negation computes 0 - x, which gives +0; its AVX one flips the bit). Ops negate with this.
template <class V> SOLDER_HD SOLDER_INLINE V neg(const V& x) { return vocab<V>::neg(x); }
template <class V> SOLDER_HD SOLDER_INLINE V abs(const V& x) { return vocab<V>::abs(x); }
template <class V> SOLDER_HD SOLDER_INLINE V exp(const V& x) { return vocab<V>::exp(x); }
template <class V> SOLDER_HD SOLDER_INLINE V expm1(const V& x) { return vocab<V>::expm1(x); }
template <class V> SOLDER_HD SOLDER_INLINE V log(const V& x) { return vocab<V>::log(x); }
template <class V> SOLDER_HD SOLDER_INLINE V log1p(const V& x) { return vocab<V>::log1p(x); }
template <class V> SOLDER_HD SOLDER_INLINE V sqrt(const V& x) { return vocab<V>::sqrt(x); }
template <class V> SOLDER_HD SOLDER_INLINE V tanh(const V& x) { return vocab<V>::tanh(x); }
template <class V> SOLDER_HD SOLDER_INLINE V erf(const V& x) { return vocab<V>::erf(x); }
/// erfc(x) = 1 - erf(x), accurate where erf(x) is near -1 (erfc(+inf) = 0, erfc(-inf) = 2).
template <class V> SOLDER_HD SOLDER_INLINE V erfc(const V& x) { return vocab<V>::erfc(x); }
/// fma(a, b, c) = a * b + c rounded once, on every target and in host and device code alike
/// (::fmaf / ::fma: the instruction, or libm's exact emulation where there is none). Where bits
/// must agree between compilers, write the fma out: nvcc contracts a * b + c into one fma by
/// default, GCC does in C++ where the target has the instruction (-march with FMA), and a host
/// without it does not, so an unwritten contraction differs between the device and the CPU.
template <class V> SOLDER_HD SOLDER_INLINE V fma(const V& a, const V& b, const V& c) { return vocab<V>::fma(a, b, c); }
template <class V> SOLDER_HD SOLDER_INLINE mask_t<V> isnan(const V& x) { return vocab<V>::isnan(x); }
template <class V>
SOLDER_HD SOLDER_INLINE V select(const mask_t<V>& m, const V& a, const V& b) {
  return vocab<V>::select(m, a, b);
}
/// load<V>(p): the V at p (one scalar, or a batch's consecutive elements; p need not be
/// aligned). store(p, v) writes it back. Element bodies (ops/optimizer.hpp) load and store
/// through these, so one body serves the CPU's vectors and a CUDA thread's float.
template <class V>
SOLDER_HD SOLDER_INLINE V load(const scalar_t<V>* p) {
  return vocab<V>::load(p);
}
template <class V>
SOLDER_HD SOLDER_INLINE void store(scalar_t<V>* p, const V& v) {
  vocab<V>::store(p, v);
}
// The composites below call the vocabulary qualified (simd::select, not select): for an
// xsimd batch, an unqualified call would also find xsimd's own functions by argument-dependent
// lookup and prefer them, and xsimd::max does not propagate NaN.

/// max(a, b): NaN if either is NaN; max(-0, +0) = -0 and max(+0, -0) = +0 (the first
/// operand wins a tie).
template <class V>
SOLDER_HD SOLDER_INLINE V max(const V& a, const V& b) {
  return simd::select(simd::isnan(a) || simd::isnan(b), a + b, simd::select(a < b, b, a));
}
/// min(a, b): NaN if either is NaN; the first operand wins a tie.
template <class V>
SOLDER_HD SOLDER_INLINE V min(const V& a, const V& b) {
  return simd::select(simd::isnan(a) || simd::isnan(b), a + b, simd::select(b < a, b, a));
}
/// 1 / sqrt(x), exact to rounding (no approximate reciprocal instruction: results must not
/// depend on the target).
template <class V> SOLDER_HD SOLDER_INLINE V rsqrt(const V& x) { return V(1) / simd::sqrt(x); }

/// sign(x) = -1, 0 or 1; sign(+-0) = +-0 and sign(NaN) = NaN, so `g * sign(x)` is the
/// gradient of |x| with |x|'(0) = 0 that keeps a NaN input visible.
template <class V>
SOLDER_HD SOLDER_INLINE V sign(const V& x) {
  return simd::select(V(0) < x, V(1), simd::select(x < V(0), V(-1), x));
}
/// keep_nan(x, v) = v, except NaN where x is NaN: how a piecewise gradient (relu, clamp)
/// reports a NaN input instead of replacing it by the gate's 0.
template <class V>
SOLDER_HD SOLDER_INLINE V keep_nan(const V& x, const V& v) {
  return simd::select(simd::isnan(x), x, v);
}

/// The logistic function s(x) = 1 / (1 + exp(-x)) and its slope s(x) (1 - s(x)).
template <class V>
struct logistic {
  V value;
  V slope;
};
/// s(x) and s'(x) from one exp of -|x|, so neither overflows nor cancels: both keep their
/// relative precision in both tails (the slope at 30 is 9.4e-14, where 1 - s(30) rounds to
/// 0 in float). s(+inf) = 1, s(-inf) = 0, s'(+-inf) = 0; NaN gives NaN in both. Results
/// below FLT_MIN (x < -87) may be flushed to 0 by a batch exp.
template <class V>
SOLDER_HD SOLDER_INLINE logistic<V> sigmoid_with_slope(const V& x) {
  const V e = simd::exp(simd::neg(simd::abs(x)));  // in (0, 1]: never overflows
  const V r = V(1) / (V(1) + e);
  return {simd::select(V(0) <= x, r, e * r), e * r * r};
}
/// sigmoid(x) = 1 / (1 + exp(-x)); range and NaN rule as sigmoid_with_slope.
template <class V>
SOLDER_HD SOLDER_INLINE V sigmoid(const V& x) {
  return simd::sigmoid_with_slope(x).value;
}
/// softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), which never overflows:
/// softplus(+inf) = +inf, softplus(-inf) = 0, softplus(NaN) = NaN.
template <class V>
SOLDER_HD SOLDER_INLINE V softplus(const V& x) {
  return simd::max(x, V(0)) + simd::log1p(simd::exp(simd::neg(simd::abs(x))));
}

template <>
struct vocab<float> {
  using scalar = float;
  using mask = bool;
  SOLDER_HD static float neg(float x) { return -x; }
  SOLDER_HD static float abs(float x) { return ::fabsf(x); }
  SOLDER_HD static float exp(float x) { return ::expf(x); }
  SOLDER_HD static float expm1(float x) { return ::expm1f(x); }
  SOLDER_HD static float log(float x) { return ::logf(x); }
  SOLDER_HD static float log1p(float x) { return ::log1pf(x); }
  SOLDER_HD static float sqrt(float x) { return ::sqrtf(x); }
  SOLDER_HD static float tanh(float x) { return ::tanhf(x); }
  SOLDER_HD static float erf(float x) { return ::erff(x); }
  SOLDER_HD static float erfc(float x) { return ::erfcf(x); }
  SOLDER_HD SOLDER_INLINE static float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
  SOLDER_HD static bool isnan(float x) { return x != x; }
  SOLDER_HD static float select(bool m, float a, float b) { return m ? a : b; }
  SOLDER_HD SOLDER_INLINE static float load(const float* p) { return *p; }
  SOLDER_HD SOLDER_INLINE static void store(float* p, float v) { *p = v; }
};

template <>
struct vocab<double> {
  using scalar = double;
  using mask = bool;
  SOLDER_HD static double neg(double x) { return -x; }
  SOLDER_HD static double abs(double x) { return ::fabs(x); }
  SOLDER_HD static double exp(double x) { return ::exp(x); }
  SOLDER_HD static double expm1(double x) { return ::expm1(x); }
  SOLDER_HD static double log(double x) { return ::log(x); }
  SOLDER_HD static double log1p(double x) { return ::log1p(x); }
  SOLDER_HD static double sqrt(double x) { return ::sqrt(x); }
  SOLDER_HD static double tanh(double x) { return ::tanh(x); }
  SOLDER_HD static double erf(double x) { return ::erf(x); }
  SOLDER_HD static double erfc(double x) { return ::erfc(x); }
  SOLDER_HD SOLDER_INLINE static double fma(double a, double b, double c) { return ::fma(a, b, c); }
  SOLDER_HD static bool isnan(double x) { return x != x; }
  SOLDER_HD static double select(bool m, double a, double b) { return m ? a : b; }
  SOLDER_HD SOLDER_INLINE static double load(const double* p) { return *p; }
  SOLDER_HD SOLDER_INLINE static void store(double* p, double v) { *p = v; }
};

}  // namespace solder::simd
