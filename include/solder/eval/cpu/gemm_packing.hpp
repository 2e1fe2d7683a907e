// eval/cpu/gemm_packing.hpp: the CPU GEMM's packed operands: B' in panels of the register
// tile's width and A' in tiles of its height, each contiguous in k, and packed_matrix, a B'
// packed once and reused by every call (a weight). The layout is the micro-kernel's
// (gemm_kernel.hpp); docs/gemm.md has the measurements behind it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/memory.hpp"

namespace solder::eval::cpu::gemm_detail {

/// The packed layout of B' [K, N] (independent of the cache blocking): panels of nr columns,
/// panel p at p * K * nr, holding B'[k][p * nr + j] at k * width + j, where width = nr except in
/// the last panel, which is only as wide as the vectors it needs (edge_nv * W), zero-padded.
/// N is a value (at least 1), so one driver serves every shape.
struct b_panels {
  static constexpr std::size_t lanes = float_lanes;
  static constexpr std::size_t nr = gemm_tile<arch>::nv * lanes;
  std::size_t n;           // columns of B'
  std::size_t panels;      // panels of nr columns, the last one narrower
  std::size_t edge_width;  // floats per k step of the last panel: edge_nv whole vectors
  constexpr explicit b_panels(std::size_t N)
      : n(N), panels(ceil_div(N, nr)), edge_width(ceil_div(N - (panels - 1) * nr, lanes) * lanes) {}
  constexpr std::size_t edge_nv() const { return edge_width / lanes; }
  constexpr std::size_t width(std::size_t p) const { return p + 1 == panels ? edge_width : nr; }
  /// Floats B' takes packed.
  constexpr std::size_t floats(std::size_t K) const { return (panels - 1) * K * nr + K * edge_width; }
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

/// out[k * stride + r] = src[r * ld + k] for k < K, r < Rows: `rows` (<= Rows) rows of a
/// row-major matrix, transposed into panel layout (stride >= Rows: a std::size_t, or an
/// std::integral_constant where the stores' offsets should be constants, as in A's tiles).
/// Lanes r in [rows, Rows) are written as 0 when ZeroFill, else left alone.
template <std::size_t Rows, bool ZeroFill, class Stride = std::size_t>
void pack_transposed(const float* src, std::size_t ld, std::size_t rows, std::size_t K, float* out, Stride stride) {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, arch> && Rows <= 16) {
    // 16 k at a time: load the row segments, transpose 16 x 16 in registers, store Rows
    // lanes of each column.
    constexpr __mmask16 lane_mask = __mmask16((1u << Rows) - 1u);
    const __mmask16 store_mask = ZeroFill ? lane_mask : __mmask16(lane_mask & ((1u << rows) - 1u));
    // Whole blocks of 16 k with the count a constant (unmasked loads, the 16 stores unrolled),
    // then the tail masked.
    auto block = [&](std::size_t k0, auto count) SOLDER_INLINE_LAMBDA {
      const std::size_t kn = count;
      const __mmask16 k_mask = __mmask16((1u << kn) - 1u);
      __m512 r[16];
      for (std::size_t i = 0; i < 16; ++i)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(k_mask, src + i * ld + k0) : _mm512_setzero_ps();
      transpose16(r);
      for (std::size_t j = 0; j < kn; ++j) _mm512_mask_storeu_ps(out + (k0 + j) * stride, store_mask, r[j]);
    };
    std::size_t k0 = 0;
    for (; k0 + 16 <= K; k0 += 16) block(k0, std::integral_constant<std::size_t, 16>{});
    if (k0 < K) block(k0, K - k0);
    return;
  }
#endif
  // Chunks of 64 k: the source rows and the destination block stay in L1.
  constexpr std::size_t chunk = 64;
  for (std::size_t k0 = 0; k0 < K; k0 += chunk) {
    const std::size_t k1 = std::min(K, k0 + chunk);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t k = k0; k < k1; ++k) out[k * stride + r] = src[r * ld + k];
    if constexpr (ZeroFill)
      for (std::size_t r = rows; r < Rows; ++r)
        for (std::size_t k = k0; k < k1; ++k) out[k * stride + r] = 0.0f;
  }
}

/// Zeroes lanes [rows, kernel_rows(rows)) of k steps of a packed A panel (row stride MR): the
/// row a kernel reads beyond an odd tile.
template <std::size_t MR>
void zero_extra_rows(float* panel, std::size_t k_steps, std::size_t rows) {
  for (std::size_t r = rows; r < kernel_rows(rows); ++r)
    for (std::size_t k = 0; k < k_steps; ++k) panel[k * MR + r] = 0.0f;
}

/// Packs tiles [t0, t1) of A' (all K columns) into dst: tile t0 + i holds A'[m][k] for its rows
/// m = begin + r at i * K * MR + k * MR + r. Lanes past a tile's rows are not written (the
/// micro-kernel for a shorter tile never reads them), but for the zero row an odd tile's
/// kernel reads (zero_extra_rows).
///   trans = false: A stored [M, K], A'[m][k] = A[m * lda + k] (a transpose)
///   trans = true:  A stored [K, M], A'[m][k] = A[k * lda + m] (rows of a tile are copies)
template <std::size_t MR>
void pack_a(const float* A, std::size_t lda, bool trans, const row_tiles& tiling, std::size_t t0, std::size_t t1,
            std::size_t K, float* dst) {
  if (K == 0) return;  // nothing to pack; A may be null, and no offset may be added to it
  for (std::size_t t = t0; t < t1; ++t) {
    const std::size_t m0 = tiling.begin(t), rows = tiling.rows(t);
    float* out = dst + (t - t0) * K * MR;
    if (trans) {
      for (std::size_t k = 0; k < K; ++k) std::memcpy(out + k * MR, A + k * lda + m0, rows * sizeof(float));
    } else {
      pack_transposed<MR, false>(A + m0 * lda, lda, rows, K, out, std::integral_constant<std::size_t, MR>{});
    }
    zero_extra_rows<MR>(out, K, rows);
  }
}

/// A' read from memory, A [M, K] or (trans) [K, M] with leading dimension lda: packed per M
/// block by pack_a (the GEMM driver's A source; eval/cpu/operand_packing.hpp has the others).
struct a_strided {
  const float* A;
  std::size_t lda;
  bool trans;
  template <std::size_t MR>
  void pack(const row_tiles& tiling, std::size_t t0, std::size_t t1, std::size_t K, float* dst) const {
    pack_a<MR>(A, lda, trans, tiling, t0, t1, K, dst);
  }
  /// Tiles [t0, t1) over K range [k0, k0 + kc) only, tile t at (t - t0) kc MR.
  template <std::size_t MR>
  void pack_k(const row_tiles& tiling, std::size_t t0, std::size_t t1, std::size_t k0, std::size_t kc, float* dst) const {
    pack_a<MR>(trans ? A + k0 * lda : A + k0, lda, trans, tiling, t0, t1, kc, dst);
  }
};

/// a_strided for A stored [M, K] with rows Lda floats apart, Lda known at compile time: where
/// each tile's panel of A would be packed right before its one use (gemm_part_run's narrow B),
/// the micro-kernels read A where it lies instead (`row_stride`, `at`).
template <std::size_t Lda>
struct a_rows : a_strided {
  static constexpr std::size_t row_stride = Lda;
  explicit a_rows(const float* a) : a_strided{a, Lda, false} {}
  const float* at(std::size_t m, std::size_t k) const { return A + m * Lda + k; }
};

/// Packs panels [p0, p1) of B' (laid out as L) into `dst`, zero-padded to the panel width.
///   trans = false: B stored [K, N], B'[k][n] = B[k * ldb + n] (rows of a panel are copies)
///   trans = true:  B stored [N, K], B'[k][n] = B[n * ldb + k] (a transpose, 16 columns at
///                  a time)
inline void pack_b_panels(const b_panels& L, const float* B, std::size_t ldb, bool trans, std::size_t K, float* dst,
                          std::size_t p0, std::size_t p1) {
  if (K == 0) return;  // nothing to pack; B may be null, and no offset may be added to it
  constexpr std::size_t W = b_panels::lanes;
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t n0 = p * L.nr;
    const std::size_t width = L.width(p);
    const std::size_t cols = std::min(width, L.n - n0);
    float* out = dst + p * K * L.nr;
    if (!trans && cols == b_panels::nr) {
      // A whole panel: rows of a constant number of vectors, copied inline (a call to memcpy
      // per 128-byte row costs as much as the copy).
      using V = vec<float>;
      for (std::size_t k = 0; k < K; ++k)
#pragma GCC unroll 8
        for (std::size_t v = 0; v < b_panels::nr; v += W)
          V::load_unaligned(B + k * ldb + n0 + v).store_unaligned(out + k * width + v);
    } else if (!trans) {
      for (std::size_t k = 0; k < K; ++k) {
        std::memcpy(out + k * width, B + k * ldb + n0, cols * sizeof(float));
        std::fill(out + k * width + cols, out + (k + 1) * width, 0.0f);
      }
    } else {
      // One vector's worth of columns at a time (16 with AVX-512, 8 with AVX2).
      for (std::size_t j = 0; j < width; j += W) {
        const std::size_t n = j < cols ? std::min(W, cols - j) : 0;
        constexpr std::integral_constant<std::size_t, b_panels::nr> full_width;
        if (width == b_panels::nr)
          pack_transposed<W, true>(B + (n0 + j) * ldb, ldb, n, K, out + j, full_width);
        else
          pack_transposed<W, true>(B + (n0 + j) * ldb, ldb, n, K, out + j, width);
      }
    }
  }
}

/// Lines of a stored matrix a block of B is packed from: `rows` rows of `row_lines` lines,
/// `stride` bytes apart, from `base` (rows == 0: none; a generated operand has none).
struct row_lines_walk {
  const char* base = nullptr;
  std::size_t row_lines = 0, rows = 0, stride = 0;
};

/// The walk of rows of `bytes` bytes of a matrix from `first`, `stride` bytes apart: whole
/// lines from the one holding `first`, one more where rows start off a line boundary; one run
/// where the rows' lines meet.
inline row_lines_walk rows_of(const void* first, std::size_t bytes, std::size_t rows, std::size_t stride) {
  if (bytes == 0 || rows == 0) return {};
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(first);
  const char* base = reinterpret_cast<const char*>(at - at % 64);
  const std::size_t lines = ceil_div(bytes, 64) + (at % 64 == 0 && stride % 64 == 0 ? 0 : 1);
  if (lines * 64 >= stride) return {base, ceil_div(at % 64 + (rows - 1) * stride + bytes, 64), 1, 0};
  return {base, lines, rows, stride};
}

}  // namespace solder::eval::cpu::gemm_detail

namespace solder {

/// B' [K, N] packed once into the micro-kernel's panels (weights frozen for inference, or
/// packed once per optimizer step) and reused by every call. B' = B [K, N], or (TransB) B^T
/// for B stored [N, K], as PyTorch stores a linear layer's weight. Row-major, leading
/// dimension ldb.
template <std::size_t N, std::size_t K, bool TransB>
class packed_matrix {
 public:
  static_assert(N >= 1 && K >= 1, "solder::packed_matrix: N and K must be at least 1");
  /// Floats the packed panels take (N and K rounded up to whole vectors per panel).
  static constexpr std::size_t size = eval::cpu::gemm_detail::b_panels(N).floats(K);

  packed_matrix() = default;
  packed_matrix(const float* B, std::size_t ldb) : packed_matrix() { pack(B, ldb); }

  /// Packs B' from B (leading dimension ldb: at least K when TransB, else at least N).
  void pack(const float* B, std::size_t ldb) {
    SOLDER_ASSERT(ldb >= (TransB ? K : N), "solder::packed_matrix: ldb is smaller than a row of B");
    constexpr eval::cpu::gemm_detail::b_panels layout(N);
    eval::cpu::gemm_detail::pack_b_panels(layout, B, ldb, TransB, K, data_.get(), 0, layout.panels);
  }

  /// The packed panels (eval::cpu::gemm_detail::b_panels(N)), 64-byte aligned.
  const float* data() const { return data_.get(); }

 private:
  aligned_array<float> data_ = allocate_aligned<float>(size);
};

}  // namespace solder
