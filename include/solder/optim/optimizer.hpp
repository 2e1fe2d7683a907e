// optim/optimizer.hpp: what every optimizer shares: the parameter view (`param`), the view of
// its state (`state_tensor`) and restoring it (`restore_state`), zero_grad, gradient-norm
// clipping and gradient accumulation over micro-batches. Each is written once over the memory
// space its tensors live in (host by default; `basic_param<device>` for CUDA memory): the math
// is ops/optimizer.hpp's element bodies, run by executor<backend_of_t<Space>>'s verbs.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/assign.hpp"
#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/executor.hpp"
#include "solder/ops/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::optim {

/// A trainable tensor as an optimizer sees it: flat views of its values and of its gradient
/// (the same number of elements, both in memory of Space), a name for messages and files, and
/// its shape (for files: a linear weight is [Out, In]).
template <class Space = host>
struct basic_param {
  using space = Space;
  using view = tensor_ref<float, shape<dyn>, Space>;
  std::string name;
  view value;
  view grad;
  std::vector<std::size_t> dims;

  // A constructor, not default member initializers: GCC 12 crashes on the latter in a class
  // template brace-initialized without them.
  basic_param(std::string name, view value, view grad, std::vector<std::size_t> dims = {})
      : name(std::move(name)), value(value), grad(grad), dims(std::move(dims)) {}
};
/// A parameter in host memory, what the CPU layers give.
using param = basic_param<host>;

namespace detail {
/// make_param's work for flat arrays, one function per memory space: dims are the `rank`
/// extents from `extents`, the batch as `batch` where an extent is dyn.
template <class Space>
basic_param<Space> flat_param(std::string name, float* value, std::size_t values, float* grad, std::size_t grads,
                              const std::size_t* extents, std::size_t rank, std::size_t batch) {
  if (values != grads)
    solder::detail::fail_message({"solder::optim::make_param: '", name, "' has ", values, " values but ", grads, " gradients"});
  std::vector<std::size_t> dims(extents, extents + rank);
  for (std::size_t& d : dims)
    if (d == dyn) d = batch;
  using view = typename basic_param<Space>::view;
  return {std::move(name), view(value, values), view(grad, grads), std::move(dims)};
}
}  // namespace detail

/// A param viewing a tensor (or writable view) and its gradient, of any shape, flattened; in
/// the tensor's memory space.
template <class V, class G>
  requires requires(V& v, G& g) {
    { v.data() } -> std::same_as<float*>;
    { g.data() } -> std::same_as<float*>;
    { v.size() } -> std::convertible_to<std::size_t>;
    { g.size() } -> std::convertible_to<std::size_t>;
  }
basic_param<memory_space_t<V>> make_param(std::string name, V& value, G& grad) {
  using Space = memory_space_t<V>;
  static_assert(std::is_same_v<Space, memory_space_t<G>>,
                "solder::optim::make_param: a value and its gradient must live in the same memory space");
  if constexpr (requires { typename V::shape_type; }) {
    using S = typename V::shape_type;
    std::size_t batch = 1;
    if constexpr (S::dynamic) batch = value.batch();
    return detail::flat_param<Space>(std::move(name), value.data(), value.size(), grad.data(), grad.size(),
                                     S::extents.data(), S::rank, batch);
  } else {
    const std::size_t flat = value.size();
    return detail::flat_param<Space>(std::move(name), value.data(), value.size(), grad.data(), grad.size(), &flat, 1,
                                     1);
  }
}

/// One tensor of an optimizer's state, named as torch's optimizer.state_dict() names it
/// ("state.0.exp_avg": parameter 0's first moment), as a flat writable view (in the
/// optimizer's memory space) with its parameter's shape.
template <class Space = host>
struct basic_state_tensor {
  using view = tensor_ref<float, shape<dyn>, Space>;
  std::string name;
  view value;
  std::vector<std::size_t> dims;

  basic_state_tensor(std::string name, view value, std::vector<std::size_t> dims = {})
      : name(std::move(name)), value(value), dims(std::move(dims)) {}
};
using state_tensor = basic_state_tensor<host>;

/// A state tensor to restore: its name, as the optimizer's state() names it, and its elements.
struct saved_state {
  std::string name;
  std::span<const float> values;
};

/// An optimizer whose state can be saved and restored (sgd, adam, adamw): its kind ("sgd"),
/// its state tensors as writable views, its step count, and its hyperparameters (an `options`
/// aggregate) to read and to set.
template <class O>
concept StatefulOptimizer = MemorySpace<typename O::space> && requires(O& o, const O& c, std::int64_t t,
                                                                       const typename O::options& h) {
  { O::kind } -> std::convertible_to<std::string_view>;
  { o.state() } -> std::same_as<std::vector<basic_state_tensor<typename O::space>>>;
  { c.steps() } -> std::same_as<std::int64_t>;
  o.set_steps(t);
  { c.hyperparameters() } -> std::convertible_to<const typename O::options&>;
  o.set_hyperparameters(h);
  { c.params() } -> std::convertible_to<std::span<const basic_param<typename O::space>>>;
};

namespace detail {

/// "state.<k>.<what>", the name torch's optimizer.state_dict() gives parameter k's state.
inline std::string state_name(std::size_t k, std::string_view what) {
  return "state." + std::to_string(k) + "." + std::string(what);
}

/// Every param non-empty, with as many gradients as values; `who` names the caller.
template <class Space>
void check_params(const char* who, std::span<const basic_param<Space>> params) {
  if (params.empty()) solder::detail::fail_message({who, ": got an empty parameter list"});
  for (const basic_param<Space>& p : params) {
    if (!p.value.data() || !p.grad.data())
      solder::detail::fail_message({who, ": parameter '", p.name, "' has no value or no gradient tensor"});
    if (p.value.size() != p.grad.size())
      solder::detail::fail_message(
          {who, ": parameter '", p.name, "' has ", p.value.size(), " values but ", p.grad.size(), " gradients"});
  }
}

/// One flat state buffer (momentum, m, v) per param, zero-filled, allocated once, in Space.
template <class Space>
std::vector<tensor<float, shape<dyn>, Space>> make_state(std::span<const basic_param<Space>> params) {
  std::vector<tensor<float, shape<dyn>, Space>> state;
  state.reserve(params.size());
  for (const basic_param<Space>& p : params) state.emplace_back(p.value.size());
  return state;
}

/// sum x_i^2 of n floats in Space, in double (ops::square_sum's blocks, added by the backend's
/// sum_blocks in an order fixed by n): the same bits for any thread count.
template <class Space>
double sum_of_squares(const float* x, std::size_t n) {
  return executor<backend_of_t<Space>>::sum_blocks(ops::square_sum::blocks(n), ops::square_sum::block,
                                                   ops::square_sum_blocks{x, n});
}

}  // namespace detail

/// Restores an optimizer's state, as torch's optimizer.load_state_dict restores state: the
/// elements of every tensor of opt.state(), each given once by name with as many elements, and
/// the step count. All or nothing: a tensor missing, unknown to the optimizer, given twice or
/// of another size, or a negative step count, is a solder::error naming it, and the optimizer
/// is left unchanged. The hyperparameters are not touched (set_hyperparameters sets them).
template <StatefulOptimizer Optimizer>
void restore_state(Optimizer& opt, std::span<const saved_state> saved, std::int64_t steps) {
  using space = typename Optimizer::space;
  using state_type = basic_state_tensor<space>;
  const std::string who = "solder::optim::restore_state (" + std::string(std::string_view(Optimizer::kind)) + ")";
  if (steps < 0) solder::detail::fail_message({who, ": the step count must be >= 0, got ", steps});
  const std::vector<state_type> state = opt.state();
  std::vector<const saved_state*> source(state.size(), nullptr);
  for (const saved_state& s : saved) {
    const auto it = std::find_if(state.begin(), state.end(), [&](const state_type& t) { return t.name == s.name; });
    if (it == state.end())
      solder::detail::fail_message({who, ": the optimizer has no state tensor '", s.name, "' (it has ", state.size(), ")"});
    const std::size_t k = std::size_t(it - state.begin());
    if (source[k]) solder::detail::fail_message({who, ": state tensor '", s.name, "' is given twice"});
    if (s.values.size() != it->value.size())
      solder::detail::fail_message({who, ": state tensor '", s.name, "' has ", s.values.size(),
                                    " elements; the optimizer's has ", it->value.size()});
    source[k] = &s;
  }
  for (std::size_t k = 0; k < state.size(); ++k)
    if (!source[k]) solder::detail::fail_message({who, ": state tensor '", state[k].name, "' is missing"});
  for (std::size_t k = 0; k < state.size(); ++k)
    executor<backend_of_t<space>>::copy_from_host(state[k].value.data(), source[k]->values.data(),
                                                  state[k].value.size());
  opt.set_steps(steps);
}

/// Sets every gradient to 0 (for callers that accumulate into grads; solder's layers
/// overwrite theirs).
template <class Space>
void zero_grad(std::span<const basic_param<Space>> params) {
  for (const basic_param<Space>& p : params)
    executor<backend_of_t<Space>>::elements(p.grad.size(), ops::fill_elements{p.grad.data(), 0.0f});
}
template <class Space>
void zero_grad(const std::vector<basic_param<Space>>& params) {
  zero_grad(std::span<const basic_param<Space>>(params));
}

/// Scales all gradients together so that their global 2-norm is at most max_norm, as
/// torch.nn.utils.clip_grad_norm_(params, max_norm):
///   norm = sqrt(sum over params of sum g^2)   (in double, in a fixed order)
///   scale = max_norm / (norm + 1e-6), applied to every gradient when < 1.
/// Returns the norm before clipping. A NaN or infinite norm is a solder::error naming the
/// first parameter whose gradient is not finite, unless error_if_nonfinite is false; then,
/// as in PyTorch, the gradients are scaled by the NaN (or 0) that the formula gives.
template <class Space>
float clip_grad_norm(std::span<const basic_param<Space>> params, float max_norm, bool error_if_nonfinite = true) {
  constexpr const char* who = "solder::optim::clip_grad_norm";
  if (!(max_norm >= 0.0f))
    solder::detail::fail_message({who, ": max_norm must be >= 0, got ", max_norm});
  detail::check_params(who, params);
  double total = 0;
  const basic_param<Space>* culprit = nullptr;
  for (const basic_param<Space>& p : params) {
    const double s = detail::sum_of_squares<Space>(p.grad.data(), p.grad.size());
    if (!std::isfinite(s) && !culprit) culprit = &p;
    total += s;
  }
  const double norm = std::sqrt(total);
  if (culprit && error_if_nonfinite)
    solder::detail::fail_message({who, ": the gradient norm is ", std::isnan(norm) ? "NaN" : "infinite", "; parameter '",
                                  culprit->name,
                                  "' has a non-finite gradient (pass error_if_nonfinite = false to clip anyway)"});
  const ops::clip_scale clip(max_norm, norm);
  if (clip.scales())
    for (const basic_param<Space>& p : params)
      executor<backend_of_t<Space>>::elements(p.grad.size(), ops::clip_elements{clip, p.grad.data()});
  return float(norm);
}
template <class Space>
float clip_grad_norm(const std::vector<basic_param<Space>>& params, float max_norm, bool error_if_nonfinite = true) {
  return clip_grad_norm(std::span<const basic_param<Space>>(params), max_norm, error_if_nonfinite);
}

/// Gradient accumulation over N micro-batches: the layers' backward passes write (overwrite)
/// each micro-batch's gradient, then accumulate() folds it into a running sum. The N-th call
/// writes grad = (g_1 + ... + g_N) / N, the gradient of the mean loss over the N equal
/// micro-batches, and returns true: time to clip and step.
///
///   for (k = 0; ; ++k) { forward; loss; backward;  if (acc.accumulate()) opt.step(); }
///
/// Holds one sum buffer per param (none when N = 1), allocated once; a call is one pass.
template <class Space = host>
class basic_grad_accumulator {
 public:
  basic_grad_accumulator(std::vector<basic_param<Space>> params, int micro_batches)
      : params_(std::move(params)), micro_batches_(micro_batches) {
    detail::check_params<Space>("solder::optim::grad_accumulator", params_);
    if (micro_batches < 1)
      solder::detail::fail_message({"solder::optim::grad_accumulator: micro_batches must be >= 1, got ", micro_batches});
    if (micro_batches > 1) sums_ = detail::make_state<Space>(params_);
  }

  /// Folds the gradients just written into this round; on its last micro-batch writes the
  /// mean gradient into each param's grad, starts a new round and returns true.
  bool accumulate() {
    const bool last = pending_ + 1 == micro_batches_;
    if (micro_batches_ > 1) {
      const ops::grad_fold fold{float(micro_batches_), pending_ == 0, last};
      for (std::size_t k = 0; k < params_.size(); ++k) {
        float* g = params_[k].grad.data();
        float* s = sums_[k].data();
        // The mean replaces the gradient; a partial sum stays in s. The first fold reads no sum.
        executor<backend_of_t<Space>>::elements(params_[k].grad.size(), ops::fold_elements{fold, s, g, last ? g : s});
      }
    }
    pending_ = last ? 0 : pending_ + 1;
    return last;
  }

  /// Drops a partly accumulated round.
  void reset() { pending_ = 0; }
  /// Micro-batches per step, N.
  int micro_batches() const { return micro_batches_; }
  /// Micro-batches accumulated in the current round so far (0 after a completed round).
  int pending() const { return pending_; }

 private:
  std::vector<basic_param<Space>> params_;
  std::vector<tensor<float, shape<dyn>, Space>> sums_;
  int micro_batches_;
  int pending_ = 0;
};
using grad_accumulator = basic_grad_accumulator<host>;

}  // namespace solder::optim
