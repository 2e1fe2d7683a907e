// eval/cpu/gemm_blocking.hpp: how the CPU GEMM cuts C = A' B' for the caches: the K, N and M
// blocks around the register tile (gemm_kernel.hpp), and the rows of C cut into tiles. The
// design, the parameters and measured numbers are in docs/gemm.md.
#pragma once

#include <algorithm>
#include <cstddef>

#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/gemm_kernel.hpp"
#include "solder/eval/cpu/tuning.hpp"

namespace solder::eval::cpu {

namespace gemm_detail {
/// Ceiling of a / b.
constexpr std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }
/// Blocks of at most `most` that n is cut into: ceil_div, without a division where one block
/// holds n (small products, where the driver's divisions are a visible part of the call).
constexpr std::size_t blocks_of(std::size_t n, std::size_t most) { return n <= most ? 1 : ceil_div(n, most); }
}  // namespace gemm_detail

/// Panels of nr columns in an N block whose kc x nc block of B fills this host's L2 budget.
inline std::size_t gemm_n_block_panels(std::size_t kc, std::size_t nr) {
  return std::max<std::size_t>(1, tuning().gemm_l2_b_bytes / (kc * nr * sizeof(float)));
}

/// How C = A' B' is cut for the caches on solder's arch (docs/gemm.md explains each choice
/// and the measurements behind it). GotoBLAS's loops with the roles of A and B exchanged,
/// because the micro-kernel's vectors run along N:
///   mr x nr   the register tile (gemm_tile), nr = nv * W columns
///   kc        K block: an mr x kc panel of A stays in L1 while the B panels stream past it
///   nc        N block, in panels of nr: a kc x nc block of B stays in L2 while every tile of
///             the M block passes over it
///   mc_max    M block, in tiles of mr: the rows of A packed at once (over all of K); B is read
///             from memory once per M block, so it is as large as its memory budget allows
/// The blocks depend on K alone and are values, not template arguments: the driver is compiled
/// once for every shape (for_k when the call starts; a test passes smaller ones).
struct gemm_blocking {
  using tile = gemm_tile<arch>;
  static constexpr std::size_t lanes = float_lanes;
  static constexpr std::size_t mr = tile::mr;
  static constexpr std::size_t nv = tile::nv;
  static constexpr std::size_t nr = nv * lanes;

  /// Bytes of packed A one M block may take: 16 MiB (1024 rows of K = 4096). It is read once
  /// per N block, from memory; B is read from memory once per M block.
  static constexpr std::size_t a_block_bytes = std::size_t{16} << 20;

  std::size_t kc;      // K block (at least 1; K = 0 is one empty block)
  std::size_t nc;      // N block, panels
  std::size_t mc_max;  // M block, tiles

  /// K blocks of equal length, at most this host's cpu_tuning::gemm_kc_max (the last one
  /// shorter by less than their count); an N block of B
  /// fills this host's L2 budget for it (cpu_tuning::gemm_l2_b_bytes; 8 panels at kc = 512
  /// with 2 MiB of L2), cutting N only, so no sum depends on it.
  static gemm_blocking for_k(std::size_t K) {
    const std::size_t k = std::max<std::size_t>(1, K);
    const std::size_t kc_max = tuning().gemm_kc_max;
    const std::size_t kc = k <= kc_max ? k : gemm_detail::ceil_div(k, gemm_detail::ceil_div(k, kc_max));
    return {kc, gemm_n_block_panels(kc, nr), std::max<std::size_t>(1, a_block_bytes / (mr * k * sizeof(float)))};
  }
};

namespace gemm_detail {

/// The rows of C cut into `count` = ceil(M / MR) tiles of nearly equal height, in pairs of
/// rows: tile t holds rows [2 (P t / count), 2 (P (t + 1) / count)) of the P = ceil(M / 2)
/// pairs, so every tile but the last of an odd M has an even height of MR or a pair fewer.
/// (Cutting MR rows at a time would leave one short tile at the bottom, whose few accumulators
/// cannot keep the FMA units busy: at 64 x 1024 x 1024 a last tile of 8 rows cost 4%.) Even
/// heights let the micro-kernels skip the odd heights above 6 (kernel_rows).
struct row_tiles {
  std::size_t M, count, pairs;
  row_tiles(std::size_t m, std::size_t mr) : M(m), count(ceil_div(m, mr)), pairs(ceil_div(m, 2)) {}
  std::size_t begin(std::size_t t) const { return std::min(M, 2 * (pairs * t / count)); }
  std::size_t rows(std::size_t t) const { return begin(t + 1) - begin(t); }
};

}  // namespace gemm_detail

}  // namespace solder::eval::cpu
