// eval/cuda/image_kernels.hpp: the CUDA backend's kernels of image layers besides the product
// (nvcc only): a convolution's input gradient gathered (col2im.hpp), batch normalization (a
// warp per channel, batch_norm.hpp) and pooling (a thread per element, pool.hpp), each a
// launch of the host+device bodies the host suite tests, on a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "solder/config.hpp"
#include "solder/eval/cuda/batch_norm.hpp"
#include "solder/eval/cuda/col2im.hpp"
#include "solder/eval/cuda/pool.hpp"
#include "solder/eval/cuda/row_kernels.hpp"

namespace solder::eval::cuda {

/// The gather of col2im.hpp over every input element.
template <class G, std::size_t Cin, std::size_t Kh, std::size_t Kw>
void run_col2im(cudaStream_t stream, const col2im_pass<G, Cin, Kh, Kw>& p) {
  detail::launch_elements(p, p.elements(), stream, "solder::eval::cuda::run_col2im: launching the gather");
}

/// Batch normalization in training mode over x [batch, C, HW]: y, the saved mean and rstd, the
/// running statistics moved. Throws solder::error where a channel has fewer than 2 values.
template <std::size_t HW>
void batch_norm_train_forward(const batch_norm_train_forward_body<HW>& body, cudaStream_t stream) {
  if (body.batch * HW < 2)
    solder::detail::fail("solder::eval::cuda::batch_norm_train_forward: expected more than 1 value per channel when "
                         "training, got " + std::to_string(body.batch * HW));
  detail::launch_rows(body, body.channels, stream, "solder::eval::cuda::batch_norm_train_forward: launching");
}

/// Its backward: dx, and the weight and bias gradients (overwritten).
template <std::size_t HW>
void batch_norm_train_backward(const batch_norm_train_backward_body<HW>& body, cudaStream_t stream) {
  detail::launch_rows(body, body.channels, stream, "solder::eval::cuda::batch_norm_train_backward: launching");
}

/// A normalization folded into the convolution before it (evaluation mode): W' and b'.
template <std::size_t PerChannel>
void batch_norm_fold(const batch_norm_fold_body<PerChannel>& body, cudaStream_t stream) {
  detail::launch_elements(body, body.elements(), stream, "solder::eval::cuda::batch_norm_fold: launching");
}

/// Pooling forward over `batch` samples of g's geometry.
template <pool_kind Kind>
void pool_forward(const pool_forward_body<Kind>& body, std::size_t batch, cudaStream_t stream) {
  detail::launch_elements(body, batch * std::size_t(body.g.channels * body.g.ho * body.g.wo), stream,
                          "solder::eval::cuda::pool_forward: launching");
}

/// Pooling backward over `batch` samples: every dx element written (zero where no window
/// reads it).
template <pool_kind Kind>
void pool_backward(const pool_backward_body<Kind>& body, std::size_t batch, cudaStream_t stream) {
  detail::launch_elements(body, batch * std::size_t(body.g.channels * body.g.h * body.g.w), stream,
                          "solder::eval::cuda::pool_backward: launching");
}

}  // namespace solder::eval::cuda
