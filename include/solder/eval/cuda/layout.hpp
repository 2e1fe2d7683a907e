// eval/cuda/layout.hpp: an image batch between the layouts of the CUDA conv path: channels-last
// [batch, H, W, C] (NHWC, the output of a convolution's product over im2col_operand, and the
// layout its backward takes the gradient in) and [batch, C, H, W] (NCHW, the layout of batch
// norm, pooling and flatten), and the per-channel sums of such a batch (a convolution's bias
// gradient) in a fixed order. Host+device bodies without CUDA headers: the host suite runs them
// over every index and tile (an emulated warp per channel); eval/cuda/layout_kernels.hpp
// launches them. The index maps are ops/conv2d.hpp's executor bodies, which these bodies
// hand each element or channel to.
//
// Use (C, H, W static; batch at run time; x and y never the same array):
//   nhwc_to_nchw_body<C, H, W>{x, y, batch}        y[n, c, h, w] = x[n, h, w, c]
//   nhwc_to_nchw_body<C, H, W>{x, y, batch, b}     y[n, c, h, w] = x[n, h, w, c] + b[c]
//   nchw_to_nhwc_body<C, H, W>{x, y, batch}        y[n, h, w, c] = x[n, c, h, w]
//   channel_sums_body<C, H, W, ChannelsLast>{g, sums, batch}   sums[c] = sum of g over n, h, w
// A reorder body is a thread per element of y (`elements()` of them, body(i) for each), or the
// same reorder as 32 x 32 tiles through shared memory (`tiles()`, a batched_transpose: the
// launcher takes it where both sides are at least 8 wide); the sums are a warp per channel
// (body(c, team) for c in [0, C)).
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/ops/conv2d.hpp"
#include "solder/shape.hpp"

namespace solder::eval::cuda {

/// The tiles of a batched transpose: 32 x 32 elements for a block of 32 x 8 threads, staged in
/// shared memory with rows of 33 floats so that a column's reads fall in distinct banks.
inline constexpr unsigned transpose_tile = 32, transpose_tile_rows = 8;
using transpose_tile_buffer = float[transpose_tile][transpose_tile + 1];

/// y [batch, S, R] = x [batch, R, S] (+ bias[s] when bias is set), a block per 32 x 32 tile: the
/// threads read a tile along s (coalesced), then write it along r (coalesced). The reorder
/// bodies below hand out their transpose (`tiles()`); the host runs the same two phases.
template <std::size_t R, std::size_t S>
struct batched_transpose {
  static constexpr std::size_t row_tiles = (R + transpose_tile - 1) / transpose_tile,
                               col_tiles = (S + transpose_tile - 1) / transpose_tile, tiles_per_sample = row_tiles * col_tiles;
  /// Whether tiles pay: a 32-byte sector holds 8 floats, so with R or S below 8 the strided
  /// side of a thread per element already shares sectors within a warp, and most of a tile's
  /// threads would be idle.
  static constexpr bool tiled = R >= 8 && S >= 8;
  const float* x;
  float* y;
  std::size_t batch;
  const float* bias = nullptr;

  SOLDER_HD std::size_t blocks() const { return batch * tiles_per_sample; }

  /// Phase 1 of block b, thread (tx, ty): tile[i][tx] = x[n, r0 + i, s0 + tx], i = ty, ty + 8, ...
  SOLDER_HD SOLDER_INLINE void load(std::size_t b, unsigned tx, unsigned ty, transpose_tile_buffer& tile) const {
    const std::size_t t = b % tiles_per_sample, n = b / tiles_per_sample;
    const std::size_t r0 = t / col_tiles * transpose_tile, s = t % col_tiles * transpose_tile + tx;
    if (s >= S) return;
    for (unsigned i = ty; i < transpose_tile && r0 + i < R; i += transpose_tile_rows) tile[i][tx] = x[(n * R + r0 + i) * S + s];
  }
  /// Phase 2 (after a barrier): y[n, s0 + i, r0 + tx] = tile[tx][i] (+ bias[s0 + i]).
  SOLDER_HD SOLDER_INLINE void store(std::size_t b, unsigned tx, unsigned ty, const transpose_tile_buffer& tile) const {
    const std::size_t t = b % tiles_per_sample, n = b / tiles_per_sample;
    const std::size_t r = t / col_tiles * transpose_tile + tx, s0 = t % col_tiles * transpose_tile;
    if (r >= R) return;
    for (unsigned i = ty; i < transpose_tile && s0 + i < S; i += transpose_tile_rows) {
      const float v = tile[tx][i];
      y[(n * S + s0 + i) * R + r] = bias ? v + bias[s0 + i] : v;
    }
  }
};

/// y [batch, C, H, W] (NCHW) = x [batch, H, W, C] (NHWC), plus bias[c] when bias is given
/// (the conv's bias added on the way out of the product's layout). A thread per element of y
/// (writes coalesced, reads C floats apart) or tiles(). Copies bits exactly (NaN payloads
/// included) without a bias; x + bias[c] with one (NaN and Inf propagate as IEEE addition).
template <std::size_t C, std::size_t H, std::size_t W>
struct nhwc_to_nchw_body {
  static constexpr std::size_t channels = C, plane = H * W;
  const float* x;
  float* y;
  std::size_t batch;
  const float* bias = nullptr;

  SOLDER_HD std::size_t elements() const { return batch * C * plane; }
  /// y[i], i = (n C + c) HW + p, from x[(n HW + p) C + c].
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    const std::size_t p = i % plane, c = (i / plane) % C, n = i / (plane * C);
    ops::conv2d_nhwc_to_nchw<C, plane>{x, y, bias}(n, c, p);
  }
  /// The same reorder as a transpose of each sample's [HW, C] (the launcher's choice).
  SOLDER_HD batched_transpose<plane, C> tiles() const { return {x, y, batch, bias}; }
};

/// y [batch, H, W, C] (NHWC) = x [batch, C, H, W] (NCHW): a gradient coming back from the NCHW
/// layers put into the layout the convolution's backward products read (g [batch H W, C]). A
/// thread per element of y (writes coalesced, reads HW floats apart) or tiles(). Copies bits
/// exactly.
template <std::size_t C, std::size_t H, std::size_t W>
struct nchw_to_nhwc_body {
  static constexpr std::size_t channels = C, plane = H * W;
  const float* x;
  float* y;
  std::size_t batch;

  SOLDER_HD std::size_t elements() const { return batch * C * plane; }
  /// y[i], i = (n HW + p) C + c, from x[(n C + c) HW + p].
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    const std::size_t c = i % C, p = (i / C) % plane, n = i / (C * plane);
    ops::conv2d_nchw_to_nhwc<C, plane>{x, y}(n, p, c);
  }
  /// The same reorder as a transpose of each sample's [C, HW] (the launcher's choice).
  SOLDER_HD batched_transpose<C, plane> tiles() const { return {x, y, batch}; }
};

/// sums[c] = the sum of g[n, c, h, w] over n, h, w (a convolution's db from its output
/// gradient), g NHWC [batch H W, C] when ChannelsLast, else NCHW. A warp per channel walks the
/// channel's batch HW values in the order j = n HW + p (warp_row<dyn>: lane l takes j = l,
/// l + 32, ..., adds blocks of 16 terms in float, the blocks in double, and the lanes meet in
/// the butterfly), so the order is fixed by batch, H and W alone: every run gives the same
/// bits, the same bits from either layout, and the host's emulated warp gives them too. Each
/// float block errs by at most 15 u of its terms' magnitudes (u = 2^-24), the doubles add
/// nothing visible, and the float result rounds once more. NaN in a channel makes its sum
/// NaN; +Inf and -Inf together make NaN. A batch of 0 gives zeros. Overwrites sums.
template <std::size_t C, std::size_t H, std::size_t W, bool ChannelsLast>
struct channel_sums_body {
  static constexpr std::size_t channels = C, plane = H * W;
  const float* g;
  float* sums;
  std::size_t batch;

  /// The backend-free body: rows<dyn> over the channels, a row the channel's batch HW values.
  SOLDER_HD ops::conv2d_channel_sums<C, plane, ChannelsLast> channel_rows() const { return {g, sums, batch * plane}; }
  /// The channel's value at walk position j = n HW + p.
  SOLDER_HD SOLDER_INLINE float at(std::size_t c, std::size_t j) const { return channel_rows().at(c, j); }

  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t c, const Team& team) const {
    const auto body = channel_rows();
    body(make_warp_row<dyn>(body.n, team), c);
  }
};

}  // namespace solder::eval::cuda
