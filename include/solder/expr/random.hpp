// expr/random.hpp: the dropout keep mask as an expression leaf: element i is kept when the
// 16 Philox bits of (seed, offset, i) reach the threshold. Regenerated wherever it is read.
#pragma once

#include <cstdint>

#include "solder/expr/expression.hpp"
#include "solder/random/philox.hpp"

namespace solder {

/// Where a random stream starts: the seed picks the stream, the offset the position in it (a
/// layer advances the offset each training step so every step draws fresh masks). first is
/// the element index the tensor's element 0 draws: a part of a larger batch (a data-parallel
/// shard, a micro-batch) starting at sample s of F elements each sets it to s F and draws the
/// larger batch's masks. rounds: the Philox rounds the stream runs (random::philox_default_rounds,
/// 7, or 10; docs/random.md, "Seven rounds").
struct philox_state {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  std::uint64_t first = 0;
  std::uint32_t rounds = random::philox_default_rounds;
};

/// keep(i) = bits16(seed, offset, first + i, rounds) >= threshold, i the row-major index in shape S.
/// Value type bool: a mask, consumed by select-like ops (ops::dropout).
template <class S>
struct dropout_mask {
  using expression_tag = solder::expression_tag;
  using value_type = bool;
  using shape_type = S;
  using space_type = any_space;  // regenerated from its counter wherever it is read
  philox_state rng;
  std::uint32_t threshold = 0;
  std::size_t batch_ = 1;
  std::size_t batch() const { return batch_; }

  /// The mask for drop probability p (p is rounded to a multiple of 2^-16, see docs/random.md).
  static dropout_mask with_p(float p, philox_state rng, std::size_t batch = 1) {
    if (!random::philox_rounds_supported(rng.rounds))
      solder::detail::fail_message({"solder::dropout: a Philox stream runs 7 or 10 rounds, not ", std::size_t(rng.rounds)});
    return dropout_mask{rng, random::threshold16(p), batch};
  }
  /// 1 / (1 - p) for the rounded p, so the kept elements' expectation is exact.
  double scale() const { return threshold >= 65536u ? 0.0 : 65536.0 / double(65536u - threshold); }
};

}  // namespace solder
