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

SOLDER_INTRINSIC_WARNINGS_OFF

namespace solder::eval::cpu {

namespace detail {

// Which intrinsic core an xsimd arch gets. xsimd's avx512 archs derive from avx512f and its AVX2
// archs (avx2, fma3<avx2>) from avx2; every other arch takes the portable core.
template <class A>
inline constexpr bool philox_avx512 = std::is_base_of_v<xsimd::avx512f, A>;
template <class A>
inline constexpr bool philox_avx2 = !philox_avx512<A> && std::is_base_of_v<xsimd::avx2, A>;

/// The per-call constants of one (seed, offset) stream of `rounds` rounds: the round keys, and
/// the parts of rounds 0 and 1 that are the same for every block (the counter's words 1..3 are
/// the same for the 16 blocks of a group, and words 2..3 for every group).
struct philox_stream {
  uint32_t k0[random::philox_max_rounds];
  uint32_t k1[random::philox_max_rounds];
  uint32_t r0_c0;  // word 0 after round 0 is r0_c0 ^ hi32(block): hi(m1 lo(offset)) ^ k0[0]
  uint32_t r0_c2;  // word 2 after round 0 is hi(m0 lo32(block)) ^ r0_c2: hi(offset) ^ k1[0]
  uint32_t r1_c0;  // word 0 after round 1 is hi(m1 c2) ^ r1_c0: lo(m1 lo(offset)) ^ k0[1]
  random::philox_key key;
  uint32_t offset_lo, offset_hi;
  uint32_t rounds;  // 7 or 10 (random::philox_rounds_supported)

  philox_stream(uint64_t seed, uint64_t offset, uint32_t rounds = random::philox_default_rounds)
      : key{{uint32_t(seed), uint32_t(seed >> 32)}}, offset_lo(uint32_t(offset)), offset_hi(uint32_t(offset >> 32)),
        rounds(rounds == 10 ? 10 : 7) {
    uint32_t a = uint32_t(seed);
    uint32_t b = uint32_t(seed >> 32);
    for (uint32_t r = 0; r < random::philox_max_rounds; ++r) {
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

/// The group-wide terms of word 2 in rounds 1 and 2. After round 0, word 0 is the same for the
/// 16 blocks of a group (r0_c0 ^ hi32(16 g)), so round 1's m0 * c0 is one scalar product: its
/// hi is xored into word 2 in round 1, and its lo, word 3 after round 1, into word 2 in round 2.
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
    const random::philox_ctr w =
        random::philox4x32_rounds({{uint32_t(block), uint32_t(block >> 32), s.offset_lo, s.offset_hi}}, s.key, s.rounds);
    for (uint32_t k = 0; k < 8; ++k) out[16 * k + l] = uint16_t(w.v[k >> 1] >> (16 * (k & 1)));
  }
}

// The SIMD cores. A register holds one block per 64-bit lane, its word in the low 32 bits:
// vpmuludq then gives each 32x32->64 product whole (lo in the low half, hi in the high half),
// and the high halves may hold anything, since vpmuludq reads only the low ones. A round is,
// per register, 2 multiplies, 2 moves of a product's hi to the low half and 2 three-way xors;
// nothing crosses lanes until the final store. The 16 blocks of a group are split by lane
// parity (blocks 0, 2, .., 14 and 1, 3, .., 15) so a register pair holds consecutive blocks.
// Ops supplies the instructions: reg, mul, high, xor2, xor3, word (broadcast a uint32).

/// Rounds 0 .. Rounds - 1 of H registers of blocks; ctr_lo[h] holds the blocks' counter words 0
/// (their word 1, and the offset words 2 and 3, are lane-independent and folded into s and
/// r1_c2/r2_c2).
template <class Ops, int H, int Rounds>
SOLDER_INLINE void philox_rounds(typename Ops::reg (&c)[4][H], const philox_stream& s, const typename Ops::reg (&ctr_lo)[H],
                                 const uint32_t (&r1_c2)[H], const uint32_t (&r2_c2)[H]) {
  static_assert(Rounds >= 3 && Rounds <= int(random::philox_max_rounds), "solder: a Philox core runs 3 to 10 rounds");
  using reg = typename Ops::reg;
  const reg m0 = Ops::word(random::philox_m0);
  const reg m1 = Ops::word(random::philox_m1);
  // Round 0: m1 * word 2 (the offset) is the same for every block; it is in s.
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h) {
    const reg p0 = Ops::mul(ctr_lo[h], m0);
    c[2][h] = Ops::xor2(Ops::high(p0), Ops::word(s.r0_c2));
    c[3][h] = p0;
  }
  // Round 1: word 0 is the same for the blocks of a group, so m0 * c0 was one scalar product,
  // its hi folded into r1_c2 and its lo (the next word 3) into r2_c2.
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h) {
    const reg p1 = Ops::mul(c[2][h], m1);
    c[0][h] = Ops::xor2(Ops::high(p1), Ops::word(s.r1_c0));
    c[1][h] = p1;
    c[2][h] = Ops::xor2(c[3][h], Ops::word(r1_c2[h]));
  }
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h) {
    const reg p0 = Ops::mul(c[0][h], m0);
    const reg p1 = Ops::mul(c[2][h], m1);
    c[0][h] = Ops::xor3(Ops::high(p1), c[1][h], Ops::word(s.k0[2]));
    c[1][h] = p1;
    c[2][h] = Ops::xor2(Ops::high(p0), Ops::word(r2_c2[h]));
    c[3][h] = p0;
  }
#pragma GCC unroll 8
  for (int r = 3; r < Rounds; ++r) {
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
      const reg p0 = Ops::mul(c[0][h], m0);
      const reg p1 = Ops::mul(c[2][h], m1);
      c[0][h] = Ops::xor3(Ops::high(p1), c[1][h], Ops::word(s.k0[r]));
      c[1][h] = p1;
      c[2][h] = Ops::xor3(Ops::high(p0), c[3][h], Ops::word(s.k1[r]));
      c[3][h] = p0;
    }
  }
}

#if defined(__AVX512F__)
struct philox_avx512_ops {
  using reg = __m512i;
  static SOLDER_INLINE reg mul(reg a, reg b) { return _mm512_mul_epu32(a, b); }
  // vpshufd (port 5 on Intel) or vpsrlq (port 0): vpmuludq issues on either port, so both
  // balance; vpshufd measured a little faster.
  static SOLDER_INLINE reg high(reg p) { return _mm512_shuffle_epi32(p, _MM_PERM_CDAB); }
  static SOLDER_INLINE reg xor2(reg a, reg b) { return _mm512_xor_si512(a, b); }
  static SOLDER_INLINE reg xor3(reg a, reg b, reg c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }
  static SOLDER_INLINE reg word(uint32_t x) { return _mm512_set1_epi32(int(x)); }
};

/// Writes output word w of a group, out[32 w + 16 h + l] = half h of block l, from the even
/// and odd blocks' low halves.
template <class A>
SOLDER_INLINE void philox_avx512_store(__m512i even, __m512i odd, uint16_t* out) {
#if defined(__AVX512BW__)
  if constexpr (std::is_base_of_v<xsimd::avx512bw, A>) {
    // One two-source permute of 16-bit words: position 16 h + l takes word 4 (l / 2) + h of
    // the even blocks (l even) or the odd blocks (l odd, index + 32).
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

/// Groups g .. g + G - 1 into out[0 .. 128 G): 2 G registers of 8 blocks. Two groups at once
/// give the out-of-order core independent multiplies to fill the 5-cycle multiply latency.
template <class A, int G, int Rounds>
SOLDER_INLINE void philox_groups_avx512(const philox_stream& s, uint64_t g, uint16_t* out) {
  constexpr int H = 2 * G;
  __m512i ctr_lo[H];
  uint32_t r1_c2[H], r2_c2[H];
#pragma GCC unroll 4
  for (int q = 0; q < G; ++q) {
    const uint64_t base = (g + uint64_t(q)) << 4;
    const philox_group_scalars gs(s, base);
    const __m512i b = _mm512_set1_epi64(int64_t(base));
    ctr_lo[2 * q] = _mm512_or_si512(b, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14));
    ctr_lo[2 * q + 1] = _mm512_or_si512(b, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15));
    r1_c2[2 * q] = r1_c2[2 * q + 1] = gs.r1_c2;
    r2_c2[2 * q] = r2_c2[2 * q + 1] = gs.r2_c2;
  }
  __m512i c[4][H];
  philox_rounds<philox_avx512_ops, H, Rounds>(c, s, ctr_lo, r1_c2, r2_c2);
#pragma GCC unroll 4
  for (int q = 0; q < G; ++q) {
#pragma GCC unroll 4
    for (int w = 0; w < 4; ++w) philox_avx512_store<A>(c[w][2 * q], c[w][2 * q + 1], out + 128 * q + 32 * w);
  }
}
#endif

#if defined(__AVX2__)
struct philox_avx2_ops {
  using reg = __m256i;
  static SOLDER_INLINE reg mul(reg a, reg b) { return _mm256_mul_epu32(a, b); }
  static SOLDER_INLINE reg high(reg p) { return _mm256_srli_epi64(p, 32); }
  static SOLDER_INLINE reg xor2(reg a, reg b) { return _mm256_xor_si256(a, b); }
  static SOLDER_INLINE reg xor3(reg a, reg b, reg c) { return _mm256_xor_si256(a, _mm256_xor_si256(b, c)); }
  static SOLDER_INLINE reg word(uint32_t x) { return _mm256_set1_epi32(int(x)); }
};

/// Writes half h of output word w for the 8 blocks of a group half: out[16 h + l], l in 0..7.
SOLDER_INLINE void philox_avx2_store(__m256i even, __m256i odd, uint16_t* out) {
  const __m256i w = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  // Per 128-bit lane: the low halves of its 4 words to bytes 0..7, the high halves to bytes
  // 8..15; then the 64-bit quarters in the order (lo 0-3, lo 4-7, hi 0-3, hi 4-7).
  const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                         0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm256_extracti128_si256(v, 1));
}

/// Group g into out[0 .. 128): two halves of 8 blocks (0..7, 8..15), each 2 registers of 4,
/// all 4 registers interleaved so the two halves' multiply chains overlap.
template <int Rounds>
SOLDER_INLINE void philox_group_avx2(const philox_stream& s, uint64_t g, uint16_t* out) {
  const uint64_t base = g << 4;
  const philox_group_scalars gs(s, base);
  const __m256i b = _mm256_set1_epi64x(int64_t(base));
  const uint32_t r1_c2[4] = {gs.r1_c2, gs.r1_c2, gs.r1_c2, gs.r1_c2};
  const uint32_t r2_c2[4] = {gs.r2_c2, gs.r2_c2, gs.r2_c2, gs.r2_c2};
  const __m256i ctr_lo[4] = {_mm256_or_si256(b, _mm256_setr_epi64x(0, 2, 4, 6)), _mm256_or_si256(b, _mm256_setr_epi64x(1, 3, 5, 7)),
                             _mm256_or_si256(b, _mm256_setr_epi64x(8, 10, 12, 14)), _mm256_or_si256(b, _mm256_setr_epi64x(9, 11, 13, 15))};
  __m256i c[4][4];
  philox_rounds<philox_avx2_ops, 4, Rounds>(c, s, ctr_lo, r1_c2, r2_c2);
#pragma GCC unroll 4
  for (int w = 0; w < 4; ++w) {
    philox_avx2_store(c[w][0], c[w][1], out + 32 * w);
    philox_avx2_store(c[w][2], c[w][3], out + 8 + 32 * w);
  }
}
#endif

/// Groups the core for A computes per step of the bulk loop.
template <class A>
inline constexpr int philox_step = philox_avx512<A> ? 2 : 1;

/// The 128 G bits16 values of groups g .. g + G - 1 into out[0 .. 128 G), on the core A selects,
/// with the stream's rounds.
template <class A, int G, int Rounds>
SOLDER_INLINE void philox_groups_of(const philox_stream& s, uint64_t g, uint16_t* out) {
  if constexpr (philox_avx512<A>) {
#if defined(__AVX512F__)
    philox_groups_avx512<A, G, Rounds>(s, g, out);
#endif
  } else if constexpr (philox_avx2<A>) {
#if defined(__AVX2__)
    for (int q = 0; q < G; ++q) philox_group_avx2<Rounds>(s, g + uint64_t(q), out + 128 * q);
#endif
  } else {
    for (int q = 0; q < G; ++q) philox_group_portable(s, g + uint64_t(q), out + 128 * q);
  }
}
template <class A, int G>
SOLDER_INLINE void philox_groups(const philox_stream& s, uint64_t g, uint16_t* out) {
  if (s.rounds == 10)
    philox_groups_of<A, G, 10>(s, g, out);
  else
    philox_groups_of<A, G, 7>(s, g, out);
}

}  // namespace detail

namespace detail {
/// philox_bits16 for any range: a partial first or last group through a stack buffer.
template <class A>
inline void philox_bits16_any(const philox_stream& s, uint64_t i0, std::size_t n, uint16_t* out) {
  if (n == 0) return;
  SOLDER_ASSERT(uint64_t(n) - 1 <= UINT64_MAX - i0, "solder::eval::cpu::philox_bits16: i0 + n exceeds 2^64; the element counter must not wrap");
  constexpr std::size_t group = random::bits16_group;
  uint64_t g = i0 / group;
  std::size_t done = 0;
  alignas(64) uint16_t buf[group];
  if (const std::size_t skip = std::size_t(i0 % group); skip != 0 || n < group) {
    detail::philox_groups<A, 1>(s, g, buf);
    done = n < group - skip ? n : group - skip;
    std::memcpy(out, buf + skip, done * sizeof(uint16_t));
    ++g;
  }
  constexpr int step = detail::philox_step<A>;
  if constexpr (step > 1) {
    for (; n - done >= step * group; done += step * group, g += step) detail::philox_groups<A, step>(s, g, out + done);
  }
  for (; n - done >= group; done += group, ++g) detail::philox_groups<A, 1>(s, g, out + done);
  if (done < n) {
    detail::philox_groups<A, 1>(s, g, buf);
    std::memcpy(out + done, buf, (n - done) * sizeof(uint16_t));
  }
}
}  // namespace detail

/// out[k] = random::bits16(seed, offset, i0 + k, rounds) for k in [0, n). Requires i0 + n <= 2^64 (the
/// element counter does not wrap). A range of whole steps of groups (a pass's segment) is drawn
/// inline: a call per segment cost a tenth of the generator's time (docs/random.md); any other
/// range goes through a stack buffer for its partial groups.
/// (This overload takes a stream whose per-(seed, offset) set-up is already done: a pass that
/// draws many short runs from one stream builds it once.)
template <class A = arch>
SOLDER_INLINE void philox_bits16(const detail::philox_stream& s, uint64_t i0, std::size_t n, uint16_t* out) {
  constexpr std::size_t group = random::bits16_group;
  constexpr int step = detail::philox_step<A>;
  if (i0 % group == 0 && n != 0 && n % (step * group) == 0 && uint64_t(n) - 1 <= UINT64_MAX - i0) {
    for (std::size_t done = 0; done < n; done += step * group)
      detail::philox_groups<A, step>(s, (i0 + done) / group, out + done);
  } else {
    detail::philox_bits16_any<A>(s, i0, n, out);
  }
}

template <class A = arch>
inline void philox_bits16(uint64_t seed, uint64_t offset, uint64_t i0, std::size_t n, uint16_t* out,
                          uint32_t rounds = random::philox_default_rounds) {
  static_assert(A::supported(), "solder::eval::cpu::philox_bits16: the arch is not enabled by the compiler flags; use solder::eval::cpu::arch or build with its -m flags");
  philox_bits16<A>(detail::philox_stream(seed, offset, rounds), i0, n, out);
}

/// Loads vec<float, A>::size consecutive uint16 values from p and zero-extends them to uint32.
template <class A = arch>
SOLDER_INLINE xsimd::batch<uint32_t, A> load_bits16(const uint16_t* p) {
  static_assert(xsimd::batch<uint32_t, A>::size == xsimd::batch<float, A>::size, "solder::eval::cpu::load_bits16: uint32 and float batches must have the same lane count");
  static_assert(A::supported(), "solder::eval::cpu::load_bits16: the arch is not enabled by the compiler flags; use solder::eval::cpu::arch or build with its -m flags");
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
  static_assert(A::supported(), "solder::eval::cpu::keep_mask: the arch is not enabled by the compiler flags; use solder::eval::cpu::arch or build with its -m flags");
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
    return xsimd::batch<float, A>::load_aligned(keep) == xsimd::batch<float, A>(1.0f);
  }
}

/// keep_mask(load_bits16(p), threshold) in fewer instructions where the target compares 16-bit
/// lanes into a mask register (AVX-512 BW + VL): one compare of the 16 draws as they are
/// stored, instead of a widening to 32 bits and a compare. A threshold of 65536 (keep none)
/// does not fit 16 bits; the compare's write mask is then empty.
template <class A = arch>
SOLDER_INLINE xsimd::batch_bool<float, A> keep_mask16(const uint16_t* p, uint32_t threshold) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if constexpr (std::is_base_of_v<xsimd::avx512bw, A>) {
    const __mmask16 valid = threshold > 0xFFFFu ? __mmask16(0) : __mmask16(0xFFFF);
    return _mm256_mask_cmpge_epu16_mask(valid, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                        _mm256_set1_epi16(short(threshold)));
  }
#endif
  return keep_mask<A>(load_bits16<A>(p), threshold);
}

}  // namespace solder::eval::cpu

SOLDER_INTRINSIC_WARNINGS_ON
