// ops/pool.hpp: the math of 2-d pooling over NCHW [batch, C, H, W] images with torch's
// semantics (max_pool2d, avg_pool2d, adaptive_avg_pool2d): which input elements a window
// covers and how padding counts, and the per-element bodies, forward per output element and
// backward per input element (a gather over the windows that hold it, so no two elements write
// one place). Host+device code: the CPU layers (nn/pool.hpp) and the CUDA kernels run the same
// bodies over their own loops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::ops::pool2d {

using index = std::ptrdiff_t;

/// The extents one pooling body reads: samples [C, H, W] in, [C, Ho, Wo] out, and the square
/// window (kernel, stride, pad) of max and avg pooling (unused by adaptive pooling).
struct geometry {
  index channels, h, w;
  index ho, wo;
  index kernel = 1, stride = 1, pad = 0;

  SOLDER_HD SOLDER_INLINE index in_offset(index n, index c) const { return (n * channels + c) * h * w; }
  SOLDER_HD SOLDER_INLINE index out_offset(index n, index c) const { return (n * channels + c) * ho * wo; }
};

SOLDER_HD SOLDER_INLINE index min(index a, index b) { return a < b ? a : b; }
SOLDER_HD SOLDER_INLINE index max(index a, index b) { return a < b ? b : a; }

/// A half-open range [begin, end) of rows or columns.
struct interval {
  index begin, end;
};

/// Output extent of a strided window over n inputs: floor((n + 2P - K) / S) + 1, torch's
/// ceil_mode=False; 0 when the padded input is shorter than the window.
constexpr std::size_t out_extent(std::size_t n, std::size_t k, std::size_t s, std::size_t p) {
  return n + 2 * p >= k ? (n + 2 * p - k) / s + 1 : 0;
}

/// The input rows (or columns) of window o of a strided window, clipped to the input [0, n):
/// the padding adds none (max: it is -inf; avg: it adds 0).
SOLDER_HD SOLDER_INLINE interval window(index o, index n, const geometry& g) {
  const index first = o * g.stride - g.pad;
  return {max(first, 0), min(first + g.kernel, n)};
}

/// The windows o in [0, n_out) whose range holds input row (or column) i: o S - P <= i and
/// i <= o S - P + K - 1.
SOLDER_HD SOLDER_INLINE interval windows_over(index i, index n_out, const geometry& g) {
  const index past = i + g.pad - g.kernel + 1;  // o S >= past
  return {past <= 0 ? 0 : (past + g.stride - 1) / g.stride, min((i + g.pad) / g.stride + 1, n_out)};
}

/// avg_pool2d's divisor for output (oh, ow), as torch: the window clipped to the padded input
/// [-P, H + P) when CountIncludePad (the pad counts, what lies beyond it does not), else to the
/// input itself.
SOLDER_HD SOLDER_INLINE index avg_divisor(index oh, index ow, const geometry& g, bool count_include_pad) {
  if (!count_include_pad) {
    const interval r = window(oh, g.h, g), q = window(ow, g.w, g);
    return (r.end - r.begin) * (q.end - q.begin);
  }
  const index h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
  return (min(h0 + g.kernel, g.h + g.pad) - h0) * (min(w0 + g.kernel, g.w + g.pad) - w0);
}

/// Adaptive window o of n_out over n inputs, as torch: [floor(o n / n_out), ceil((o + 1) n / n_out)).
/// The same formula with n and n_out swapped gives the windows that hold input i.
SOLDER_HD SOLDER_INLINE interval adaptive_window(index o, index n_out, index n) {
  return {(o * n) / n_out, ((o + 1) * n + n_out - 1) / n_out};
}

/// y[n, c, oh, ow] = the max of x over the window, and argmax[n, c, oh, ow] = its index
/// ih * W + iw in the plane. As torch's CPU kernel: the first maximal element in row-major
/// window order wins a tie; a NaN wins over any number and the last NaN of the window is kept,
/// so a NaN anywhere in the window makes y NaN. A window of -inf only points at its first
/// element (torch starts from -inf there).
SOLDER_HD SOLDER_INLINE void max_forward_at(const float* x, float* y, std::int32_t* argmax, const geometry& g, index n,
                                            index c, index oh, index ow) {
  const float* xp = x + g.in_offset(n, c);
  const interval r = window(oh, g.h, g), q = window(ow, g.w, g);
  float best = -std::numeric_limits<float>::infinity();
  index at = r.begin * g.w + q.begin;
  for (index ih = r.begin; ih < r.end; ++ih)
    for (index iw = q.begin; iw < q.end; ++iw) {
      const float v = xp[ih * g.w + iw];
      if (v > best || simd::isnan(v)) {
        best = v;
        at = ih * g.w + iw;
      }
    }
  const index o = g.out_offset(n, c) + oh * g.wo + ow;
  y[o] = best;
  argmax[o] = std::int32_t(at);
}

/// dx[n, c, ih, iw] = the sum of dy over the windows whose argmax is (ih, iw), added in
/// row-major output order (the order of torch's scatter, so the same float sum).
SOLDER_HD SOLDER_INLINE void max_backward_at(const float* dy, const std::int32_t* argmax, float* dx, const geometry& g,
                                             index n, index c, index ih, index iw) {
  const index base = g.out_offset(n, c), self = ih * g.w + iw;
  const interval r = windows_over(ih, g.ho, g), q = windows_over(iw, g.wo, g);
  float sum = 0;
  for (index oh = r.begin; oh < r.end; ++oh)
    for (index ow = q.begin; ow < q.end; ++ow) {
      const index o = base + oh * g.wo + ow;
      if (argmax[o] == self) sum += dy[o];
    }
  dx[g.in_offset(n, c) + self] = sum;
}

/// y[n, c, oh, ow] = (sum of x over the window) / avg_divisor, summed in float in row-major
/// window order as torch's CPU kernel.
SOLDER_HD SOLDER_INLINE void avg_forward_at(const float* x, float* y, const geometry& g, bool count_include_pad,
                                            index n, index c, index oh, index ow) {
  const float* xp = x + g.in_offset(n, c);
  const interval r = window(oh, g.h, g), q = window(ow, g.w, g);
  float sum = 0;
  for (index ih = r.begin; ih < r.end; ++ih)
    for (index iw = q.begin; iw < q.end; ++iw) sum += xp[ih * g.w + iw];
  y[g.out_offset(n, c) + oh * g.wo + ow] = sum / float(avg_divisor(oh, ow, g, count_include_pad));
}

/// dx[n, c, ih, iw] = the sum of dy / avg_divisor over the windows that hold (ih, iw), in
/// row-major output order.
SOLDER_HD SOLDER_INLINE void avg_backward_at(const float* dy, float* dx, const geometry& g, bool count_include_pad,
                                             index n, index c, index ih, index iw) {
  const float* dyp = dy + g.out_offset(n, c);
  const interval r = windows_over(ih, g.ho, g), q = windows_over(iw, g.wo, g);
  float sum = 0;
  for (index oh = r.begin; oh < r.end; ++oh)
    for (index ow = q.begin; ow < q.end; ++ow)
      sum += dyp[oh * g.wo + ow] / float(avg_divisor(oh, ow, g, count_include_pad));
  dx[g.in_offset(n, c) + ih * g.w + iw] = sum;
}

/// y[n, c, oh, ow] = (sum of x over the adaptive window) / kh / kw: float sum in row-major
/// order and two divisions, as torch's CPU kernel.
SOLDER_HD SOLDER_INLINE void adaptive_avg_forward_at(const float* x, float* y, const geometry& g, index n, index c,
                                                     index oh, index ow) {
  const float* xp = x + g.in_offset(n, c);
  const interval r = adaptive_window(oh, g.ho, g.h), q = adaptive_window(ow, g.wo, g.w);
  float sum = 0;
  for (index ih = r.begin; ih < r.end; ++ih)
    for (index iw = q.begin; iw < q.end; ++iw) sum += xp[ih * g.w + iw];
  y[g.out_offset(n, c) + oh * g.wo + ow] = sum / float(r.end - r.begin) / float(q.end - q.begin);
}

/// dx[n, c, ih, iw] = the sum of dy / kh / kw over the adaptive windows that hold (ih, iw), in
/// row-major output order.
SOLDER_HD SOLDER_INLINE void adaptive_avg_backward_at(const float* dy, float* dx, const geometry& g, index n, index c,
                                                      index ih, index iw) {
  const float* dyp = dy + g.out_offset(n, c);
  const interval r = adaptive_window(ih, g.h, g.ho), q = adaptive_window(iw, g.w, g.wo);
  float sum = 0;
  for (index oh = r.begin; oh < r.end; ++oh) {
    const interval wr = adaptive_window(oh, g.ho, g.h);
    for (index ow = q.begin; ow < q.end; ++ow) {
      const interval wq = adaptive_window(ow, g.wo, g.w);
      sum += dyp[oh * g.wo + ow] / float(wr.end - wr.begin) / float(wq.end - wq.begin);
    }
  }
  dx[g.in_offset(n, c) + ih * g.w + iw] = sum;
}

enum class pool_kind { max, avg, adaptive_avg };

/// Pooling forward as a body of the executor's planes verb: body(p, oh, ow) for output (oh, ow)
/// of plane p = n C + c (max: its argmax too).
template <pool_kind Kind>
struct forward_planes {
  const float* x;
  float* y;
  std::int32_t* argmax;  // max only
  geometry g;
  bool count_include_pad;  // avg only
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t p, std::size_t i, std::size_t j) const {
    const index n = index(p) / g.channels, c = index(p) % g.channels, oh = index(i), ow = index(j);
    if constexpr (Kind == pool_kind::max)
      max_forward_at(x, y, argmax, g, n, c, oh, ow);
    else if constexpr (Kind == pool_kind::avg)
      avg_forward_at(x, y, g, count_include_pad, n, c, oh, ow);
    else
      adaptive_avg_forward_at(x, y, g, n, c, oh, ow);
  }
};

/// Pooling backward as a body of the planes verb: body(p, ih, iw) gathers dx at input (ih, iw)
/// of plane p from the windows that hold it, in row-major output order.
template <pool_kind Kind>
struct backward_planes {
  const float* dy;
  const std::int32_t* argmax;  // max only
  float* dx;
  geometry g;
  bool count_include_pad;  // avg only
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t p, std::size_t i, std::size_t j) const {
    const index n = index(p) / g.channels, c = index(p) % g.channels, ih = index(i), iw = index(j);
    if constexpr (Kind == pool_kind::max)
      max_backward_at(dy, argmax, dx, g, n, c, ih, iw);
    else if constexpr (Kind == pool_kind::avg)
      avg_backward_at(dy, dx, g, count_include_pad, n, c, ih, iw);
    else
      adaptive_avg_backward_at(dy, dx, g, n, c, ih, iw);
  }
};

}  // namespace solder::ops::pool2d
