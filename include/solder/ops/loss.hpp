// ops/loss.hpp: the training losses' math: softmax cross-entropy with label smoothing (one row
// of logits), and the elementwise mse and bce_with_logits with the row sum that serves both;
// each gives the loss and its gradient together, written once over a row walker (the interface
// is described in ops/softmax.hpp and docs/ops.md, "Row ops").
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>

#include "solder/config.hpp"
#include "solder/ops/softmax.hpp"
#include "solder/simd.hpp"

// xsimd's exp and log1p inline AVX-512 intrinsics into these bodies on the CPU (see config.hpp).
SOLDER_INTRINSIC_WARNINGS_OFF

namespace solder::ops {

/// An elementwise loss at one element (or one vector of them) and its derivative.
template <class V>
struct loss_and_slope {
  V loss;
  V slope;
};

/// loss = (x - t)^2 (torch.nn.MSELoss's term); d/dx = 2 (x - t). IEEE NaN and Inf.
struct mse {
  static constexpr const char* name = "mse";
  /// Per element: subtract, square, sum; the gradient: double, scale.
  static constexpr int flops = 5;
  template <class V>
  SOLDER_HD SOLDER_INLINE loss_and_slope<V> forward(const V& x, const V& t) const {
    const V d = x - t;
    return {d * d, d + d};
  }
};

/// loss = softplus(x) - x t = max(x, 0) - x t + log(1 + e^-|x|) (torch.nn.BCEWithLogitsLoss's
/// term, t a probability); d/dx = sigmoid(x) - t. softplus and sigmoid (simd.hpp) exponentiate
/// only -|x|, so nothing overflows for any finite x; a NaN x gives NaN loss and slope.
struct bce_with_logits {
  static constexpr const char* name = "bce_with_logits";
  /// Per element: softplus (abs, exp, log1p, max, add), x t and a subtraction, the sum; the
  /// gradient: sigmoid from the same exp (add, divide, select), a subtraction, the scale.
  static constexpr int flops = 13;
  template <class V>
  SOLDER_HD SOLDER_INLINE loss_and_slope<V> forward(const V& x, const V& t) const {
    return {simd::softplus(x) - x * t, simd::sigmoid(x) - t};
  }
};

/// sum_i loss(x_i, t_i) over a row (a span of elements) of an elementwise loss Op; with Grad,
/// also g_i = dloss/dx_i * scale (scale = 1/n: the gradient of the mean over n elements).
template <bool Grad, class Op, class R>
SOLDER_HD SOLDER_INLINE typename R::accum elementwise_loss_sum(const Op& op, const R& r, const typename R::scalar* x,
                                                                const typename R::scalar* t, typename R::scalar* g,
                                                                typename R::scalar scale) {
  using V = typename R::value;
  const V vscale(scale);
  return r.sum([&](auto at) SOLDER_INLINE_LAMBDA {
    const auto ls = op.forward(r.load(at, x), r.load(at, t));
    if constexpr (Grad) r.store(at, g, ls.slope * vscale);
    return ls.loss;
  });
}

/// An elementwise loss Op over chunk c of n elements, as a body of the executor's row_sums<dyn>
/// (Chunks: the backend's chunking of the elements, items of one element each): the chunk's sum,
/// and with Grad its gradient, by one walk resized to the chunk (the last may be shorter). n:
/// the longest chunk's length, which the walker is made for.
template <bool Grad, class Op, class Chunks>
struct elementwise_loss_chunks {
  Op op;
  const float* x;
  const float* t;
  float* g;
  float scale;
  Chunks chunks;
  std::size_t n;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE double operator()(const R& walker, std::size_t c) const {
    const std::size_t b = chunks.begin(c);
    return elementwise_loss_sum<Grad>(op, walker.with_length(chunks.end(c) - b), x + b, t + b, Grad ? g + b : nullptr,
                                      scale);
  }
};

/// Softmax cross-entropy of one row of C logits against the label y, with torch's label
/// smoothing eps (the target is (1 - eps) onehot(y) + eps / C):
///   loss = logsumexp(x) - keep x_y - spread sum_j x_j,  keep = 1 - eps, spread = eps / C,
/// computed from gaps to the row max, m + log s - keep x_y - spread sum x_j = log s + keep
/// (m - x_y) + spread sum (m - x_j), so logits of 1000 neither overflow nor cancel.
/// Gradient: g_j = (softmax(x)_j - spread - keep [j == y]) * scale. It reuses softmax's steps
/// (row_max, shifted_exp_sum). NaN or +inf in the row: NaN loss and gradient; -inf (masking)
/// gives an infinite loss only where the target weights it (the label, or any class when
/// spread > 0), as torch.
struct softmax_cross_entropy {
  float keep = 1.0f;    // 1 - label_smoothing: the label's weight
  float spread = 0.0f;  // label_smoothing / C: every class's weight
  float scale = 1.0f;   // the gradient's factor: 1 / B for the mean over B rows

  static constexpr const char* name = "softmax_cross_entropy";
  /// Per element: softmax's max, subtract, exp and sum; the gap sum; the gradient's
  /// multiply-subtract.
  static constexpr int flops = 7;

  /// The row's loss; with Grad, writes its gradient to g.
  template <bool Grad, class R>
  SOLDER_HD SOLDER_INLINE typename R::accum row(const R& r, const typename R::scalar* x, std::size_t y,
                                                typename R::scalar* g) const {
    using V = typename R::value;
    using T = typename R::scalar;
    using A = typename R::accum;
    const T m = row_max(r, x);
    // e_j parked in g until s is known. Without smoothing the gap sum is not taken (and -inf
    // logits, spread 0 x inf, stay finite).
    const exp_sums<A> s =
        spread != 0.0f ? shifted_exp_sum<Grad, true>(r, x, m, g) : shifted_exp_sum<Grad, false>(r, x, m, g);
    A loss = simd::log(s.sum) + A(keep) * (A(m) - A(x[y]));
    if (spread != 0.0f) loss += A(spread) * s.gap;
    if constexpr (Grad) {
      // An explicit fused multiply-subtract: left to the compiler, a * b - c is contracted in
      // some instantiations and not in others, and the gradients would differ in bits.
      const V a(T(A(scale) / s.sum)), c(simd::neg(T(spread) * T(scale)));
      r.each([&](auto at) SOLDER_INLINE_LAMBDA { r.store(at, g, simd::fma(r.load(at, g), a, c)); });
      r.once([&]() SOLDER_INLINE_LAMBDA { g[y] = simd::fma(simd::neg(T(keep)), T(scale), g[y]); });
    }
    return loss;
  }
};

/// Softmax cross-entropy over the rows of logits x [rows, n] against labels, as a row body of
/// the executor's row_sums<N>: row r's loss (NaN for a label outside [0, n), reading nothing
/// of the row), and with Grad its gradient in g.
template <bool Grad, std::size_t N>
struct softmax_cross_entropy_rows {
  softmax_cross_entropy op;
  const float* x;
  const std::int32_t* labels;
  float* g;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE double operator()(const R& walker, std::size_t r) const {
    const std::int32_t y = labels[r];
    if (y < 0 || std::size_t(y) >= n) return NAN;  // the same label on every lane of a warp
    return double(op.template row<Grad>(walker, x + r * n, std::size_t(y), Grad ? g + r * n : nullptr));
  }
};

}  // namespace solder::ops

SOLDER_INTRINSIC_WARNINGS_ON
