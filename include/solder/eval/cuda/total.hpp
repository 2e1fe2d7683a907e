// eval/cuda/total.hpp: the fixed-order sum of many terms by blocks of threads (each thread a
// strided partial in double, then a tree in shared memory), as the CUDA kernels' losses and
// gradient norms use it. Host+device code without CUDA headers, so the host suite runs it.
#pragma once

#include <cstddef>

#include "solder/config.hpp"

namespace solder::eval::cuda {

/// Threads of a block that sums: a power of two.
inline constexpr unsigned total_threads = 256;

/// sum_i term(i) over i in [0, n) by one block of Threads threads t = 0 .. Threads - 1 (a
/// power of two): thread t adds term(first + t), term(first + t + stride), ... in order in
/// double; the partials then meet in a tree (s[t] += s[t + h] for h = Threads / 2, ..., 1).
/// The order depends on n, first and stride alone: a launch always gives the same bits.
template <unsigned Threads>
struct block_total {
  static_assert(Threads > 0 && (Threads & (Threads - 1)) == 0,
                "solder::eval::cuda::block_total: Threads must be a power of two");
  static constexpr unsigned threads = Threads;

  /// term(i) for i = first, first + stride, ... below n, added in order.
  SOLDER_EXEC_CHECK_OFF
  template <class Term>
  SOLDER_HD static double partial(std::size_t first, std::size_t stride, std::size_t n, const Term& term) {
    double s = 0;
    for (std::size_t i = first; i < n; i += stride) s += term(i);
    return s;
  }
  /// The tree over shared[0, Threads), which holds the threads' partials: sync() (the
  /// block's barrier) between the levels; returns the total to every thread.
  SOLDER_EXEC_CHECK_OFF
  template <class Sync>
  SOLDER_HD static double tree(unsigned t, double* shared, const Sync& sync) {
    for (unsigned h = Threads / 2; h > 0; h /= 2) {
      sync();
      if (t < h) shared[t] = shared[t] + shared[t + h];
    }
    sync();
    return shared[0];
  }
  /// Thread t's part of the whole sum: its partial of (first + t, stride), then the tree.
  SOLDER_EXEC_CHECK_OFF
  template <class Term, class Sync>
  SOLDER_HD static double run(unsigned t, std::size_t first, std::size_t stride, std::size_t n, const Term& term,
                              double* shared, const Sync& sync) {
    shared[t] = partial(first + t, stride, n, term);
    return tree(t, shared, sync);
  }
};

/// Blocks of the first pass of a two-pass sum of n terms (block b sums the terms b Threads + t
/// + k Threads blocks, the second pass the blocks' totals): about 32 terms per thread, at
/// most 1024 blocks; fixed by n alone.
SOLDER_HD constexpr std::size_t total_blocks(std::size_t n) {
  constexpr std::size_t per_block = std::size_t(total_threads) * 32, most = 1024;
  const std::size_t b = (n + per_block - 1) / per_block;
  return b == 0 ? 1 : b > most ? most : b;
}

}  // namespace solder::eval::cuda
