// optim/adam.hpp: Adam (L2 weight decay) and AdamW (decoupled weight decay), with
// torch.optim.Adam's and torch.optim.AdamW's semantics; one fused pass per parameter tensor, the
// per-element update being ops::adam_update. Written once over the memory space of its
// parameters: `adam`, `adamw` for host memory, `basic_adam<true, device>` for CUDA memory.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "solder/ops/optimizer.hpp"
#include "solder/optim/optimizer.hpp"

namespace solder::optim {

/// Adam and AdamW; use the aliases `adam` and `adamw`. Per element at step t = 1, 2, ...:
///   w = w (1 - lr weight_decay)              (AdamW: decoupled decay)
///   g = g + weight_decay w                   (Adam: L2 decay through the gradient)
///   m = m + (1 - beta1) (g - m)              (torch's lerp, = beta1 m + (1 - beta1) g)
///   v = beta2 v + (1 - beta2) g^2
///   w = w - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// eps is added outside the square root, after the bias correction, as PyTorch does.
template <bool Decoupled, class Space = host>
class basic_adam {
 public:
  using space = Space;
  using param_type = basic_param<Space>;
  static constexpr const char* name = ops::adam_options<Decoupled>::name;
  /// What checkpoints call this optimizer.
  static constexpr std::string_view kind = Decoupled ? "adamw" : "adam";

  /// The hyperparameters, with PyTorch's names and defaults (AdamW decays by 1e-2 by default):
  /// ops/optimizer.hpp's, which the CUDA backend's train steps take too.
  using options = ops::adam_options<Decoupled>;

  /// Allocates m and v (zero) for every parameter, once.
  basic_adam(std::vector<param_type> params, options opt) : params_(std::move(params)), opt_(opt) {
    detail::check_params<Space>(name, params_);
    check(opt_);
    m_ = detail::make_state<Space>(params_);
    v_ = detail::make_state<Space>(params_);
  }

  /// Throws solder::error, naming the option, for options PyTorch refuses (the CUDA backend's
  /// generated train steps check the same).
  static void check(const options& opt) { options::check(opt); }
  explicit basic_adam(std::vector<param_type> params) : basic_adam(std::move(params), options{}) {}

  /// One update of every parameter from its gradient.
  void step() {
    ++steps_;
    const ops::adam_update<Decoupled> update(opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, steps_);
    for (std::size_t k = 0; k < params_.size(); ++k)
      executor<backend_of_t<Space>>::elements(
          params_[k].value.size(),
          ops::adam_elements<Decoupled>{update, params_[k].value.data(), params_[k].grad.data(), m_[k].data(), v_[k].data()});
  }

  /// Sets every gradient to 0.
  void zero_grad() { optim::zero_grad(params_); }

  float lr() const { return opt_.lr; }
  /// Sets the learning rate of later steps (what a schedule calls; see optim/schedule.hpp).
  void set_lr(float lr) {
    check_lr(lr);
    opt_.lr = lr;
  }
  const options& hyperparameters() const { return opt_; }
  /// Replaces every hyperparameter (what restoring a checkpoint does, as torch's
  /// load_state_dict restores the param group), checked as the constructor checks them; on
  /// error nothing changes.
  void set_hyperparameters(const options& opt) {
    check(opt);
    opt_ = opt;
  }
  /// Steps taken so far (PyTorch's state['step']).
  std::int64_t steps() const { return steps_; }
  /// Sets the step count t (restoring a checkpoint); the next step is t + 1, bias-corrected so.
  void set_steps(std::int64_t t) {
    if (t < 0) solder::detail::fail_message({name, "::set_steps: the step count must be >= 0, got ", t});
    steps_ = t;
  }
  std::span<const param_type> params() const { return params_; }
  /// Parameter k's first moment m (PyTorch's state['exp_avg']).
  tensor_ref<const float, shape<dyn>, Space> exp_avg(std::size_t k) const { return state_of(m_, k); }
  /// Parameter k's second moment v (PyTorch's state['exp_avg_sq']).
  tensor_ref<const float, shape<dyn>, Space> exp_avg_sq(std::size_t k) const { return state_of(v_, k); }
  /// The state as torch's state_dict names it, writable: "state.<k>.exp_avg" and
  /// "state.<k>.exp_avg_sq" for every parameter k, shaped as the parameter. (torch keeps
  /// state.<k>.step per parameter; here the one count is steps().)
  std::vector<basic_state_tensor<Space>> state() {
    std::vector<basic_state_tensor<Space>> out;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      out.push_back({detail::state_name(k, "exp_avg"), m_[k].ref(), params_[k].dims});
      out.push_back({detail::state_name(k, "exp_avg_sq"), v_[k].ref(), params_[k].dims});
    }
    return out;
  }

 private:
  static void check_lr(float lr) { options::check_lr(lr); }
  using state_buffers = std::vector<tensor<float, shape<dyn>, Space>>;
  static tensor_ref<const float, shape<dyn>, Space> state_of(const state_buffers& s, std::size_t k) {
    if (k >= s.size())
      solder::detail::fail_message({name, ": parameter index ", k, " is out of range (", s.size(), " parameters)"});
    return s[k].ref();
  }

  std::vector<param_type> params_;
  options opt_;
  state_buffers m_, v_;
  std::int64_t steps_ = 0;
};

/// torch.optim.Adam: weight decay is L2, added to the gradient.
using adam = basic_adam<false>;
/// torch.optim.AdamW: weight decay is decoupled, w *= 1 - lr weight_decay before the update.
using adamw = basic_adam<true>;

static_assert(StatefulOptimizer<adam> && StatefulOptimizer<adamw>);

}  // namespace solder::optim
