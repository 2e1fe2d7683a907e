// eval/cpu/batch.hpp: the simd.hpp vocabulary for xsimd batches, and the project's names for
// xsimd's architectures (xsimd 8 spells its fallback `generic`, newer xsimd `common`).
#pragma once

#include <type_traits>

#include "solder/config.hpp"

// xsimd's math functions inline AVX-512 intrinsics that GCC 12.2 warns about (config.hpp).
SOLDER_INTRINSIC_WARNINGS_OFF
#include <xsimd/xsimd.hpp>
SOLDER_INTRINSIC_WARNINGS_ON

#include "solder/simd.hpp"

namespace solder::eval::cpu {

/// The instruction set solder's CPU kernels are compiled for: the best one the compiler
/// flags allow (-march=native: AVX-512 or AVX2, whichever the host has).
using arch = xsimd::default_arch;

/// xsimd::batch of T on solder's arch; `vec<float>::size` lanes.
template <class T, class A = arch>
using vec = xsimd::batch<T, A>;

/// Lanes of a float vector on solder's arch (16 with AVX-512, 8 with AVX2).
inline constexpr std::size_t float_lanes = vec<float>::size;

/// Vector registers of instruction set A: 32 with AVX-512, 16 with SSE, AVX, AVX2 and NEON.
template <class A>
inline constexpr std::size_t vector_registers = std::is_base_of_v<xsimd::avx512f, A> ? 32 : 16;

/// a * b + c rounded once, on every compiler. xsimd 8 has no AVX-512 fma: its generic form is
/// a * b + c, which GCC's default contraction (-ffp-contract=fast) turns into one vfmadd and
/// Clang's (on: within one expression) leaves as a multiply and an add: half the GEMM's speed.
template <class T, class A>
SOLDER_INLINE xsimd::batch<T, A> fma(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b,
                                     const xsimd::batch<T, A>& c) {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, A> && std::is_same_v<T, float>)
    return _mm512_fmadd_ps(a, b, c);
  else if constexpr (std::is_base_of_v<xsimd::avx512f, A> && std::is_same_v<T, double>)
    return _mm512_fmadd_pd(a, b, c);
  else
#endif
    return xsimd::fma(a, b, c);
}

}  // namespace solder::eval::cpu

namespace solder::simd {

template <class T, class A>
struct vocab<xsimd::batch<T, A>> {
  using V = xsimd::batch<T, A>;
  using scalar = T;
  using mask = xsimd::batch_bool<T, A>;
  static SOLDER_INLINE V neg(const V& x) {
    if constexpr (std::is_floating_point_v<T>)
      return x ^ V(T(-0.0));  // flip the sign bit only
    else
      return -x;
  }
  static SOLDER_INLINE V abs(const V& x) { return xsimd::abs(x); }
  static SOLDER_INLINE V exp(const V& x) { return xsimd::exp(x); }
  // xsimd's expm1 and log1p return +0 for -0; Annex F (and the scalar forms) keep the sign.
  static SOLDER_INLINE V expm1(const V& x) { return xsimd::select(x == V(0), x, xsimd::expm1(x)); }
  static SOLDER_INLINE V log(const V& x) { return xsimd::log(x); }
  static SOLDER_INLINE V log1p(const V& x) { return xsimd::select(x == V(0), x, xsimd::log1p(x)); }
  static SOLDER_INLINE V sqrt(const V& x) { return xsimd::sqrt(x); }
  static SOLDER_INLINE V tanh(const V& x) { return xsimd::tanh(x); }
  static SOLDER_INLINE V erf(const V& x) { return xsimd::erf(x); }
  // xsimd's erfc gives -0 for large x where it underflows; erfc is never negative.
  static SOLDER_INLINE V erfc(const V& x) { return xsimd::abs(xsimd::erfc(x)); }
  static SOLDER_INLINE V fma(const V& a, const V& b, const V& c) { return eval::cpu::fma(a, b, c); }
  // Not x != x: xsimd 8's != compares ordered (_CMP_NEQ_OQ), so NaN != NaN is false on batches.
  static SOLDER_INLINE mask isnan(const V& x) { return xsimd::isnan(x); }
  static SOLDER_INLINE V select(const mask& m, const V& a, const V& b) { return xsimd::select(m, a, b); }
  static SOLDER_INLINE V load(const T* p) { return V::load_unaligned(p); }
  static SOLDER_INLINE void store(T* p, const V& v) { v.store_unaligned(p); }
};

}  // namespace solder::simd
