// eval/cuda/conv_kernels.hpp: convolution kernels besides the product (nvcc only): the gather of
// a convolution's input gradient (col2im.hpp) and its launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "solder/eval/cuda/col2im.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/kernels.hpp"

namespace solder::eval::cuda {

/// Every input element of the batch, grid-stride.
template <class P>
__global__ void __launch_bounds__(flat_threads_per_block) col2im_kernel(P p) {
  const std::size_t n = p.elements();
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p.element(i);
}

/// Launches the gather on `stream`: a few blocks per multiprocessor, grid-stride over the rest.
template <class P>
void run_col2im(cudaStream_t stream, const P& p) {
  const std::size_t n = p.elements();
  if (n == 0) return;
  const std::size_t want = (n + flat_threads_per_block - 1) / flat_threads_per_block;
  const std::size_t most = std::size_t(multiprocessors()) * (2048 / flat_threads_per_block);
  col2im_kernel<P><<<unsigned(want < most ? want : most), flat_threads_per_block, 0, stream>>>(p);
  check(cudaGetLastError(), "solder::eval::cuda::run_col2im: launching the gather");
}

}  // namespace solder::eval::cuda
