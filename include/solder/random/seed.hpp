// random/seed.hpp: SplitMix64, the one seed mixer: it turns a user's seed into well-spread
// seeds for Philox streams (one per layer, per dropout) and drives the data shuffles.
#pragma once

#include <cstdint>

#include "solder/config.hpp"

namespace solder::random {

/// SplitMix64 (Steele, Lea, Flood, OOPSLA 2014; Vigna's reference splitmix64.c):
///   state += 0x9E3779B97F4A7C15;  z = state;
///   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;  z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
///   return z ^ (z >> 31);
/// The data shuffles draw from it through `below`, never through <random>'s distributions,
/// whose results differ between standard libraries: a seed means the same order everywhere.
/// (Seed 1234567 gives 6457827717110365317, 3203168211198807973, ...)
struct splitmix64 {
  std::uint64_t state = 0;

  SOLDER_HD constexpr std::uint64_t next() { return finalize(state += 0x9E3779B97F4A7C15ull); }

  /// Uniform in [0, n), n >= 1, without modulo bias: draws r = next() until r >= 2^64 mod n,
  /// then returns r mod n (the accepted draws are a whole number of copies of [0, n)).
  SOLDER_HD constexpr std::uint64_t below(std::uint64_t n) {
    const std::uint64_t reject_under = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const std::uint64_t r = next();
      if (r >= reject_under) return r % n;
    }
  }

  /// The output function alone.
  SOLDER_HD static constexpr std::uint64_t finalize(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

/// The seed of stream `index` (a layer, a dropout) derived from a user's seed: the
/// (index + 1)-th output of SplitMix64 started at `seed`. Distinct, well-spread streams.
SOLDER_HD constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t index) {
  return splitmix64::finalize(seed + 0x9E3779B97F4A7C15ull * (index + 1));
}

}  // namespace solder::random
