// eval/cpu/conv_nhwc.hpp: the CPU convolution of one group over channels-last rows. Each output
// row is cut into tiles of the GEMM micro-kernel's shape (pixels x output channels); a tile's
// accumulators stay in registers over every tap and input channel, reading the input in place:
// for tap (kh, kw) the tile's A operand is the input row itself, one pixel (Cin floats) per row
// of A, so nothing is packed per call. The weights are packed once (conv_packed_weights) in the
// order the tiles stream them. docs/convolution.md, "How a convolution runs".
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/eval/cpu/gemm_epilogue.hpp"
#include "solder/eval/cpu/gemm_kernel.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/row_writes.hpp"
#include "solder/memory.hpp"

namespace solder::eval::cpu {

namespace conv_detail {

/// Cache lines to bring into L2 one at a time, between the FMAs of the tiles: `runs` runs of
/// `run_lines` lines, each run `stride` bytes after the start of the one before. Asking for a
/// whole row at once would stall on the few line-fill buffers; one line per k step spreads it.
struct line_stream {
  const char* line = nullptr;
  std::size_t run_lines = 0, run_left = 0, runs = 0;
  std::ptrdiff_t stride = 0;

  /// The lines of `runs` runs of n floats from p, `stride` floats apart.
  static line_stream of(const float* p, std::size_t n, std::size_t runs = 1, std::size_t stride = 0) {
    if (n == 0 || runs == 0) return {};
    const auto first = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{63};
    const auto last = reinterpret_cast<std::uintptr_t>(p + n - 1) & ~std::uintptr_t{63};
    line_stream s;
    s.line = reinterpret_cast<const char*>(first);
    s.run_lines = s.run_left = (last - first) / 64 + 1;
    s.runs = runs;
    s.stride = std::ptrdiff_t(stride * sizeof(float)) - std::ptrdiff_t(s.run_lines * 64);
    return s;
  }
  /// Prefetches the next line (for writing if Write), if any is left.
  template <bool Write>
  SOLDER_INLINE void step() {
    if (runs == 0) return;
    __builtin_prefetch(line, Write ? 1 : 0, 2);
    line += 64;
    if (--run_left == 0) {
      line += stride;
      run_left = run_lines;
      --runs;
    }
  }
};

#if defined(__AVX512F__) && !defined(__CUDACC__)
/// A 16 x 16 block transposed in registers: log2(16) rounds of interleaving row i with row
/// i + 8 (a perfect shuffle each; GCC and Clang make one vpermt2ps of each interleave).
struct block_transpose16 {
  typedef float row_t __attribute__((vector_size(64)));
  template <std::size_t... I>
  SOLDER_INLINE static row_t low(row_t a, row_t b, std::index_sequence<I...>) {
    return __builtin_shufflevector(a, b, (I % 2 ? 16 + I / 2 : I / 2)...);
  }
  template <std::size_t... I>
  SOLDER_INLINE static row_t high(row_t a, row_t b, std::index_sequence<I...>) {
    return __builtin_shufflevector(a, b, (I % 2 ? 24 + I / 2 : 8 + I / 2)...);
  }
  /// dst[j ldd + i] = src[i lds + j] for i, j < 16.
  SOLDER_INLINE static void run(const float* src, std::size_t lds, float* dst, std::size_t ldd) {
    row_t r[16], t[16];
    for (std::size_t i = 0; i < 16; ++i) std::memcpy(&r[i], src + i * lds, sizeof(row_t));
    for (int round = 0; round < 4; ++round) {
      for (std::size_t i = 0; i < 8; ++i) {
        t[2 * i] = low(r[i], r[i + 8], std::make_index_sequence<16>{});
        t[2 * i + 1] = high(r[i], r[i + 8], std::make_index_sequence<16>{});
      }
      for (std::size_t i = 0; i < 16; ++i) r[i] = t[i];
    }
    for (std::size_t j = 0; j < 16; ++j) std::memcpy(dst + j * ldd, &r[j], sizeof(row_t));
  }
};
#endif

/// dst[j ldd] = src[j] for j < n.
inline void transpose_row(const float* src, float* dst, std::size_t ldd, std::size_t n) {
  for (const float* end = src + n; src != end; ++src, dst += ldd) *dst = *src;
}

/// dst[j ldd + i] = src[i lds + j] for i < rows, j < cols: with AVX-512, 16 x 16 blocks in
/// registers and the edges one element at a time; otherwise one element at a time (GCC's
/// 8-lane interleaves across 128-bit halves were slower than that with AVX2).
inline void transpose(const float* src, std::size_t lds, float* dst, std::size_t ldd, std::size_t rows,
                      std::size_t cols) {
  for (std::size_t i0 = 0; i0 < rows; i0 += 16, src += 16 * lds, dst += 16) {
    const std::size_t height = rows - i0 < 16 ? rows - i0 : 16;
    std::size_t j0 = 0;
#if defined(__AVX512F__) && !defined(__CUDACC__)
    if (height == 16)
      for (; j0 + 16 <= cols; j0 += 16) block_transpose16::run(src + j0, lds, dst + j0 * ldd, ldd);
#endif
    for (std::size_t i = 0; i < height; ++i) transpose_row(src + i * lds + j0, dst + j0 * ldd + i, ldd, cols - j0);
  }
}

/// Where sample n's input row h is and how it becomes channels-last: x [N, H, W, Cin] as
/// stored (a copy of the row), or x [N, Cin, H, W] (a transpose of the row's Cin runs).
template <std::size_t Cin, std::size_t H, std::size_t W>
struct nhwc_rows {
  const float* x;
  /// dst[w Cin + c] = x[n][h][w][c] for every w < W, c < Cin.
  void load(std::size_t n, std::size_t h, float* dst) const {
    std::memcpy(dst, x + (n * H + h) * W * Cin, W * Cin * sizeof(float));
  }
  /// The lines of rows [h0, h1] of sample n (rows of the next sample past H).
  line_stream lines(std::size_t n, std::size_t h0, std::size_t h1) const {
    return line_stream::of(x + (n * H + h0) * W * Cin, (h1 - h0 + 1) * W * Cin);
  }
};
template <std::size_t Cin, std::size_t H, std::size_t W>
struct nchw_rows {
  const float* x;
  /// dst[w Cin + c] = x[n][c][h][w] for every w < W, c < Cin.
  void load(std::size_t n, std::size_t h, float* dst) const {
    transpose(x + (n * Cin * H + h) * W, H * W, dst, Cin, Cin, W);
  }
  /// The lines of rows [h0, h1] of sample n, h1 < H.
  line_stream lines(std::size_t n, std::size_t h0, std::size_t h1) const {
    return line_stream::of(x + (n * Cin * H + h0) * W, (h1 - h0 + 1) * W, Cin, H * W);
  }
};

/// Where sample n's output row h goes: y [N, Ho, Wo, Cout] (the tiles store into it), or y
/// [N, Cout, Ho, Wo] (the tiles store into a channels-last row buffer, transposed at the end).
template <std::size_t Cout, std::size_t Ho, std::size_t Wo>
struct nhwc_store {
  float* y;
  static constexpr bool staged = false;
  float* row(std::size_t n, std::size_t h, float*) const { return y + (n * Ho + h) * Wo * Cout; }
  void finish(std::size_t, std::size_t, const float*) const {}
  line_stream lines(std::size_t n, std::size_t h) const { return line_stream::of(y + (n * Ho + h) * Wo * Cout, Wo * Cout); }
};
/// An epilogue (row_writes.hpp) runs over the row's Cout output rows once they are stored.
template <std::size_t Cout, std::size_t Ho, std::size_t Wo>
struct nchw_store {
  float* y;
  row_epilogue after{};
  static constexpr bool staged = true;
  float* row(std::size_t, std::size_t, float* buffer) const { return buffer; }
  line_stream lines(std::size_t n, std::size_t h) const {
    return line_stream::of(y + (n * Cout * Ho + h) * Wo, Wo, Cout, Ho * Wo);
  }
  /// y[n][c][h][w] = row[w Cout + c], then the epilogue over those values.
  void finish(std::size_t n, std::size_t h, const float* row) const {
    transpose(row, Cout, y + (n * Cout * Ho + h) * Wo, Ho * Wo, Wo, Cout);
    after.rows(n * Cout * Ho + h, Cout, Ho);
  }
};

/// The input rows that the output rows in flight read, staged channels-last (Cin floats per
/// pixel) with P zero pixels on each side, in a ring of D (Kh - 1) + 1 rows: while consecutive
/// output rows run, each input row of a sample is staged once. One per thread and run of rows.
template <std::size_t Cin, std::size_t H, std::size_t W, std::size_t Kh, std::size_t S, std::size_t P, std::size_t D>
class row_ring {
 public:
  static constexpr std::size_t row_floats = (W + 2 * P) * Cin;
  static constexpr std::size_t slots = D * (Kh - 1) + 1;

  row_ring() : base(space().get(slots * row_floats)) {
    std::fill_n(base, slots * row_floats, 0.0f);  // the padding pixels stay 0
    std::fill_n(held, slots, ~std::size_t{0});
  }
  row_ring(const row_ring&) = delete;
  row_ring& operator=(const row_ring&) = delete;

  /// The input row that tap row kh of output row ho reads (sample n): staged by input.load if
  /// the ring does not hold it; null when it lies in the padding.
  template <class Rows>
  const float* row(const Rows& input, std::size_t n, std::size_t ho, std::size_t kh) {
    const std::size_t h = ho * S + kh * D - P;  // wraps past the top edge
    if (h >= H) return nullptr;
    const std::size_t slot = h % slots, key = n * H + h;
    float* dst = base + slot * row_floats;
    if (held[slot] != key) {
      input.load(n, h, dst + P * Cin);
      held[slot] = key;
    }
    return dst;
  }
  /// The lines of the input rows that output row ho of sample n will stage (those the ring
  /// does not hold now), to prefetch while the row before it runs.
  template <class Rows>
  line_stream missing_lines(const Rows& input, std::size_t n, std::size_t ho) const {
    std::size_t h0 = H, h1 = 0;
    for (std::size_t kh = 0; kh < Kh; ++kh) {
      const std::size_t h = ho * S + kh * D - P;
      if (h < H && held[h % slots] != n * H + h) {
        h0 = std::min(h0, h);
        h1 = std::max(h1, h);
      }
    }
    return h0 <= h1 ? input.lines(n, h0, h1) : line_stream{};
  }

 private:
  static growing_buffer<float>& space() {
    thread_local growing_buffer<float> s;
    return s;
  }
  float* base;
  std::size_t held[slots];  // which input row (n H + h) each slot holds
};

/// The tile's stores: y[r][j] = op(acc[r][j] + bias[n0 + j]) for the tile's rows and its nr
/// valid output channels from n0, rows ldc floats apart; no bias when bias is null.
template <class Op>
struct bias_op_store {
  const float* bias;
  Op op;
  template <std::size_t R, std::size_t NV>
  SOLDER_INLINE void operator()(const vec<float> (&acc)[R][NV], float* y, std::size_t ldc, std::size_t n0,
                                std::size_t nr) const {
    using V = vec<float>;
    constexpr std::size_t W = V::size;
    V b[NV];
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v)
      b[v] = bias == nullptr ? V(0.0f)
             : (v + 1) * W <= nr ? V::load_unaligned(bias + n0 + v * W)
             : v * W < nr        ? load_first<V>(bias + n0 + v * W, nr - v * W)
                                 : V(0.0f);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < R; ++r)
      gemm_detail::store_row<NV>(y + r * ldc, acc[r], nr, [&](const V& x, std::size_t v) { return op.forward(x + b[v]); });
  }
};

}  // namespace conv_detail

/// A convolution's weights w [Cout, Cin, Kh, Kw] (torch's layout) in the order conv_nhwc's
/// tiles stream them: panels of nr output channels, in each the taps in (kh, kw) order, in each
/// the input channels, nr floats (zeros past Cout) per channel.
template <std::size_t Cin, std::size_t Cout, std::size_t Kh, std::size_t Kw>
struct conv_packed_weights {
  static constexpr std::size_t nr = gemm_tile<arch>::nv * float_lanes;
  static constexpr std::size_t panels = (Cout + nr - 1) / nr;
  static constexpr std::size_t panel_floats = Kh * Kw * Cin * nr;
  static constexpr std::size_t floats = panels * panel_floats;

  /// packed[p panel_floats + ((kh Kw + kw) Cin + c) nr + j] = w[p nr + j][c][kh][kw].
  static void pack(const float* w, float* packed) {
    for (std::size_t p = 0; p < panels; ++p)
      for (std::size_t t = 0; t < Kh * Kw; ++t)
        for (std::size_t c = 0; c < Cin; ++c) {
          float* dst = packed + p * panel_floats + (t * Cin + c) * nr;
          for (std::size_t j = 0; j < nr; ++j) {
            const std::size_t co = p * nr + j;
            dst[j] = co < Cout ? w[(co * Cin + c) * Kh * Kw + t] : 0.0f;
          }
        }
  }
};

/// A convolution with one group over [N, H, W] images of Cin channels to Cout channels, Kh x Kw
/// taps, stride S, zero padding P, dilation D, on the micro-kernel's register tile
/// (gemm_tile): R output pixels of one row by NV vectors of output channels, summed over the
/// valid taps in (kh, kw) order and over the input channels in order, one FMA chain per output
/// element whatever the tile, the thread or the layouts, so every layout and thread count gives
/// the same bits.
template <std::size_t Cin, std::size_t Cout, std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw,
          std::size_t S, std::size_t P, std::size_t D>
struct conv_nhwc {
  using tile = gemm_tile<arch>;
  static constexpr std::size_t lanes = float_lanes;
  static constexpr std::size_t mr = tile::mr;
  static constexpr std::size_t nv = tile::nv;
  static constexpr std::size_t nr = nv * lanes;  // output channels of a panel
  static constexpr std::size_t panels = (Cout + nr - 1) / nr;
  static constexpr std::size_t Ho = (H + 2 * P - D * (Kh - 1) - 1) / S + 1;
  static constexpr std::size_t Wo = (W + 2 * P - D * (Kw - 1) - 1) / S + 1;
  using weights = conv_packed_weights<Cin, Cout, Kh, Kw>;
  static constexpr std::size_t panel_floats = weights::panel_floats;

  /// y = store(conv(x, w)) for `batch` samples, w packed by `weights`: rows.load stages input
  /// rows, out says where output rows go, store writes a finished tile (bias and activation).
  /// Output rows are cut into `threads` runs of nearly equal length by the sizes alone.
  template <class Rows, class Out, class Store>
  static void run(const float* packed, const Rows& rows, const Out& out, const Store& store, std::size_t batch,
                  int threads) {
    const std::size_t total = batch * Ho;
    const std::size_t runs = std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(threads), total));
    parallel_for(runs, int(runs), [&](std::size_t t) {
      run_rows(packed, rows, out, store, total * t / runs, total * (t + 1) / runs);
    });
  }

 private:
  template <std::size_t R>
  struct tile_fn {
    /// acc = the sum over the valid taps and channels for pixels [wo0, wo0 + R) of the row
    /// whose input rows are ring[kh] (null: that tap row is in the padding), panel b.
    SOLDER_INLINE static void accumulate(vec<float> (&acc)[R][nv], const float* const (&ring)[Kh], std::size_t wo0,
                                         const float* b, conv_detail::line_stream& in, conv_detail::line_stream& out) {
      using V = vec<float>;
      constexpr std::size_t BS = nv * lanes;
#pragma GCC unroll 16
      for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (std::size_t v = 0; v < nv; ++v) acc[r][v] = V(0.0f);
      for (std::size_t kh = 0; kh < Kh; ++kh) {
        if (ring[kh] == nullptr) {
          b += Kw * Cin * BS;
          continue;
        }
        for (std::size_t kw = 0; kw < Kw; ++kw) {
          const float* __restrict a = ring[kh] + (wo0 * S + kw * D) * Cin;
#pragma GCC unroll 4
          for (std::size_t c = 0; c < Cin; ++c) {
#pragma GCC unroll 8
            for (std::size_t line = 0; line < BS * sizeof(float); line += 64)
              __builtin_prefetch(reinterpret_cast<const char*>(b) + gemm_detail::b_prefetch_bytes + line, 0, 3);
            // The next output row's input and output lines, on alternate steps.
            if (c % 2 == 0)
              in.step<false>();
            else
              out.step<true>();
            gemm_detail::fma_step<R, nv, S * Cin>(acc, a + c, b);
            b += BS;
          }
        }
      }
    }

    template <class Store>
    static void run(const float* const (&ring)[Kh], std::size_t wo0, const float* b, float* y, std::size_t n0,
                    const Store& store, conv_detail::line_stream& in, conv_detail::line_stream& out) {
      vec<float> acc[R][nv];
      accumulate(acc, ring, wo0, b, in, out);
      store(acc, y + wo0 * Cout + n0, Cout, n0, std::min(nr, Cout - n0));
    }
  };

  template <class Store>
  using tile_run = void (*)(const float* const (&)[Kh], std::size_t, const float*, float*, std::size_t, const Store&,
                            conv_detail::line_stream&, conv_detail::line_stream&);
  template <class Store, std::size_t... R>
  static constexpr auto make_tiles(std::index_sequence<R...>) {
    return std::array<tile_run<Store>, sizeof...(R)>{&tile_fn<R + 1>::template run<Store>...};
  }
  /// The tile heights output rows use: Wo cut into tiles of at most mr pixels, nearly equal.
  static constexpr std::size_t row_tile_count = (Wo + mr - 1) / mr;
  static constexpr std::size_t row_tile_begin(std::size_t t) { return Wo * t / row_tile_count; }

  /// Output rows [first, last) of the flattened [batch, Ho] rows.
  template <class Rows, class Out, class Store>
  static void run_rows(const float* packed, const Rows& rows, const Out& out, const Store& store, std::size_t first,
                       std::size_t last) {
    if (first == last) return;
    static constexpr auto tiles = make_tiles<Store>(std::make_index_sequence<mr>{});
    thread_local growing_buffer<float> out_space;
    float* staged = Out::staged ? out_space.get(Wo * Cout) : nullptr;
    conv_detail::row_ring<Cin, H, W, Kh, S, P, D> inputs;

    for (std::size_t q = first; q < last; ++q) {
      const std::size_t n = q / Ho, ho = q % Ho;
      const float* ring[Kh];
      for (std::size_t kh = 0; kh < Kh; ++kh) ring[kh] = inputs.row(rows, n, ho, kh);
      // The next output row's new input rows, and its output, on their way while this one runs.
      conv_detail::line_stream in_next, out_next;
      if (q + 1 < last) {
        in_next = inputs.missing_lines(rows, (q + 1) / Ho, (q + 1) % Ho);
        out_next = out.lines((q + 1) / Ho, (q + 1) % Ho);
      }
      float* y = out.row(n, ho, staged);
      for (std::size_t p = 0; p < panels; ++p)
        for (std::size_t t = 0; t < row_tile_count; ++t) {
          const std::size_t wo0 = row_tile_begin(t), height = row_tile_begin(t + 1) - wo0;
          tiles[height - 1](ring, wo0, packed + p * panel_floats, y, p * nr, store, in_next, out_next);
        }
      out.finish(n, ho, y);
    }
  }
};

}  // namespace solder::eval::cpu
