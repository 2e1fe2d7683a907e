// eval/cpu/gemm.hpp: C = A' B' on the CPU for a static N and a static or runtime K: cache
// blocking, packing of A and B into the micro-kernel's panels, the split over threads, and the
// epilogues that store C.
//
// The design, the parameters and measured numbers are in docs/gemm.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/memory.hpp"
#include "solder/eval/cpu/gemm_kernel.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/ops/activations.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace solder::eval::cpu {

// ---------------------------------------------------------------------------------------------
// Blocking
// ---------------------------------------------------------------------------------------------

/// How C = A' B' is cut for static N and K on solder's arch (docs/gemm.md explains each choice
/// and the measurements behind it). GotoBLAS's loops with the roles of A and B exchanged,
/// because the micro-kernel's vectors run along N:
///   mr x nr   the register tile (gemm_tile), nr = nv * W columns
///   kc        K block: an mr x kc panel of A stays in L1 while the B panels stream past it
///   nc        N block, in panels of nr: a kc x nc block of B stays in L2 while every tile of
///             the M block passes over it
///   mc_max    M block, in tiles of mr: the rows of A packed at once (over all of K); B is read
///             from memory once per M block, so it is as large as its memory budget allows
template <std::size_t N, std::size_t K>
struct gemm_blocking {
  static_assert(N >= 1 && K >= 1, "solder::eval::cpu::gemm: N and K must be at least 1");
  using tile = gemm_tile<arch>;
  static constexpr std::size_t lanes = float_lanes;
  static constexpr std::size_t mr = tile::mr;
  static constexpr std::size_t nv = tile::nv;
  static constexpr std::size_t nr = nv * lanes;

  /// Longest K block: a 14 x 512 panel of A (28 KiB) stays in the 48 KiB L1 next to the B
  /// stream (AVX2: 6 x 512, 12 KiB). Measured against 256: 3-5% faster at 64 x 1024 x 1024 and
  /// 256 x 1024 x 2048 (half the partial-sum round trips and block switches).
  static constexpr std::size_t kc_max = 512;
  static constexpr std::size_t k_blocks = (K + kc_max - 1) / kc_max;
  /// K blocks of equal length (the last one shorter by less than k_blocks).
  static constexpr std::size_t kc = (K + k_blocks - 1) / k_blocks;

  /// Bytes of B one N block may take in L2 (2 MiB per core here): a quarter of it, leaving
  /// room for the next block arriving and the A panels and partial sums passing through
  /// (measured: 256 KiB to 512 KiB are best, 1 MiB loses 3-10%). 8 panels at kc = 512.
  static constexpr std::size_t l2_b_bytes = std::size_t{512} << 10;
  static constexpr std::size_t panels = (N + nr - 1) / nr;
  static constexpr std::size_t nc = std::max<std::size_t>(1, l2_b_bytes / (kc * nr * sizeof(float)));  // panels

  /// Bytes of packed A one M block may take: 16 MiB (1024 rows of K = 4096). It is read once
  /// per N block, from memory; B is read from memory once per M block.
  static constexpr std::size_t a_block_bytes = std::size_t{16} << 20;
  static constexpr std::size_t mc_max = std::max<std::size_t>(1, a_block_bytes / (mr * K * sizeof(float)));  // tiles
};

/// gemm_blocking for a K known only at run time (gemm_dyn_k): the same register tile, budgets
/// and formulas, evaluated when the call starts (for_k(K) equals gemm_blocking<N, K>).
struct gemm_dyn_k_blocking {
  using tile = gemm_tile<arch>;
  static constexpr std::size_t mr = tile::mr;
  static constexpr std::size_t nv = tile::nv;
  static constexpr std::size_t nr = nv * float_lanes;

  std::size_t kc;      // K block (at least 1; K = 0 is one empty block)
  std::size_t nc;      // N block, panels
  std::size_t mc_max;  // M block, tiles

  static constexpr gemm_dyn_k_blocking for_k(std::size_t K) {
    using budgets = gemm_blocking<1, 1>;  // kc_max and the byte budgets depend on neither N nor K
    const std::size_t k = std::max<std::size_t>(1, K);
    const std::size_t k_blocks = (k + budgets::kc_max - 1) / budgets::kc_max;
    const std::size_t kc = (k + k_blocks - 1) / k_blocks;
    return {kc, std::max<std::size_t>(1, budgets::l2_b_bytes / (kc * nr * sizeof(float))),
            std::max<std::size_t>(1, budgets::a_block_bytes / (mr * k * sizeof(float)))};
  }
};

namespace gemm_detail {

/// Ceiling of a / b.
constexpr std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

/// K as the packing and the driver below take it: std::integral_constant<std::size_t, K> for a
/// static K (one instantiation per K, every expression of K folded as before), std::size_t for
/// a runtime one (one instantiation for all K).
template <std::size_t K>
using static_k = std::integral_constant<std::size_t, K>;

/// The value of a K argument (for static_k, a constant the compiler folds).
template <std::size_t K>
constexpr std::size_t k_of(static_k<K>) { return K; }
constexpr std::size_t k_of(std::size_t k) { return k; }

/// The packed layout of B' [K, N] (independent of the cache blocking): panels of nr columns,
/// panel p at p * K * nr, holding B'[k][p * nr + j] at k * width + j, where width = nr except in
/// the last panel, which is only as wide as the vectors it needs (edge_nv * W), zero-padded.
template <std::size_t N>
struct b_panels {
  static constexpr std::size_t lanes = float_lanes;
  static constexpr std::size_t nr = gemm_tile<arch>::nv * lanes;
  static constexpr std::size_t panels = ceil_div(N, nr);
  static constexpr std::size_t edge_cols = N - (panels - 1) * nr;  // columns of the last panel
  static constexpr std::size_t edge_nv = ceil_div(edge_cols, lanes);
  static constexpr std::size_t edge_width = edge_nv * lanes;
  static constexpr std::size_t width(std::size_t p) { return p + 1 == panels ? edge_width : nr; }
  /// Floats B' takes packed.
  static constexpr std::size_t floats(std::size_t K) { return (panels - 1) * K * nr + K * edge_width; }
};

/// b_panels for a static K, with its size.
template <std::size_t N, std::size_t K>
struct b_layout : b_panels<N> {
  using blocking = gemm_blocking<N, K>;
  static constexpr std::size_t size = b_panels<N>::floats(K);  // floats
};

#if defined(__AVX512F__)
/// The lane indices of one transpose stage: with h = 8, 4, 2, 1 in turn, row i (bit h clear)
/// and row i + h exchange their off-diagonal blocks; after the four stages the row and lane
/// bits have traded places. vpermt2ps indices: 0-15 pick from row i, 16-31 from row i + h.
template <int H>
SOLDER_INLINE __m512i transpose_index(bool upper) {
  alignas(64) int idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = (l & H) == 0 ? (upper ? l + H : l) : (upper ? 16 + l : 16 + l - H);
  return _mm512_load_si512(idx);
}
template <int H>
SOLDER_INLINE void transpose_stage(__m512 (&r)[16]) {
  const __m512i lo = transpose_index<H>(false), hi = transpose_index<H>(true);
  for (int i = 0; i < 16; ++i)
    if ((i & H) == 0) {
      const __m512 a = r[i], b = r[i + H];
      r[i] = _mm512_permutex2var_ps(a, lo, b);
      r[i + H] = _mm512_permutex2var_ps(a, hi, b);
    }
}
/// Transposes 16 vectors in place: afterwards r[j] lane i holds what r[i] lane j held.
/// (Permutes rather than unpacks: GCC 12's unpack intrinsics trip -Wmaybe-uninitialized.)
SOLDER_INLINE void transpose16(__m512 (&r)[16]) {
  transpose_stage<8>(r);
  transpose_stage<4>(r);
  transpose_stage<2>(r);
  transpose_stage<1>(r);
}
#endif

/// out[k * Stride + r] = src[r * ld + k] for k < K, r < Rows: `rows` (<= Rows) rows of a
/// row-major matrix, transposed into panel layout. Lanes r in [rows, Rows) are written as 0
/// when ZeroFill, else left alone.
template <std::size_t Rows, std::size_t Stride, bool ZeroFill, class KArg>
void pack_transposed(const float* src, std::size_t ld, std::size_t rows, KArg k_arg, float* out) {
  const std::size_t K = k_of(k_arg);
  static_assert(Rows <= Stride, "solder::eval::cpu::pack_transposed: Rows must fit in Stride");
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, arch> && Rows <= 16) {
    // 16 k at a time: load the row segments, transpose 16 x 16 in registers, store Rows
    // lanes of each column.
    constexpr __mmask16 lane_mask = __mmask16((1u << Rows) - 1u);
    for (std::size_t k0 = 0; k0 < K; k0 += 16) {
      const std::size_t kn = std::min<std::size_t>(16, K - k0);
      const __mmask16 k_mask = __mmask16((1u << kn) - 1u);
      __m512 r[16];
      for (std::size_t i = 0; i < 16; ++i)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(k_mask, src + i * ld + k0) : _mm512_setzero_ps();
      transpose16(r);
      const __mmask16 store_mask = ZeroFill ? lane_mask : __mmask16(lane_mask & ((1u << rows) - 1u));
      for (std::size_t j = 0; j < kn; ++j) _mm512_mask_storeu_ps(out + (k0 + j) * Stride, store_mask, r[j]);
    }
    return;
  }
#endif
  // Chunks of 64 k: the source rows and the destination block stay in L1.
  constexpr std::size_t chunk = 64;
  for (std::size_t k0 = 0; k0 < K; k0 += chunk) {
    const std::size_t k1 = std::min(K, k0 + chunk);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t k = k0; k < k1; ++k) out[k * Stride + r] = src[r * ld + k];
    if constexpr (ZeroFill)
      for (std::size_t r = rows; r < Rows; ++r)
        for (std::size_t k = k0; k < k1; ++k) out[k * Stride + r] = 0.0f;
  }
}

/// The rows of C cut into tiles of nearly equal height: `count` = ceil(M / MR) tiles, tile t
/// holding rows [M t / count, M (t + 1) / count), MR or a row fewer. (Cutting MR rows at a time
/// would leave one short tile at the bottom, whose few accumulators cannot keep the FMA units
/// busy: at 64 x 1024 x 1024 a last tile of 8 rows cost 4%.)
struct row_tiles {
  std::size_t M, count;
  row_tiles(std::size_t m, std::size_t mr) : M(m), count(ceil_div(m, mr)) {}
  std::size_t begin(std::size_t t) const { return M * t / count; }
  std::size_t rows(std::size_t t) const { return begin(t + 1) - begin(t); }
};

/// Packs tiles [t0, t1) of A' (all K columns) into dst: tile t0 + i holds A'[m][k] for its rows
/// m = begin + r at i * K * MR + k * MR + r. Lanes past a tile's rows are not written (the
/// micro-kernel for a shorter tile never reads them).
///   TransA = false: A stored [M, K], A'[m][k] = A[m * lda + k] (a transpose)
///   TransA = true:  A stored [K, M], A'[m][k] = A[k * lda + m] (rows of a tile are copies)
template <std::size_t MR, bool TransA, class KArg>
void pack_a(const float* A, std::size_t lda, const row_tiles& tiling, std::size_t t0, std::size_t t1, KArg k_arg,
            float* dst) {
  const std::size_t K = k_of(k_arg);
  for (std::size_t t = t0; t < t1; ++t) {
    const std::size_t m0 = tiling.begin(t), rows = tiling.rows(t);
    float* out = dst + (t - t0) * K * MR;
    if constexpr (TransA) {
      for (std::size_t k = 0; k < K; ++k) std::memcpy(out + k * MR, A + k * lda + m0, rows * sizeof(float));
    } else {
      pack_transposed<MR, MR, false>(A + m0 * lda, lda, rows, k_arg, out);
    }
  }
}

/// Packs panels [p0, p1) of B' into `dst` (b_panels<N>), zero-padded to the panel width.
///   TransB = false: B stored [K, N], B'[k][n] = B[k * ldb + n] (rows of a panel are copies)
///   TransB = true:  B stored [N, K], B'[k][n] = B[n * ldb + k] (a transpose, 16 columns at
///                   a time)
template <std::size_t N, bool TransB, class KArg>
void pack_b_panels(const float* B, std::size_t ldb, KArg k_arg, float* dst, std::size_t p0, std::size_t p1) {
  const std::size_t K = k_of(k_arg);
  using L = b_panels<N>;
  constexpr std::size_t W = L::lanes;
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t n0 = p * L::nr;
    const std::size_t width = L::width(p);
    const std::size_t cols = std::min(width, N - n0);
    float* out = dst + p * K * L::nr;
    if constexpr (!TransB) {
      for (std::size_t k = 0; k < K; ++k) {
        std::memcpy(out + k * width, B + k * ldb + n0, cols * sizeof(float));
        std::fill(out + k * width + cols, out + (k + 1) * width, 0.0f);
      }
    } else {
      // One vector's worth of columns at a time (16 with AVX-512, 8 with AVX2).
      for (std::size_t j = 0; j < width; j += W) {
        const std::size_t n = j < cols ? std::min(W, cols - j) : 0;
        if (width == L::nr)
          pack_transposed<W, L::nr, true>(B + (n0 + j) * ldb, ldb, n, k_arg, out + j);
        else
          pack_transposed<W, L::edge_width, true>(B + (n0 + j) * ldb, ldb, n, k_arg, out + j);
      }
    }
  }
}

/// What each thread keeps between calls: packed A, the partial sums, and (for the calls that
/// pack B themselves) the packed B of the calling thread.
enum class workspace_slot { packed_a, partial_sums, packed_b, count };
inline float* thread_workspace(workspace_slot slot, std::size_t n) {
  thread_local growing_buffer<float> spaces[std::size_t(workspace_slot::count)];
  return spaces[std::size_t(slot)].get(n);
}

/// One thread's share of C: row tiles [t0, t1) and column panels [p0, p1).
struct gemm_part {
  std::size_t t0, t1, p0, p1;
};

/// Which lines of the next block of packed B (panels [p, p + np), K range [k0, k0 + kc)) each
/// micro-kernel call of the current block prefetches into L2. Every tile of a block reads the
/// whole block, so without this the first tile would fetch it all from memory at once, faster
/// than one core's memory bandwidth; spread over all the calls of the previous block, the
/// fetch asks for a few lines per 100 cycles.
template <std::size_t N, class KArg>
struct l2_prefetch_plan {
  using L = b_panels<N>;
  const float* packed_b = nullptr;
  [[no_unique_address]] KArg k_arg;
  std::size_t p = 0, np = 0, k0 = 0, kc = 0;  // the next block; np = 0: none
  std::size_t parts = 1, part_lines = 0;      // calls per panel, lines per call

  /// Plans the fetch of the next block over `calls` calls of `kc_now` steps each.
  void plan(std::size_t calls, std::size_t kc_now) {
    if (np == 0) return;
    parts = std::max<std::size_t>(1, calls / np);
    const std::size_t lines = ceil_div(kc * L::nr * sizeof(float), 64);
    part_lines = std::min(ceil_div(lines, parts), ceil_div(kc_now, 2));
  }
  /// The lines call `c` of the current block prefetches.
  void assign(std::size_t c, tile_job& job) const {
    job.b_next = nullptr;
    job.b_next_lines = 0;
    const std::size_t q = c / parts, part = c % parts;
    if (q >= np) return;
    const std::size_t panel = p + q;
    const std::size_t lines = ceil_div(kc * L::width(panel) * sizeof(float), 64);
    const std::size_t first = part * part_lines;
    if (first >= lines) return;
    const std::size_t K = k_of(k_arg);
    job.b_next = reinterpret_cast<const char*>(packed_b + panel * K * L::nr + k0 * L::width(panel)) + first * 64;
    job.b_next_lines = std::min(part_lines, lines - first);
  }
};

/// Computes one thread's part of C with the cache blocking `blocking` (gemm_blocking<N, K>,
/// gemm_dyn_k_blocking, or a test's smaller one): for each M block, A is packed once over all
/// of K; for each N block, each K block runs over every tile of the M block, each tile over
/// every panel of the N block (so a kc x mr panel of A stays in L1 across the panels, and the
/// kc x nc block of B in L2 across the tiles). Meanwhile the next block of B
/// (l2_prefetch_plan) and the next panel of A are prefetched into L2.
template <std::size_t N, bool TransA, class Blocking, class KArg, class Epi>
void gemm_part_run(const gemm_part& part, const row_tiles& tiling, Blocking blocking, KArg k_arg, const float* A,
                   std::size_t lda, const float* packed_b, Epi& epi) {
  const std::size_t K = k_of(k_arg);
  using L = b_panels<N>;
  constexpr std::size_t MR = Blocking::mr;
  constexpr std::size_t NV = Blocking::nv;
  constexpr std::size_t NR = Blocking::nr;
  const std::size_t KC = blocking.kc;
  // K = 0 (runtime K only) is one empty K block: the epilogue still gets every tile.
  const std::size_t k_blocks = std::max<std::size_t>(1, ceil_div(K, KC));
  constexpr auto& full = kernel_table<NV, MR, Epi>;
  constexpr auto& edge = kernel_table<L::edge_nv, MR, Epi>;

  const std::size_t tiles = part.t1 - part.t0;
  const std::size_t panels = part.p1 - part.p0;
  if (tiles == 0 || panels == 0) return;
  // Blocks of equal size (within one tile or panel), at most mc_max tiles and nc panels.
  const std::size_t m_blocks = ceil_div(tiles, blocking.mc_max);
  const std::size_t mc = ceil_div(tiles, m_blocks);
  const std::size_t n_blocks = ceil_div(panels, blocking.nc);
  const std::size_t nc = ceil_div(panels, n_blocks);

  float* packed_a = thread_workspace(workspace_slot::packed_a, mc * MR * K);
  float* partial = k_blocks > 1 ? thread_workspace(workspace_slot::partial_sums, mc * nc * MR * NR) : nullptr;

  for (std::size_t ti = part.t0; ti < part.t1; ti += mc) {
    const std::size_t mt = std::min(mc, part.t1 - ti);
    pack_a<MR, TransA>(A, lda, tiling, ti, ti + mt, k_arg, packed_a);

    for (std::size_t pj = part.p0; pj < part.p1; pj += nc) {
      const std::size_t np = std::min(nc, part.p1 - pj);
      for (std::size_t kb = 0; kb < k_blocks; ++kb) {
        tile_job job{};
        job.first = kb == 0;
        job.last = kb + 1 == k_blocks;
        const std::size_t k0 = kb * KC;
        job.kc = std::min(KC, K - k0);

        // The block this thread reads next: the next K block, else the first K block of the
        // next N block, else that of the first N block for the next M block.
        l2_prefetch_plan<N, KArg> next{packed_b, k_arg};
        if (!job.last)
          next.p = pj, next.np = np, next.k0 = k0 + KC, next.kc = std::min(KC, K - k0 - KC);
        else if (pj + nc < part.p1)
          next.p = pj + nc, next.np = std::min(nc, part.p1 - pj - nc), next.kc = std::min(KC, K);
        else if (ti + mc < part.t1)
          next.p = part.p0, next.np = std::min(nc, panels), next.kc = std::min(KC, K);
        next.plan(mt * np, job.kc);

        for (std::size_t i = 0; i < mt; ++i) {
          job.m0 = tiling.begin(ti + i);
          const std::size_t r = tiling.rows(ti + i);
          job.a = packed_a + i * K * MR + k0 * MR;
          // The A panel used after this tile's calls: the next tile's, else the first tile's in
          // the next K block or N block. Packed A is read from memory once per N block, and
          // the hardware prefetcher stops at every 4 KiB page of a panel.
          const float* a_next = nullptr;
          std::size_t a_next_kc = 0;
          if (i + 1 < mt)
            a_next = job.a + K * MR, a_next_kc = job.kc;
          else if (!job.last)
            a_next = packed_a + (k0 + KC) * MR, a_next_kc = std::min(KC, K - k0 - KC);
          else if (pj + nc < part.p1)
            a_next = packed_a, a_next_kc = std::min(KC, K);
          const std::size_t a_lines = ceil_div(a_next_kc * MR * sizeof(float), 64);
          const std::size_t a_per_call = std::min(ceil_div(a_lines, np), ceil_div(job.kc, 2));
          for (std::size_t j = 0; j < np; ++j) {
            const std::size_t p = pj + j;
            const std::size_t width = L::width(p);
            job.n0 = p * NR;
            job.nr = std::min(NR, N - job.n0);
            job.b = packed_b + p * K * NR + k0 * width;
            job.partial = partial ? partial + (i * np + j) * MR * NR : nullptr;  // slots in call order
            next.assign(i * np + j, job);
            const std::size_t a_first = j * a_per_call;
            job.a_next = a_first < a_lines ? reinterpret_cast<const char*>(a_next) + a_first * 64 : nullptr;
            job.a_next_lines = a_first < a_lines ? std::min(a_per_call, a_lines - a_first) : 0;
            // The partial sums the next call starts from, on their way to L1 meanwhile.
            if (!job.first && partial != nullptr)
              for (std::size_t line = 0; line < MR * NR * sizeof(float); line += 64)
                __builtin_prefetch(reinterpret_cast<const char*>(job.partial + MR * NR) + line, 0, 3);
            if (width == NR) {
              if (r == MR) micro_kernel<MR, NV, MR, Epi>(job, epi);
              else full[r - 1](job, epi);
            } else {
              edge[r - 1](job, epi);
            }
          }
        }
      }
    }
  }
}

/// Flops below which a call stays on one thread (a parallel region costs a few microseconds).
inline constexpr double parallel_min_flops = 4.0e6;

/// Splits C into `threads` parts of tm x tn (row tiles x column panels), choosing the split
/// with the least work on the busiest thread. A thread's work is counted as rows x (columns +
/// 32): packing a row of A costs about as much as 32 columns of its products.
template <std::size_t N, std::size_t NR, std::size_t Panels>
std::pair<std::size_t, std::size_t> choose_split(const row_tiles& tiling, int threads) {
  std::size_t best_tm = 1, best_tn = 1;
  double best = -1;
  for (std::size_t tm = 1; tm <= std::size_t(threads); ++tm) {
    const std::size_t tn = std::size_t(threads) / tm;
    if (tm > tiling.count || tn > Panels) continue;
    const double rows = double(tiling.begin(ceil_div(tiling.count, tm)));  // the first part is the largest
    const double cols = double(std::min(N, ceil_div(Panels, tn) * NR));
    const double cost = rows * (cols + 32.0);
    if (best < 0 || cost < best) best = cost, best_tm = tm, best_tn = tn;
  }
  return {best_tm, best_tn};
}

/// C = A' B' with B' already packed (b_panels<N>), on up to `threads` threads.
template <std::size_t N, bool TransA, class Blocking, class KArg, class Epi>
void gemm_packed(std::size_t M, KArg k_arg, Blocking blocking, const float* A, std::size_t lda,
                 const float* packed_b, Epi& epi, int threads) {
  if (M == 0) return;
  const std::size_t K = k_of(k_arg);
  constexpr std::size_t panels = b_panels<N>::panels;
  const row_tiles tiling(M, Blocking::mr);
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (threads <= 1 || flops < parallel_min_flops) {
    gemm_part_run<N, TransA>(gemm_part{0, tiling.count, 0, panels}, tiling, blocking, k_arg, A, lda, packed_b, epi);
    return;
  }
  const auto [tm, tn] = choose_split<N, Blocking::nr, panels>(tiling, threads);
  parallel_for(tm * tn, int(tm * tn), [&](std::size_t t) {
    const std::size_t i = t / tn, j = t % tn;
    const std::size_t tiles = tiling.count;
    const gemm_part part{tiles * i / tm, tiles * (i + 1) / tm, panels * j / tn, panels * (j + 1) / tn};
    gemm_part_run<N, TransA>(part, tiling, blocking, k_arg, A, lda, packed_b, epi);
  });
}

/// Packs B' for a call that was not given a packed_b: into the calling thread's workspace,
/// panels spread over the threads.
template <std::size_t N, bool TransB, class KArg>
const float* pack_b_for_call(const float* B, std::size_t ldb, KArg k_arg, int threads) {
  const std::size_t K = k_of(k_arg);
  using L = b_panels<N>;
  float* dst = thread_workspace(workspace_slot::packed_b, L::floats(K));
  const double bytes = double(N) * double(K) * sizeof(float);
  const int t = threads > 1 && bytes >= (1 << 20) ? threads : 1;
  const std::size_t chunks = std::min<std::size_t>(L::panels, std::size_t(t));
  parallel_for(chunks, t, [&](std::size_t c) {
    pack_b_panels<N, TransB>(B, ldb, k_arg, dst, L::panels * c / chunks, L::panels * (c + 1) / chunks);
  });
  return dst;
}

/// C = A' B' for a runtime K with the cache blocking `blocking`: B' packed per call, then the
/// driver of the static K.
template <std::size_t N, bool TransA, bool TransB, class Epi>
void gemm_dyn_k_run(std::size_t M, std::size_t K, const float* A, std::size_t lda, const float* B, std::size_t ldb,
                    Epi& epi, int threads, const gemm_dyn_k_blocking& blocking) {
  if (M == 0) return;
  const float* packed = pack_b_for_call<N, TransB>(B, ldb, K, threads);
  gemm_packed<N, TransA>(M, K, blocking, A, lda, packed, epi, threads);
}

}  // namespace gemm_detail

// ---------------------------------------------------------------------------------------------
// Packed B and the entry points
// ---------------------------------------------------------------------------------------------

/// B' [K, N] packed once into the micro-kernel's panels (weights frozen for inference, or
/// packed once per optimizer step) and reused by every call. B' = B [K, N], or (TransB) B^T
/// for B stored [N, K], as PyTorch stores a linear layer's weight. Row-major, leading
/// dimension ldb.
template <std::size_t N, std::size_t K, bool TransB>
class packed_b {
 public:
  using layout = gemm_detail::b_layout<N, K>;
  /// Floats the packed panels take (N and K rounded up to whole vectors per panel).
  static constexpr std::size_t size = layout::size;

  packed_b() = default;
  packed_b(const float* B, std::size_t ldb) : packed_b() { pack(B, ldb); }

  /// Packs B' from B (leading dimension ldb: at least K when TransB, else at least N).
  void pack(const float* B, std::size_t ldb) {
    SOLDER_ASSERT(ldb >= (TransB ? K : N), "solder::eval::cpu::packed_b: ldb is smaller than a row of B");
    gemm_detail::pack_b_panels<N, TransB>(B, ldb, gemm_detail::static_k<K>{}, data_.get(), 0, layout::panels);
  }

  /// The packed panels (gemm_detail::b_layout<N, K>), 64-byte aligned.
  const float* data() const { return data_.get(); }

 private:
  aligned_array<float> data_ = allocate_aligned<float>(size);
};

/// C[M, N] = A' B' with B' pre-packed; A' = A [M, K] or (TransA) A^T for A stored [K, M],
/// row-major with leading dimension lda. Every tile of C goes to the epilogue once, with its
/// whole K sum in registers: epi.template tile<MR, NV>(acc, m0, n0, mr, nr) (see
/// store_epilogue). Tiles are disjoint and may reach the epilogue from several threads at once.
/// The result does not depend on `threads` (bit for bit): threads split M and N, never K.
template <std::size_t N, std::size_t K, bool TransA, bool TransB, class Epilogue>
void gemm(std::size_t M, const float* A, std::size_t lda, const packed_b<N, K, TransB>& B, Epilogue&& epi,
          int threads = solder::num_threads()) {
  SOLDER_ASSERT(lda >= (TransA ? M : K), "solder::eval::cpu::gemm: lda is smaller than a row of A");
  gemm_detail::gemm_packed<N, TransA>(M, gemm_detail::static_k<K>{}, gemm_blocking<N, K>{}, A, lda, B.data(), epi,
                                      threads);
}

/// C[M, N] = A' B' as above, B' = B [K, N] or (TransB) B^T for B stored [N, K], leading
/// dimension ldb; B' is packed on every call (into a buffer the calling thread keeps).
template <std::size_t N, std::size_t K, bool TransA, bool TransB, class Epilogue>
void gemm(std::size_t M, const float* A, std::size_t lda, const float* B, std::size_t ldb, Epilogue&& epi,
          int threads = solder::num_threads()) {
  SOLDER_ASSERT(lda >= (TransA ? M : K), "solder::eval::cpu::gemm: lda is smaller than a row of A");
  SOLDER_ASSERT(ldb >= (TransB ? K : N), "solder::eval::cpu::gemm: ldb is smaller than a row of B");
  if (M == 0) return;
  const float* packed = gemm_detail::pack_b_for_call<N, TransB>(B, ldb, gemm_detail::static_k<K>{}, threads);
  gemm_detail::gemm_packed<N, TransA>(M, gemm_detail::static_k<K>{}, gemm_blocking<N, K>{}, A, lda, packed, epi,
                                      threads);
}

/// C[M, N] = A' B' as above with K a runtime value (K = 0 gives the epilogue a zero sum):
/// A' = A [M, K] or (TransA) A^T for A stored [K, M]; B' = B [K, N] or (TransB) B^T for B
/// stored [N, K]. For products whose inner length is the batch, e.g. a linear layer's
/// dW [Out, In] = dy^T x: gemm_dyn_k<In, true, false>(Out, batch, dy, Out, x, In, epi).
/// The same packing, driver, micro-kernels and epilogue hook as gemm, so the same bits as gemm
/// for the same K, for any `threads`; B' is packed on every call (into a buffer the calling
/// thread keeps), A' per M block.
template <std::size_t N, bool TransA, bool TransB, class Epilogue>
void gemm_dyn_k(std::size_t M, std::size_t K, const float* A, std::size_t lda, const float* B, std::size_t ldb,
                Epilogue&& epi, int threads = solder::num_threads()) {
  if constexpr (N >= 1) {
    SOLDER_ASSERT(lda >= (TransA ? M : K), "solder::eval::cpu::gemm_dyn_k: lda is smaller than a row of A");
    SOLDER_ASSERT(ldb >= (TransB ? K : N), "solder::eval::cpu::gemm_dyn_k: ldb is smaller than a row of B");
    gemm_detail::gemm_dyn_k_run<N, TransA, TransB>(M, K, A, lda, B, ldb, epi, threads,
                                                   gemm_dyn_k_blocking::for_k(K));
  } else {
    static_assert(N >= 1, "solder::eval::cpu::gemm_dyn_k: N must be at least 1; N is the number of columns of C");
  }
}

// ---------------------------------------------------------------------------------------------
// Epilogues
// ---------------------------------------------------------------------------------------------

namespace gemm_detail {

/// Stores row `row` of a tile (NV vectors, nr valid columns) at c, through `f` per vector.
template <std::size_t NV, class F>
SOLDER_INLINE void store_row(float* c, const vec<float> (&row)[NV], std::size_t nr, F&& f) {
  constexpr std::size_t W = float_lanes;
  if (nr == NV * W) {
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v) f(row[v], v).store_unaligned(c + v * W);
    return;
  }
  for (std::size_t v = 0; v < NV && v * W < nr; ++v) {
    const std::size_t left = nr - v * W;
    if (left >= W) f(row[v], v).store_unaligned(c + v * W);
    else store_first(c + v * W, f(row[v], v), left);
  }
}

}  // namespace gemm_detail

/// C = A' B': stores each tile at C[m][n] (row-major, leading dimension ldc), never past the
/// mr x nr valid part of an edge tile.
struct store_epilogue {
  float* C;
  std::size_t ldc;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr)
        gemm_detail::store_row<NV>(C + (m0 + r) * ldc + n0, acc[r], nr,
                                   [](const vec<float>& x, std::size_t) { return x; });
  }
};

/// C = relu(A' B' + bias), bias [N] added to every row; relu is ops::relu (relu(NaN) = NaN).
struct bias_relu_epilogue {
  const float* bias;
  float* C;
  std::size_t ldc;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    constexpr std::size_t W = float_lanes;
    vec<float> b[NV];
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v)
      b[v] = (v + 1) * W <= nr ? vec<float>::load_unaligned(bias + n0 + v * W)
             : v * W < nr      ? load_first<vec<float>>(bias + n0 + v * W, nr - v * W)
                               : vec<float>(0.0f);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr)
        gemm_detail::store_row<NV>(C + (m0 + r) * ldc + n0, acc[r], nr, [&](const vec<float>& x, std::size_t v) {
          return ops::relu{}.forward(x + b[v]);
        });
  }
};

/// C = beta C + A' B', as fma(beta, C, A' B') (one rounding; beta = 1 gives C + A' B'), for
/// gradients accumulated over micro-batches. beta = 0 stores A' B' without reading C, so
/// whatever C held (NaN, Inf, uninitialized memory) is overwritten.
struct accumulate_epilogue {
  float* C;
  std::size_t ldc;
  float beta = 1.0f;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    if (beta == 0.0f) {
      store_epilogue{C, ldc}.template tile<MR, NV>(acc, m0, n0, mr, nr);
      return;
    }
    constexpr std::size_t W = float_lanes;
    const vec<float> b(beta);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr) {
        float* c = C + (m0 + r) * ldc + n0;
        gemm_detail::store_row<NV>(c, acc[r], nr, [&](const vec<float>& x, std::size_t v) {
          const std::size_t col = v * W;  // store_row asks only for vectors with valid lanes
          const vec<float> old = col + W <= nr ? vec<float>::load_unaligned(c + col)
                                               : load_first<vec<float>>(c + col, nr - col);
          return xsimd::fma(b, old, x);
        });
      }
  }
};

}  // namespace solder::eval::cpu
