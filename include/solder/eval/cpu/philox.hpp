// eval/cpu/philox.hpp: SIMD forms of random::bits16 (AVX-512 and AVX2 intrinsic cores, a portable fallback) and the dropout keep mask.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/random/philox.hpp"

// GCC 12.2 warns -Wmaybe-uninitialized inside its own AVX-512 intrinsics (the "undefined" source
// operand of the unmasked forms, GCC bug 105593, fixed in 12.3); the warning names no solder code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace solder::cpu {

namespace detail {

// Which intrinsic core an xsimd arch gets. xsimd's avx512 archs derive from avx512f and its AVX2
// archs (avx2, fma3<avx2>) from avx2; every other arch takes the portable core.
template <class A>
inline constexpr bool philox_avx512 = std::is_base_of_v<xsimd::avx512f, A>;
template <class A>
inline constexpr bool philox_avx2 = !philox_avx512<A> && std::is_base_of_v<xsimd::avx2, A>;

/// The per-call constants of one (seed, offset) stream: the ten round keys, and the parts of
/// rounds 0 and 1 that are the same for every block (the counter's words 1..3 are the same for
/// the 16 blocks of a group, and words 2..3 for every group).
struct philox_stream {
  uint32_t k0[random::philox_rounds];
  uint32_t k1[random::philox_rounds];
  uint32_t r0_c0;  // round 0 word 0 is hi(m1 * lo(offset)) ^ k0[0] ^ hi32(counter)
  uint32_t r0_c2;  // round 0 word 2 is hi(m0 * lo32(counter)) ^ hi(offset) ^ k1[0]
  uint32_t r1_c0;  // round 1 word 0 is hi(m1 * c2) ^ lo(m1 * lo(offset)) ^ k0[1]
  random::philox_key key;
  uint32_t offset_lo, offset_hi;

  philox_stream(uint64_t seed, uint64_t offset)
      : key{{uint32_t(seed), uint32_t(seed >> 32)}}, offset_lo(uint32_t(offset)), offset_hi(uint32_t(offset >> 32)) {
    uint32_t a = uint32_t(seed);
    uint32_t b = uint32_t(seed >> 32);
    for (int r = 0; r < random::philox_rounds; ++r) {
      k0[r] = a;
      k1[r] = b;
      a += random::philox_w0;
      b += random::philox_w1;
    }
    const uint64_t p1 = uint64_t(random::philox_m1) * uint32_t(offset);
    r0_c0 = uint32_t(p1 >> 32) ^ k0[0];
    r0_c2 = uint32_t(offset >> 32) ^ k1[0];
    r1_c0 = uint32_t(p1) ^ k0[1];
  }
};

/// Round 1 word 0 of group g's blocks, and the two words round 1's scalar product m0 * c0 adds
/// (its high half xored into word 2 in round 1, its low half into word 2 in round 2).
struct philox_group_scalars {
  uint32_t r1_c2;
  uint32_t r2_c2;
  SOLDER_INLINE philox_group_scalars(const philox_stream& s, uint64_t base) {
    const uint32_t c0 = s.r0_c0 ^ uint32_t(base >> 32);
    const uint64_t p0 = uint64_t(random::philox_m0) * c0;
    r1_c2 = uint32_t(p0 >> 32) ^ s.k1[1];
    r2_c2 = uint32_t(p0) ^ s.k1[2];
  }
};

/// Portable core: the scalar generator, block by block; out[16 k + l] for the 16 blocks l of group g.
inline void philox_group_portable(const philox_stream& s, uint64_t g, uint16_t* out) {
  for (uint32_t l = 0; l < 16; ++l) {
    const uint64_t block = (g << 4) | l;
    const random::philox_ctr w = random::philox4x32_10({{uint32_t(block), uint32_t(block >> 32), s.offset_lo, s.offset_hi}}, s.key);
    for (uint32_t k = 0; k < 8; ++k) out[16 * k + l] = uint16_t(w.v[k >> 1] >> (16 * (k & 1)));
  }
}

#if defined(__AVX512F__)
// AVX-512 core. The 16 blocks of a group live as 8 even lanes (blocks 0, 2, .., 14) and 8 odd
// lanes (1, 3, .., 15), one block per 64-bit lane with its word in the low half: vpmuludq then
// gives each 32x32->64 product whole (hi half in the upper slot, lo half in the lower), and the
// upper slots may hold garbage because vpmuludq reads only the lower ones. A round is
// 2 multiplies, 2 shifts and 2 three-way xors per half, with no shuffles.
struct philox_avx512_half {
  __m512i c0, c1, c2, c3;
};

SOLDER_INLINE __m512i philox_xor3(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }

SOLDER_INLINE void philox_avx512_rounds(philox_avx512_half& h, const philox_stream& s, const philox_group_scalars& gs, __m512i lanes_lo) {
  const __m512i m0 = _mm512_set1_epi64(random::philox_m0);
  const __m512i m1 = _mm512_set1_epi64(random::philox_m1);
  // Round 0: word 0 (the block counter's low word) varies by lane, word 2 (the offset) does not.
  __m512i p0 = _mm512_mul_epu32(lanes_lo, m0);
  __m512i c2 = _mm512_xor_si512(_mm512_srli_epi64(p0, 32), _mm512_set1_epi32(int(s.r0_c2)));
  __m512i c3 = p0;
  // Round 1: word 0 is the same for all 16 blocks, so m0 * c0 was a scalar product (in gs).
  __m512i p1 = _mm512_mul_epu32(c2, m1);
  __m512i c0 = _mm512_xor_si512(_mm512_srli_epi64(p1, 32), _mm512_set1_epi32(int(s.r1_c0)));
  __m512i c1 = p1;
  c2 = _mm512_xor_si512(c3, _mm512_set1_epi32(int(gs.r1_c2)));
  // Round 2: word 3 is round 1's scalar lo(m0 * c0), folded into gs.r2_c2.
  p0 = _mm512_mul_epu32(c0, m0);
  p1 = _mm512_mul_epu32(c2, m1);
  c0 = philox_xor3(_mm512_srli_epi64(p1, 32), c1, _mm512_set1_epi32(int(s.k0[2])));
  c1 = p1;
  c2 = _mm512_xor_si512(_mm512_srli_epi64(p0, 32), _mm512_set1_epi32(int(gs.r2_c2)));
  c3 = p0;
#pragma GCC unroll 8
  for (int r = 3; r < random::philox_rounds; ++r) {
    p0 = _mm512_mul_epu32(c0, m0);
    p1 = _mm512_mul_epu32(c2, m1);
    c0 = philox_xor3(_mm512_srli_epi64(p1, 32), c1, _mm512_set1_epi32(int(s.k0[r])));
    c1 = p1;
    c2 = philox_xor3(_mm512_srli_epi64(p0, 32), c3, _mm512_set1_epi32(int(s.k1[r])));
    c3 = p0;
  }
  h = {c0, c1, c2, c3};
}

/// Writes output word w of the group, out[32 w + 16 h + l] = half h of lane l, from the even
/// and odd lanes' low slots.
template <class A>
SOLDER_INLINE void philox_avx512_store(__m512i even, __m512i odd, uint16_t* out) {
#if defined(__AVX512BW__)
  if constexpr (std::is_base_of_v<xsimd::avx512bw, A>) {
    // One two-source word permute: position 16 h + l takes 16-bit word 4 (l / 2) + h of the
    // even lanes (l even) or of the odd lanes (l odd, index + 32).
    const __m512i idx = _mm512_setr_epi32(0x00200000, 0x00240004, 0x00280008, 0x002C000C, 0x00300010, 0x00340014, 0x00380018, 0x003C001C,
                                          0x00210001, 0x00250005, 0x00290009, 0x002D000D, 0x00310011, 0x00350015, 0x00390019, 0x003D001D);
    _mm512_storeu_si512(out, _mm512_permutex2var_epi16(even, idx, odd));
    return;
  }
#endif
  const __m512i w = _mm512_mask_blend_epi32(__mmask16(0xAAAA), even, _mm512_slli_epi64(odd, 32));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(w));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
}

template <class A>
SOLDER_INLINE void philox_group_avx512(const philox_stream& s, uint64_t g, uint16_t* out) {
  const uint64_t base = g << 4;
  const philox_group_scalars gs(s, base);
  const __m512i b = _mm512_set1_epi64(int64_t(base));
  philox_avx512_half e, o;
  philox_avx512_rounds(e, s, gs, _mm512_or_si512(b, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14)));
  philox_avx512_rounds(o, s, gs, _mm512_or_si512(b, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15)));
  philox_avx512_store<A>(e.c0, o.c0, out);
  philox_avx512_store<A>(e.c1, o.c1, out + 32);
  philox_avx512_store<A>(e.c2, o.c2, out + 64);
  philox_avx512_store<A>(e.c3, o.c3, out + 96);
}
#endif

#if defined(__AVX2__)
// AVX2 core: the same layout as the AVX-512 one at 4 blocks per register, so a group is two
// 8-block halves (blocks 0..7, 8..15), each as 4 even and 4 odd lanes. AVX2 has no three-way
// xor; a round is 2 multiplies, 2 shifts and 4 xors per register pair.
struct philox_avx2_half {
  __m256i c0, c1, c2, c3;
};

SOLDER_INLINE void philox_avx2_rounds(philox_avx2_half& h, const philox_stream& s, const philox_group_scalars& gs, __m256i lanes_lo) {
  const __m256i m0 = _mm256_set1_epi64x(random::philox_m0);
  const __m256i m1 = _mm256_set1_epi64x(random::philox_m1);
  __m256i p0 = _mm256_mul_epu32(lanes_lo, m0);
  __m256i c2 = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_set1_epi32(int(s.r0_c2)));
  __m256i c3 = p0;
  __m256i p1 = _mm256_mul_epu32(c2, m1);
  __m256i c0 = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_set1_epi32(int(s.r1_c0)));
  __m256i c1 = p1;
  c2 = _mm256_xor_si256(c3, _mm256_set1_epi32(int(gs.r1_c2)));
  p0 = _mm256_mul_epu32(c0, m0);
  p1 = _mm256_mul_epu32(c2, m1);
  c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1), _mm256_set1_epi32(int(s.k0[2])));
  c1 = p1;
  c2 = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_set1_epi32(int(gs.r2_c2)));
  c3 = p0;
#pragma GCC unroll 8
  for (int r = 3; r < random::philox_rounds; ++r) {
    p0 = _mm256_mul_epu32(c0, m0);
    p1 = _mm256_mul_epu32(c2, m1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1), _mm256_set1_epi32(int(s.k0[r])));
    c1 = p1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3), _mm256_set1_epi32(int(s.k1[r])));
    c3 = p0;
  }
  h = {c0, c1, c2, c3};
}

/// Writes half h of word w for the 8 blocks of one group half: out[16 h + l], l in 0..7.
SOLDER_INLINE void philox_avx2_store(__m256i even, __m256i odd, uint16_t* out) {
  const __m256i w = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  // Per 128-bit lane: low halves of its 4 words to bytes 0..7, high halves to bytes 8..15;
  // then the 64-bit quarters in the order (lo 0-3, lo 4-7, hi 0-3, hi 4-7).
  const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                         0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm256_extracti128_si256(v, 1));
}

inline void philox_group_avx2(const philox_stream& s, uint64_t g, uint16_t* out) {
  const uint64_t base = g << 4;
  const philox_group_scalars gs(s, base);
  const __m256i b = _mm256_set1_epi64x(int64_t(base));
  for (int half = 0; half < 2; ++half) {
    const __m256i first = _mm256_set1_epi64x(8 * half);
    philox_avx2_half e, o;
    philox_avx2_rounds(e, s, gs, _mm256_or_si256(b, _mm256_add_epi64(first, _mm256_setr_epi64x(0, 2, 4, 6))));
    philox_avx2_rounds(o, s, gs, _mm256_or_si256(b, _mm256_add_epi64(first, _mm256_setr_epi64x(1, 3, 5, 7))));
    uint16_t* dst = out + 8 * half;
    philox_avx2_store(e.c0, o.c0, dst);
    philox_avx2_store(e.c1, o.c1, dst + 32);
    philox_avx2_store(e.c2, o.c2, dst + 64);
    philox_avx2_store(e.c3, o.c3, dst + 96);
  }
}
#endif

/// The 128 bits16 values of group g into out[0..128), on the core A selects.
template <class A>
SOLDER_INLINE void philox_group(const philox_stream& s, uint64_t g, uint16_t* out) {
  if constexpr (philox_avx512<A>) {
#if defined(__AVX512F__)
    philox_group_avx512<A>(s, g, out);
#endif
  } else if constexpr (philox_avx2<A>) {
#if defined(__AVX2__)
    philox_group_avx2(s, g, out);
#endif
  } else {
    philox_group_portable(s, g, out);
  }
}

}  // namespace detail

/// out[k] = random::bits16(seed, offset, i0 + k) for k in [0, n): whole 128-element groups go
/// straight to out, a partial first or last group through a stack buffer. Requires
/// i0 + n <= 2^64 (the element counter does not wrap).
template <class A = arch>
inline void philox_bits16(uint64_t seed, uint64_t offset, uint64_t i0, std::size_t n, uint16_t* out) {
  static_assert(A::supported(), "solder::cpu::philox_bits16: the arch is not enabled by the compiler flags; use solder::cpu::arch or build with its -m flags");
  if (n == 0) return;
  SOLDER_ASSERT(uint64_t(n) - 1 <= UINT64_MAX - i0, "solder::cpu::philox_bits16: i0 + n exceeds 2^64; the element counter must not wrap");
  constexpr std::size_t group = random::bits16_group;
  const detail::philox_stream s(seed, offset);
  uint64_t g = i0 / group;
  std::size_t done = 0;
  alignas(64) uint16_t buf[group];
  if (const std::size_t skip = std::size_t(i0 % group); skip != 0 || n < group) {
    detail::philox_group<A>(s, g, buf);
    done = n < group - skip ? n : group - skip;
    std::memcpy(out, buf + skip, done * sizeof(uint16_t));
    ++g;
  }
  for (; n - done >= group; done += group, ++g) detail::philox_group<A>(s, g, out + done);
  if (done < n) {
    detail::philox_group<A>(s, g, buf);
    std::memcpy(out + done, buf, (n - done) * sizeof(uint16_t));
  }
}

/// Loads vec<float, A>::size consecutive uint16 values from p and zero-extends them to uint32.
template <class A = arch>
SOLDER_INLINE xsimd::batch<uint32_t, A> load_bits16(const uint16_t* p) {
  static_assert(xsimd::batch<uint32_t, A>::size == xsimd::batch<float, A>::size, "solder::cpu::load_bits16: uint32 and float batches must have the same lane count");
  static_assert(A::supported(), "solder::cpu::load_bits16: the arch is not enabled by the compiler flags; use solder::cpu::arch or build with its -m flags");
  if constexpr (detail::philox_avx512<A>) {
#if defined(__AVX512F__)
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
  } else if constexpr (detail::philox_avx2<A>) {
#if defined(__AVX2__)
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
  } else {
    constexpr std::size_t lanes = xsimd::batch<uint32_t, A>::size;
    alignas(64) uint32_t wide[lanes];
    for (std::size_t l = 0; l < lanes; ++l) wide[l] = p[l];
    return xsimd::batch<uint32_t, A>::load_aligned(wide);
  }
}

/// Lanes where bits >= threshold (the dropout keep rule with threshold = random::threshold16(p)),
/// as a mask for xsimd::select on float batches; any uint32 bits and threshold (0 keeps all lanes).
template <class A = arch>
SOLDER_INLINE xsimd::batch_bool<float, A> keep_mask(const xsimd::batch<uint32_t, A>& bits, uint32_t threshold) {
  static_assert(A::supported(), "solder::cpu::keep_mask: the arch is not enabled by the compiler flags; use solder::cpu::arch or build with its -m flags");
  if constexpr (detail::philox_avx512<A>) {
#if defined(__AVX512F__)
    return _mm512_cmpge_epu32_mask(bits, _mm512_set1_epi32(int(threshold)));
#endif
  } else if constexpr (detail::philox_avx2<A>) {
#if defined(__AVX2__)
    // Unsigned bits >= t is max(bits, t) == bits (AVX2 has no unsigned compare).
    const __m256i t = _mm256_set1_epi32(int(threshold));
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(bits, t), bits));
#endif
  } else {
    constexpr std::size_t lanes = xsimd::batch<uint32_t, A>::size;
    alignas(64) uint32_t b[lanes];
    alignas(64) float keep[lanes];
    bits.store_aligned(b);
    for (std::size_t l = 0; l < lanes; ++l) keep[l] = b[l] >= threshold ? 1.0f : 0.0f;
    return xsimd::batch<float, A>::load_aligned(keep) != xsimd::batch<float, A>(0.0f);
  }
}

}  // namespace solder::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
