// eval/cpu/gemm_kernel.hpp: the GEMM micro-kernel: an mr x (nv * W) tile of C accumulated in
// registers over one K block, and handed to the epilogue once its K sum is complete.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"

namespace solder::eval::cpu {

/// The register tile of the micro-kernel on instruction set A: `mr` rows of C by `nv` vectors
/// of float, so mr * nv accumulators, nv vectors of B and the A broadcasts fit the register
/// file. Each k step loads nv vectors of B (the packed panel, contiguous) and broadcasts mr
/// values of A (the packed panel, contiguous), then issues mr * nv FMAs.
///
/// 16 vector registers (SSE, AVX, AVX2 + FMA, NEON): 6 x 2 = 12 accumulators, 2 B vectors and
/// 1 broadcast (the 6x16 AVX2 kernel of BLIS). 8 loads per 12 FMAs.
template <class A>
struct gemm_tile {
  static constexpr std::size_t mr = 6;
  static constexpr std::size_t nv = 2;
};

/// 32 vector registers (AVX-512): 14 x 2 = 28 accumulators, 2 B vectors and 1 broadcast = 31
/// registers. 16 loads (2 vectors, 14 broadcasts) per 28 FMAs, and the B panel streams from L2
/// at 128 bytes per 14 cycles. Wider tiles (6 x 4, 8 x 3) load twice as much of B per FMA;
/// taller ones do not fit.
template <class A>
  requires std::is_base_of_v<xsimd::avx512f, A>
struct gemm_tile<A> {
  static constexpr std::size_t mr = 14;
  static constexpr std::size_t nv = 2;
};

namespace gemm_detail {

/// The micro-kernels compiled: heights 1 to 6, then the even heights up to MR. A tile of r rows
/// runs the one of kernel_rows(r) rows: r, or above 6 an odd r (the last tile of an odd M) one
/// more, over a zero row of packed A whose results are not stored. Every kernel is compiled in
/// every translation unit that multiplies matrices (docs/gemm.md, "Micro-kernels for heights
/// 1-6 and the even heights"); the small odd ones stay for small batches, where one more row
/// would cost up to a third.
inline constexpr std::size_t exact_kernel_rows = 6;
constexpr std::size_t kernel_rows(std::size_t r) { return r <= exact_kernel_rows ? r : r + (r & 1); }
/// The index of the kernel of kernel_rows(r) rows among those compiled; their count for MR.
constexpr std::size_t kernel_index(std::size_t r) {
  return r <= exact_kernel_rows ? r - 1 : exact_kernel_rows + (kernel_rows(r) - exact_kernel_rows) / 2 - 1;
}
constexpr std::size_t kernel_count(std::size_t mr) { return kernel_index(mr) + 1; }
/// The height of kernel i: the inverse of kernel_index.
constexpr std::size_t rows_of_kernel(std::size_t i) {
  return i < exact_kernel_rows ? i + 1 : exact_kernel_rows + 2 * (i + 1 - exact_kernel_rows);
}

/// One k step of an R x NV tile: acc[r][v] += a[r * ARow] * b[v * W .. v * W + W - 1].
template <std::size_t R, std::size_t NV, std::size_t ARow = 1>
SOLDER_INLINE void fma_step(vec<float> (&acc)[R][NV], const float* a, const float* b) {
  using V = vec<float>;
  V bv[NV];
#pragma GCC unroll 8
  for (std::size_t v = 0; v < NV; ++v) bv[v] = V::load_aligned(b + v * V::size);
#pragma GCC unroll 16
  for (std::size_t r = 0; r < R; ++r) {
    const V ar(a[r * ARow]);
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v) acc[r][v] = eval::cpu::fma(ar, bv[v], acc[r][v]);
  }
}

/// Bytes ahead of the B stream that the micro-kernel prefetches into L1 (B comes from L2).
inline constexpr std::size_t b_prefetch_bytes = 1024;

/// One call of the micro-kernel: which tile, which K block, where its operands are.
struct tile_job {
  std::size_t kc;           // steps of this K block
  const float* a;           // packed A panel of this K block: a[k * AStride + r]
  const float* b;           // packed B panel of this K block: b[k * NV * W + j], 64-byte aligned
  float* partial;           // this tile's slot in the partial-sum scratch ([R][NV * W])
  bool first, last;         // first / last K block
  std::size_t m0, n0;       // the tile's place in C
  std::size_t mr, nr;       // its valid rows (R, or R - 1 for an odd tile) and columns
  const char* b_next;       // lines of the next block of B to prefetch into L2 (at even steps)
  std::size_t b_next_lines; //   how many (at most kc / 2)
  std::size_t b_row_lines;  //   in rows of this many lines (0: one run), the first row
  std::size_t b_row_left;   //   ending after b_row_left of them, each next row b_row_skip
  std::size_t b_row_skip;   //   bytes after the end of the previous
  const char* a_next;       // lines of the next panel of A to prefetch into L2 (at odd steps)
  std::size_t a_next_lines; //   how many (at most kc / 2)
};

/// The micro-kernel: the C tile of R rows from m0 and NV vectors from n0 over one K block.
/// A is read at a[k * AStride + r * ARow]: a packed panel (AStride = the tile height, ARow = 1),
/// or rows of A as stored (AStride = 1, ARow = its row length, known at compile time, so each
/// row's broadcast is one load at a constant offset).
///   first  the accumulators start at 0, else at the partial sums stored in `partial`
///   last   the accumulators hold the whole K sum and go to the epilogue,
///          epi.template tile<R, NV>(acc, m0, n0, mr, nr); otherwise they are stored to `partial`
/// (mr is R, or R - 1 for the odd tile that runs the kernel one row taller: kernel_rows).
/// Every element is one chain of FMAs in increasing k, whatever R and NV: the tile a row or a
/// column lands in never changes its value (so thread counts and edge tiles give equal bits).
template <std::size_t R, std::size_t NV, std::size_t AStride, class Epilogue, std::size_t ARow = 1>
void micro_kernel(const tile_job& job, Epilogue& epi) {
  using V = vec<float>;
  constexpr std::size_t W = V::size;
  constexpr std::size_t BS = NV * W;  // floats of B per k step
  static_assert(R >= 1 && (ARow > 1 || R <= AStride), "solder::eval::cpu::micro_kernel: R must be in [1, AStride]");
  const float* __restrict a = job.a;
  const float* __restrict b = job.b;
  float* __restrict partial = job.partial;

  V acc[R][NV];
  if (job.first) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = V(0.0f);
  } else {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = V::load_aligned(partial + r * BS + v * W);
  }

  // Lines for later calls, fetched from memory into L2 one per k step (prefetcht1), so only
  // a few memory reads are in flight at once: the next block of B on even steps, the next
  // panel of A on odd ones. The loop runs two steps at a time so each step's stream is known
  // at compile time and its pointer and count stay in registers (indexing a two-entry array by
  // k & 1 kept them on the stack: a load and a store per step next to the FMAs).
  const char* b_next = job.b_next;
  const char* a_next = job.a_next;
  std::size_t b_left = job.b_next_lines, a_left = job.a_next_lines;
  // The next block of B may be rows of a stored matrix (B packed per block): at the end of a
  // row the stream skips to the next one. Packed B is one run (b_row_left never reaches 0).
  std::size_t b_row_left = job.b_row_lines == 0 ? ~std::size_t{0} : job.b_row_left;
  auto step = [&](const char*& next, std::size_t& left, auto rows) SOLDER_INLINE_LAMBDA {
    // One prefetch per cache line of B this step reads.
#pragma GCC unroll 8
    for (std::size_t line = 0; line < BS * sizeof(float); line += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(b) + b_prefetch_bytes + line, 0, 3);
    if (left != 0) {
      __builtin_prefetch(next, 0, 2);
      next += 64;
      --left;
      if constexpr (decltype(rows)::value)
        if (--b_row_left == 0) {
          next += job.b_row_skip;
          b_row_left = job.b_row_lines;
        }
    }
    fma_step<R, NV, ARow>(acc, a, b);
    a += AStride;
    b += BS;
  };
  constexpr std::true_type in_rows{};
  constexpr std::false_type one_run{};
  // An odd kc leaves the loop halfway through its last pass (one copy of each step in the
  // code, not a third for the odd step: the kernels are compiled in every translation unit).
  for (std::size_t k = 0; k < job.kc; k += 2) {
    step(b_next, b_left, in_rows);
    if (k + 1 == job.kc) break;
    step(a_next, a_left, one_run);
  }

  if (job.last) {
    epi.template tile<R, NV>(acc, job.m0, job.n0, job.mr, job.nr);
  } else {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[r][v].store_aligned(partial + r * BS + v * W);
  }
}

/// The micro-kernel's signature, for the tables below.
template <class Epilogue>
using micro_kernel_fn = void (*)(const tile_job&, Epilogue&);

template <std::size_t NV, std::size_t AStride, class Epilogue, std::size_t ARow, std::size_t... I>
constexpr std::array<micro_kernel_fn<Epilogue>, sizeof...(I)> make_kernel_table(std::index_sequence<I...>) {
  return {&micro_kernel<rows_of_kernel(I), NV, AStride, Epilogue, ARow>...};
}

/// kernels[kernel_index(r)] computes a tile of r rows: the full tile is r = MR, the bottom
/// edge of C fewer. A is read packed (ARow = 0) or as stored with rows ARow floats apart (then
/// only tiles whose kernel_rows(r) is r).
template <std::size_t NV, std::size_t MR, class Epilogue, std::size_t ARow = 0>
inline constexpr std::array<micro_kernel_fn<Epilogue>, kernel_count(MR)> kernel_table =
    make_kernel_table<NV, ARow == 0 ? MR : 1, Epilogue, ARow == 0 ? 1 : ARow>(
        std::make_index_sequence<kernel_count(MR)>{});

/// kernel_table for every panel width: kernel_tables<NV, ...>[v - 1] is the table of panels v
/// vectors wide (the last panel of B may be narrower than the others).
template <std::size_t NV, std::size_t MR, class Epilogue, std::size_t ARow = 0>
inline constexpr auto kernel_tables = []<std::size_t... V>(std::index_sequence<V...>) {
  return std::array{&kernel_table<V + 1, MR, Epilogue, ARow>...};
}(std::make_index_sequence<NV>{});

}  // namespace gemm_detail
}  // namespace solder::eval::cpu
