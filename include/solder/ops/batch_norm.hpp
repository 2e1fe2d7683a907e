// ops/batch_norm.hpp: batch normalization (torch's nn.BatchNorm1d and BatchNorm2d): a channel's
// statistics from shifted sums, the normalize-and-affine forward and the backward, written once
// over a row walker (ops/softmax.hpp and docs/ops.md, "Row ops"). A walk covers one sample's
// plane of one channel (a per-channel operand is then a number) or one sample's C channels (an
// array, one column per channel); the same bodies serve both. Also evaluation mode's
// normalization folded into the linear layer or convolution before it (batch_norm_fold).
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/simd.hpp"

// The walker's masked tail loads inline AVX-512 intrinsics into these bodies (see config.hpp).
SOLDER_INTRINSIC_WARNINGS_OFF

namespace solder::ops {

/// A channel's batch statistics: the mean, the biased variance that normalizes, and the
/// unbiased one (n / (n - 1) times it) that torch's running_var tracks.
template <class A>
struct batch_norm_moments {
  A mean;
  A var;
  A var_unbiased;
};

/// Per channel, over its n values, with xhat = (x - mean) rstd, rstd = 1 / sqrt(Var + eps) and
/// k = weight rstd (training: the batch's mean and biased Var; evaluation: the running ones):
///   y = (x - mean) k + bias;  dbias = sum dy,  dweight = sum dy xhat,
///   dx = k (dy - xhat dweight / n - dbias / n)   (training),   dx = k dy   (evaluation).
/// A NaN or infinity anywhere in a channel makes its statistics NaN in training, so every y and
/// dx of that channel is NaN (as torch); in evaluation a NaN x gives a NaN y there only.
struct batch_norm {
  static constexpr const char* name = "batch_norm";
  /// Per element, training: the shifted sums (4), normalize and affine (3).
  static constexpr int forward_flops = 7;
  /// Per element: xhat and the two sums (5), then xhat again and dx (6).
  static constexpr int backward_flops = 11;

  /// A channel's moments from its n values' shifted sums s1 = sum d, s2 = sum d^2, d = x - shift.
  /// With the shift a value of the channel, d and d^2 stay on the scale of the spread, so the
  /// sums keep their precision where sum x^2 - n mean^2 cancels to nothing (|mean| >> std);
  /// what is left cancels by a factor 1 + z^2, z = (mean - shift) / std. n >= 2.
  template <class A>
  SOLDER_HD SOLDER_INLINE static batch_norm_moments<A> moments(A n, A shift, A s1, A s2) {
    const A d = s1 / n;
    // Written as one fma, so that every compiler and backend rounds it alike (contraction of
    // s2 / n - d * d depends on the compiler and its flags).
    const A var = simd::max(simd::fma(-d, d, s2 / n), A(0));  // NaN stays NaN
    return {shift + d, var, var * (n / (n - A(1)))};
  }
  /// 1 / sqrt(var + eps).
  template <class A>
  SOLDER_HD SOLDER_INLINE static A rstd(A var, A eps) {
    return A(1) / simd::sqrt(var + eps);
  }
  /// A running statistic moved towards the batch's, as torch: momentum batch + (1 - momentum) old,
  /// as fma(momentum, batch, (1 - momentum) old) on every compiler and backend.
  template <class A>
  SOLDER_HD SOLDER_INLINE static A running(A old, A batch, A momentum) {
    return simd::fma(momentum, batch, (A(1) - momentum) * old);
  }

  /// xhat = (x - mean) rstd.
  template <class V>
  SOLDER_HD SOLDER_INLINE static V normalized(V x, V mean, V rstd) {
    return (x - mean) * rstd;
  }
  /// y = (x - mean) k + b. The mean is subtracted first (exact for x near it), so only the float
  /// mean's own rounding, u |mean| / 2, reaches y; x k + (b - mean k) adds u |mean| k twice more.
  template <class V>
  SOLDER_HD SOLDER_INLINE static V affine(V x, V mean, V k, V b) {
    return simd::fma(x - mean, k, b);
  }
  /// dx = k (dy - xhat gw - gb), gw = dweight / n and gb = dbias / n.
  template <class V>
  SOLDER_HD SOLDER_INLINE static V input_grad(V xhat, V dy, V k, V gw, V gb) {
    return (dy - simd::fma(xhat, gw, gb)) * k;
  }

  /// {sum (x - shift), sum (x - shift)^2} over a walk inside one channel.
  template <class R>
  SOLDER_HD SOLDER_INLINE auto statistics_sums(const R& r, const typename R::scalar* x, typename R::scalar shift) const {
    return r.template sums<2>([&](auto at) SOLDER_INLINE_LAMBDA { return statistics_terms(r, at, x, shift); });
  }
  /// Adds x - shift and (x - shift)^2 to s1 and s2, per column of a walk across channels.
  template <class R>
  SOLDER_HD SOLDER_INLINE void add_statistics(const R& r, const typename R::scalar* x, const typename R::scalar* shift,
                                              typename R::scalar* s1, typename R::scalar* s2) const {
    r.each([&](auto at) SOLDER_INLINE_LAMBDA { add_columns(r, at, statistics_terms(r, at, x, shift), s1, s2); });
  }

  /// y = (x - mean) k + b along a walk; y may be x. P: a number or a per-column array (channel).
  template <class R, class P>
  SOLDER_HD SOLDER_INLINE void forward(const R& r, const typename R::scalar* x, typename R::scalar* y, P mean, P k,
                                       P b) const {
    r.each([&](auto at) SOLDER_INLINE_LAMBDA {
      r.store(at, y, affine(r.load(at, x), channel(r, at, mean), channel(r, at, k), channel(r, at, b)));
    });
  }

  /// {sum dy, sum dy xhat} over a walk inside one channel.
  template <class R>
  SOLDER_HD SOLDER_INLINE auto grad_sums(const R& r, const typename R::scalar* x, const typename R::scalar* dy,
                                         typename R::scalar mean, typename R::scalar rstd) const {
    return r.template sums<2>([&](auto at) SOLDER_INLINE_LAMBDA { return grad_terms(r, at, x, dy, mean, rstd); });
  }
  /// Adds dy and dy xhat to sdy and sdyx, per column of a walk across channels.
  template <class R>
  SOLDER_HD SOLDER_INLINE void add_grads(const R& r, const typename R::scalar* x, const typename R::scalar* dy,
                                         const typename R::scalar* mean, const typename R::scalar* rstd,
                                         typename R::scalar* sdy, typename R::scalar* sdyx) const {
    r.each([&](auto at) SOLDER_INLINE_LAMBDA { add_columns(r, at, grad_terms(r, at, x, dy, mean, rstd), sdy, sdyx); });
  }

  /// Training: dx = k (dy - xhat gw - gb) along a walk; dx may be dy.
  template <class R, class P>
  SOLDER_HD SOLDER_INLINE void backward(const R& r, const typename R::scalar* x, const typename R::scalar* dy,
                                        typename R::scalar* dx, P mean, P rstd, P k, P gw, P gb) const {
    r.each([&](auto at) SOLDER_INLINE_LAMBDA {
      const auto xhat = normalized(r.load(at, x), channel(r, at, mean), channel(r, at, rstd));
      r.store(at, dx, input_grad(xhat, r.load(at, dy), channel(r, at, k), channel(r, at, gw), channel(r, at, gb)));
    });
  }
  /// Evaluation: dx = k dy along a walk (the running statistics are constants; x is not read,
  /// as torch); dx may be dy.
  template <class R, class P>
  SOLDER_HD SOLDER_INLINE void backward_eval(const R& r, const typename R::scalar* dy, typename R::scalar* dx, P k) const {
    r.each([&](auto at) SOLDER_INLINE_LAMBDA { r.store(at, dx, r.load(at, dy) * channel(r, at, k)); });
  }

 private:
  /// A per-channel operand at a step: a number as a vector of it, or an array's columns.
  template <class R, class At>
  SOLDER_HD SOLDER_INLINE static typename R::value channel(const R&, At, typename R::scalar v) {
    return typename R::value(v);
  }
  template <class R, class At>
  SOLDER_HD SOLDER_INLINE static typename R::value channel(const R& r, At at, const typename R::scalar* p) {
    return r.load(at, p);
  }

  template <class R, class At, class P>
  SOLDER_HD SOLDER_INLINE static typename R::template terms<2> statistics_terms(const R& r, At at,
                                                                              const typename R::scalar* x, P shift) {
    const auto d = r.load(at, x) - channel(r, at, shift);
    return {d, d * d};
  }
  template <class R, class At, class P>
  SOLDER_HD SOLDER_INLINE static typename R::template terms<2> grad_terms(const R& r, At at, const typename R::scalar* x,
                                                                        const typename R::scalar* dy, P mean, P rstd) {
    const auto g = r.load(at, dy);
    return {g, g * normalized(r.load(at, x), channel(r, at, mean), channel(r, at, rstd))};
  }
  template <class R, class At, class T>
  SOLDER_HD SOLDER_INLINE static void add_columns(const R& r, At at, const T& t, typename R::scalar* a,
                                                  typename R::scalar* b) {
    r.store(at, a, r.load(at, a) + t[0]);
    r.store(at, b, r.load(at, b) + t[1]);
  }
};

/// Evaluation mode's normalization folded into the product before it (a linear layer or a
/// convolution), one output channel with weight gamma, bias beta and running statistics:
///   s = gamma / sqrt(running_var + eps),  W' = W s,  b' = fma(b - running_mean, s, beta)
/// in double, each W' and b' rounded once to float (b = 0 where the product has no bias). The
/// multiply-add of b' is fused by name, as the host compilers of every build with FMA fuse
/// (b - mean) s + beta anyway, so the bits do not hang on a compiler's contraction setting and
/// a device compiler gets the same ones. A NaN or infinite statistic gives NaN or infinite W'
/// and b' in its channel only.
struct batch_norm_fold {
  /// s, in double.
  double scale;
  double mean, beta;

  SOLDER_HD SOLDER_INLINE batch_norm_fold(float gamma, float beta, float running_mean, float running_var, double eps)
      : scale(double(gamma) / simd::sqrt(double(running_var) + eps)), mean(running_mean), beta(beta) {}

  /// W' = W s, one weight of the channel.
  SOLDER_HD SOLDER_INLINE float weight(float w) const { return float(double(w) * scale); }
  /// b' = fma(b - running_mean, s, beta), from the product's bias b (0 without one).
  SOLDER_HD SOLDER_INLINE float bias(double b) const { return float(simd::fma(b - mean, scale, beta)); }
};

}  // namespace solder::ops

SOLDER_INTRINSIC_WARNINGS_ON
