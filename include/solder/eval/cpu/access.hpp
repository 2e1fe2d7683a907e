// eval/cpu/access.hpp: the loads and stores every CPU loop shares: a vector's first n lanes
// (the tail of a row, segment or tile), streaming stores and prefetches.
#pragma once

#include <cstddef>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"

namespace solder::eval::cpu {

namespace detail {
template <class V>
inline constexpr bool avx512_float = std::is_same_v<typename V::value_type, float> &&
                                     std::is_base_of_v<xsimd::avx512f, typename V::arch_type>;
template <class V>
inline constexpr bool avx2_float = std::is_same_v<typename V::value_type, float> && V::size == 8 &&
                                   std::is_base_of_v<xsimd::avx2, typename V::arch_type>;
#if defined(__AVX2__)
/// All ones in lanes [0, n) of an AVX2 register.
SOLDER_INLINE __m256i avx2_first_lanes(std::size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif
}  // namespace detail

/// A vector of p[0, n) (n < V::size) with the other lanes set to `pad`; reads nothing past
/// p + n. Masked loads where the target has them: a narrow copy into a stack buffer followed by
/// a wide load stalls on store forwarding.
template <class V>
SOLDER_INLINE V load_first(const typename V::value_type* p, std::size_t n, typename V::value_type pad = 0) {
  using T = typename V::value_type;
#if defined(__AVX512F__)
  if constexpr (detail::avx512_float<V>) return _mm512_mask_loadu_ps(_mm512_set1_ps(pad), __mmask16((1u << n) - 1u), p);
#endif
#if defined(__AVX2__)
  if constexpr (detail::avx2_float<V>) {
    const __m256i m = detail::avx2_first_lanes(n);
    return _mm256_blendv_ps(_mm256_set1_ps(pad), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
#endif
  alignas(alignment) T lanes[V::size];
  for (std::size_t i = 0; i < V::size; ++i) lanes[i] = i < n ? p[i] : pad;
  return V::load_aligned(lanes);
}

/// Stores the first n < V::size lanes of v to p[0, n); nothing is written past p + n.
template <class V>
SOLDER_INLINE void store_first(typename V::value_type* p, const V& v, std::size_t n) {
  using T = typename V::value_type;
#if defined(__AVX512F__)
  if constexpr (detail::avx512_float<V>) {
    _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1u), v);
    return;
  }
#endif
#if defined(__AVX2__)
  if constexpr (detail::avx2_float<V>) {
    _mm256_maskstore_ps(p, detail::avx2_first_lanes(n), v);
    return;
  }
#endif
  alignas(alignment) T lanes[V::size];
  v.store_aligned(lanes);
  for (std::size_t i = 0; i < n; ++i) p[i] = lanes[i];
}

/// A non-temporal store of a whole vector to a vector-aligned p: the line goes to memory
/// without being read first (worth it once the output no longer fits the cache).
template <class V>
SOLDER_INLINE void stream_store(typename V::value_type* p, const V& v) {
#if defined(__AVX512F__)
  if constexpr (detail::avx512_float<V>) {
    _mm512_stream_ps(p, v);
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (std::is_same_v<typename V::value_type, float> && V::size == 8 &&
                std::is_base_of_v<xsimd::avx, typename V::arch_type>) {
    _mm256_stream_ps(p, v);
    return;
  }
#endif
  v.store_aligned(p);
}

/// Prefetches the line `Bytes` ahead of p into L2 (the T1 hint).
template <std::size_t Bytes, class T>
SOLDER_INLINE void prefetch_l2(const T* p) {
#if defined(__SSE__)
  _mm_prefetch(reinterpret_cast<const char*>(p) + Bytes, _MM_HINT_T1);
#else
  __builtin_prefetch(reinterpret_cast<const char*>(p) + Bytes, 0, 2);
#endif
}

}  // namespace solder::eval::cpu
