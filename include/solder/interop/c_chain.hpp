// interop/c_chain.hpp: a chain as code behind a C interface sees it: one object holding the model,
// its optimizer and what a caller passes as flat arrays and plain numbers. The extern "C"
// functions solder-gen writes for a chain (generators/, docs/cuda.md) are one line each around
// these members; written over the chain's memory space, the same members serve a chain in host
// memory, which the CPU suite tests them on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/executor.hpp"
#include "solder/nn/buffer.hpp"
#include "solder/nn/criterion.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/optim/sgd.hpp"
#include "solder/tensor.hpp"

namespace solder::interop {

/// An optimizer as a C caller names it: torch.optim.SGD, Adam or AdamW with PyTorch's
/// hyperparameters (the fields a kind does not use are ignored).
struct optimizer_settings {
  enum kind_type : int { sgd = 0, adam = 1, adamw = 2 };
  int kind = sgd;
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

/// One parameter tensor: its name (torch's state_dict key), its values and gradient in the
/// chain's memory, and its float count.
struct param_tensor {
  const char* name;
  float* value;
  float* grad;
  std::size_t floats;
};

/// Model (an nn::basic_chain in any memory space) behind flat arrays: inputs [batch,
/// in_floats], outputs [batch, out_floats] and labels [batch] in the chain's memory; parameters,
/// gradients and buffers (running statistics) as host arrays laid out in params() and buffers()
/// order. Every member throws solder::error for what it refuses, before changing anything.
template <class Model>
class c_chain {
  using space = typename Model::space;
  using exec = executor<backend_of_t<space>>;

 public:
  using model_type = Model;
  static constexpr std::size_t in_floats = Model::in_features, out_floats = Model::out_features;
  /// What a training step gives: its mean loss, and the steps taken with the optimizer state.
  struct step_result {
    float loss;
    std::int64_t steps;
  };

  /// The model drawn as nn::chain(seed) draws it, in training mode.
  explicit c_chain(std::uint64_t seed) : model(seed), params_(model.params()), buffers_(model.buffers()) {
    for (const auto& p : params_) {
      tensors_.push_back({p.name.c_str(), p.value.data(), p.grad.data(), p.value.size()});
      param_floats_ += p.value.size();
    }
    for (const auto& b : buffers_) buffer_floats_ += b.value.size();
  }
  c_chain(const c_chain&) = delete;
  c_chain& operator=(const c_chain&) = delete;

  Model model;

  std::size_t param_floats() const { return param_floats_; }
  std::size_t buffer_floats() const { return buffer_floats_; }
  /// Every parameter, in params() order (the names and pointers live as long as the object).
  std::span<const param_tensor> tensors() const { return tensors_; }

  /// y [batch, out_floats] = the model on x [batch, in_floats], in its mode. backward reads x:
  /// it must stay unchanged until then.
  void forward(const float* x, float* y, std::size_t batch) {
    check_batch("forward", batch);
    model.forward_into(input(x, batch), tensor_ref<float, typename Model::widths::output_batch, space>(y, batch));
  }
  /// Every parameter's gradient (overwritten) for dL/dy = dy [batch, out_floats], after the
  /// forward of that batch.
  void backward(const float* dy, std::size_t batch) {
    check_batch("backward", batch);
    model.backward(typename Model::output_ref(dy, batch));
  }
  /// The forward of x in training mode, torch's CrossEntropyLoss (mean over the batch, with
  /// label_smoothing) against labels [batch] in the chain's memory, and the backward: the mean
  /// loss, and every gradient overwritten. A label outside [0, out_floats) is refused.
  float loss_and_backward(const float* x, const std::int32_t* labels, std::size_t batch, float label_smoothing) {
    check_batch("loss_and_backward", batch);
    if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
      solder::detail::fail("label_smoothing must be in [0, 1], got " + std::to_string(label_smoothing) +
                           "; nothing was run");
    check_labels(labels, batch);
    return model.loss_and_backward(input(x, batch), std::span<const std::int32_t>(labels, batch),
                                   nn::cross_entropy_loss{label_smoothing});
  }
  /// One step of the optimizer `s` names on every parameter, from the gradients as they are:
  /// the optimizer state (momentum, Adam's moments and step count) is kept here from step to
  /// step, and started afresh when the kind (or SGD's use of momentum) changes or after
  /// reset_optimizer. Returns the steps taken with this state.
  std::int64_t optimizer_step(const optimizer_settings& s) {
    check_settings(s);
    return std::visit([&](auto& opt) { return step(opt, s); }, optimizer);
  }
  /// Forgets the optimizer's state: the next step starts it afresh, as a new torch optimizer.
  void reset_optimizer() { optimizer = std::monostate{}; }
  /// loss_and_backward, then optimizer_step: one training step.
  step_result train_step(const float* x, const std::int32_t* labels, std::size_t batch, const optimizer_settings& s,
                         float label_smoothing) {
    check_settings(s);
    const float loss = loss_and_backward(x, labels, batch, label_smoothing);
    return {loss, optimizer_step(s)};
  }

  /// The parameters (or their gradients) into host memory, param_floats() of them; finished on
  /// return.
  void read_params(float* out) const { read(params_, out, false); }
  void read_grads(float* out) const { read(params_, out, true); }
  /// The parameters from host memory, param_floats() of them.
  void write_params(const float* in) {
    write(params_, in);
    model.parameters_changed();
  }
  /// The buffers (batch_norm's running statistics), buffer_floats() of them, to or from host
  /// memory.
  void read_buffers(float* out) const { read(buffers_, out, false); }
  void write_buffers(const float* in) {
    write(buffers_, in);
    model.parameters_changed();
  }

 private:
  std::vector<typename Model::param_type> params_;
  std::vector<nn::basic_buffer<space>> buffers_;
  std::vector<param_tensor> tensors_;
  std::size_t param_floats_ = 0, buffer_floats_ = 0;
  std::vector<std::int32_t> label_copy;  // check_labels' host copy
  std::variant<std::monostate, optim::basic_sgd<space>, optim::basic_adam<false, space>, optim::basic_adam<true, space>>
      optimizer;

  /// Every label in [0, out_floats), checked before the forward moves anything (dropout
  /// streams, running statistics), as the loss checks them; labels outside host memory are read
  /// back for it.
  void check_labels(const std::int32_t* labels, std::size_t batch) {
    std::span<const std::int32_t> readable(labels, batch);
    if constexpr (!std::is_same_v<space, host>) {
      label_copy.resize(batch);
      exec::copy_to_host(label_copy.data(), labels, batch);
      readable = label_copy;
    }
    nn::detail::check_labels("loss_and_backward", readable, batch, out_floats);
  }
  static void check_kind(const optimizer_settings& s) {
    if (s.kind != optimizer_settings::sgd && s.kind != optimizer_settings::adam && s.kind != optimizer_settings::adamw)
      solder::detail::fail("optimizer kind " + std::to_string(s.kind) + " is none of sgd (0), adam (1), adamw (2)");
  }
  typename Model::input_ref input(const float* x, std::size_t batch) const { return typename Model::input_ref(x, batch); }
  static void check_batch(const char* what, std::size_t batch) {
    if (batch == 0) solder::detail::fail(std::string(what) + ": batch must be at least 1");
  }

  static ops::sgd_options sgd_options(const optimizer_settings& s) {
    return {.lr = s.lr, .momentum = s.momentum, .dampening = s.dampening, .weight_decay = s.weight_decay,
            .nesterov = s.nesterov};
  }
  template <bool Decoupled>
  static ops::adam_options<Decoupled> adam_options(const optimizer_settings& s) {
    return {.lr = s.lr, .beta1 = s.beta1, .beta2 = s.beta2, .eps = s.eps, .weight_decay = s.weight_decay};
  }
  /// The settings checked as the optimizer they name checks them (train_step checks before the
  /// forward, so a bad setting leaves the model as it was).
  static void check_settings(const optimizer_settings& s) {
    check_kind(s);
    if (s.kind == optimizer_settings::sgd)
      optim::basic_sgd<space>::check(sgd_options(s));
    else if (s.kind == optimizer_settings::adam)
      optim::basic_adam<false, space>::check(adam_options<false>(s));
    else if (s.kind == optimizer_settings::adamw)
      optim::basic_adam<true, space>::check(adam_options<true>(s));
  }

  /// A step of the optimizer s names: the held one `opt` where it is that one (its settings
  /// replaced), else one made anew (SGD's momentum buffers exist or not from construction).
  template <class Held>
  std::int64_t step(Held& opt, const optimizer_settings& s) {
    using sgd_type = optim::basic_sgd<space>;
    if (s.kind == optimizer_settings::sgd) {
      const auto o = sgd_options(s);
      if constexpr (std::is_same_v<Held, sgd_type>)
        if ((o.momentum != 0.0f) != (opt.hyperparameters().momentum != 0.0f)) return fresh<sgd_type>(o);
      return step_with<sgd_type>(opt, o);
    }
    if (s.kind == optimizer_settings::adam) return step_with<optim::basic_adam<false, space>>(opt, adam_options<false>(s));
    return step_with<optim::basic_adam<true, space>>(opt, adam_options<true>(s));
  }
  template <class O, class Held, class Options>
  std::int64_t step_with(Held& held, const Options& o) {
    if constexpr (std::is_same_v<Held, O>) {
      held.set_hyperparameters(o);
      held.step();
      return held.steps();
    } else {
      return fresh<O>(o);
    }
  }
  template <class O, class Options>
  std::int64_t fresh(const Options& o) {
    O& made = optimizer.template emplace<O>(params_, o);
    made.step();
    return made.steps();
  }

  template <class List>
  static void read(const List& list, float* out, bool grads) {
    std::size_t at = 0;
    for (const auto& t : list) {
      const auto& view = [&]() -> const auto& {
        if constexpr (requires { t.grad; })
          return grads ? t.grad : t.value;
        else
          return t.value;
      }();
      exec::copy_to_host(out + at, view.data(), view.size());
      at += view.size();
    }
  }
  /// The values of every tensor of `list` from the host array `in`, laid out in order.
  template <class List>
  static void write(const List& list, const float* in) {
    std::size_t at = 0;
    for (const auto& t : list) {
      exec::copy_from_host(t.value.data(), in + at, t.value.size());
      at += t.value.size();
    }
  }
};

}  // namespace solder::interop
