// eval/cpu/operand_packing.hpp: the CPU packs every kind of product operand (expr/operand.hpp)
// into the GEMM's panels: stored blocks are copied (or transposed), sign sketches are generated
// from Philox on the way, an image's im2col columns are copied from the image (zeros for the
// padding), and concatenations pack each part where it lies. Packing is exact, so
// a product of packed values gives the same bits whichever operand form supplied them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/eval/cpu/gemm_packing.hpp"
#include "solder/eval/cpu/philox.hpp"
#include "solder/expr/operand.hpp"
#include "solder/memory.hpp"
#include "solder/random/sketch.hpp"

namespace solder::eval::cpu {

namespace operand_detail {

/// dst[i] = src[i] for i < n: whole vectors inline (a call to memcpy per panel row, 128 bytes,
/// costs as much as the copy).
SOLDER_INLINE void copy_short(const float* src, float* dst, std::size_t n) {
  using V = vec<float>;
  // The tail's length bounded by a vector, so the compiler sees its loop is short.
  const std::size_t whole = n - n % V::size;
  for (std::size_t i = 0; i < whole; i += V::size) V::load_unaligned(src + i).store_unaligned(dst + i);
  for (std::size_t j = 0; j < n % V::size; ++j) dst[whole + j] = src[whole + j];
}

/// out[(k - k0) * ld + (n - n0)] = src[k * lds + n]: rows of a stored matrix.
inline void copy_rows(const float* src, std::size_t lds, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1,
                      float* out, std::size_t ld) {
  for (std::size_t k = k0; k < k1; ++k) copy_short(src + k * lds + n0, out + (k - k0) * ld, n1 - n0);
}

/// copy_transposed for ld = Stride (a whole number of vectors), W rows of src at a time through
/// the GEMM's in-register transpose.
template <std::size_t Stride>
void copy_transposed_vectors(const float* src, std::size_t lds, std::size_t k0, std::size_t k1, std::size_t n0,
                             std::size_t n1, float* out) {
  constexpr std::size_t W = float_lanes;
  constexpr std::integral_constant<std::size_t, Stride> stride;
  for (std::size_t n = n0; n < n1; n += W)
    gemm_detail::pack_transposed<W, false>(src + n * lds + k0, lds, std::min(W, n1 - n), k1 - k0, out + (n - n0),
                                           stride);
}

/// out[(k - k0) * ld + (n - n0)] = src[n * lds + k]: a stored matrix read transposed. Where ld
/// is a whole number of vectors up to a register tile's width (every B panel), W rows at a time
/// through the GEMM's in-register transpose; elsewhere (A tiles) in chunks of 64 k, so the
/// destination block stays in L1 while the source rows stream past.
inline void copy_transposed(const float* src, std::size_t lds, std::size_t k0, std::size_t k1, std::size_t n0,
                            std::size_t n1, float* out, std::size_t ld) {
  constexpr std::size_t W = float_lanes;
  static_assert(gemm_detail::b_panels::nr == 2 * W, "solder: the register tile is two vectors wide");
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

/// The sign bits of one sketch term, a Philox group at a time: the 16 blocks of counters
/// (16 g .. 16 g + 15, term) under the seed, which are the dropout generator's group of stream
/// (seed, offset = term), so its SIMD cores make them (eval/cpu/philox.hpp); a group holds the
/// signs of 2048 consecutive elements.
class sign_bits {
 public:
  static constexpr std::uint64_t group_signs = 16 * random::signs_per_block;

  sign_bits(std::uint64_t seed, std::uint64_t term, std::uint32_t rounds)
      : stream_(seed, term, rounds), seed_(seed), term_(term), rounds_(rounds) {}
  bool is(std::uint64_t seed, std::uint64_t term, std::uint32_t rounds) const {
    return seed == seed_ && term == term_ && rounds == rounds_;
  }

  /// The signs of elements e .. e + 15 (e a multiple of 16): bit j set where e + j is negative.
  /// The group's word 16 k + l is bits 16 k .. 16 k + 15 of its block l.
  SOLDER_INLINE std::uint32_t piece(std::uint64_t e) {
    const std::uint64_t g = e / group_signs;
    if (g != group_) [[unlikely]]
      make(g);
    return bits_[16 * ((e / 16) % 8) + (e / random::signs_per_block) % 16];
  }
  bool negative(std::uint64_t e) { return ((piece(e & ~std::uint64_t{15}) >> (e & 15)) & 1u) != 0; }

 private:
  [[gnu::noinline]] void make(std::uint64_t g) {
    detail::philox_groups<arch, 1>(stream_, g, bits_);
    group_ = g;
  }

  detail::philox_stream stream_;
  std::uint64_t seed_, term_;
  std::uint32_t rounds_;
  std::uint64_t group_ = ~std::uint64_t{0};
  alignas(64) std::uint16_t bits_[random::bits16_group];
};

/// The calling thread's sign_bits of (seed, term, rounds), kept between calls so the rows of a
/// block that share a group generate it once (one slot per term mod 8: the terms a block spans).
inline sign_bits& sign_source(std::uint64_t seed, std::uint64_t term, std::uint32_t rounds) {
  thread_local std::optional<sign_bits> slots[8];
  std::optional<sign_bits>& slot = slots[term % 8];
  if (!slot || !slot->is(seed, term, rounds)) slot.emplace(seed, term, rounds);
  return *slot;
}

/// out[j] = bit j of `bits` set ? minus : plus, for j < 16.
SOLDER_INLINE void expand_signs16(std::uint32_t bits, const vec<float>& plus, const vec<float>& minus, float* out) {
  using I = xsimd::batch<std::int32_t, arch>;
  alignas(64) static constexpr std::int32_t lane_bit[16] = {1 << 0, 1 << 1, 1 << 2,  1 << 3,  1 << 4,  1 << 5,  1 << 6,  1 << 7,
                                                           1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14, 1 << 15};
  const I word(static_cast<std::int32_t>(bits));
  for (std::size_t h = 0; h < 16; h += I::size) {
    const auto negative = (word & I::load_aligned(lane_bit + h)) != I(0);
    xsimd::select(xsimd::bool_cast(negative), minus, plus).store_unaligned(out + h);
  }
}

/// out[i * stride] = +scale or -scale, the signs of elements [e0, e0 + count) of the term `src`
/// generates; contiguous runs 16 at a time (a compare and a blend per vector).
/// Always inlined: a sketch row's caller passes stride 1, which folds its loops away.
SOLDER_INLINE void fill_signs(sign_bits& src, std::uint64_t e0, std::size_t count, float scale, float* out,
                              std::size_t stride) {
  std::uint64_t e = e0;
  const std::uint64_t end = e0 + count;
  if (stride == 1) {
    const vec<float> plus(scale), minus(-scale);
    for (; e < end && (e & 15) != 0; ++e, ++out) *out = src.negative(e) ? -scale : scale;
    for (; e + 16 <= end; e += 16, out += 16) expand_signs16(src.piece(e), plus, minus, out);
  }
  for (; e < end; ++e, out += stride) *out = src.negative(e) ? -scale : scale;
}

/// Row r, columns [c0, c1) of the stacked sketch u (as stored, untransposed) into out[(c - c0) * stride].
template <class U>
void sketch_row(const U& u, std::size_t r, std::size_t c0, std::size_t c1, float* out, std::size_t stride) {
  constexpr std::size_t TR = U::term_rows, TC = U::term_cols;
  if constexpr (U::stack == sketch_stack::columns) {
    for (std::size_t c = c0; c < c1;) {
      const std::size_t t = c / TC, stop = std::min(c1, (t + 1) * TC);
      fill_signs(sign_source(u.seed, t, u.rounds), std::uint64_t(r) * TC + (c - t * TC), stop - c, u.scale,
                 out + (c - c0) * stride, stride);
      c = stop;
    }
  } else {
    const std::size_t t = r / TR;
    fill_signs(sign_source(u.seed, t, u.rounds), std::uint64_t(r - t * TR) * TC + c0, c1 - c0, u.scale, out, stride);
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
/// Rows k of an image's columns: channel k / (Kh Kw), tap (k / Kw % Kh, k % Kw), the output
/// positions [n0, n1) across output rows (G::im2col_span: the padding's zeros split off, the
/// inside a strided copy).
template <class G, std::size_t C, class Space>
void pack_block(const im2col<G, C, Space>& x, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1, float* out,
                std::size_t ld) {
  constexpr std::size_t Kh = G::kernel_height, Kw = G::kernel_width;
  for (std::size_t k = k0; k < k1; ++k)
    G::im2col_span(x.image + k / (Kh * Kw) * G::in_plane, k / Kw % Kh, k % Kw, n0, n1, out + (k - k0) * ld);
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
/// Whether the block [k0, k1) x [n0, n1) of x holds a sketch read as it is (Trans = false).
template <class X>
bool plain_sketch_in(const X& /*x*/, std::size_t, std::size_t, std::size_t, std::size_t) {
  return false;
}
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
bool plain_sketch_in(const sign_sketch<TR, TC, Terms, Stack, Trans>&, std::size_t, std::size_t, std::size_t, std::size_t) {
  return !Trans;
}
template <class A, class B, sketch_stack Axis>
bool plain_sketch_in(const operand_concat<A, B, Axis>& x, std::size_t k0, std::size_t k1, std::size_t n0, std::size_t n1) {
  if constexpr (Axis == sketch_stack::columns) {
    constexpr std::size_t split = solder::detail::operand_traits<A>::cols;
    return (n0 < split && plain_sketch_in(x.a, k0, k1, n0, std::min(n1, split))) ||
           (n1 > split && plain_sketch_in(x.b, k0, k1, std::max(n0, split) - split, n1 - split));
  } else {
    constexpr std::size_t split = solder::detail::operand_traits<A>::rows;
    return (k0 < split && plain_sketch_in(x.a, k0, std::min(k1, split), n0, n1)) ||
           (k1 > split && plain_sketch_in(x.b, std::max(k0, split) - split, k1 - split, n0, n1));
  }
}
/// Whether x may hold a sketch read as it is at all (the panels of other operands are packed
/// one by one, and the row-by-row path is not compiled for them).
template <class X>
inline constexpr bool may_hold_plain_sketch = false;
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
inline constexpr bool may_hold_plain_sketch<sign_sketch<TR, TC, Terms, Stack, Trans>> = !Trans;
template <class A, class B, sketch_stack Axis>
inline constexpr bool may_hold_plain_sketch<operand_concat<A, B, Axis>> =
    may_hold_plain_sketch<A> || may_hold_plain_sketch<B>;
}  // namespace operand_detail

/// Panels [p0, p1) of B' = x over K range [k0, k1) into dst, as the GEMM's driver reads a cache
/// block (gemm_from): panel p at (p - p0) (k1 - k0) nr, row k at (k - k0) width, zero-padded to
/// the panel width (gemm_detail::b_panels(N)). Each panel is packed on its own, except the
/// panels holding a sketch read as it is: those go row by row, each row of them whole into a
/// buffer (long runs, where consecutive rows share Philox groups), then cut into the panels.
template <std::size_t N, class X>
void pack_b_block_of(const X& x, float* dst, std::size_t p0, std::size_t p1, std::size_t k0, std::size_t k1) {
  constexpr gemm_detail::b_panels L(N);
  const std::size_t kc = k1 - k0;
  std::size_t first = p1, last = p0;  // the panels with a plain sketch: [first, last)
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t n0 = p * L.nr, width = L.width(p), cols = std::min(width, N - n0);
    float* out = dst + (p - p0) * kc * L.nr;
    if (operand_detail::plain_sketch_in(x, k0, k1, n0, n0 + cols)) {
      first = std::min(first, p);
      last = p + 1;
    } else {
      pack_block(x, k0, k1, n0, n0 + cols, out, width);
    }
    if (cols < width)
      for (std::size_t k = 0; k < kc; ++k) std::fill(out + k * width + cols, out + (k + 1) * width, 0.0f);
  }
  if constexpr (operand_detail::may_hold_plain_sketch<std::remove_cvref_t<X>>) {
    if (first >= last) return;
    const std::size_t n_begin = first * L.nr, n_end = std::min(N, last * L.nr);
    thread_local growing_buffer<float> row_buffer;
    float* row = row_buffer.get(n_end - n_begin);
    for (std::size_t k = k0; k < k1; ++k) {
      pack_block(x, k, k + 1, n_begin, n_end, row, n_end - n_begin);
      for (std::size_t p = first; p < last; ++p) {
        const std::size_t n0 = p * L.nr, width = L.width(p), cols = std::min(width, N - n0);
        operand_detail::copy_short(row + (n0 - n_begin), dst + (p - p0) * kc * L.nr + (k - k0) * width, cols);
      }
    }
  }
}

namespace operand_detail {
/// The stored rows the block [k0, k1) x [n0, n1) of x is packed from (gemm_detail::rows_of),
/// for the driver to prefetch; none for a sketch, the first stored part's for a concatenation.
/// A matrix from `base` with rows ld floats apart, read as it is or (Trans) transposed.
template <bool Trans>
gemm_detail::row_lines_walk stored_rows_of(const float* base, std::size_t ld, std::size_t k0, std::size_t k1,
                                           std::size_t n0, std::size_t n1) {
  if constexpr (Trans)
    return gemm_detail::rows_of(base + n0 * ld + k0, (k1 - k0) * sizeof(float), n1 - n0, ld * sizeof(float));
  else
    return gemm_detail::rows_of(base + k0 * ld + n0, (n1 - n0) * sizeof(float), k1 - k0, ld * sizeof(float));
}
template <class S>
gemm_detail::row_lines_walk stored_rows(const tensor_ref<const float, S>& x, std::size_t k0, std::size_t k1,
                                        std::size_t n0, std::size_t n1) {
  return stored_rows_of<false>(x.data(), S::last, k0, k1, n0, n1);
}
template <class S>
gemm_detail::row_lines_walk stored_rows(const transposed<S>& x, std::size_t k0, std::size_t k1, std::size_t n0,
                                        std::size_t n1) {
  return stored_rows_of<true>(x.ref.data(), S::last, k0, k1, n0, n1);
}
template <class S, std::size_t C0, std::size_t C1, bool Trans>
gemm_detail::row_lines_walk stored_rows(const column_block<S, C0, C1, Trans>& x, std::size_t k0, std::size_t k1,
                                        std::size_t n0, std::size_t n1) {
  return stored_rows_of<Trans>(x.ref.data() + C0, S::last, k0, k1, n0, n1);
}
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
gemm_detail::row_lines_walk stored_rows(const sign_sketch<TR, TC, Terms, Stack, Trans>&, std::size_t, std::size_t,
                                        std::size_t, std::size_t) {
  return {};
}
/// An image's columns gather from rows spread over its planes: none named.
template <class G, std::size_t C, class Space>
gemm_detail::row_lines_walk stored_rows(const im2col<G, C, Space>&, std::size_t, std::size_t, std::size_t, std::size_t) {
  return {};
}
template <class A, class B, sketch_stack Axis>
gemm_detail::row_lines_walk stored_rows(const operand_concat<A, B, Axis>& x, std::size_t k0, std::size_t k1,
                                        std::size_t n0, std::size_t n1) {
  gemm_detail::row_lines_walk w;
  if constexpr (Axis == sketch_stack::columns) {
    constexpr std::size_t split = solder::detail::operand_traits<A>::cols;
    if (n0 < split) w = stored_rows(x.a, k0, k1, n0, std::min(n1, split));
    if (w.rows == 0 && n1 > split) w = stored_rows(x.b, k0, k1, std::max(n0, split) - split, n1 - split);
  } else {
    constexpr std::size_t split = solder::detail::operand_traits<A>::rows;
    if (k0 < split) w = stored_rows(x.a, k0, std::min(k1, split), n0, n1);
    if (w.rows == 0 && k1 > split) w = stored_rows(x.b, std::max(k0, split) - split, k1 - split, n0, n1);
  }
  return w;
}
}  // namespace operand_detail

/// The B packer gemm_from takes for an operand x of N columns: packs a block (pack_b_block_of)
/// and names the stored rows a block is packed from, so the driver prefetches the next block's.
template <std::size_t N, class X>
struct b_block_packer {
  const X& x;
  void operator()(float* dst, std::size_t p0, std::size_t p1, std::size_t k0, std::size_t k1) const {
    pack_b_block_of<N>(x, dst, p0, p1, k0, k1);
  }
  gemm_detail::row_lines_walk source(std::size_t p0, std::size_t p1, std::size_t k0, std::size_t k1) const {
    constexpr std::size_t nr = gemm_detail::b_panels::nr;
    return operand_detail::stored_rows(x, k0, k1, p0 * nr, std::min(N, p1 * nr));
  }
};

/// The GEMM driver's A source for any operand: tile t of A' = x holds A'[m][k] for its rows at
/// k * MR + r, which is a block of x^T packed with row stride MR.
template <class X>
struct a_operand {
  X x;
  template <std::size_t MR>
  void pack(const gemm_detail::row_tiles& tiling, std::size_t t0, std::size_t t1, std::size_t K, float* dst) const {
    pack_k<MR>(tiling, t0, t1, 0, K, dst);
  }
  /// Tiles [t0, t1) over K range [k0, k0 + kc) only, tile t at (t - t0) kc MR.
  template <std::size_t MR>
  void pack_k(const gemm_detail::row_tiles& tiling, std::size_t t0, std::size_t t1, std::size_t k0, std::size_t kc,
              float* dst) const {
    const auto xt = transpose(x);
    for (std::size_t t = t0; t < t1; ++t) {
      const std::size_t m0 = tiling.begin(t), rows = tiling.rows(t);
      float* out = dst + (t - t0) * kc * MR;
      pack_block(xt, k0, k0 + kc, m0, m0 + rows, out, MR);
      gemm_detail::zero_extra_rows<MR>(out, kc, rows);
    }
  }
};

}  // namespace solder::eval::cpu
