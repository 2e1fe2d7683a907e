// eval/cpu/row.hpp: one row of N floats walked with xsimd vectors, for the layers that work row
// by row (layer_norm, softmax): whole vectors, then the tail (N % lanes) through the same vector
// code on a masked load padded with a neutral value, so every column is computed the same way;
// and row sums in a fixed order (float vectors per block, block totals in double).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"

namespace solder::eval::cpu {

/// The vector walk of a row of N floats. A row kernel uses it as
///   each([&]<class T>(std::size_t j, T tail) { store(tail, y + j, load(tail, x + j) * 2); });
/// where `tail` is std::false_type for whole vectors and std::true_type for the last, partial one.
template <std::size_t N>
struct row {
  using V = vec<float>;
  static constexpr std::size_t lanes = V::size, full = N / lanes * lanes, rest = N - full;
  /// Elements a float vector accumulator sums before its total joins a double: 16 terms per
  /// lane, so a row sum errs by about 20 u of its terms' magnitudes whatever N is.
  static constexpr std::size_t block = 16 * lanes;

  /// A vector of p[0, lanes), or of p[0, rest) padded with `pad` on the tail. The tail goes
  /// through masked loads and stores where the target has them, which touch p[0, rest) only:
  /// a copy through a stack buffer stalls store forwarding, several times per row.
  template <class Tail>
  static SOLDER_INLINE V load(Tail, const float* p, float pad = 0.0f) {
    if constexpr (!Tail::value) return V::load_unaligned(p);
#if defined(__AVX512F__)
    else return _mm512_mask_loadu_ps(_mm512_set1_ps(pad), tail_mask, p);
#elif defined(__AVX2__)
    else {
      const __m256i m = avx2_mask();
      return _mm256_blendv_ps(_mm256_set1_ps(pad), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
    }
#else
    else {
      alignas(alignment) float buf[lanes];
      std::fill_n(buf, lanes, pad);
      std::memcpy(buf, p, rest * sizeof(float));
      return V::load_aligned(buf);
    }
#endif
  }
  template <class Tail>
  static SOLDER_INLINE void store(Tail, float* p, const V& v) {
    if constexpr (!Tail::value) v.store_unaligned(p);
#if defined(__AVX512F__)
    else _mm512_mask_storeu_ps(p, tail_mask, v);
#elif defined(__AVX2__)
    else _mm256_maskstore_ps(p, avx2_mask(), v);
#else
    else {
      alignas(alignment) float buf[lanes];
      v.store_aligned(buf);
      std::memcpy(p, buf, rest * sizeof(float));
    }
#endif
  }
#if defined(__AVX512F__)
  static_assert(lanes == 16, "solder::nn: AVX-512 builds use 16-lane float vectors");
  static constexpr __mmask16 tail_mask = __mmask16((1u << rest) - 1);
#elif defined(__AVX2__)
  static_assert(lanes == 8, "solder::nn: AVX2 builds use 8-lane float vectors");
  /// All ones in the tail's lanes [0, rest).
  static SOLDER_INLINE __m256i avx2_mask() {
    constexpr auto on = [](std::size_t k) { return k < rest ? -1 : 0; };
    return _mm256_setr_epi32(on(0), on(1), on(2), on(3), on(4), on(5), on(6), on(7));
  }
#endif

  /// f(j, std::false_type) for every whole vector at column j, then f(full, std::true_type).
  template <class F>
  static SOLDER_INLINE void each(const F& f) {
    for (std::size_t j = 0; j < full; j += lanes) f(j, std::false_type{});
    if constexpr (rest != 0) f(full, std::true_type{});
  }

  /// The K sums over the row of f(j, tail)[k] (an std::array<V, K>), in a fixed order: float
  /// vectors per block, block totals in double. Tail loads must pad so that f's padding lanes are 0.
  template <std::size_t K, class F>
  static SOLDER_INLINE std::array<double, K> sums(const F& f) {
    std::array<double, K> total{};
    auto flush = [&](const std::array<V, K>& acc) {
      for (std::size_t k = 0; k < K; ++k) total[k] += double(xsimd::hadd(acc[k]));
    };
    for (std::size_t b = 0; b < full; b += block) {
      std::array<V, K> acc;
      acc.fill(V(0.0f));
      const std::size_t end = std::min(full, b + block);
      for (std::size_t j = b; j < end; j += lanes) {
        const std::array<V, K> v = f(j, std::false_type{});
        for (std::size_t k = 0; k < K; ++k) acc[k] += v[k];
      }
      flush(acc);
    }
    if constexpr (rest != 0) flush(f(full, std::true_type{}));
    return total;
  }

  /// sums<1> as a double.
  template <class F>
  static SOLDER_INLINE double sum(const F& f) {
    return sums<1>([&]<class T>(std::size_t j, T t) { return std::array<V, 1>{f(j, t)}; })[0];
  }
};

}  // namespace solder::eval::cpu
