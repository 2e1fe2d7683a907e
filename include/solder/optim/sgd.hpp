// optim/sgd.hpp: stochastic gradient descent with momentum, dampening, Nesterov momentum and
// L2 weight decay, with torch.optim.SGD's semantics; one fused pass per parameter tensor, the
// per-element update being ops::sgd_update. Written once over the memory space of its
// parameters: `sgd` for host memory, `basic_sgd<device>` for CUDA memory.
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

/// torch.optim.SGD. Per element, with g the gradient and b the momentum buffer:
///   g = g + weight_decay w
///   b = g on the first step, else momentum b + (1 - dampening) g     (when momentum != 0)
///   g = nesterov ? g + momentum b : b                                 (when momentum != 0)
///   w = w - lr g
template <class Space = host>
class basic_sgd {
 public:
  using space = Space;
  using param_type = basic_param<Space>;
  /// What checkpoints call this optimizer.
  static constexpr std::string_view kind = "sgd";

  /// The hyperparameters, with PyTorch's names and defaults (lr has none): ops/optimizer.hpp's,
  /// which the CUDA backend's train steps take too.
  using options = ops::sgd_options;

  /// Allocates the momentum buffers (when momentum != 0), once; checks the options as
  /// PyTorch does (Nesterov needs momentum > 0 and zero dampening).
  basic_sgd(std::vector<param_type> params, options opt) : params_(std::move(params)), opt_(opt) {
    detail::check_params<Space>("solder::optim::sgd", params_);
    check(opt_);
    if (opt_.momentum != 0.0f) momentum_ = detail::make_state<Space>(params_);
  }

  /// Throws solder::error, naming the option, for options PyTorch refuses (the CUDA backend's
  /// generated train steps check the same).
  static void check(const options& opt) { options::check(opt); }

  /// One update of every parameter from its gradient.
  void step() {
    const ops::sgd_update update(opt_.lr, opt_.momentum, opt_.dampening, opt_.weight_decay, opt_.nesterov, steps_ == 0);
    using exec = executor<backend_of_t<Space>>;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      float* w = params_[k].value.data();
      const float* g = params_[k].grad.data();
      if (momentum_.empty())
        exec::elements(params_[k].value.size(), ops::sgd_elements{update, w, g});
      else
        exec::elements(params_[k].value.size(), ops::sgd_momentum_elements{update, w, g, momentum_[k].data()});
    }
    ++steps_;
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
  /// load_state_dict restores the param group). Checked as the constructor checks them; the
  /// momentum buffers exist or not from construction, so momentum may not change between zero
  /// and non-zero. On error nothing changes.
  void set_hyperparameters(const options& opt) {
    check(opt);
    if ((opt.momentum != 0.0f) != (opt_.momentum != 0.0f))
      solder::detail::fail_message(
          {"solder::optim::sgd::set_hyperparameters: momentum ",
           opt_.momentum != 0.0f ? "is non-zero; it cannot become 0" : "is 0; it cannot become non-zero",
           " (the momentum buffers are made at construction); construct the optimizer with the momentum you need"});
    opt_ = opt;
  }
  /// Steps taken so far.
  std::int64_t steps() const { return steps_; }
  /// Sets the step count (restoring a checkpoint): with momentum, step 0 starts the buffers
  /// afresh (b = g), any later step continues them.
  void set_steps(std::int64_t t) {
    if (t < 0) solder::detail::fail_message({"solder::optim::sgd::set_steps: the step count must be >= 0, got ", t});
    steps_ = t;
  }
  std::span<const param_type> params() const { return params_; }
  /// Parameter k's momentum buffer (PyTorch's state['momentum_buffer']); needs momentum != 0.
  tensor_ref<const float, shape<dyn>, Space> momentum_buffer(std::size_t k) const {
    SOLDER_ASSERT(!momentum_.empty(), "solder::optim::sgd: no momentum buffer: momentum is 0");
    SOLDER_ASSERT(k < momentum_.size(), "solder::optim::sgd: momentum_buffer index out of range");
    return momentum_[k].ref();
  }
  /// The state as torch's state_dict names it, writable: "state.<k>.momentum_buffer" for every
  /// parameter k, shaped as the parameter; none when momentum is 0 (torch keeps none either).
  std::vector<basic_state_tensor<Space>> state() {
    std::vector<basic_state_tensor<Space>> out;
    for (std::size_t k = 0; k < momentum_.size(); ++k)
      out.push_back({detail::state_name(k, "momentum_buffer"), momentum_[k].ref(), params_[k].dims});
    return out;
  }

 private:
  static void check_lr(float lr) { options::check_lr(lr); }

  std::vector<param_type> params_;
  options opt_;
  std::vector<tensor<float, shape<dyn>, Space>> momentum_;
  std::int64_t steps_ = 0;
};

/// torch.optim.SGD over host memory.
using sgd = basic_sgd<host>;

static_assert(StatefulOptimizer<sgd>);

}  // namespace solder::optim
