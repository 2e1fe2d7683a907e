// optim/adam.hpp: Adam (L2 weight decay) and AdamW (decoupled weight decay), with
// torch.optim.Adam's and torch.optim.AdamW's semantics; one fused pass per parameter tensor.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "solder/optim/optimizer.hpp"

namespace solder::optim {

/// Adam and AdamW; use the aliases `adam` and `adamw`. Per element at step t = 1, 2, ...:
///   w = w (1 - lr weight_decay)              (AdamW: decoupled decay)
///   g = g + weight_decay w                   (Adam: L2 decay through the gradient)
///   m = m + (1 - beta1) (g - m)              (torch's lerp, = beta1 m + (1 - beta1) g)
///   v = beta2 v + (1 - beta2) g^2
///   w = w - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// eps is added outside the square root, after the bias correction, as PyTorch does.
template <bool Decoupled>
class basic_adam {
 public:
  static constexpr const char* name = Decoupled ? "solder::optim::adamw" : "solder::optim::adam";

  /// The hyperparameters, with PyTorch's names and defaults (AdamW decays by 1e-2 by default).
  struct options {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = Decoupled ? 1e-2f : 0.0f;
  };

  /// Allocates m and v (zero) for every parameter, once.
  basic_adam(std::vector<param> params, options opt) : params_(std::move(params)), opt_(opt) {
    detail::check_params(name, params_);
    check_lr(opt_.lr);
    if (!(opt_.beta1 >= 0.0f && opt_.beta1 < 1.0f))
      solder::detail::fail(std::string(name) + ": beta1 must be in [0, 1), got " + std::to_string(opt_.beta1));
    if (!(opt_.beta2 >= 0.0f && opt_.beta2 < 1.0f))
      solder::detail::fail(std::string(name) + ": beta2 must be in [0, 1), got " + std::to_string(opt_.beta2));
    if (!(opt_.eps >= 0.0f)) solder::detail::fail(std::string(name) + ": eps must be >= 0, got " + std::to_string(opt_.eps));
    if (!(opt_.weight_decay >= 0.0f))
      solder::detail::fail(std::string(name) + ": weight_decay must be >= 0, got " + std::to_string(opt_.weight_decay));
    m_ = detail::make_state(params_);
    v_ = detail::make_state(params_);
  }
  explicit basic_adam(std::vector<param> params) : basic_adam(std::move(params), options{}) {}

  /// One update of every parameter from its gradient.
  void step() {
    ++steps_;
    // The per-step scalars in double, rounded once to float, as PyTorch's Python floats are.
    const double t = double(steps_);
    const double bias1 = 1.0 - std::pow(double(opt_.beta1), t);
    const double bias2 = 1.0 - std::pow(double(opt_.beta2), t);
    const float step_size = float(double(opt_.lr) / bias1);
    const float bias2_sqrt = float(std::sqrt(bias2));
    const float decay = Decoupled ? float(1.0 - double(opt_.lr) * double(opt_.weight_decay)) : opt_.weight_decay;
    const bool has_decay = opt_.weight_decay != 0.0f;
    const float one_minus_beta1 = float(1.0 - double(opt_.beta1));
    const float one_minus_beta2 = float(1.0 - double(opt_.beta2));
    const float beta2 = opt_.beta2, eps = opt_.eps;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      float* w = params_[k].value.data();
      const float* gp = params_[k].grad.data();
      float* m = m_[k].data();
      float* v = v_[k].data();
      detail::for_each_element(params_[k].value.size(), [=]<class V>(std::size_t i) {
        V wi = detail::load<V>(w + i);
        V g = detail::load<V>(gp + i);
        if (has_decay) {
          if constexpr (Decoupled)
            wi = wi * V(decay);
          else
            g = g + V(decay) * wi;
        }
        const V mi = detail::load<V>(m + i);
        const V mn = mi + V(one_minus_beta1) * (g - mi);
        const V vn = detail::load<V>(v + i) * V(beta2) + V(one_minus_beta2) * g * g;
        detail::store(m + i, mn);
        detail::store(v + i, vn);
        const V denom = simd::sqrt(vn) / V(bias2_sqrt) + V(eps);
        detail::store(w + i, wi - V(step_size) * (mn / denom));
      });
    }
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
  /// Steps taken so far (PyTorch's state['step']).
  std::int64_t steps() const { return steps_; }
  std::span<const param> params() const { return params_; }
  /// Parameter k's first moment m (PyTorch's state['exp_avg']).
  tensor_ref<const float, shape<dyn>> exp_avg(std::size_t k) const { return state(m_, k); }
  /// Parameter k's second moment v (PyTorch's state['exp_avg_sq']).
  tensor_ref<const float, shape<dyn>> exp_avg_sq(std::size_t k) const { return state(v_, k); }

 private:
  static void check_lr(float lr) {
    if (!(lr >= 0.0f)) solder::detail::fail(std::string(name) + ": lr must be >= 0, got " + std::to_string(lr));
  }
  static tensor_ref<const float, shape<dyn>> state(const std::vector<tensor<float, shape<dyn>>>& s, std::size_t k) {
    if (k >= s.size())
      solder::detail::fail(std::string(name) + ": parameter index " + std::to_string(k) + " is out of range (" +
                           std::to_string(s.size()) + " parameters)");
    return s[k].ref();
  }

  std::vector<param> params_;
  options opt_;
  std::vector<tensor<float, shape<dyn>>> m_, v_;
  std::int64_t steps_ = 0;
};

/// torch.optim.Adam: weight decay is L2, added to the gradient.
using adam = basic_adam<false>;
/// torch.optim.AdamW: weight decay is decoupled, w *= 1 - lr weight_decay before the update.
using adamw = basic_adam<true>;

}  // namespace solder::optim
