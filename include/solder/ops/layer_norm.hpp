// ops/layer_norm.hpp: layer normalization of a row (torch's nn.LayerNorm over the last axis):
// its statistics, forward and backward, written once over a row walker (the interface is
// described in ops/softmax.hpp and docs/ops.md, "Row ops").
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/ops/rows.hpp"
#include "solder/simd.hpp"

// xsimd's exp and log1p inline AVX-512 intrinsics into these bodies on the CPU (see config.hpp).
SOLDER_INTRINSIC_WARNINGS_OFF

namespace solder::ops {

/// A row's mean and 1 / sqrt(Var + eps), kept by forward for backward.
template <class T>
struct layer_norm_stats {
  T mean;
  T rstd;
};

/// y = (x - mean) rstd w + b along a row of n, rstd = 1 / sqrt(Var + eps), Var the biased
/// variance (/ n), as torch. Backward, with g = dy w and xhat = (x - mean) rstd:
///   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw += dy xhat,  db += dy.
/// A NaN or infinity in a row makes its mean, and so its whole y, NaN.
struct layer_norm {
  static constexpr const char* name = "layer_norm";
  /// Per element: the mean (1), the shifted sums (3), normalize and affine (4).
  static constexpr int forward_flops = 8;
  /// Per element: the two sums (6), dx (6), dweight and dbias (3).
  static constexpr int backward_flops = 15;
  /// Backward reads the input x and the row's statistics.
  static constexpr bool output_backward = false;

  /// The row's mean and rstd by a corrected two-pass over the row (Chan, Golub and LeVeque
  /// 1983): pass 1 gives a mean m1; pass 2 sums d = x - m1 and d^2, so mean = m1 + sum d / n
  /// repairs m1's rounding, and the variance sums small squares that do not cancel, where
  /// E[x^2] - mean^2 loses everything once |mean| >> std.
  template <class R>
  SOLDER_HD SOLDER_INLINE layer_norm_stats<typename R::scalar> statistics(const R& r, const typename R::scalar* x,
                                                                          typename R::accum eps) const {
    using V = typename R::value;
    using T = typename R::scalar;
    using A = typename R::accum;
    const A n = A(r.size());
    const T m1 = T(r.sum([&](auto at) SOLDER_INLINE_LAMBDA { return r.load(at, x); }) / n);
    const V vm1(m1);
    const auto [s1, s2] = r.template sums<2>([&](auto at) SOLDER_INLINE_LAMBDA {
      const V d = r.load(at, x) - vm1;
      return typename R::template terms<2>{d, d * d};
    });
    const A shift = s1 / n;
    const A var = simd::max(s2 / n - shift * shift, A(0));  // NaN stays NaN
    return {T(A(m1) + shift), T(A(1) / simd::sqrt(var + eps))};
  }

  /// y = (x - mean) rstd w + b for one row; returns {mean, rstd}. y may be x.
  template <class R>
  SOLDER_HD SOLDER_INLINE layer_norm_stats<typename R::scalar> forward(const R& r, const typename R::scalar* x,
                                                                       typename R::scalar* y, const typename R::scalar* w,
                                                                       const typename R::scalar* b,
                                                                       typename R::accum eps) const {
    using V = typename R::value;
    const auto st = statistics(r, x, eps);
    const V vm(st.mean), vr(st.rstd);
    r.each([&](auto at) SOLDER_INLINE_LAMBDA {
      const V xhat = (r.load(at, x) - vm) * vr;
      r.store(at, y, simd::fma(xhat, r.load(at, w), r.load(at, b)));
    });
    return st;
  }

  /// dx for one row from its saved statistics, and its dy xhat and dy added to dw and db (the
  /// caller's partial sums over rows). dx may be dy.
  template <class R>
  SOLDER_HD SOLDER_INLINE void backward(const R& r, const typename R::scalar* x, const typename R::scalar* dy,
                                        const typename R::scalar* w, layer_norm_stats<typename R::scalar> st,
                                        typename R::scalar* dx, typename R::scalar* dw, typename R::scalar* db) const {
    using V = typename R::value;
    using T = typename R::scalar;
    using A = typename R::accum;
    const V vm(st.mean), vr(st.rstd);
    const auto [sg, sgx] = r.template sums<2>([&](auto at) SOLDER_INLINE_LAMBDA {
      const V xhat = (r.load(at, x) - vm) * vr;
      const V g = r.load(at, dy) * r.load(at, w);
      return typename R::template terms<2>{g, g * xhat};
    });
    const A n = A(r.size());
    const V mg(T(sg / n)), mgx(T(sgx / n));
    r.each([&](auto at) SOLDER_INLINE_LAMBDA {
      const V xhat = (r.load(at, x) - vm) * vr;
      const V d = r.load(at, dy);
      r.store(at, dx, (d * r.load(at, w) - simd::fma(xhat, mgx, mg)) * vr);
      r.store(at, dw, simd::fma(d, xhat, r.load(at, dw)));
      r.store(at, db, r.load(at, db) + d);
    });
  }
};

/// layer_norm forward on row r of x, y [rows, n], as a body of the executor's rows<N>: y, and
/// the row's mean and rstd at mean[r * stride] and rstd[r * stride].
template <std::size_t N>
struct layer_norm_forward_rows {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  float* mean;
  float* rstd;
  std::size_t stride;
  double eps;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t r) const {
    const auto st = layer_norm{}.forward(walker, x + r * n, y + r * n, w, b, eps);
    walker.once([&]() SOLDER_INLINE_LAMBDA {
      mean[r * stride] = st.mean;
      rstd[r * stride] = st.rstd;
    });
  }
};

/// layer_norm backward on chunk c of the rows (Chunks: the backend's chunking, fixed by the row
/// count), as a body of the executor's chunks<N>: dx of each row, and the chunk's dweight and
/// dbias terms summed in float, flushed to double every flush_rows rows, into total[c] =
/// [dweight (n), dbias (n)]; partial[c] (2 n floats) is scratch. Each step of the walker touches
/// only its own columns of both.
template <std::size_t N, class Chunks>
struct layer_norm_backward_chunks {
  /// Rows summed in float before a flush to double: 64 terms, about 64 u of relative error.
  static constexpr std::size_t flush_rows = 64;
  const float* x;
  const float* dy;
  const float* w;
  const float* mean;
  const float* rstd;
  std::size_t stride;
  float* dx;
  float* partial;
  double* total;
  Chunks chunks;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t c) const {
    float* p = partial + c * 2 * n;
    double* t = total + c * 2 * n;
    zero_columns(walker, p, t, n);
    const std::size_t begin = chunks.begin(c), end = chunks.end(c);
    for (std::size_t r = begin; r < end; ++r) {
      layer_norm{}.backward(walker, x + r * n, dy + r * n, w, {mean[r * stride], rstd[r * stride]}, dx + r * n, p, p + n);
      if ((r - begin + 1) % flush_rows == 0 || r + 1 == end) {
        flush_columns(walker, p, t, n);
      }
    }
  }
};

/// layer_norm's parameter gradients, as an element body over the 2 n columns: dw[j] (j < n) and
/// db[j - n] the sums over chunks of total[c][j], added in chunk order.
struct layer_norm_param_grads {
  const double* total;
  std::size_t chunks;
  std::size_t n;
  float* dw;
  float* db;
  SOLDER_HD SOLDER_INLINE void column(std::size_t j) const {
    double s = 0;
    for (std::size_t c = 0; c < chunks; ++c) s += total[c * 2 * n + j];
    if (j < n)
      dw[j] = float(s);
    else
      db[j - n] = float(s);
  }
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    for (std::size_t k = 0; k < simd::lanes<V>; ++k) column(i + k);
  }
};

}  // namespace solder::ops

SOLDER_INTRINSIC_WARNINGS_ON
