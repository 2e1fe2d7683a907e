// ops/conv2d.hpp: the geometry of a 2-D convolution (zero padding, stride, dilation) and its
// im2col / col2im index maps: which input element an entry (channel, kh, kw, ho, wo) of a
// sample's column matrix [C Kh Kw, Ho Wo], or of a batch's patch matrix [batch Ho Wo, C Kh Kw],
// reads (0 in the padding), and which entries read a given input element; and the executor
// bodies of a convolution run as products over the patches (nn/conv2d_product.hpp): the
// reorders between NCHW and the products' channels-last layout, the per-channel sums, the
// gather of dx. Backend-free SOLDER_HD code: every backend's packers, loops, verbs and kernels
// run the same bodies.
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/ops/rows.hpp"
#include "solder/simd.hpp"

namespace solder::ops {

/// The output extent along an axis of `in` elements for a kernel of `k` taps with stride s,
/// zero padding p on each side and dilation d: (in + 2p - d (k - 1) - 1) / s + 1, as torch's
/// Conv2d; 0 when the dilated kernel does not fit in the padded input.
SOLDER_HD constexpr std::size_t conv2d_output_size(std::size_t in, std::size_t k, std::size_t s, std::size_t p,
                                                   std::size_t d) {
  const std::size_t span = d * (k - 1) + 1;
  return in + 2 * p < span ? 0 : (in + 2 * p - span) / s + 1;
}

/// y = x: a convolution's activation when there is none.
struct conv2d_identity {
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    return x;
  }
};

/// Where the windows of a convolution of one [C, H, W] sample fall: a Kh x Kw kernel with
/// stride S, zero padding P and dilation D on each side gives [Ho, Wo] outputs. The per-element
/// bodies below are functions of their coordinates only, for host loops and device code alike.
template <std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P, std::size_t D>
struct conv2d_geometry {
  static constexpr std::size_t height = H;
  static constexpr std::size_t width = W;
  static constexpr std::size_t kernel_height = Kh;
  static constexpr std::size_t kernel_width = Kw;
  static constexpr std::size_t stride = S;
  static constexpr std::size_t padding = P;
  static constexpr std::size_t dilation = D;
  static constexpr std::size_t out_height = (H + 2 * P - D * (Kh - 1) - 1) / S + 1;
  static constexpr std::size_t out_width = (W + 2 * P - D * (Kw - 1) - 1) / S + 1;
  static constexpr std::size_t in_plane = H * W;
  static constexpr std::size_t out_plane = out_height * out_width;
  static constexpr std::size_t taps = Kh * Kw;

  /// The input row (column) that tap kh (kw) of output row ho (column wo) reads; past the
  /// padding on the left or top it wraps to a huge value, so one unsigned compare with H (W)
  /// tests both edges.
  SOLDER_HD static constexpr std::size_t in_row(std::size_t ho, std::size_t kh) { return ho * S + kh * D - P; }
  SOLDER_HD static constexpr std::size_t in_col(std::size_t wo, std::size_t kw) { return wo * S + kw * D - P; }

  /// col[(ci Kh + kh) Kw + kw][ho Wo + wo] = x[ci][in_row(ho, kh)][in_col(wo, kw)] for x
  /// [C, H, W], 0 in the padding: im2col's element.
  SOLDER_HD static float im2col_at(const float* x, std::size_t ci, std::size_t kh, std::size_t kw, std::size_t ho,
                                   std::size_t wo) {
    const std::size_t hi = in_row(ho, kh), wi = in_col(wo, kw);
    return hi < H && wi < W ? x[(ci * H + hi) * W + wi] : 0.0f;
  }

  /// Element (r, c) of a batch's patch matrix [batch Ho Wo, C Kh Kw]: row r = n Ho Wo + ho Wo
  /// + wo is output pixel (ho, wo) of sample n, column c = (ci Kh + kh) Kw + kw its tap (kh, kw)
  /// of channel ci (torch's order of a weight [Cout, C, Kh, Kw]); x [batch, C, H, W], or
  /// [batch, H, W, C] when ChannelsLast; 0 in the padding. Stored: the channels of a stored
  /// sample when the C are one group's (x at the group's first channel).
  template <std::size_t C, bool ChannelsLast = false, std::size_t Stored = C>
  SOLDER_HD static float patch_at(const float* x, std::size_t r, std::size_t c) {
    const std::size_t n = r / out_plane, p = r % out_plane;
    const std::size_t ci = c / taps, t = c % taps;
    const std::size_t hi = in_row(p / out_width, t / Kw), wi = in_col(p % out_width, t % Kw);
    if (!(hi < H && wi < W)) return 0.0f;
    return ChannelsLast ? x[((n * H + hi) * W + wi) * Stored + ci] : x[((n * Stored + ci) * H + hi) * W + wi];
  }

  /// The output columns [first, last) whose tap kw reads inside the input (first == last: none).
  // (Ternaries rather than std::min and std::max, which device code cannot call.)
  SOLDER_HD static constexpr std::size_t first_inside(std::size_t kw) {
    const std::size_t first = kw * D >= P ? 0 : (P - kw * D + S - 1) / S;
    return first < out_width ? first : out_width;
  }
  SOLDER_HD static constexpr std::size_t last_inside(std::size_t kw) {
    std::size_t last = W + P <= kw * D ? 0 : (W + P - kw * D + S - 1) / S;
    last = last < out_width ? last : out_width;
    return last > first_inside(kw) ? last : first_inside(kw);
  }

  /// out[wo] = im2col_at(x, 0, kh, kw, ho, wo) for every wo of output row ho, x one plane
  /// [H, W]: im2col's elements a row at a time, the padding's zeros split off so the inside
  /// is a plain (strided) copy.
  SOLDER_HD static void im2col_row(const float* x, std::size_t kh, std::size_t kw, std::size_t ho, float* out) {
    const std::size_t hi = in_row(ho, kh);
    const std::size_t first = hi < H ? first_inside(kw) : out_width, last = hi < H ? last_inside(kw) : out_width;
    for (std::size_t wo = 0; wo < first; ++wo) out[wo] = 0.0f;
    if (first < last) {
      const float* src = x + hi * W + in_col(first, kw);
      for (std::size_t j = 0; j < last - first; ++j) out[first + j] = src[j * S];
    }
    for (std::size_t wo = last; wo < out_width; ++wo) out[wo] = 0.0f;
  }

  /// out[wo - wo0] = im2col_at(x, 0, kh, kw, ho, wo) for wo in [wo0, wo1) of output row ho, x
  /// one plane [H, W]: part of im2col_row.
  SOLDER_HD static void im2col_row_part(const float* x, std::size_t kh, std::size_t kw, std::size_t ho, std::size_t wo0,
                                        std::size_t wo1, float* out) {
    const std::size_t hi = in_row(ho, kh);
    std::size_t first = hi < H ? first_inside(kw) : out_width, last = hi < H ? last_inside(kw) : out_width;
    first = first < wo0 ? wo0 : first > wo1 ? wo1 : first;
    last = last < first ? first : last > wo1 ? wo1 : last;
    for (std::size_t wo = wo0; wo < first; ++wo) out[wo - wo0] = 0.0f;
    if (first < last) {
      const float* src = x + hi * W + in_col(first, kw);
      float* dst = out + (first - wo0);
      for (std::size_t j = 0; j < last - first; ++j) dst[j] = src[j * S];
    }
    for (std::size_t wo = last; wo < wo1; ++wo) out[wo - wo0] = 0.0f;
  }

  /// out[n - n0] = im2col_at(x, 0, kh, kw, n / Wo, n % Wo) for the output positions n in
  /// [n0, n1) of one plane x [H, W]: a span of im2col's row (kh, kw), across output rows.
  SOLDER_HD static void im2col_span(const float* x, std::size_t kh, std::size_t kw, std::size_t n0, std::size_t n1,
                                    float* out) {
    for (std::size_t n = n0; n < n1;) {
      const std::size_t ho = n / out_width, wo0 = n % out_width;
      const std::size_t wo1 = n1 - n < out_width - wo0 ? wo0 + (n1 - n) : out_width;
      im2col_row_part(x, kh, kw, ho, wo0, wo1, out + (n - n0));
      n += wo1 - wo0;
    }
  }

  /// f(kh, kw, ho, wo) for every tap (kh, kw) of every window (ho, wo) that reads input element
  /// (hi, wi), kh then kw ascending: the inverse of im2col_at's index map.
  template <class F>
  SOLDER_HD static void for_each_reader(std::size_t hi, std::size_t wi, F&& f) {
    for (std::size_t kh = 0; kh < Kh; ++kh) {
      if (hi + P < kh * D) break;  // later taps start further down
      const std::size_t th = hi + P - kh * D;  // ho S
      if (th % S != 0 || th / S >= out_height) continue;
      for (std::size_t kw = 0; kw < Kw; ++kw) {
        if (wi + P < kw * D) break;
        const std::size_t tw = wi + P - kw * D;  // wo S
        if (tw % S != 0 || tw / S >= out_width) continue;
        f(kh, kw, th / S, tw / S);
      }
    }
  }

  /// dx[ci][hi][wi] = sum of dcol over the im2col entries that copied x[ci][hi][wi], dcol
  /// [C Kh Kw, Ho Wo]: col2im as a gather, each input element summed by itself in a fixed order.
  SOLDER_HD static float col2im_at(const float* dcol, std::size_t ci, std::size_t hi, std::size_t wi) {
    float acc = 0.0f;
    for_each_reader(hi, wi, [&](std::size_t kh, std::size_t kw, std::size_t ho, std::size_t wo) {
      acc += dcol[((ci * Kh + kh) * Kw + kw) * out_plane + ho * out_width + wo];
    });
    return acc;
  }

  /// dx[hi][wi] of one input plane of a depthwise layer: the sum over its `multiplier` output
  /// planes j (dy_j = dy + j Ho Wo, kernel w_j = w + j Kh Kw) of w_j[kh][kw] dy_j[ho][wo] over
  /// the windows that read (hi, wi).
  SOLDER_HD static float depthwise_dx_at(const float* dy, const float* w, std::size_t multiplier, std::size_t hi,
                                         std::size_t wi) {
    float acc = 0.0f;
    for (std::size_t j = 0; j < multiplier; ++j)
      for_each_reader(hi, wi, [&](std::size_t kh, std::size_t kw, std::size_t ho, std::size_t wo) {
        acc += w[j * taps + kh * Kw + kw] * dy[j * out_plane + ho * out_width + wo];
      });
    return acc;
  }
};

// ---- A convolution as products over a batch's patches: the passes around the products --------
// The product c = patches(x) W^T leaves the output channels-last, [batch Ho Wo, Cout]; its
// backward takes the output gradient in that layout. These bodies move images between the
// layouts, sum a gradient per channel and gather dx, each shaped for an executor verb
// (executor.hpp), so every backend runs the same index maps.

/// y [batch, C, HW] (NCHW) = op(x [batch, HW, C] (NHWC) + bias[c]), the add skipped where bias
/// is null: a convolution's output leaving the product's layout with its bias and activation (op
/// as a backend's convolution takes it: conv2d_identity or an activation of ops/activations.hpp). A
/// plane body of planes(batch, C, HW): body(n, c, p) writes y[(n C + c) HW + p], so y is
/// written in order. Without bias and op the bits are copied (NaN payloads included); with a
/// bias, x + bias[c] is IEEE addition.
/// Stored: the channels of a sample of y when the C are one group's (y and bias at the group's
/// first channel).
template <std::size_t C, std::size_t HW, class Op = conv2d_identity, std::size_t Stored = C>
struct conv2d_nhwc_to_nchw {
  const float* x;
  float* y;
  const float* bias = nullptr;
  Op op{};
  SOLDER_EXEC_CHECK_OFF
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t n, std::size_t c, std::size_t p) const {
    const float v = x[(n * HW + p) * C + c];
    y[(n * Stored + c) * HW + p] = op.forward(bias ? v + bias[c] : v);
  }
};

/// y [batch, HW, C] (NHWC) = x [batch, C, HW] (NCHW): an output gradient put into the layout
/// the backward products read. A plane body of planes(batch, HW, C): body(n, p, c) writes
/// y[(n HW + p) C + c]. Copies bits.
template <std::size_t C, std::size_t HW>
struct conv2d_nchw_to_nhwc {
  const float* x;
  float* y;
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t n, std::size_t p, std::size_t c) const {
    y[(n * HW + p) * C + c] = x[(n * C + c) * HW + p];
  }
};

/// sums[c] = the sum of g over the batch and the plane of channel c (a convolution's db), g
/// [batch HW, C] when ChannelsLast, else [batch, C, HW]. A row body of rows<dyn> over the C
/// channels: row c is the channel's n = batch HW values in the order j = sample HW + p whatever
/// the layout, added by the walker's sum (an order fixed by n), so both layouts give the same
/// bits on a backend. A walker step of several lanes gathers them (they lie HW or C apart). NaN
/// in a channel makes its sum NaN; n = 0 gives zeros. Overwrites sums.
template <std::size_t C, std::size_t HW, bool ChannelsLast>
struct conv2d_channel_sums {
  const float* g;
  float* sums;
  std::size_t n;  // values per channel: batch HW (the row length rows<dyn> reads)

  /// Channel c's value at walk position j.
  SOLDER_HD SOLDER_INLINE float at(std::size_t c, std::size_t j) const {
    if constexpr (ChannelsLast)
      return g[j * C + c];
    else
      return g[((j / HW) * C + c) * HW + j % HW];
  }
  /// The step's values of channel c as V (lanes past the row's end hold 0).
  SOLDER_EXEC_CHECK_OFF
  template <class V, class Step>
  SOLDER_HD SOLDER_INLINE V step_values(std::size_t c, const Step& step) const {
    constexpr std::size_t lanes = simd::lanes<V>;
    if constexpr (lanes == 1) {
      return V(at(c, step.j));
    } else {
      const std::size_t valid = n_or(step, lanes);
      // NCHW, a whole step inside one sample's run: its values are consecutive.
      if (!ChannelsLast && valid == lanes && step.j % HW + lanes <= HW)
        return simd::load<V>(g + ((step.j / HW) * C + c) * HW + step.j % HW);
      float lane[lanes];
      for (std::size_t k = 0; k < lanes; ++k) lane[k] = k < valid ? at(c, step.j + k) : 0.0f;
      return simd::load<V>(lane);
    }
  }
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t c) const {
    const double s = walker.sum([&](auto step) SOLDER_INLINE_LAMBDA {
      return step_values<typename R::value>(c, step);
    });
    walker.once([&]() SOLDER_INLINE_LAMBDA { sums[c] = n ? float(s) : 0.0f; });
  }
};

/// dx [batch, C, H, W] (NCHW) from dcol [batch Ho Wo, C Kh Kw] (a row per output pixel, its
/// columns in the patches' order): dx at an input element is the sum of the dcol entries of the
/// windows that read it, taps kh then kw ascending (G::for_each_reader): col2im as a gather,
/// without atomics, so every run gives the same bits. A plane body of planes(batch C, H, W):
/// body(q, hi, wi) writes dx[(q H + hi) W + wi], q = sample C + channel. G: the geometry.
/// Stored: the channels of a sample of dx when the C are one group's (dx at the group's first
/// channel): plane q is then channel q % C of sample q / C.
template <class G, std::size_t C, std::size_t Stored = C>
struct conv2d_col2im {
  static constexpr std::size_t columns = C * G::taps;
  const float* dcol;
  float* dx;
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t q, std::size_t hi, std::size_t wi) const {
    const float* rows = dcol + (q / C) * G::out_plane * columns + (q % C) * G::taps;
    float sum = 0.0f;
    G::for_each_reader(hi, wi, [&](std::size_t kh, std::size_t kw, std::size_t ho, std::size_t wo) {
      sum += rows[(ho * G::out_width + wo) * columns + kh * G::kernel_width + kw];
    });
    dx[(((q / C) * Stored + q % C) * G::height + hi) * G::width + wi] = sum;
  }
};

/// What a convolution layer is, as its backends see it: torch's Conv2d(Cin, Cout, (Kh, Kw),
/// stride S, padding P, dilation D, groups G, bias B) over [Cin, H, W] samples, weights
/// [Cout, Cin/G, Kh, Kw]. geometry<H, W> is where its windows fall on an H x W image.
template <std::size_t Cin, std::size_t Cout, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P, std::size_t D,
          std::size_t G, bool B>
struct conv2d_spec {
  static constexpr std::size_t in_channels = Cin;
  static constexpr std::size_t out_channels = Cout;
  static constexpr std::size_t kernel_height = Kh;
  static constexpr std::size_t kernel_width = Kw;
  static constexpr std::size_t stride = S;
  static constexpr std::size_t padding = P;
  static constexpr std::size_t dilation = D;
  static constexpr std::size_t groups = G;
  static constexpr bool has_bias = B;
  static constexpr std::size_t group_in = Cin / G;    // input channels per group
  static constexpr std::size_t group_out = Cout / G;  // output channels per group
  /// Inputs of one output element: the K of each group's product (rows of its column matrix).
  static constexpr std::size_t fan_in = group_in * Kh * Kw;
  /// One input channel per group (torch's depthwise layers).
  static constexpr bool depthwise = G == Cin && G > 1;
  template <std::size_t H, std::size_t W>
  using geometry = conv2d_geometry<H, W, Kh, Kw, S, P, D>;
};

}  // namespace solder::ops
