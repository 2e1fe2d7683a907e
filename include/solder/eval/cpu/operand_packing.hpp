// eval/cpu/operand_packing.hpp: the CPU packs every kind of product operand (expr/operand.hpp)
// into the GEMM's panels: stored blocks are copied (or transposed), sign sketches are generated
// from Philox on the way, and concatenations pack each part where it lies. Packing is exact, so
// a product of packed values gives the same bits whichever operand form supplied them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/eval/cpu/gemm_packing.hpp"
#include "solder/expr/operand.hpp"
#include "solder/memory.hpp"
#include "solder/random/sketch.hpp"

namespace solder::eval::cpu {

namespace operand_detail {

/// dst[i] = src[i] for i < n, n at most a panel's width: whole vectors inline (a call to
/// memcpy per panel row costs as much as the copy).
SOLDER_INLINE void copy_short(const float* src, float* dst, std::size_t n) {
  using V = vec<float>;
  std::size_t i = 0;
  for (; i + V::size <= n; i += V::size) V::load_unaligned(src + i).store_unaligned(dst + i);
  for (; i < n; ++i) dst[i] = src[i];
}

/// out[(k - k0) * ld + (n - n0)] = src[k * lds + n]: rows of a stored matrix.
inline void copy_rows(const float* src, std::size_t lds, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1,
                      float* out, std::size_t ld) {
  for (std::size_t k = k0; k < k1; ++k) std::memcpy(out + (k - k0) * ld, src + k * lds + n0, (n1 - n0) * sizeof(float));
}

/// copy_transposed for ld = Stride, W rows of src at a time through the GEMM's in-register
/// transpose.
template <std::size_t Stride>
void copy_transposed_vectors(const float* src, std::size_t lds, std::size_t k0, std::size_t k1, std::size_t n0,
                             std::size_t n1, float* out) {
  constexpr std::size_t W = float_lanes;
  for (std::size_t n = n0; n < n1; n += W)
    gemm_detail::pack_transposed<W, Stride, false>(src + n * lds + k0, lds, std::min(W, n1 - n), k1 - k0, out + (n - n0));
}

/// out[(k - k0) * ld + (n - n0)] = src[n * lds + k]: a stored matrix read transposed. Where ld
/// is a whole number of vectors up to a register tile's width (every B panel), W rows at a time
/// through the GEMM's in-register transpose; elsewhere (A tiles) in chunks of 64 k, so the
/// destination block stays in L1 while the source rows stream past.
inline void copy_transposed(const float* src, std::size_t lds, std::size_t k0, std::size_t k1, std::size_t n0,
                            std::size_t n1, float* out, std::size_t ld) {
  constexpr std::size_t W = float_lanes;
  static_assert(gemm_detail::b_panels<1>::nr <= 2 * W, "solder: a register tile wider than two vectors needs more strides here");
  // Two strides spelled out, not a fold over an index sequence: with the fold, nvcc 13's front
  // end printed its index sequence into the types of unrelated kernels of a .cu (a bad type).
  if (ld == W) return copy_transposed_vectors<W>(src, lds, k0, k1, n0, n1, out);
  if (ld == 2 * W) return copy_transposed_vectors<2 * W>(src, lds, k0, k1, n0, n1, out);
  constexpr std::size_t chunk = 64;
  for (std::size_t c0 = k0; c0 < k1; c0 += chunk) {
    const std::size_t c1 = std::min(k1, c0 + chunk);
    for (std::size_t n = n0; n < n1; ++n) {
      const float* row = src + n * lds;
      float* col = out + (n - n0);
      for (std::size_t k = c0; k < c1; ++k) col[(k - k0) * ld] = row[k];
    }
  }
}

/// The 8 signs (+1 or -1) a byte of sign bits stands for: bit j set gives -1 at j.
struct sign_byte_table {
  alignas(32) float v[256][8];
};
inline constexpr sign_byte_table sign_bytes = [] {
  sign_byte_table t{};
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 8; ++j) t.v[b][j] = (b >> j) & 1 ? -1.0f : 1.0f;
  return t;
}();

/// out[i * stride] = +scale or -scale, the signs of elements [e0, e0 + count) of sketch `term`:
/// one Philox block per 128 consecutive elements; contiguous runs expand a byte of bits into 8
/// floats at a time (a table row times the scale: one vector multiply).
inline void fill_signs(std::uint64_t seed, std::uint64_t term, std::uint64_t e0, std::size_t count, float scale,
                       float* out, std::size_t stride) {
  std::uint64_t e = e0;
  const std::uint64_t end = e0 + count;
  while (e < end) {
    const std::uint64_t b = e / random::signs_per_block;
    const random::philox_ctr block = random::sign_block(seed, term, b);
    const std::uint64_t stop = std::min(end, (b + 1) * random::signs_per_block);
    if (stride == 1) {
      for (; e < stop && (e & 7) != 0; ++e, ++out) *out = random::sign_bit(block, e) ? -scale : scale;
      for (; e + 8 <= stop; e += 8, out += 8) {
        const std::uint32_t byte = (block.v[(e >> 5) & 3] >> (e & 24)) & 0xFFu;
        const float* row = sign_bytes.v[byte];
        for (int j = 0; j < 8; ++j) out[j] = row[j] * scale;
      }
    }
    for (; e < stop; ++e, out += stride) *out = random::sign_bit(block, e) ? -scale : scale;
  }
}

/// Row r, columns [c0, c1) of the stacked sketch u (as stored, untransposed) into out[(c - c0) * stride].
template <class U>
void sketch_row(const U& u, std::size_t r, std::size_t c0, std::size_t c1, float* out, std::size_t stride) {
  constexpr std::size_t TR = U::term_rows, TC = U::term_cols;
  if constexpr (U::stack == sketch_stack::columns) {
    for (std::size_t c = c0; c < c1;) {
      const std::size_t t = c / TC, stop = std::min(c1, (t + 1) * TC);
      fill_signs(u.seed, t, std::uint64_t(r) * TC + (c - t * TC), stop - c, u.scale, out + (c - c0) * stride, stride);
      c = stop;
    }
  } else {
    const std::size_t t = r / TR;
    fill_signs(u.seed, t, std::uint64_t(r - t * TR) * TC + c0, c1 - c0, u.scale, out, stride);
  }
}

}  // namespace operand_detail

/// out[(k - k0) * ld + (n - n0)] = X'(k, n) for k in [k0, k1), n in [n0, n1): a block of the
/// operand x as the product reads it.
template <class S>
void pack_block(const tensor_ref<const float, S>& x, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1,
                float* out, std::size_t ld) {
  operand_detail::copy_rows(x.data(), S::last, k0, k1, n0, n1, out, ld);
}
template <class S>
void pack_block(const transposed<S>& x, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1, float* out,
                std::size_t ld) {
  operand_detail::copy_transposed(x.ref.data(), S::last, k0, k1, n0, n1, out, ld);
}
template <class S, std::size_t C0, std::size_t C1, bool Trans>
void pack_block(const column_block<S, C0, C1, Trans>& x, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1,
                float* out, std::size_t ld) {
  if constexpr (Trans)
    operand_detail::copy_transposed(x.ref.data() + C0, S::last, k0, k1, n0, n1, out, ld);
  else
    operand_detail::copy_rows(x.ref.data() + C0, S::last, k0, k1, n0, n1, out, ld);
}
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
void pack_block(const sign_sketch<TR, TC, Terms, Stack, Trans>& u, std::size_t k0, std::size_t k1, std::size_t n0,
                std::size_t n1, float* out, std::size_t ld) {
  // Generated along the sketch's own rows, where consecutive elements share Philox blocks; read
  // transposed, a few rows at a time into an L1 buffer, then transposed into place.
  if constexpr (Trans) {
    constexpr std::size_t rows = float_lanes, span = 256;
    alignas(64) float buffer[rows * span];
    for (std::size_t n = n0; n < n1; n += rows) {
      const std::size_t nr = std::min(rows, n1 - n);
      for (std::size_t c = k0; c < k1; c += span) {
        const std::size_t len = std::min(span, k1 - c);
        for (std::size_t r = 0; r < nr; ++r) operand_detail::sketch_row(u, n + r, c, c + len, buffer + r * span, 1);
        operand_detail::copy_transposed(buffer, span, 0, len, 0, nr, out + (c - k0) * ld + (n - n0), ld);
      }
    }
  } else {
    for (std::size_t k = k0; k < k1; ++k) operand_detail::sketch_row(u, k, n0, n1, out + (k - k0) * ld, 1);
  }
}
template <class A, class B, sketch_stack Axis>
void pack_block(const operand_concat<A, B, Axis>& x, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1,
                float* out, std::size_t ld) {
  if constexpr (Axis == sketch_stack::columns) {
    constexpr std::size_t split = solder::detail::operand_traits<A>::cols;
    if (n0 < split) pack_block(x.a, k0, k1, n0, std::min(n1, split), out, ld);
    if (n1 > split) {
      const std::size_t from = std::max(n0, split);
      pack_block(x.b, k0, k1, from - split, n1 - split, out + (from - n0), ld);
    }
  } else {
    constexpr std::size_t split = solder::detail::operand_traits<A>::rows;
    if (k0 < split) pack_block(x.a, k0, std::min(k1, split), n0, n1, out, ld);
    if (k1 > split) {
      const std::size_t from = std::max(k0, split);
      pack_block(x.b, from - split, k1 - split, n0, n1, out + (from - k0) * ld, ld);
    }
  }
}

namespace operand_detail {
/// How many sketches x holds read as they are (Trans = false) and read transposed.
template <class X>
struct sketch_count {
  static constexpr std::size_t plain = 0, transposed = 0;
};
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
struct sketch_count<sign_sketch<TR, TC, Terms, Stack, Trans>> {
  static constexpr std::size_t plain = Trans ? 0 : 1, transposed = Trans ? 1 : 0;
};
template <class A, class B, sketch_stack Axis>
struct sketch_count<operand_concat<A, B, Axis>> {
  static constexpr std::size_t plain = sketch_count<A>::plain + sketch_count<B>::plain;
  static constexpr std::size_t transposed = sketch_count<A>::transposed + sketch_count<B>::transposed;
};
}  // namespace operand_detail

/// Panels [p0, p1) of B' = x over K range [k0, k1) into dst, as the GEMM's driver reads a cache
/// block (gemm_from): panel p at (p - p0) (k1 - k0) nr, row k at (k - k0) width, zero-padded to
/// the panel width (gemm_detail::b_panels<N>). An operand holding a sketch read as it is goes
/// row by row: each row of the block whole into a buffer (long runs: a Philox block per 128
/// signs, a byte of them expanded at a time), then cut into the panels.
template <std::size_t N, class X>
void pack_b_block_of(const X& x, float* dst, std::size_t p0, std::size_t p1, std::size_t k0, std::size_t k1) {
  using L = gemm_detail::b_panels<N>;
  using count = operand_detail::sketch_count<X>;
  constexpr bool by_rows = count::plain > 0 && count::transposed == 0;
  const std::size_t kc = k1 - k0;
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t n0 = p * L::nr, width = L::width(p), cols = std::min(width, N - n0);
    float* out = dst + (p - p0) * kc * L::nr;
    if (!by_rows) pack_block(x, k0, k1, n0, n0 + cols, out, width);
    if (cols < width)
      for (std::size_t k = 0; k < kc; ++k) std::fill(out + k * width + cols, out + (k + 1) * width, 0.0f);
  }
  if constexpr (by_rows) {
    const std::size_t n_begin = p0 * L::nr, n_end = std::min(N, p1 * L::nr);
    thread_local growing_buffer<float> row_buffer;
    float* row = row_buffer.get(n_end - n_begin);
    for (std::size_t k = k0; k < k1; ++k) {
      pack_block(x, k, k + 1, n_begin, n_end, row, n_end - n_begin);
      for (std::size_t p = p0; p < p1; ++p) {
        const std::size_t n0 = p * L::nr, width = L::width(p), cols = std::min(width, N - n0);
        operand_detail::copy_short(row + (n0 - n_begin), dst + (p - p0) * kc * L::nr + (k - k0) * width, cols);
      }
    }
  }
}

/// The GEMM driver's A source for any operand: tile t of A' = x holds A'[m][k] for its rows at
/// k * MR + r, which is a block of x^T packed with row stride MR.
template <class X>
struct a_operand {
  X x;
  template <std::size_t MR, class KArg>
  void pack(const gemm_detail::row_tiles& tiling, std::size_t t0, std::size_t t1, KArg k_arg, float* dst) const {
    pack_k<MR>(tiling, t0, t1, 0, gemm_detail::k_of(k_arg), dst);
  }
  /// Tiles [t0, t1) over K range [k0, k0 + kc) only, tile t at (t - t0) kc MR.
  template <std::size_t MR>
  void pack_k(const gemm_detail::row_tiles& tiling, std::size_t t0, std::size_t t1, std::size_t k0, std::size_t kc,
              float* dst) const {
    const auto xt = transpose(x);
    for (std::size_t t = t0; t < t1; ++t) {
      const std::size_t m0 = tiling.begin(t);
      pack_block(xt, k0, k0 + kc, m0, m0 + tiling.rows(t), dst + (t - t0) * kc * MR, MR);
    }
  }
};

}  // namespace solder::eval::cpu
