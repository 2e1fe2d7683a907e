// nn/loss.hpp: the training losses (mse, softmax_cross_entropy, bce_with_logits) and accuracy.
// Each loss visits a row once and returns the mean loss together with the gradient of that
// mean, or the loss alone for evaluation. The math is ops/loss.hpp's, run on the row walk of the
// executor of the inputs' memory space (accuracy in host memory); sums are fixed-order, so
// results never depend on the thread count.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/ops/loss.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

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
    solder::detail::fail_message({who, ": ", what, " has a batch of ", got, " rows but the input has ", want});
}

inline void check_labels(const char* who, std::span<const std::int32_t> labels, std::size_t rows, std::size_t classes) {
  if (labels.size() != rows)
    solder::detail::fail_message(
        {who, ": got ", labels.size(), " labels for a batch of ", rows, " rows; give one label per row"});
  for (std::size_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || std::size_t(labels[r]) >= classes)
      solder::detail::fail_message({who, ": label ", labels[r], " of row ", r, " is outside [0, ", classes, ")"});
}


/// Softmax cross-entropy over the rows of logits x [B, C] of shape S in memory of Space, against
/// labels in the same memory: the mean loss, and with Grad its gradient in g. C is a constant,
/// so each row's loops and tail are laid out at compile time. The labels are checked before
/// anything is written (labels outside host memory are read back for it).
template <bool Grad, class S, class Space>
float softmax_cross_entropy(const float* x, std::size_t batch, std::span<const std::int32_t> labels, float* g,
                            float label_smoothing) {
  using exec = executor<backend_of_t<Space>>;
  constexpr const char* who = "solder::nn::softmax_cross_entropy";
  constexpr std::size_t classes = S::last;
  const std::size_t rows = S::elements(batch) / classes;
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    solder::detail::fail_message({who, ": label_smoothing must be in [0, 1], got ", label_smoothing});
  if constexpr (std::is_same_v<Space, host>) {
    check_labels(who, labels, rows, classes);
  } else {
    std::vector<std::int32_t> readable(labels.size() == rows ? rows : 0);
    exec::copy_to_host(readable.data(), labels.data(), readable.size());
    check_labels(who, labels.size() == rows ? std::span<const std::int32_t>(readable) : labels, rows, classes);
  }
  const ops::softmax_cross_entropy op{1.0f - label_smoothing, label_smoothing / float(classes), 1.0f / float(rows)};
  const double total = exec::template row_sums<classes>(
      rows, ops::softmax_cross_entropy_rows<Grad, classes>{op, x, labels.data(), Grad ? g : nullptr});
  return float(total / double(rows));
}

/// The mean of an elementwise loss Op over n elements in memory of Space, and with Grad its
/// gradient in g. The elements are cut into chunks fixed by n alone (the executor's chunking),
/// each summed by one row walk (ops::elementwise_loss_chunks), then the chunks in order.
template <bool Grad, class Space, class Op>
float elementwise_mean_loss(const Op& op, const float* x, const float* t, float* g, std::size_t n) {
  using exec = executor<backend_of_t<Space>>;
  const float scale = 1.0f / float(n);
  const auto parts = exec::chunks_of(n, 1);
  const double total = exec::template row_sums<dyn>(
      parts.count, ops::elementwise_loss_chunks<Grad, Op, typename exec::chunking>{op, x, t, Grad ? g : nullptr, scale, parts,
                                                                                 parts.end(0) - parts.begin(0)});
  return float(total / double(n));
}

/// The target of an elementwise loss matches the input: the same shape, and the same batch.
template <fixed_string Who, class X, class T>
void check_target(const X& input, const T& target) {
  using S = shape_of_t<X>;
  static_assert(std::is_same_v<memory_space_t<std::remove_cvref_t<X>>, memory_space_t<std::remove_cvref_t<T>>>,
                "solder::nn::mse, bce_with_logits: the input and the target must be in the same memory space");
  static_assert(check_same_shape<Who, S, shape_of_t<T>>());
  if constexpr (S::dynamic) check_batches(Who.text, input.batch(), target.batch(), "the target");
}
/// A gradient output matches the input it is the gradient of; `what` names it in messages.
template <fixed_string Who, class X, class G>
void check_gradient(const X& input, const G& grad, const char* what) {
  using S = shape_of_t<X>;
  static_assert(std::is_same_v<memory_space_t<std::remove_cvref_t<X>>, memory_space_t<std::remove_cvref_t<G>>>,
                "solder::nn: a loss's gradient must be in its input's memory space");
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
  return detail::elementwise_mean_loss<true, memory_space_t<std::remove_cvref_t<X>>>(ops::mse{}, input.data(), target.data(), dinput.data(),
                                             detail::elements(input));
}
/// Mean squared error without the gradient (evaluation).
template <FloatInput X, FloatInput T>
float mse(const X& input, const T& target) {
  detail::check_target<"solder::nn::mse">(input, target);
  return detail::elementwise_mean_loss<false, memory_space_t<std::remove_cvref_t<X>>>(ops::mse{}, input.data(), target.data(), nullptr,
                                              detail::elements(input));
}

/// Binary cross-entropy on logits, loss = mean(max(x, 0) - x t + log(1 + e^-|x|)), stable for
/// any finite x (torch.nn.BCEWithLogitsLoss()); writes dinput = (sigmoid(x) - t) / n.
/// Targets are probabilities, normally in [0, 1] (not checked, as in PyTorch).
template <FloatInput X, FloatInput T, FloatOutput G>
float bce_with_logits(const X& input, const T& target, G&& dinput) {
  detail::check_target<"solder::nn::bce_with_logits">(input, target);
  detail::check_gradient<"solder::nn::bce_with_logits">(input, dinput, "the gradient");
  return detail::elementwise_mean_loss<true, memory_space_t<std::remove_cvref_t<X>>>(ops::bce_with_logits{}, input.data(), target.data(), dinput.data(),
                                             detail::elements(input));
}
/// Binary cross-entropy on logits without the gradient (evaluation).
template <FloatInput X, FloatInput T>
float bce_with_logits(const X& input, const T& target) {
  detail::check_target<"solder::nn::bce_with_logits">(input, target);
  return detail::elementwise_mean_loss<false, memory_space_t<std::remove_cvref_t<X>>>(ops::bce_with_logits{}, input.data(), target.data(), nullptr,
                                              detail::elements(input));
}

/// Softmax cross-entropy of logits [B, C] against integer labels in [0, C), mean over the
/// batch, with torch.nn.CrossEntropyLoss(label_smoothing=eps)'s smoothing:
///   loss_i = logsumexp(x_i) - (1 - eps) x_i[y_i] - eps / C sum_j x_i[j]
/// Writes dlogits = (softmax(x_i) - (1 - eps) onehot(y_i) - eps / C) / B, the gradient of the
/// mean. A NaN or +inf logit makes its row's loss NaN; -inf logits are allowed (masking) and
/// give an infinite loss only where they carry target weight, as in PyTorch. The logits, labels
/// and dlogits are in one memory space (device tensors take device labels).
template <FloatInput L, FloatOutput G>
float softmax_cross_entropy(const L& logits, std::span<const std::int32_t> labels, G&& dlogits,
                            float label_smoothing = 0.0f) {
  using S = detail::shape_of_t<L>;
  using Space = memory_space_t<std::remove_cvref_t<L>>;
  static_assert(detail::check_rank2<"solder::nn::softmax_cross_entropy", S>());
  static_assert(std::is_same_v<Space, memory_space_t<std::remove_cvref_t<G>>>,
                "solder::nn::softmax_cross_entropy: the logits and dlogits must be in the same memory space");
  detail::check_gradient<"solder::nn::softmax_cross_entropy">(logits, dlogits, "dlogits");
  return detail::softmax_cross_entropy<true, S, Space>(logits.data(), logits.batch(), labels, dlogits.data(),
                                                       label_smoothing);
}
/// Softmax cross-entropy without the gradient (evaluation); the same loss as above.
template <FloatInput L>
float softmax_cross_entropy(const L& logits, std::span<const std::int32_t> labels, float label_smoothing = 0.0f) {
  using S = detail::shape_of_t<L>;
  static_assert(detail::check_rank2<"solder::nn::softmax_cross_entropy", S>());
  return detail::softmax_cross_entropy<false, S, memory_space_t<std::remove_cvref_t<L>>>(logits.data(), logits.batch(),
                                                                                      labels, nullptr, label_smoothing);
}

/// The fraction of rows of logits [B, C] whose argmax is the label. Ties go to the lowest
/// index and a NaN counts as the largest value, as torch.argmax does.
template <FloatInput L>
float accuracy(const L& logits, std::span<const std::int32_t> labels) {
  using S = detail::shape_of_t<L>;
  static_assert(detail::check_rank2<"solder::nn::accuracy", S>());
  static_assert(std::is_same_v<memory_space_t<std::remove_cvref_t<L>>, host>,
                "solder::nn::accuracy: the logits must be in host memory (copy them with solder::to_host)");
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
