// random/sketch.hpp: the random signs of sketch matrices, a pure function of (seed, term,
// element) through Philox4x32 (7 rounds unless the sketch asks for 10), so a sketch is
// regenerated wherever it is read and never stored.
#pragma once

#include <cstdint>

#include "solder/config.hpp"
#include "solder/random/philox.hpp"

namespace solder::random {

/// Signs per Philox block: one bit each of its 128.
inline constexpr uint64_t signs_per_block = 128;

/// The Philox block holding the signs of elements [128 b, 128 b + 128) of sketch `term` under
/// `seed`: counter (b, term), key seed.
SOLDER_HD constexpr philox_ctr sign_block(uint64_t seed, uint64_t term, uint64_t b,
                                          std::uint32_t rounds = philox_default_rounds) {
  return philox4x32_rounds({{uint32_t(b), uint32_t(b >> 32), uint32_t(term), uint32_t(term >> 32)}},
                           {{uint32_t(seed), uint32_t(seed >> 32)}}, rounds);
}

/// Whether element e's sign is negative, from its block: bit e & 31 of word (e >> 5) & 3.
SOLDER_HD constexpr bool sign_bit(const philox_ctr& block, uint64_t e) {
  const uint32_t k = uint32_t(e >> 5) & 3;
  const uint32_t word = k == 0 ? block.v[0] : k == 1 ? block.v[1] : k == 2 ? block.v[2] : block.v[3];
  return ((word >> (e & 31)) & 1u) != 0;
}

/// The sign (+1 or -1) of element e of sketch `term` under `seed`; an [R, C] sketch numbers its
/// elements row-major, e = r * C + c.
SOLDER_HD constexpr float sketch_sign(uint64_t seed, uint64_t term, uint64_t e,
                                     std::uint32_t rounds = philox_default_rounds) {
  return sign_bit(sign_block(seed, term, e / signs_per_block, rounds), e) ? -1.0f : 1.0f;
}

}  // namespace solder::random
