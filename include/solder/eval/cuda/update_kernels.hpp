// eval/cuda/update_kernels.hpp: the optimizer updates of ops/optimizer.hpp (SGD with and
// without momentum, Adam and AdamW, gradient clipping and accumulation) over device arrays, one
// thread per element running the element bodies the CPU optimizers run, and the fixed-order sum
// of squares that clipping's norm needs. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/eval/cuda/row_kernels.hpp"
#include "solder/ops/optimizer.hpp"

namespace solder::eval::cuda {

/// Terms of a sum of squares: x[i]^2 in double (exact).
struct square_terms {
  const float* x;
  SOLDER_HD double operator()(std::size_t i) const {
    const double v = x[i];
    return v * v;
  }
};

/// torch.optim.SGD without momentum on n weights w and their gradients g (device).
inline void sgd_step(const ops::sgd_update& update, float* w, const float* g, std::size_t n, cudaStream_t stream) {
  detail::launch_elements(thread_elements<ops::sgd_elements>{{update, w, g}}, n, stream, "sgd_step launch");
}
/// torch.optim.SGD with momentum: w, g and the momentum buffer b, n each (device).
inline void sgd_step(const ops::sgd_update& update, float* w, const float* g, float* b, std::size_t n,
                     cudaStream_t stream) {
  detail::launch_elements(thread_elements<ops::sgd_momentum_elements>{{update, w, g, b}}, n, stream, "sgd_step launch");
}
/// torch.optim.Adam (Decoupled = false) or AdamW: w, g and the moments m and v, n each (device).
template <bool Decoupled>
void adam_step(const ops::adam_update<Decoupled>& update, float* w, const float* g, float* m, float* v, std::size_t n,
               cudaStream_t stream) {
  detail::launch_elements(thread_elements<ops::adam_elements<Decoupled>>{{update, w, g, m, v}}, n, stream, "adam_step launch");
}
/// g *= clip's scale over n gradients (device), where clip.scales() (the coefficient is below
/// 1, or NaN), as optim::clip_grad_norm applies it; otherwise nothing is launched.
inline void clip_gradients(const ops::clip_scale& clip, float* g, std::size_t n, cudaStream_t stream) {
  if (clip.scales()) detail::launch_elements(thread_elements<ops::clip_elements>{{clip, g}}, n, stream, "clip_gradients launch");
}
/// One micro-batch of gradient accumulation, as optim::grad_accumulator: folds g into the
/// running sum (n each, device); on fold.last writes the mean into g, else the sum into sum.
inline void fold_gradients(const ops::grad_fold& fold, float* sum, float* g, std::size_t n, cudaStream_t stream) {
  detail::launch_elements(thread_elements<ops::fold_elements>{{fold, sum, g, fold.last ? g : sum}}, n, stream,
                          "fold_gradients launch");
}

/// *out (device) = sum x_i^2 over n floats (device), in double in an order fixed by n (the
/// two-pass block_total of total.hpp): the same bits on every run. For clipping's norm over
/// several arrays, sum each into its own slot and total() the slots.
inline void sum_of_squares(const float* x, std::size_t n, double* out, cudaStream_t stream) {
  detail::sum_terms(square_terms{x}, n, out, stream, "sum_of_squares launch");
}

}  // namespace solder::eval::cuda
