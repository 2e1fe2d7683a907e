// nn/loss.hpp: the training losses (mse, softmax_cross_entropy, bce_with_logits) and accuracy.
// Each loss visits a row once and returns the mean loss together with the gradient of that
// mean, or the loss alone for evaluation. Sums are fixed-order, so results never depend on
// the thread count.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "solder/config.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

// GCC 12.2 warns -W(maybe-)uninitialized inside its own AVX-512 intrinsics (the "undefined"
// source operand of the unmasked forms, GCC bug 105593, fixed in 12.3) when xsimd's exp and
// log1p are inlined into the loss loops below; the warning names no solder code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace solder::nn {

/// Something a loss reads: tensor<float, S>, tensor_ref<float, S> or tensor_ref<const float, S>.
template <class M>
concept FloatInput = requires(const std::remove_cvref_t<M>& m) {
  typename std::remove_cvref_t<M>::shape_type;
  { m.data() } -> std::convertible_to<const float*>;
  { m.batch() } -> std::convertible_to<std::size_t>;
};

/// Something a loss writes a gradient into: tensor<float, S>& or tensor_ref<float, S>.
template <class M>
concept FloatOutput = FloatInput<M> && requires(M&& m) {
  { m.data() } -> std::same_as<float*>;
};

namespace detail {

template <class M>
using shape_of_t = typename std::remove_cvref_t<M>::shape_type;

/// Reports, once, that two arguments of a loss differ in shape.
template <fixed_string Who, class A, class B>
constexpr bool check_same_shape() {
  if constexpr (std::is_same_v<A, B>) {
    return true;
  } else {
    constexpr fixed_string m = [] {
      fixed_string s(Who);
      s.append(": the arguments must have the same shape; got ");
      solder::detail::append_shape<A>(s);
      s.append(" and ");
      solder::detail::append_shape<B>(s);
      return s;
    }();
    return diagnostic<m>::reported;
  }
}

/// Reports, once, that a loss over classes got logits that are not [batch, classes].
template <fixed_string Who, class S>
constexpr bool check_rank2() {
  if constexpr (S::rank == 2) {
    return true;
  } else {
    constexpr fixed_string m = [] {
      fixed_string s(Who);
      s.append(": logits must be rank 2, [batch, classes]; got ");
      solder::detail::append_shape<S>(s);
      return s;
    }();
    return diagnostic<m>::reported;
  }
}

/// A dynamic batch is checked at run time: every argument must have the first one's.
inline void check_batches(const char* who, std::size_t want, std::size_t got, const char* what) {
  if (want != got)
    solder::detail::fail(std::string(who) + ": " + what + " has a batch of " + std::to_string(got) + " rows but the input has " +
                         std::to_string(want));
}

inline void check_labels(const char* who, std::span<const std::int32_t> labels, std::size_t rows, std::size_t classes) {
  if (labels.size() != rows)
    solder::detail::fail(std::string(who) + ": got " + std::to_string(labels.size()) + " labels for a batch of " +
                         std::to_string(rows) + " rows; give one label per row");
  for (std::size_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || std::size_t(labels[r]) >= classes)
      solder::detail::fail(std::string(who) + ": label " + std::to_string(labels[r]) + " of row " + std::to_string(r) +
                           " is outside [0, " + std::to_string(classes) + ")");
}

using vecf = eval::cpu::vec<float>;
inline constexpr std::size_t lanes = vecf::size;

// Tails of a row go through masked loads and stores where the target has them: they touch
// only the row's own elements, and a narrow copy into a stack buffer followed by a wide load
// would stall on store forwarding once per row (a quarter of the time of a 10-class row).

#if defined(__AVX512F__)
static_assert(lanes == 16, "solder::nn: AVX-512 builds use 16-lane float vectors");
#elif defined(__AVX2__)
static_assert(lanes == 8, "solder::nn: AVX2 builds use 8-lane float vectors");
/// Lanes [0, n) of an AVX2 mask.
SOLDER_INLINE __m256i avx2_first(std::size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/// The first n < lanes floats at p in a vector, the other lanes set to `pad`; reads p[0, n).
SOLDER_INLINE vecf load_tail(const float* p, std::size_t n, float pad) {
#if defined(__AVX512F__)
  return _mm512_mask_loadu_ps(_mm512_set1_ps(pad), __mmask16((1u << n) - 1), p);
#elif defined(__AVX2__)
  const __m256i m = avx2_first(n);
  return _mm256_blendv_ps(_mm256_set1_ps(pad), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
#else
  alignas(alignment) float buf[lanes];
  std::fill_n(buf, lanes, pad);
  std::memcpy(buf, p, n * sizeof(float));
  return vecf::load_aligned(buf);
#endif
}
/// Stores the first n < lanes lanes of v to p[0, n).
SOLDER_INLINE void store_tail(float* p, std::size_t n, const vecf& v) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), v);
#elif defined(__AVX2__)
  _mm256_maskstore_ps(p, avx2_first(n), v);
#else
  alignas(alignment) float buf[lanes];
  v.store_aligned(buf);
  std::memcpy(p, buf, n * sizeof(float));
#endif
}
/// True in the first n lanes.
SOLDER_INLINE auto first_lanes(std::size_t n) {
  alignas(alignment) static constexpr auto iota = [] {
    std::array<float, lanes> a{};
    for (std::size_t k = 0; k < lanes; ++k) a[k] = float(k);
    return a;
  }();
  return vecf::load_aligned(iota.data()) < vecf(float(n));
}
/// The largest lane. A NaN lane may or may not win: callers let NaN reach the result
/// through the data itself.
SOLDER_INLINE float reduce_max(const vecf& v) {
  alignas(alignment) float buf[lanes];
  v.store_aligned(buf);
  for (std::size_t w = lanes / 2; w > 0; w /= 2)  // a tree: log2(lanes) dependent steps
    for (std::size_t k = 0; k < w; ++k) buf[k] = buf[k] < buf[k + w] ? buf[k + w] : buf[k];
  return buf[0];
}

/// Row r of a pass contributes row(r); the sum is taken chunk by chunk, each chunk serially in
/// double, then the chunks in order. The chunks depend on the sizes only, never on the thread
/// count, so the result is bitwise the same for any number of threads.
template <class Row>
double sum_rows(std::size_t rows, std::size_t row_len, const Row& row) {
  constexpr std::size_t max_chunks = 32;
  constexpr std::size_t min_chunk_elements = std::size_t(1) << 14;  // below this a thread is not worth waking
  constexpr std::size_t parallel_min_elements = std::size_t(1) << 16;
  const std::size_t per_chunk =
      std::max((rows + max_chunks - 1) / max_chunks, (min_chunk_elements + row_len - 1) / row_len);
  const std::size_t chunks = (rows + per_chunk - 1) / per_chunk;
  std::array<double, max_chunks> partial{};
  const int threads = rows * row_len >= parallel_min_elements ? num_threads() : 1;
  eval::cpu::parallel_for(chunks, threads, [&](std::size_t c) {
    const Row f = row;  // a local copy: the row's stores cannot alias its captured state
    double acc = 0;
    const std::size_t end = std::min(rows, (c + 1) * per_chunk);
    for (std::size_t r = c * per_chunk; r < end; ++r) acc += f(r);
    partial[c] = acc;
  });
  double total = 0;
  for (std::size_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

/// Elementwise losses run over flat blocks of this many elements: each block sums in float
/// vectors (at most block / lanes terms per lane), then adds its total to a double.
inline constexpr std::size_t flat_block = 1024;

/// One row of softmax cross-entropy over C classes (a constant: the loops and the tail are
/// laid out at compile time): returns the row's loss, and with Grad writes g_j = (p_j - spread - keep [j == y]) * inv_batch.
/// `spread` = eps / C, `keep` = 1 - eps.
template <bool Grad, std::size_t C>
SOLDER_INLINE double softmax_ce_row(const float* x, std::size_t y, float* g, float keep, float spread,
                                    float inv_batch) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  constexpr std::size_t full = C / lanes * lanes, rest = C - full;

  vecf vmax(neg_inf);
  for (std::size_t j = 0; j < full; j += lanes) vmax = simd::max(vmax, vecf::load_unaligned(x + j));
  if constexpr (rest != 0) vmax = simd::max(vmax, load_tail(x + full, rest, neg_inf));
  // A NaN logit need not win the max: it makes its x_j - m, and so the row's sum, loss and
  // whole gradient, NaN anyway.
  const float m = reduce_max(vmax);

  // e_j = exp(x_j - m) <= 1 (parked in g until the sum is known); gap = sum (m - x_j) >= 0.
  vecf vsum(0.0f), vgap(0.0f);
  const vecf vm(m);
  for (std::size_t j = 0; j < full; j += lanes) {
    const vecf d = vm - vecf::load_unaligned(x + j);
    const vecf e = simd::exp(simd::neg(d));
    vsum += e;
    vgap += d;
    if constexpr (Grad) e.store_unaligned(g + j);
  }
  if constexpr (rest != 0) {
    const vecf d = vm - load_tail(x + full, rest, m);  // padding gives d = 0, e = 1: masked out of the sum
    const vecf e = simd::exp(simd::neg(d));
    vsum += simd::select(first_lanes(rest), e, vecf(0.0f));
    vgap += d;
    if constexpr (Grad) store_tail(g + full, rest, e);
  }
  const float s = xsimd::hadd(vsum);

  // loss = lse - keep x_y - spread sum x_j, with lse = m + log s, written as gaps from the max
  // so that large logits (1000) do not cancel.
  double loss = std::log(double(s)) + double(keep) * (double(m) - double(x[y]));
  if (spread != 0.0f) loss += double(spread) * double(xsimd::hadd(vgap));  // skipped at eps = 0, so -inf logits stay finite

  if constexpr (Grad) {
    // Explicit fused multiply-subtracts: left to the compiler, a * b - c is contracted in some
    // instantiations (static batch) and not in others, and the gradients would differ in bits.
    const vecf a(inv_batch / s), c(spread * inv_batch);
    for (std::size_t j = 0; j < full; j += lanes) xsimd::fms(vecf::load_unaligned(g + j), a, c).store_unaligned(g + j);
    if constexpr (rest != 0) store_tail(g + full, rest, xsimd::fms(load_tail(g + full, rest, 0.0f), a, c));
    g[y] = std::fma(-keep, inv_batch, g[y]);
  }
  return loss;
}

template <bool Grad, class S>
float softmax_cross_entropy(const float* x, std::size_t batch, std::span<const std::int32_t> labels, float* g,
                            float label_smoothing) {
  constexpr const char* who = "solder::nn::softmax_cross_entropy";
  constexpr std::size_t classes = S::last;
  const std::size_t rows = S::elements(batch) / classes;
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    solder::detail::fail(std::string(who) + ": label_smoothing must be in [0, 1], got " + std::to_string(label_smoothing));
  check_labels(who, labels, rows, classes);
  const float keep = 1.0f - label_smoothing;
  const float spread = label_smoothing / float(classes);
  const float inv_batch = 1.0f / float(rows);
  const std::int32_t* y = labels.data();
  const double total = sum_rows(rows, classes, [=](std::size_t r) {
    return softmax_ce_row<Grad, classes>(x + r * classes, std::size_t(y[r]), Grad ? g + r * classes : nullptr, keep,
                                         spread, inv_batch);
  });
  return float(total / double(rows));
}

/// Block b of an elementwise loss: returns sum_i loss(x_i, t_i) and with Grad writes
/// g_i = dloss/dx_i * scale; elem(x, t) gives {loss, dloss/dx} for a vector of elements.
template <bool Grad, class Elem>
SOLDER_INLINE double flat_block_loss(const float* x, const float* t, float* g, std::size_t n, std::size_t b,
                                     float scale, Elem elem) {
  const std::size_t begin = b * flat_block, end = std::min(n, begin + flat_block);
  const vecf vscale(scale);
  vecf acc(0.0f);
  std::size_t i = begin;
  for (; i + lanes <= end; i += lanes) {
    const auto [loss, slope] = elem(vecf::load_unaligned(x + i), vecf::load_unaligned(t + i));
    acc += loss;
    if constexpr (Grad) (slope * vscale).store_unaligned(g + i);
  }
  if (i < end) {
    const std::size_t rest = end - i;
    const auto [loss, slope] = elem(load_tail(x + i, rest, 0.0f), load_tail(t + i, rest, 0.0f));
    acc += simd::select(first_lanes(rest), loss, vecf(0.0f));
    if constexpr (Grad) store_tail(g + i, rest, slope * vscale);
  }
  return double(xsimd::hadd(acc));
}

template <class V>
struct loss_and_slope {
  V loss;
  V slope;
};

/// (x - t)^2 and its derivative 2 (x - t).
struct squared_error {
  template <class V>
  SOLDER_INLINE loss_and_slope<V> operator()(const V& x, const V& t) const {
    const V d = x - t;
    return {d * d, d + d};
  }
};

/// max(x, 0) - x t + log(1 + e^-|x|) and its derivative sigmoid(x) - t, from one exp.
struct logistic_error {
  template <class V>
  SOLDER_INLINE loss_and_slope<V> operator()(const V& x, const V& t) const {
    const V e = simd::exp(simd::neg(simd::abs(x)));  // in (0, 1]: never overflows
    const V r = V(1.0f) / (V(1.0f) + e);
    const V sig = simd::select(V(0.0f) <= x, r, e * r);  // NaN lands in e * r and stays NaN
    return {simd::max(x, V(0.0f)) - x * t + simd::log1p(e), sig - t};
  }
};

template <bool Grad, class Elem>
float flat_mean_loss(const float* x, const float* t, float* g, std::size_t n, Elem elem) {
  const float scale = 1.0f / float(n);
  const std::size_t blocks = (n + flat_block - 1) / flat_block;
  const double total = sum_rows(blocks, flat_block, [=](std::size_t b) {
    return flat_block_loss<Grad>(x, t, g, n, b, scale, elem);
  });
  return float(total / double(n));
}

/// The target of an elementwise loss matches the input: the same shape, and the same batch.
template <fixed_string Who, class X, class T>
void check_target(const X& input, const T& target) {
  using S = shape_of_t<X>;
  static_assert(check_same_shape<Who, S, shape_of_t<T>>());
  if constexpr (S::dynamic) check_batches(Who.text, input.batch(), target.batch(), "the target");
}
/// A gradient output matches the input it is the gradient of; `what` names it in messages.
template <fixed_string Who, class X, class G>
void check_gradient(const X& input, const G& grad, const char* what) {
  using S = shape_of_t<X>;
  static_assert(check_same_shape<Who, S, shape_of_t<G>>());
  if constexpr (S::dynamic) check_batches(Who.text, input.batch(), grad.batch(), what);
}
template <class X>
std::size_t elements(const X& x) {
  return shape_of_t<X>::elements(x.batch());
}

}  // namespace detail

/// Mean squared error, loss = mean((x - t)^2) over all elements (torch.nn.MSELoss()); writes
/// dinput = 2 (x - t) / n, the gradient of that mean. Any shape; all three arguments alike.
template <FloatInput X, FloatInput T, FloatOutput G>
float mse(const X& input, const T& target, G&& dinput) {
  detail::check_target<"solder::nn::mse">(input, target);
  detail::check_gradient<"solder::nn::mse">(input, dinput, "the gradient");
  return detail::flat_mean_loss<true>(input.data(), target.data(), dinput.data(), detail::elements(input),
                                      detail::squared_error{});
}
/// Mean squared error without the gradient (evaluation).
template <FloatInput X, FloatInput T>
float mse(const X& input, const T& target) {
  detail::check_target<"solder::nn::mse">(input, target);
  return detail::flat_mean_loss<false>(input.data(), target.data(), nullptr, detail::elements(input),
                                       detail::squared_error{});
}

/// Binary cross-entropy on logits, loss = mean(max(x, 0) - x t + log(1 + e^-|x|)), stable for
/// any finite x (torch.nn.BCEWithLogitsLoss()); writes dinput = (sigmoid(x) - t) / n.
/// Targets are probabilities, normally in [0, 1] (not checked, as in PyTorch).
template <FloatInput X, FloatInput T, FloatOutput G>
float bce_with_logits(const X& input, const T& target, G&& dinput) {
  detail::check_target<"solder::nn::bce_with_logits">(input, target);
  detail::check_gradient<"solder::nn::bce_with_logits">(input, dinput, "the gradient");
  return detail::flat_mean_loss<true>(input.data(), target.data(), dinput.data(), detail::elements(input),
                                      detail::logistic_error{});
}
/// Binary cross-entropy on logits without the gradient (evaluation).
template <FloatInput X, FloatInput T>
float bce_with_logits(const X& input, const T& target) {
  detail::check_target<"solder::nn::bce_with_logits">(input, target);
  return detail::flat_mean_loss<false>(input.data(), target.data(), nullptr, detail::elements(input),
                                       detail::logistic_error{});
}

/// Softmax cross-entropy of logits [B, C] against integer labels in [0, C), mean over the
/// batch, with torch.nn.CrossEntropyLoss(label_smoothing=eps)'s smoothing:
///   loss_i = logsumexp(x_i) - (1 - eps) x_i[y_i] - eps / C sum_j x_i[j]
/// Writes dlogits = (softmax(x_i) - (1 - eps) onehot(y_i) - eps / C) / B, the gradient of the
/// mean. A NaN or +inf logit makes its row's loss NaN; -inf logits are allowed (masking) and
/// give an infinite loss only where they carry target weight, as in PyTorch.
template <FloatInput L, FloatOutput G>
float softmax_cross_entropy(const L& logits, std::span<const std::int32_t> labels, G&& dlogits,
                            float label_smoothing = 0.0f) {
  using S = detail::shape_of_t<L>;
  static_assert(detail::check_rank2<"solder::nn::softmax_cross_entropy", S>());
  detail::check_gradient<"solder::nn::softmax_cross_entropy">(logits, dlogits, "dlogits");
  return detail::softmax_cross_entropy<true, S>(logits.data(), logits.batch(), labels, dlogits.data(), label_smoothing);
}
/// Softmax cross-entropy without the gradient (evaluation); the same loss as above.
template <FloatInput L>
float softmax_cross_entropy(const L& logits, std::span<const std::int32_t> labels, float label_smoothing = 0.0f) {
  using S = detail::shape_of_t<L>;
  static_assert(detail::check_rank2<"solder::nn::softmax_cross_entropy", S>());
  return detail::softmax_cross_entropy<false, S>(logits.data(), logits.batch(), labels, nullptr, label_smoothing);
}

/// The fraction of rows of logits [B, C] whose argmax is the label. Ties go to the lowest
/// index and a NaN counts as the largest value, as torch.argmax does.
template <FloatInput L>
float accuracy(const L& logits, std::span<const std::int32_t> labels) {
  using S = detail::shape_of_t<L>;
  static_assert(detail::check_rank2<"solder::nn::accuracy", S>());
  constexpr std::size_t classes = S::last;
  const std::size_t rows = S::elements(logits.batch()) / classes;
  detail::check_labels("solder::nn::accuracy", labels, rows, classes);
  std::size_t correct = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * classes;
    std::size_t best = 0;
    for (std::size_t j = 1; j < classes && !std::isnan(x[best]); ++j)
      if (x[j] > x[best] || std::isnan(x[j])) best = j;
    correct += best == std::size_t(labels[r]);
  }
  return float(double(correct) / double(rows));
}

}  // namespace solder::nn

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
