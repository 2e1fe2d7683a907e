// ops/conv2d.hpp: the geometry of a 2-D convolution (zero padding, stride, dilation) and its
// im2col / col2im index maps: which input element an entry (channel, kh, kw, ho, wo) of a
// sample's column matrix [C Kh Kw, Ho Wo] reads (0 in the padding), and which entries read a
// given input element. Backend-free SOLDER_HD code: the CPU's packers and loops and the CUDA
// kernels run the same bodies.
#pragma once

#include <cstddef>

#include "solder/config.hpp"

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
/// bodies below are functions of their coordinates only, for the CPU loops and device code alike.
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
