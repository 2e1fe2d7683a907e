// ops/batch_norm.hpp: batch normalization (torch's nn.BatchNorm1d and BatchNorm2d): a channel's
// statistics from shifted sums, the normalize-and-affine forward and the backward, written once
// over a row walker (ops/softmax.hpp and docs/ops.md, "Row ops"). A walk covers one sample's
// plane of one channel (a per-channel operand is then a number) or one sample's C channels (an
// array, one column per channel); the same bodies serve both. Also evaluation mode's
// normalization folded into the linear layer or convolution before it (batch_norm_fold).
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/ops/rows.hpp"
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

// ---- The layer's passes as executor bodies (executor.hpp), the same on every backend ----------
// A pass over x [batch, C, HW] walks each sample's plane of a channel (HW > 1: rows<HW> over the
// batch C planes, q = sample C + channel) or (HW = 1, x [batch, C]) each sample's row across the
// channels (rows<C> over the samples). A channel's sums over the batch are added in an order
// fixed by the sizes: planes' double sums in sample order, or (HW = 1) chunks of samples whose
// float columns flush to double every 16 samples, the chunks' totals in chunk order.

/// Plane q's two sums, stored at sums[2 q] and sums[2 q + 1]: the statistics' {x - shift,
/// (x - shift)^2} (shift: the channel's first value), or with Grads {dy, dy xhat}.
template <std::size_t HW, bool Grads>
struct batch_norm_plane_sums {
  const float* x;
  const float* dy;    // Grads
  const float* mean;  // Grads: per channel
  const float* rstd;  // Grads: per channel
  double* sums;
  std::size_t channels;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t q) const {
    const std::size_t c = q % channels;
    const auto s = [&]() SOLDER_INLINE_LAMBDA {
      if constexpr (Grads)
        return batch_norm{}.grad_sums(walker, x + q * HW, dy + q * HW, mean[c], rstd[c]);
      else
        return batch_norm{}.statistics_sums(walker, x + q * HW, x[c * HW]);
    }();
    walker.once([&]() SOLDER_INLINE_LAMBDA {
      sums[2 * q] = s[0];
      sums[2 * q + 1] = s[1];
    });
  }
};

/// Chunk k's two sums per channel (x [batch, C]), the same terms as batch_norm_plane_sums
/// (shift: sample 0's row): float columns partial[k] [2, C] flushed every flush_rows samples
/// into total[k] [2, C].
template <std::size_t C, class Chunks, bool Grads>
struct batch_norm_chunk_sums {
  /// Samples added in float before a flush: 16 terms, so a column errs by about 20 u of its
  /// terms' magnitudes.
  static constexpr std::size_t flush_rows = 16;
  const float* x;
  const float* dy;    // Grads
  const float* mean;  // Grads: [C]
  const float* rstd;  // Grads: [C]
  float* partial;
  double* total;
  Chunks chunks;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t k) const {
    float* p = partial + k * 2 * C;
    double* t = total + k * 2 * C;
    zero_columns(walker, p, t, C);
    const std::size_t begin = chunks.begin(k), end = chunks.end(k);
    for (std::size_t r = begin; r < end; ++r) {
      if constexpr (Grads)
        batch_norm{}.add_grads(walker, x + r * C, dy + r * C, mean, rstd, p, p + C);
      else
        batch_norm{}.add_statistics(walker, x + r * C, x, p, p + C);
      if ((r - begin + 1) % flush_rows == 0 || r + 1 == end) {
        flush_columns(walker, p, t, C);
      }
    }
  }
};

/// Where the pieces' sums of a pass lie, and a channel's total of one term: the pieces (planes
/// of a sample, or chunks) added in order. Piece i's term t of channel c is at
/// base[i piece_stride + t term_stride + c channel_stride].
struct batch_norm_sums {
  const double* base;
  std::size_t pieces;
  std::size_t piece_stride, term_stride, channel_stride;
  SOLDER_HD SOLDER_INLINE double total(std::size_t term, std::size_t c) const {
    double s = 0;
    for (std::size_t i = 0; i < pieces; ++i) s += base[i * piece_stride + term * term_stride + c * channel_stride];
    return s;
  }
};

/// What a pass leaves per channel for the walks, as an element body over the C channels. Forward
/// in training: the batch's mean and rstd saved, k = weight rstd, the running statistics moved.
/// Forward in evaluation (no sums): the running mean and rstd saved, k. Backward: the parameter
/// gradients, k, and (training) dweight / n and dbias / n.
struct batch_norm_channels {
  enum class pass { train_forward, eval_forward, backward };
  pass what;
  batch_norm_sums sums;
  const float* x;     // train_forward: the channel's shift is x[c plane]
  std::size_t plane;  // values per sample and channel
  double count;       // values per channel: batch plane
  double eps, momentum;
  bool training;  // backward: of a training forward
  const float* weight;
  float* running_mean;
  float* running_var;
  float* saved_mean;
  float* saved_rstd;
  float* scale;
  float* weight_grad;   // backward
  float* bias_grad;     // backward
  float* dweight_mean;  // backward, training
  float* dbias_mean;    // backward, training

  SOLDER_HD SOLDER_INLINE void channel(std::size_t c) const {
    using op = batch_norm;
    if (what == pass::train_forward) {
      const auto m = op::moments(count, double(x[c * plane]), sums.total(0, c), sums.total(1, c));
      const double rstd = op::rstd(m.var, eps);
      saved_mean[c] = float(m.mean);
      saved_rstd[c] = float(rstd);
      scale[c] = float(double(weight[c]) * rstd);
      running_mean[c] = float(op::running(double(running_mean[c]), m.mean, momentum));
      running_var[c] = float(op::running(double(running_var[c]), m.var_unbiased, momentum));
    } else if (what == pass::eval_forward) {
      const double rstd = op::rstd(double(running_var[c]), eps);
      saved_mean[c] = running_mean[c];
      saved_rstd[c] = float(rstd);
      scale[c] = float(double(weight[c]) * rstd);
    } else {
      const double sdy = sums.total(0, c), sdyx = sums.total(1, c);
      weight_grad[c] = float(sdyx);
      bias_grad[c] = float(sdy);
      scale[c] = float(double(weight[c]) * double(saved_rstd[c]));
      if (training) {
        dweight_mean[c] = float(sdyx / count);
        dbias_mean[c] = float(sdy / count);
      }
    }
  }
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    for (std::size_t k = 0; k < simd::lanes<V>; ++k) channel(i + k);
  }
};

/// The walks of a pass over x [batch, C, HW] (or [batch, C]): walk w is plane w (sample w / C,
/// channel w % C) or (HW = 1) sample w's row, a per-channel array then read as a number or by
/// column. Forward: y = (x - mean) k + b, then after.rows(...) over the walk's rows of y (rows
/// of row_len values; a producer's epilogue, ops::no_row_epilogue for none). Backward (training):
/// dx = k (dy - xhat gw - gb); (evaluation) dx = k dy.
template <std::size_t C, std::size_t HW, class After>
struct batch_norm_forward_walks {
  static constexpr std::size_t walk = HW == 1 ? C : HW;
  const float* x;
  float* y;
  const float* mean;
  const float* k;
  const float* b;
  After after;
  std::size_t row_len;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t w) const {
    const std::size_t at = w * walk;
    if constexpr (HW == 1) {
      batch_norm{}.forward(walker, x + at, y + at, mean, k, b);
    } else {
      const std::size_t c = w % C;
      batch_norm{}.forward(walker, x + at, y + at, mean[c], k[c], b[c]);
    }
    after.rows(at / row_len, walk / row_len, 1);
  }
};

template <std::size_t C, std::size_t HW, bool Training>
struct batch_norm_backward_walks {
  static constexpr std::size_t walk = HW == 1 ? C : HW;
  const float* x;
  const float* dy;
  float* dx;
  const float* mean;
  const float* rstd;
  const float* k;
  const float* gw;
  const float* gb;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t w) const {
    const std::size_t at = w * walk;
    const auto per_channel = [&](const float* p) SOLDER_INLINE_LAMBDA {
      if constexpr (HW == 1)
        return p;
      else
        return p[w % C];
    };
    if constexpr (Training)
      batch_norm{}.backward(walker, x + at, dy + at, dx + at, per_channel(mean), per_channel(rstd), per_channel(k),
                            per_channel(gw), per_channel(gb));
    else
      batch_norm{}.backward_eval(walker, dy + at, dx + at, per_channel(k));
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

/// The fold of a batch_norm into the product before it, as an element body over the product's
/// weight W [channels, per_channel] (element i of channel i / per_channel): W'[i] and, at each
/// channel's first element, b'[c] from the product's bias b (null: none), by batch_norm_fold.
struct batch_norm_fold_elements {
  const float* product_weight;
  const float* product_bias;
  const float* weight;
  const float* bias;
  const float* running_mean;
  const float* running_var;
  float* folded_weight;
  float* folded_bias;
  std::size_t per_channel;
  double eps;

  SOLDER_HD SOLDER_INLINE void element(std::size_t i) const {
    const std::size_t c = i / per_channel;
    const batch_norm_fold fold(weight[c], bias[c], running_mean[c], running_var[c], eps);
    folded_weight[i] = fold.weight(product_weight[i]);
    if (i % per_channel == 0) folded_bias[c] = fold.bias(product_bias ? double(product_bias[c]) : 0.0);
  }
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    for (std::size_t k = 0; k < simd::lanes<V>; ++k) element(i + k);
  }
};

}  // namespace solder::ops

SOLDER_INTRINSIC_WARNINGS_ON
