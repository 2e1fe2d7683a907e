// eval/cuda/optimizer_step.hpp: one optimizer step over a flat array of parameters on the GPU
// (nvcc only), as the CPU optimizers (torch.optim.SGD, Adam, AdamW) take it: the same checks of
// the settings and the same per-element functors, both from ops/optimizer.hpp (the updates run
// by update_kernels.hpp), the same step count. What a generated chain's train step calls.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "solder/config.hpp"
#include "solder/eval/cuda/update_kernels.hpp"
#include "solder/ops/optimizer.hpp"

namespace solder::eval::cuda {

enum class optimizer_kind { sgd, adam, adamw };

/// An optimizer's settings and step count, torch's names; a field an optimizer does not use is
/// ignored.
struct optimizer_settings {
  optimizer_kind kind = optimizer_kind::sgd;
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;   // SGD
  float dampening = 0.0f;  // SGD
  bool nesterov = false;   // SGD
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // Adam, AdamW
  std::int64_t steps = 0;  // steps taken so far (torch's state['step'])
};

/// Throws solder::error for what the CPU optimizer of that kind refuses, a negative step count,
/// and a null state array where the optimizer keeps state (SGD's momentum buffer; Adam's m, v).
inline void check_optimizer(const optimizer_settings& o, const float* state) {
  if (o.steps < 0) solder::detail::fail("solder: optimizer steps must be >= 0, got " + std::to_string(o.steps));
  if (o.kind == optimizer_kind::sgd) {
    ops::sgd_options::check({o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov});
    if (o.momentum != 0.0f && !state)
      solder::detail::fail(std::string(ops::sgd_options::name) +
                           ": the optimizer state is a null pointer; the momentum buffer lives there");
    return;
  }
  if (o.kind == optimizer_kind::adam)
    ops::adam_options<false>::check({o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
  else
    ops::adam_options<true>::check({o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
  if (!state)
    solder::detail::fail(std::string(o.kind == optimizer_kind::adam ? ops::adam_options<false>::name
                                                                     : ops::adam_options<true>::name) +
                         ": the optimizer state is a null pointer; m and v live there");
}

/// One update of the n parameters from their gradients, queued on `stream`, then steps + 1:
/// Adam and AdamW at step t = steps + 1, SGD's first-step rule where steps is 0. `state`: SGD's
/// momentum buffer (n floats; none where momentum is 0, as torch keeps none), or Adam's m then v
/// (2 n floats).
inline void optimizer_step(optimizer_settings& o, float* params, const float* grads, float* state, std::size_t n,
                           cudaStream_t stream) {
  if (o.kind == optimizer_kind::sgd) {
    const ops::sgd_update update(o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.steps == 0);
    if (o.momentum == 0.0f)
      sgd_step(update, params, grads, n, stream);
    else
      sgd_step(update, params, grads, state, n, stream);
  } else if (o.kind == optimizer_kind::adam) {
    adam_step(ops::adam_update<false>(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.steps + 1), params, grads, state,
              state + n, n, stream);
  } else {
    adam_step(ops::adam_update<true>(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.steps + 1), params, grads, state,
              state + n, n, stream);
  }
  ++o.steps;
}

}  // namespace solder::eval::cuda
