// eval/cpu/gemm.hpp: C = A' B' on the CPU: the driver (the loops over the blocks of
// gemm_blocking.hpp, the packing of gemm_packing.hpp, the micro-kernel of gemm_kernel.hpp, the
// split over threads), which takes N and K as values so that one instantiation serves every
// shape, and its entry points. Each tile of C goes to an epilogue once (gemm_epilogue.hpp). The
// design, the parameters and measured numbers are in docs/gemm.md.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/eval/cpu/gemm_epilogue.hpp"
#include "solder/eval/cpu/gemm_kernel.hpp"
#include "solder/eval/cpu/gemm_packing.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/memory.hpp"

namespace solder::eval::cpu {

namespace gemm_detail {

/// What each thread keeps between calls: packed A, the partial sums, and (for the calls that
/// pack B themselves) the packed B of the calling thread.
enum class workspace_slot { packed_a, partial_sums, packed_b, block_b, count };
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
struct l2_prefetch_plan {
  const b_panels* L;
  std::size_t K;
  const float* packed_b = nullptr;
  std::size_t p = 0, np = 0, k0 = 0, kc = 0;  // the next block; np = 0: none
  std::size_t parts = 1, part_lines = 0;      // calls per panel, lines per call

  /// Plans the fetch of the next block over `calls` calls of `kc_now` steps each.
  void plan(std::size_t calls, std::size_t kc_now) {
    if (np == 0) return;
    parts = std::max<std::size_t>(1, calls / np);
    const std::size_t lines = ceil_div(kc * b_panels::nr * sizeof(float), 64);
    part_lines = std::min(ceil_div(lines, parts), ceil_div(kc_now, 2));
  }
  /// The lines call `c` of the current block prefetches.
  void assign(std::size_t c, tile_job& job) const {
    job.b_next = nullptr;
    job.b_next_lines = 0;
    const std::size_t q = c / parts, part = c % parts;
    if (q >= np) return;
    const std::size_t panel = p + q;
    const std::size_t lines = ceil_div(kc * L->width(panel) * sizeof(float), 64);
    const std::size_t first = part * part_lines;
    if (first >= lines) return;
    job.b_next = reinterpret_cast<const char*>(packed_b + panel * K * b_panels::nr + k0 * L->width(panel)) + first * 64;
    job.b_next_lines = std::min(part_lines, lines - first);
  }
};

/// Which lines of the stored matrix that the next block of B is packed from each micro-kernel
/// call of the current block prefetches into L2: the walk cut into runs of consecutive lines,
/// one per call, crossing rows. Packing reads those rows a page apart, which the hardware
/// prefetcher does not follow; fetched meanwhile, they are in L2 when the block is packed.
struct row_prefetch_plan {
  row_lines_walk walk;
  std::size_t per_call = 0;
  void plan(std::size_t calls, std::size_t kc_now) {
    if (walk.rows == 0 || calls == 0) return;
    per_call = std::min(ceil_div(walk.rows * walk.row_lines, calls), ceil_div(kc_now, 2));
  }
  void assign(std::size_t c, tile_job& job) const {
    job.b_next = nullptr;
    job.b_next_lines = 0;
    const std::size_t total = walk.rows * walk.row_lines, first = c * per_call;
    if (per_call == 0 || first >= total) return;
    const std::size_t r = first / walk.row_lines, l = first % walk.row_lines;
    job.b_next = walk.base + r * walk.stride + l * 64;
    job.b_next_lines = std::min(per_call, total - first);
    job.b_row_lines = walk.row_lines;
    job.b_row_left = walk.row_lines - l;
    job.b_row_skip = walk.stride - walk.row_lines * 64;
  }
};

/// Where the micro-kernels read B' from: all of it packed before the call (a packed_matrix, or
/// packed per call), so the next block can be prefetched into L2 while this one is used.
struct b_packed_whole {
  static constexpr bool prefetchable = true;
  const float* data;
  void prepare(std::size_t /*p*/, std::size_t /*np*/, std::size_t /*k0*/, std::size_t /*kc*/) {}
  template <std::size_t NR>
  const float* panel(std::size_t p, std::size_t k0, std::size_t width, std::size_t K) const {
    return data + p * K * NR + k0 * width;
  }
};

/// B' packed one block at a time, right before the tiles use it, into a per-thread buffer that
/// stays in L2: pack(dst, p0, p1, k0, k1) packs panels [p0, p1) over K range [k0, k1), panel
/// p - p0 at (p - p0) kc nr, row k - k0 at (k - k0) width. For operands made while packing
/// (sketches): B' never goes to memory whole, and is made again for each M block.
template <class Pack>
struct b_packed_per_block {
  static constexpr bool prefetchable = false;
  const Pack* pack;
  std::size_t floats;  // the largest cache block: nc kc nr
  std::size_t nr;
  float* buffer = nullptr;
  std::size_t p0 = 0, k_base = 0, kc = 0;
  /// Packs panels [p, p + np) over K range [k0, k0 + k_count): a cache block, or (a tile-major
  /// run) all of K.
  void prepare(std::size_t p, std::size_t np, std::size_t k0, std::size_t k_count) {
    // The buffer of the thread that runs this part (a copy of the source is made per part).
    if (buffer == nullptr || np * k_count * nr > floats) {
      floats = std::max(floats, np * k_count * nr);
      buffer = thread_workspace(workspace_slot::block_b, floats);
    }
    (*pack)(buffer, p, p + np, k0, k0 + k_count);
    p0 = p;
    k_base = k0;
    kc = k_count;
  }
  template <std::size_t NR>
  const float* panel(std::size_t p, std::size_t k0, std::size_t width, std::size_t /*K*/) const {
    return buffer + (p - p0) * kc * NR + (k0 - k_base) * width;
  }
  /// The stored rows the block (p, np, k0, k_count) is packed from, where the packer says.
  row_lines_walk source(std::size_t p, std::size_t np, std::size_t k0, std::size_t k_count) const {
    if constexpr (requires { pack->source(p, p + np, k0, k0 + k_count); })
      return pack->source(p, p + np, k0, k0 + k_count);
    else
      return {};
  }
};

/// What the threads of an N split share: A' packed once for all of them, where each would
/// otherwise pack all of it for its own columns (at 256 x 1024 x 2048 on 2 threads, 2 MiB of A
/// packed twice: 0.96x oneDNN, 0.99x shared; docs/gemm.md). The tiles are packed by whichever
/// thread claims them next, so a worker that starts late packs fewer; a thread computes once
/// every tile is packed.
struct shared_a {
  float* packed;  // tile t at t K MR
  std::atomic<std::size_t> next_tile{0}, tiles_packed{0};

  /// Packs the tiles this thread claims, then waits for the others' (a tile claimed is being
  /// packed by a running thread, so the wait is at most one tile's packing).
  template <std::size_t MR, class ASource>
  void pack(const ASource& a, const row_tiles& tiling, std::size_t K) {
    const std::size_t tiles = tiling.count;
    for (std::size_t t; (t = next_tile.fetch_add(1, std::memory_order_relaxed)) < tiles;) {
      a.template pack<MR>(tiling, t, t + 1, K, packed + t * K * MR);
      tiles_packed.fetch_add(1, std::memory_order_release);
    }
    spin_until([&] { return tiles_packed.load(std::memory_order_acquire) == tiles; });
  }
};

/// Computes one thread's part of C (N columns laid out as L, inner extent K) with the cache
/// blocking `blocking` (gemm_blocking::for_k, or a test's smaller one): for each M block, A is
/// packed once over all of K (with a single N block, per tile and K block right before use
/// instead, or read where it lies); for each N block, each K block runs over every tile of the
/// M block, each tile over every panel of the N block (so a kc x mr panel of A stays in L1
/// across the panels, and the kc x nc block of B in L2 across the tiles). Meanwhile the next
/// block of B (l2_prefetch_plan, or the rows it is packed from: row_prefetch_plan) and the next
/// panel of A are prefetched into L2. A narrow B is run tile by tile over all of K instead
/// (tile_major below).
/// With `team` (a call where shares_a holds: this part holds every tile), A' is packed by the
/// team into team->packed instead of by this thread for itself.
template <class ASource, class BSource, class Epi>
void gemm_part_run(const gemm_part& part, const row_tiles& tiling, const gemm_blocking& blocking, const b_panels& L,
                   std::size_t K, const ASource& a, BSource b_source, Epi& epi, shared_a* team = nullptr) {
  constexpr std::size_t MR = gemm_blocking::mr;
  constexpr std::size_t NV = gemm_blocking::nv;
  constexpr std::size_t NR = gemm_blocking::nr;
  const std::size_t N = L.n;
  const std::size_t KC = blocking.kc;
  // K = 0 is one empty K block: the epilogue still gets every tile.
  const std::size_t k_blocks = blocks_of(std::max<std::size_t>(1, K), KC);
  // A read where it lies (a_rows) where it would be packed per tile; 0: always packed.
  constexpr std::size_t a_row = [] {
    if constexpr (requires { ASource::row_stride; }) return ASource::row_stride;
    else return std::size_t{0};
  }();
  // The kernels of the full panels and of the last one (edge_nv vectors wide).
  constexpr auto& full = kernel_table<NV, MR, Epi>;
  const auto& edge = *kernel_tables<NV, MR, Epi>[L.edge_nv() - 1];
  constexpr auto& full_rows = kernel_table<NV, MR, Epi, a_row>;
  const auto& edge_rows = *kernel_tables<NV, MR, Epi, a_row>[L.edge_nv() - 1];

  const std::size_t tiles = part.t1 - part.t0;
  const std::size_t panels = part.p1 - part.p0;
  if (tiles == 0 || panels == 0) return;
  // Blocks of equal size (within one tile or panel), at most mc_max tiles and nc panels.
  const std::size_t m_blocks = blocks_of(tiles, blocking.mc_max);
  const std::size_t mc = m_blocks == 1 ? tiles : ceil_div(tiles, m_blocks);
  const std::size_t n_blocks = blocks_of(panels, blocking.nc);
  const std::size_t nc = n_blocks == 1 ? panels : ceil_div(panels, n_blocks);

  // With one N block each tile's A panel of a K block is used by that block's panels right
  // away and never again: it is packed then, into L1, instead of the whole M block into memory
  // first (which, for a narrow B, cost as much as the products).
  const bool a_per_tile = n_blocks == 1 && team == nullptr;
  // Where moreover B over all of K fits the L2 budget (a narrow B), each tile runs all its K
  // blocks in turn rather than each K block all tiles: the tile's rows of A then stream through
  // once, which the hardware prefetcher follows, where a K block at a time restarted each row's
  // stream at every block. Each element's sum still runs in increasing k: the same bits.
  const bool tile_major =
      a_per_tile && k_blocks > 1 && panels * K * NR * sizeof(float) <= tuning().gemm_l2_b_bytes;
  float* packed_a =
      team ? team->packed : thread_workspace(workspace_slot::packed_a, a_per_tile ? MR * KC : mc * MR * K);
  float* partial = k_blocks > 1 ? thread_workspace(workspace_slot::partial_sums, mc * nc * MR * NR) : nullptr;

  const bool a_in_place = a_row != 0 && a_per_tile;
  // Whether a tile of r rows reads A where it lies: not an odd tile, whose kernel reads a row
  // more (kernel_rows), zero in packed A.
  auto in_place = [&](std::size_t r) { return a_in_place && kernel_rows(r) == r; };
  // One call of the micro-kernel for a tile of job.mr rows and a panel of `width` columns, A
  // packed or (in_place) read where it lies.
  auto run = [&](const tile_job& job, std::size_t width) {
    const std::size_t k = kernel_index(job.mr);
    if (in_place(job.mr)) {
      if constexpr (a_row != 0) (width == NR ? full_rows : edge_rows)[k](job, epi);
    } else if (width == NR) {
      if (job.mr == MR) micro_kernel<MR, NV, MR, Epi>(job, epi);
      else full[k](job, epi);
    } else {
      edge[k](job, epi);
    }
  };
  // A's panel for tile t of r rows over K range [k0, k0 + kc): packed into packed_a, or where
  // it lies.
  auto a_panel = [&](std::size_t t, std::size_t m0, std::size_t r, std::size_t k0, std::size_t kc) -> const float* {
    if constexpr (a_row != 0)
      if (in_place(r)) return a.at(m0, k0);
    a.template pack_k<MR>(tiling, t, t + 1, k0, kc, packed_a);
    return packed_a;
  };

  for (std::size_t ti = part.t0; ti < part.t1; ti += mc) {
    const std::size_t mt = std::min(mc, part.t1 - ti);
    if (tile_major) {
      b_source.prepare(part.p0, panels, 0, K);
      for (std::size_t i = 0; i < mt; ++i) {
        tile_job job{};
        job.m0 = tiling.begin(ti + i);
        job.mr = tiling.rows(ti + i);
        for (std::size_t kb = 0; kb < k_blocks; ++kb) {
          const std::size_t k0 = kb * KC;
          job.kc = std::min(KC, K - k0);
          job.first = kb == 0;
          job.last = kb + 1 == k_blocks;
          job.a = a_panel(ti + i, job.m0, job.mr, k0, job.kc);
          for (std::size_t j = 0; j < panels; ++j) {
            const std::size_t p = part.p0 + j, width = L.width(p);
            job.n0 = p * NR;
            job.nr = std::min(NR, N - job.n0);
            job.b = b_source.template panel<NR>(p, k0, width, K);
            job.partial = partial + j * MR * NR;
            run(job, width);
          }
        }
      }
      continue;
    }
    if (team) team->template pack<MR>(a, tiling, K);
    else if (!a_per_tile) a.template pack<MR>(tiling, ti, ti + mt, K, packed_a);

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
        b_source.prepare(pj, np, k0, job.kc);
        l2_prefetch_plan next{&L, K};
        if (!job.last)
          next.p = pj, next.np = np, next.k0 = k0 + KC, next.kc = std::min(KC, K - k0 - KC);
        else if (pj + nc < part.p1)
          next.p = pj + nc, next.np = std::min(nc, part.p1 - pj - nc), next.kc = std::min(KC, K);
        else if (ti + mc < part.t1)
          next.p = part.p0, next.np = std::min(nc, panels), next.kc = std::min(KC, K);
        row_prefetch_plan next_rows;
        if constexpr (BSource::prefetchable) {
          next.packed_b = b_source.data;
          next.plan(mt * np, job.kc);
        } else {
          if (next.np != 0) next_rows.walk = b_source.source(next.p, next.np, next.k0, next.kc);
          next_rows.plan(mt * np, job.kc);
        }

        for (std::size_t i = 0; i < mt; ++i) {
          job.m0 = tiling.begin(ti + i);
          job.mr = tiling.rows(ti + i);
          // The A panel used after this tile's calls: the next tile's, else the first tile's in
          // the next K block or N block. Packed A is read from memory once per N block, and
          // the hardware prefetcher stops at every 4 KiB page of a panel.
          const float* a_next = nullptr;
          std::size_t a_next_kc = 0;
          if (a_per_tile) {
            job.a = a_panel(ti + i, job.m0, job.mr, k0, job.kc);
          } else {
            job.a = packed_a + i * K * MR + k0 * MR;
            if (i + 1 < mt)
              a_next = job.a + K * MR, a_next_kc = job.kc;
            else if (!job.last)
              a_next = packed_a + (k0 + KC) * MR, a_next_kc = std::min(KC, K - k0 - KC);
            else if (pj + nc < part.p1)
              a_next = packed_a, a_next_kc = std::min(KC, K);
          }
          const std::size_t a_lines = ceil_div(a_next_kc * MR * sizeof(float), 64);
          const std::size_t a_per_call = std::min(ceil_div(a_lines, np), ceil_div(job.kc, 2));
          for (std::size_t j = 0; j < np; ++j) {
            const std::size_t p = pj + j;
            const std::size_t width = L.width(p);
            job.n0 = p * NR;
            job.nr = std::min(NR, N - job.n0);
            job.b = b_source.template panel<NR>(p, k0, width, K);
            job.partial = partial ? partial + (i * np + j) * MR * NR : nullptr;  // slots in call order
            if constexpr (BSource::prefetchable)
              next.assign(i * np + j, job);
            else
              next_rows.assign(i * np + j, job);
            const std::size_t a_first = j * a_per_call;
            job.a_next = a_first < a_lines ? reinterpret_cast<const char*>(a_next) + a_first * 64 : nullptr;
            job.a_next_lines = a_first < a_lines ? std::min(a_per_call, a_lines - a_first) : 0;
            // The partial sums the next call starts from, on their way to L1 meanwhile.
            if (!job.first && partial != nullptr)
              for (std::size_t line = 0; line < MR * NR * sizeof(float); line += 64)
                __builtin_prefetch(reinterpret_cast<const char*>(job.partial + MR * NR) + line, 0, 3);
            run(job, width);
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
inline std::pair<std::size_t, std::size_t> choose_split(const row_tiles& tiling, const b_panels& L, int threads) {
  std::size_t best_tm = 1, best_tn = 1;
  double best = -1;
  for (std::size_t tm = 1; tm <= std::size_t(threads); ++tm) {
    const std::size_t tn = std::size_t(threads) / tm;
    if (tm > tiling.count || tn > L.panels) continue;
    const double rows = double(tiling.begin(ceil_div(tiling.count, tm)));  // the first part is the largest
    const double cols = double(std::min(L.n, ceil_div(L.panels, tn) * b_panels::nr));
    const double cost = rows * (cols + 32.0);
    if (best < 0 || cost < best) best = cost, best_tm = tm, best_tn = tn;
  }
  return {best_tm, best_tn};
}

/// Whether a call split into tm x tn parts packs A' once for all its threads (shared_a): an N
/// split whose parts each run several N blocks over one M block, so that every thread would
/// otherwise pack all of A' whole.
inline bool shares_a(const row_tiles& tiling, const b_panels& L, std::size_t K, const gemm_blocking& blocking,
                     std::size_t tm, std::size_t tn) {
  return tm == 1 && tn > 1 && K > 0 && tiling.count <= blocking.mc_max && L.panels / tn > blocking.nc;
}

/// C = A' B' (N columns laid out as L, inner extent K) with B' read from `b` (b_packed_whole:
/// already packed as L; or b_packed_per_block) and A' packed per M block by `a` (a_strided, or
/// an operand's packer), on up to `threads` threads. One instantiation per kind of operand
/// source and epilogue, whatever the shapes.
template <class ASource, class BSource, class Epi>
void gemm_packed_from(std::size_t M, const b_panels& L, std::size_t K, const gemm_blocking& blocking, const ASource& a,
                      const BSource& b, Epi& epi, int threads) {
  if (M == 0) return;
  const row_tiles tiling(M, gemm_blocking::mr);
  const double flops = 2.0 * double(M) * double(L.n) * double(K);
  if (threads <= 1 || flops < parallel_min_flops) {
    gemm_part_run(gemm_part{0, tiling.count, 0, L.panels}, tiling, blocking, L, K, a, b, epi);
    return;
  }
  const auto [tm, tn] = choose_split(tiling, L, threads);
  if (shares_a(tiling, L, K, blocking, tm, tn)) {
    shared_a team{thread_workspace(workspace_slot::packed_a, tiling.count * gemm_blocking::mr * K)};
    parallel_for(tn, int(tn), [&](std::size_t j) {
      const gemm_part part{0, tiling.count, L.panels * j / tn, L.panels * (j + 1) / tn};
      gemm_part_run(part, tiling, blocking, L, K, a, b, epi, &team);
    });
    return;
  }
  parallel_for(tm * tn, int(tm * tn), [&](std::size_t t) {
    const std::size_t i = t / tn, j = t % tn;
    const std::size_t tiles = tiling.count, panels = L.panels;
    const gemm_part part{tiles * i / tm, tiles * (i + 1) / tm, panels * j / tn, panels * (j + 1) / tn};
    gemm_part_run(part, tiling, blocking, L, K, a, b, epi);
  });
}

/// Packs B' (laid out as L) for a call that was not given a packed_b: into the calling thread's
/// workspace, panels spread over the threads.
inline const float* pack_b_for_call(const b_panels& L, const float* B, std::size_t ldb, bool trans, std::size_t K,
                                    int threads) {
  float* dst = thread_workspace(workspace_slot::packed_b, L.floats(K));
  const double bytes = double(L.n) * double(K) * sizeof(float);
  const int t = threads > 1 && bytes >= (1 << 20) ? threads : 1;
  const std::size_t chunks = std::min<std::size_t>(L.panels, std::size_t(t));
  parallel_for(chunks, t, [&](std::size_t c) {
    pack_b_panels(L, B, ldb, trans, K, dst, L.panels * c / chunks, L.panels * (c + 1) / chunks);
  });
  return dst;
}

/// C [M, N] = A' B' for stored A (a_strided) and stored B [K, N] or (trans_b) [N, K]: B' packed
/// on this call, then the driver. Every product of two stored matrices runs this one function.
template <class Epi>
void gemm_stored(std::size_t M, std::size_t N, std::size_t K, const a_strided& a, const float* B, std::size_t ldb,
                 bool trans_b, Epi& epi, int threads, const gemm_blocking& blocking) {
  if (M == 0) return;
  const b_panels L(N);
  const float* packed = pack_b_for_call(L, B, ldb, trans_b, K, threads);
  gemm_packed_from(M, L, K, blocking, a, b_packed_whole{packed}, epi, threads);
}

}  // namespace gemm_detail

// ---------------------------------------------------------------------------------------------
// The entry points
// ---------------------------------------------------------------------------------------------

/// C[M, N] = A' B' with B' pre-packed; A' = A [M, K] or (TransA) A^T for A stored [K, M],
/// row-major with leading dimension lda. Every tile of C goes to the epilogue once, with its
/// whole K sum in registers: epi.template tile<MR, NV>(acc, m0, n0, mr, nr) (see
/// gemm_epilogue.hpp). Tiles are disjoint and may reach the epilogue from several threads at once.
/// The result does not depend on `threads` (bit for bit): threads split M and N, never K.
template <std::size_t N, std::size_t K, bool TransA, bool TransB, class Epilogue>
void gemm(std::size_t M, const float* A, std::size_t lda, const packed_matrix<N, K, TransB>& B, Epilogue&& epi,
          int threads = solder::num_threads()) {
  SOLDER_ASSERT(lda >= (TransA ? M : K), "solder::eval::cpu::gemm: lda is smaller than a row of A");
  gemm_detail::gemm_packed_from(M, gemm_detail::b_panels(N), K, gemm_blocking::for_k(K),
                                gemm_detail::a_strided{A, lda, TransA}, gemm_detail::b_packed_whole{B.data()}, epi,
                                threads);
}

/// C[M, N] = A' B' as above, B' = B [K, N] or (TransB) B^T for B stored [N, K], leading
/// dimension ldb; B' is packed on every call (into a buffer the calling thread keeps).
template <std::size_t N, std::size_t K, bool TransA, bool TransB, class Epilogue>
void gemm(std::size_t M, const float* A, std::size_t lda, const float* B, std::size_t ldb, Epilogue&& epi,
          int threads = solder::num_threads()) {
  static_assert(N >= 1 && K >= 1, "solder::eval::cpu::gemm: N and K must be at least 1");
  SOLDER_ASSERT(lda >= (TransA ? M : K), "solder::eval::cpu::gemm: lda is smaller than a row of A");
  SOLDER_ASSERT(ldb >= (TransB ? K : N), "solder::eval::cpu::gemm: ldb is smaller than a row of B");
  gemm_detail::gemm_stored(M, N, K, gemm_detail::a_strided{A, lda, TransA}, B, ldb, TransB, epi, threads,
                           gemm_blocking::for_k(K));
}

/// C[M, N] = A' B' as above with K a runtime value (K = 0 gives the epilogue a zero sum):
/// A' = A [M, K] or (TransA) A^T for A stored [K, M]; B' = B [K, N] or (TransB) B^T for B
/// stored [N, K]. For products whose inner length is the batch, e.g. a linear layer's
/// dW [Out, In] = dy^T x: gemm_dyn_k<In, true, false>(Out, batch, dy, Out, x, In, epi).
/// The same packing, driver, micro-kernels and epilogue hook as gemm (the very same
/// instantiation), so the same bits as gemm for the same K, for any `threads`; B' is packed on
/// every call (into a buffer the calling thread keeps), A' per M block.
template <std::size_t N, bool TransA, bool TransB, class Epilogue>
void gemm_dyn_k(std::size_t M, std::size_t K, const float* A, std::size_t lda, const float* B, std::size_t ldb,
                Epilogue&& epi, int threads = solder::num_threads()) {
  if constexpr (N >= 1) {
    SOLDER_ASSERT(lda >= (TransA ? M : K), "solder::eval::cpu::gemm_dyn_k: lda is smaller than a row of A");
    SOLDER_ASSERT(ldb >= (TransB ? K : N), "solder::eval::cpu::gemm_dyn_k: ldb is smaller than a row of B");
    gemm_detail::gemm_stored(M, N, K, gemm_detail::a_strided{A, lda, TransA}, B, ldb, TransB, epi, threads,
                             gemm_blocking::for_k(K));
  } else {
    static_assert(N >= 1, "solder::eval::cpu::gemm_dyn_k: N must be at least 1; N is the number of columns of C");
  }
}

/// C[M, N] = A' B' for operands packed by rule (eval/cpu/operand_packing.hpp): `a` packs tiles
/// of A' per M block (gemm_detail::a_strided, or an operand's packer); pack_b(dst, p0, p1, k0,
/// k1) packs panels [p0, p1) of B' over K range [k0, k1), panel p - p0 at (p - p0) (k1 - k0) nr
/// and row k - k0 at (k - k0) width (gemm_detail::b_panels(N)), one cache block at a time as
/// the tiles need it (gemm_detail::b_packed_per_block). The same driver, micro-kernels and
/// epilogue hook as gemm, so the same bits as gemm for the same packed values.
template <std::size_t N, class ASource, class PackB, class Epilogue>
void gemm_from(std::size_t M, std::size_t K, const ASource& a, const PackB& pack_b, Epilogue&& epi,
               int threads = solder::num_threads()) {
  static_assert(N >= 1, "solder::eval::cpu::gemm_from: N must be at least 1");
  if (M == 0) return;
  const gemm_blocking blocking = gemm_blocking::for_k(K);
  const gemm_detail::b_packed_per_block<PackB> b{&pack_b, blocking.nc * blocking.kc * gemm_blocking::nr,
                                                 gemm_blocking::nr};
  gemm_detail::gemm_packed_from(M, gemm_detail::b_panels(N), K, blocking, a, b, epi, threads);
}

}  // namespace solder::eval::cpu
