// eval/cpu/conv_weight_grad.hpp: a convolution's weight gradient (one group) on the GEMM
// micro-kernel's register tiles, from the same staged channels-last rows as the forward
// (conv_nhwc.hpp), so no im2col columns are stored:
//   dW[co][ci][kh][kw] = sum over output rows (n, ho) and pixels wo of
//                        x[n][ci][ho S + kh D - P][wo S + kw D - P] dy[n][co][ho][wo].
// Per output row and tap, a tile of R input channels x NV vectors of output channels sums the
// row's Wo pixels in registers: its A operand is the staged input row read in place (R
// consecutive channels of one pixel, then the next pixel S Cin floats on), its B operand the
// staged dy row (one pixel's output channels per step). The tiles add into a partial dW of
// their run of output rows, [tap][ci][co] with co padded to whole panels.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/conv_nhwc.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/eval/cpu/gemm_kernel.hpp"
#include "solder/memory.hpp"

namespace solder::eval::cpu {

/// The share of a weight-gradient tile's lanes that do work for Cin input and Cout output
/// channels (the rest are rows past Cin or panel columns past Cout). Below about 0.2 the GEMM
/// over stored columns is faster (docs/convolution.md, "How a convolution runs").
constexpr double conv_weight_grad_fill(std::size_t cin, std::size_t cout) {
  constexpr std::size_t mr = gemm_tile<arch>::mr, nr = gemm_tile<arch>::nv * float_lanes;
  const std::size_t rows = cin < mr ? cin : mr, panels = (cout + nr - 1) / nr;
  return double(rows) / double(mr) * double(cout) / double(panels * nr);
}

/// The weight gradient of conv_nhwc's convolution (same template arguments): Cin channels of
/// [H, W] images to Cout channels, Kh x Kw taps, stride S, zero padding P, dilation D.
template <std::size_t Cin, std::size_t Cout, std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw,
          std::size_t S, std::size_t P, std::size_t D>
struct conv_weight_grad {
  using tile = gemm_tile<arch>;
  static constexpr std::size_t lanes = float_lanes;
  static constexpr std::size_t mr = tile::mr;
  static constexpr std::size_t nv = tile::nv;
  static constexpr std::size_t nr = nv * lanes;  // output channels of a panel
  static constexpr std::size_t panels = (Cout + nr - 1) / nr;
  /// A staged dy row's pitch: Cout rounded up to whole panels (the padding stays 0), so every
  /// B load is aligned and reads no other pixel.
  static constexpr std::size_t cout_pitch = panels * nr;
  static constexpr std::size_t Ho = (H + 2 * P - D * (Kh - 1) - 1) / S + 1;
  static constexpr std::size_t Wo = (W + 2 * P - D * (Kw - 1) - 1) / S + 1;
  static constexpr std::size_t taps = Kh * Kw;
  /// A run's partial dW: [tap][ci][co], cout_pitch floats per (tap, ci).
  static constexpr std::size_t partial_floats = taps * Cin * cout_pitch;
  /// Multiply-adds per output row (the work a run's partial sum is set against).
  static constexpr double row_fmas = double(taps) * Cin * Cout * Wo;

  /// part = the sum over output rows [first, last) of the flattened [batch, Ho] rows, rows.load
  /// staging x's rows (conv_nhwc's nchw_rows / nhwc_rows), dy [batch, Cout, Ho, Wo] (NCHW).
  /// part holds partial_floats, 64-byte aligned; what it held is overwritten.
  template <class Rows>
  static void run_rows(const Rows& rows, const float* dy, float* part, std::size_t first, std::size_t last) {
    static constexpr auto tiles = make_tiles(std::make_index_sequence<mr>{});
    std::fill_n(part, partial_floats, 0.0f);
    if (first == last) return;
    thread_local growing_buffer<float> dy_space;
    float* dy_row = dy_space.get(Wo * cout_pitch);
    std::fill_n(dy_row, Wo * cout_pitch, 0.0f);  // the panels' padding stays 0
    conv_detail::row_ring<Cin, H, W, Kh, S, P, D> inputs;
    const conv_detail::nchw_rows<Cout, Ho, Wo> dy_rows{dy};
    for (std::size_t q = first; q < last; ++q) {
      const std::size_t n = q / Ho, ho = q % Ho;
      // dy_row[wo][co] = dy[n][co][ho][wo].
      conv_detail::transpose(dy + (n * Cout * Ho + ho) * Wo, Ho * Wo, dy_row, cout_pitch, Cout, Wo);
      // The next output row's new input rows and its dy row, on their way into L2 while this
      // one runs, one line per step of the tiles (as conv_nhwc's).
      conv_detail::line_stream in_next, dy_next;
      if (q + 1 < last) {
        in_next = inputs.missing_lines(rows, (q + 1) / Ho, (q + 1) % Ho);
        dy_next = dy_rows.lines((q + 1) / Ho, (q + 1) % Ho, (q + 1) % Ho);
      }
      for (std::size_t kh = 0; kh < Kh; ++kh) {
        const float* staged = inputs.row(rows, n, ho, kh);
        if (staged == nullptr) continue;  // a tap row in the padding adds nothing
        for (std::size_t kw = 0; kw < Kw; ++kw) {
          const float* a = staged + kw * D * Cin;
          float* dw_tap = part + (kh * Kw + kw) * Cin * cout_pitch;
          for (std::size_t p = 0; p < panels; ++p)
            for (std::size_t b = 0; b < ci_blocks; ++b) {
              const std::size_t c0 = ci_begin(b), height = ci_begin(b + 1) - c0;
              tiles[height - 1](a + c0, dy_row + p * nr, dw_tap + c0 * cout_pitch + p * nr, in_next, dy_next);
            }
        }
      }
    }
  }

  /// dw[co][ci][kh][kw] (torch's layout) = the sum of the runs' partial sums, in run order, in
  /// double, for the partial sums' entries [a0, a1) (a block of their own layout, read in
  /// order: walking dw's layout instead strides across every run's partial sum).
  static void combine(const float* parts, std::size_t runs, float* dw, std::size_t a0, std::size_t a1) {
    constexpr std::size_t block = 512;
    double acc[block];
    for (std::size_t b0 = a0; b0 < a1; b0 += block) {
      const std::size_t n = std::min(block, a1 - b0);
      std::fill_n(acc, n, 0.0);
      for (std::size_t r = 0; r < runs; ++r) {
        const float* p = parts + r * partial_floats + b0;
        for (std::size_t j = 0; j < n; ++j) acc[j] += double(p[j]);
      }
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t at = b0 + j, co = at % cout_pitch, ci = at / cout_pitch % Cin, t = at / (cout_pitch * Cin);
        if (co < Cout) dw[(co * Cin + ci) * taps + t] = float(acc[j]);
      }
    }
  }

 private:
  /// Cin cut into blocks of at most mr channels, nearly equal.
  static constexpr std::size_t ci_blocks = (Cin + mr - 1) / mr;
  static constexpr std::size_t ci_begin(std::size_t b) { return Cin * b / ci_blocks; }

  /// dw[r][co] += sum over wo of a[wo S Cin + r] b[wo cout_pitch + co] for the tile's R input
  /// channels and nr output channels; rows of dw cout_pitch floats apart.
  template <std::size_t R>
  static void tile_run(const float* a, const float* b, float* dw, conv_detail::line_stream& in,
                       conv_detail::line_stream& dy_lines) {
    using V = vec<float>;
    V acc[R][nv];
#pragma GCC unroll 16
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < nv; ++v) acc[r][v] = V::load_aligned(dw + r * cout_pitch + v * lanes);
#pragma GCC unroll 4
    for (std::size_t wo = 0; wo < Wo; ++wo) {
      if (wo % 2 == 0)
        in.step<false>();
      else
        dy_lines.step<false>();
      gemm_detail::fma_step<R, nv, 1>(acc, a + wo * S * Cin, b + wo * cout_pitch);
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < nv; ++v) acc[r][v].store_aligned(dw + r * cout_pitch + v * lanes);
  }
  using tile_fn = void (*)(const float*, const float*, float*, conv_detail::line_stream&, conv_detail::line_stream&);
  template <std::size_t... R>
  static constexpr auto make_tiles(std::index_sequence<R...>) {
    return std::array<tile_fn, sizeof...(R)>{&tile_run<R + 1>...};
  }
};

}  // namespace solder::eval::cpu
