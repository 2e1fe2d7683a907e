// eval/cuda/product_kernel.hpp: the CUDA backend's product kernel and its launch (nvcc only):
// the __global__ template that runs a product pass of eval/cuda/product.hpp, its phases
// separated by barriers, and run_product, which checks the grid and launches it on a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "solder/config.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/product.hpp"

namespace solder::eval::cuda {

/// The warp-wide multiplies of an mma tiling (product.hpp) on the device: one mma.sync each,
/// in the fragment layouts the tiling loads (sm_80 and later).
struct device_warp {
  __device__ void mma_tf32(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) const {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  __device__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) const {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

/// One block of a product pass: per slice of K, stage the panels, barrier, accumulate,
/// barrier (the next slice overwrites the panels); then every thread's elements through the
/// epilogue.
template <class P>
__global__ void __launch_bounds__(P::threads) product_kernel(P p) {
  __shared__ float shared[P::shared_floats];
  auto acc = p.start();
  const std::size_t slices = p.slices();
  for (std::size_t s = 0; s < slices; ++s) {
    p.stage(blockIdx.x, blockIdx.y, threadIdx.x, s, shared);
    __syncthreads();
    p.accumulate(threadIdx.x, shared, acc, device_warp{});
    __syncthreads();
  }
  p.finish(blockIdx.x, blockIdx.y, threadIdx.x, acc);
}

/// Launches a product pass on `stream`. Throws solder::error where the grid does not fit
/// CUDA's limits, cuda_error where the launch fails.
template <class P>
void run_product(cudaStream_t stream, const P& p) {
  if (p.M == 0) return;
  constexpr std::size_t max_grid_y = 65535;
  if (p.grid_rows() > max_grid_y)
    solder::detail::fail("solder::eval::cuda::run_product: " + std::to_string(p.M) + " rows need " +
                         std::to_string(p.grid_rows()) + " row blocks; CUDA allows " + std::to_string(max_grid_y));
  const dim3 grid(unsigned(p.grid_cols()), unsigned(p.grid_rows()));
  product_kernel<P><<<grid, P::threads, 0, stream>>>(p);
  check(cudaGetLastError(), "solder::eval::cuda::run_product: launching the product kernel");
}

}  // namespace solder::eval::cuda
