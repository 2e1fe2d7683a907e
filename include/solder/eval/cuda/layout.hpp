// eval/cuda/layout.hpp: an image batch between the layouts of the CUDA conv path: channels-last
// [batch, H, W, C] (NHWC, the output of a convolution's product over im2col_operand, and the
// layout its backward takes the gradient in) and [batch, C, H, W] (NCHW, the layout of batch
// norm, pooling and flatten), and the per-channel sums of such a batch (a convolution's bias
// gradient) in a fixed order. Host+device bodies without CUDA headers: the host suite runs them
// over every index (an emulated warp per channel); eval/cuda/layout_kernels.hpp launches them.
//
// Use (C, H, W static; batch at run time; x and y never the same array):
//   nhwc_to_nchw_body<C, H, W>{x, y, batch}        y[n, c, h, w] = x[n, h, w, c]
//   nhwc_to_nchw_body<C, H, W>{x, y, batch, b}     y[n, c, h, w] = x[n, h, w, c] + b[c]
//   nchw_to_nhwc_body<C, H, W>{x, y, batch}        y[n, h, w, c] = x[n, c, h, w]
//   channel_sums_body<C, H, W, ChannelsLast>{g, sums, batch}   sums[c] = sum of g over n, h, w
// A reorder body is a thread per element of y (`elements()` of them, body(i) for each); the
// sums are a warp per channel (body(c, team) for c in [0, C)).
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/shape.hpp"

namespace solder::eval::cuda {

/// y [batch, C, H, W] (NCHW) = x [batch, H, W, C] (NHWC), plus bias[c] when bias is given
/// (the conv's bias added on the way out of the product's layout). A thread per element of y:
/// the writes are coalesced, the reads C floats apart. Copies bits exactly (NaN payloads
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
    const float v = x[(n * plane + p) * C + c];
    y[i] = bias ? v + bias[c] : v;
  }
};

/// y [batch, H, W, C] (NHWC) = x [batch, C, H, W] (NCHW): a gradient coming back from the NCHW
/// layers put into the layout the convolution's backward products read (g [batch H W, C]). A
/// thread per element of y: coalesced writes, reads HW floats apart. Copies bits exactly.
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
    y[i] = x[(n * C + c) * plane + p];
  }
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

  /// The channel's value at walk position j = n HW + p.
  SOLDER_HD SOLDER_INLINE float at(std::size_t c, std::size_t j) const {
    if constexpr (ChannelsLast)
      return g[j * C + c];
    else
      return g[((j / plane) * C + c) * plane + j % plane];
  }

  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t c, const Team& team) const {
    const std::size_t count = batch * plane;
    const auto walk = make_warp_row<dyn>(count, team);
    const double s = walk.sum([&](warp_step step) SOLDER_INLINE_LAMBDA { return at(c, step.j); });
    walk.once([&]() SOLDER_INLINE_LAMBDA { sums[c] = count ? float(s) : 0.0f; });
  }
};

}  // namespace solder::eval::cuda
