// random/philox.hpp: the Philox4x32 counter-based generator (7 or 10 rounds) and the bits16
// mapping dropout uses (scalar, host and device).
#pragma once

#include <cstdint>

#include "solder/config.hpp"

namespace solder::random {

/// A Philox4x32 counter (128 bits) and the block it maps to.
struct philox_ctr {
  uint32_t v[4];
};

/// A Philox4x32 key (64 bits).
struct philox_key {
  uint32_t v[2];
};

// The constants of Salmon et al. 2011 (Random123 philox.h): the round multipliers and the Weyl
// sequence that bumps the key between rounds. The SIMD forms read them from here.
inline constexpr uint32_t philox_m0 = 0xD2511F53u;
inline constexpr uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr uint32_t philox_w0 = 0x9E3779B9u;
inline constexpr uint32_t philox_w1 = 0xBB67AE85u;

/// The rounds a stream of dropout masks or sketch signs runs: 7 by default, the fewest with
/// which Philox4x32 passes TestU01's BigCrush (Salmon et al. 2011), as FlashAttention-2's
/// dropout and Composable Kernel run it; 10 (Random123's choice with margin, cuRAND's) is
/// selectable per stream. docs/random.md, "Seven rounds".
inline constexpr std::uint32_t philox_default_rounds = 7;
/// The most rounds a stream may ask for; the SIMD forms size their key schedules by it.
inline constexpr std::uint32_t philox_max_rounds = 10;
/// Whether a stream may run `rounds` rounds: 7 or 10, the two forms compiled.
SOLDER_HD constexpr bool philox_rounds_supported(std::uint32_t rounds) { return rounds == 7 || rounds == 10; }

/// One Philox4x32 round: (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), with (hi0, lo0) = m0 * c0 and
/// (hi1, lo1) = m1 * c2 as 64-bit products.
SOLDER_HD constexpr philox_ctr philox4x32_round(philox_ctr c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t(philox_m0) * c.v[0];
  const uint64_t p1 = uint64_t(philox_m1) * c.v[2];
  return {{uint32_t(p1 >> 32) ^ c.v[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c.v[3] ^ k1, uint32_t(p0)}};
}

/// Philox4x32-R (Salmon et al. 2011, Random123): R rounds, multipliers 0xD2511F53, 0xCD9E8D57,
/// Weyl constants 0x9E3779B9, 0xBB67AE85; the key is bumped before every round but the first.
template <int Rounds>
SOLDER_HD constexpr philox_ctr philox4x32(philox_ctr ctr, philox_key key) {
  uint32_t k0 = key.v[0];
  uint32_t k1 = key.v[1];
  for (int r = 0; r < Rounds; ++r) {
    ctr = philox4x32_round(ctr, k0, k1);
    k0 += philox_w0;
    k1 += philox_w1;
  }
  return ctr;
}
SOLDER_HD constexpr philox_ctr philox4x32_10(philox_ctr ctr, philox_key key) { return philox4x32<10>(ctr, key); }
SOLDER_HD constexpr philox_ctr philox4x32_7(philox_ctr ctr, philox_key key) { return philox4x32<7>(ctr, key); }
/// Philox4x32 with the rounds of a stream: 10, else 7 (philox_rounds_supported says which a
/// stream may hold; the places that take a stream's rounds from a user check it).
SOLDER_HD constexpr philox_ctr philox4x32_rounds(philox_ctr ctr, philox_key key, std::uint32_t rounds) {
  return rounds == 10 ? philox4x32<10>(ctr, key) : philox4x32<7>(ctr, key);
}

/// Elements per bits16 group: the 16 Philox blocks of one group give 128 elements 16 bits each.
inline constexpr uint64_t bits16_group = 128;

/// Dropout/sketch bits: the 16 random bits of element i under (seed, offset) with the stream's
/// rounds. Pure function, 64-bit element counter. Element i takes, of the block with counter
/// (16 * (i >> 7) + (i & 15), offset) and key seed, word k >> 1 and half k & 1, k = (i >> 4) & 7.
SOLDER_HD constexpr uint32_t bits16(uint64_t seed, uint64_t offset, uint64_t i,
                                    std::uint32_t rounds = philox_default_rounds) {
  // 16 * g is a multiple of 16, so adding the lane never carries into the high word.
  const uint64_t block = ((i >> 7) << 4) | (i & 15);
  const uint32_t k = uint32_t(i >> 4) & 7;
  const philox_ctr w = philox4x32_rounds({{uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)}},
                                         {{uint32_t(seed), uint32_t(seed >> 32)}}, rounds);
  // Selects instead of w.v[k >> 1]: a variable index would put the block in local memory on a GPU.
  const uint32_t word = (k >> 1) == 0 ? w.v[0] : (k >> 1) == 1 ? w.v[1] : (k >> 1) == 2 ? w.v[2] : w.v[3];
  return (word >> (16 * (k & 1))) & 0xFFFFu;
}

/// Threshold for keep probability 1 - p at 16-bit resolution: element kept iff
/// bits16 >= threshold16(p). threshold16(p) = round(p * 65536) clamped to [0, 65536], halves
/// rounded up; p <= 0 and NaN give 0 (keep all), p >= 1 gives 65536 (keep none).
SOLDER_HD constexpr uint32_t threshold16(float p) {
  if (!(p > 0.0f)) return 0;
  if (p >= 1.0f) return 65536;
  // p * 65536 is exact in float (a power-of-two scale), and so is its fraction; adding 0.5f
  // first would round up values just below one half.
  const float x = p * 65536.0f;
  const uint32_t t = uint32_t(x);
  return t + ((x - float(t)) >= 0.5f ? 1u : 0u);
}

}  // namespace solder::random
