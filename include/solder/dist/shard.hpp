// dist/shard.hpp: the rows of a global batch each rank of a data-parallel world trains on.
#pragma once

#include <algorithm>
#include <cstddef>

namespace solder::dist {

/// Rows [first, first + count) of a global batch of n samples that rank r of P trains on: the
/// batch cut into P contiguous shards whose sizes differ by at most one.
struct shard {
  std::size_t first = 0, count = 0;
};
constexpr shard shard_of(std::size_t n, int rank, int size) {
  const std::size_t P = std::size_t(size), r = std::size_t(rank);
  const std::size_t first = n / P * r + std::min(r, n % P);
  return {first, n / P + (r < n % P ? 1 : 0)};
}

}  // namespace solder::dist
