// eval/cuda/product_kernel.hpp: the CUDA backend's product kernel and its launch (nvcc only):
// the __global__ template that runs a product pass of eval/cuda/product.hpp, its phases
// separated by barriers, and run_product, which checks the grid and launches it on a stream
// (row tiles on the grid's x, column tiles on y: product_pass::grid and tile_of).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "solder/config.hpp"
#include "solder/eval/cuda/device_flags.hpp"
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

/// One block of a product pass, the panels double-buffered: while the warps multiply slice s
/// from one buffer, each thread's loads of slice s + 1 are in flight into registers, stored to
/// the other buffer after the multiplies; one barrier per slice. Then every thread's elements
/// through the epilogue.
template <class P>
__global__ void __launch_bounds__(P::threads) product_kernel(P p) {
  extern __shared__ float panels[];  // two buffers of P::shared_floats
  const product_tile tile = P::tile_of(blockIdx.x, blockIdx.y);
  auto acc = p.start();
  const std::size_t slices = p.slices();
  typename P::staged r;
  p.load(tile.bx, tile.by, threadIdx.x, 0, r);
  p.store(threadIdx.x, r, panels);
  __syncthreads();
  for (std::size_t s = 0; s < slices; ++s) {
    const bool more = s + 1 < slices;
    if (more) p.load(tile.bx, tile.by, threadIdx.x, s + 1, r);
    p.accumulate(threadIdx.x, panels + (s % 2) * P::shared_floats, acc, device_warp{});
    if (more) p.store(threadIdx.x, r, panels + ((s + 1) % 2) * P::shared_floats);
    __syncthreads();
  }
  p.finish(tile.bx, tile.by, threadIdx.x, acc);
}

/// Launches a product pass on `stream`. Throws solder::error where the grid does not fit
/// CUDA's limits, cuda_error where the launch fails.
template <class P>
void run_product(cudaStream_t stream, const P& p) {
  if (p.M == 0) return;
  const product_grid g = p.grid();
  if (g.x > max_grid_x)
    solder::detail::fail("solder::eval::cuda::run_product: " + std::to_string(p.M) + " rows need " +
                         std::to_string(g.x) + " row blocks; CUDA allows " + std::to_string(max_grid_x));
  if (g.y > max_grid_y)
    solder::detail::fail("solder::eval::cuda::run_product: " + std::to_string(P::N) + " columns need " +
                         std::to_string(g.y) + " column blocks; CUDA allows " + std::to_string(max_grid_y));
  constexpr std::size_t bytes = 2 * std::size_t(P::shared_floats) * sizeof(float);
  // Past 48 KiB a kernel must ask for its dynamic shared memory, on every device it runs on
  // (the attribute is the current device's): once per device and kernel.
  if constexpr (bytes > (std::size_t(48) << 10)) {
    static per_device_flags raised;
    int device = 0;
    check(cudaGetDevice(&device), "solder::eval::cuda::run_product: cudaGetDevice");
    raised.ensure(device, [] {
      check(cudaFuncSetAttribute(product_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
            "solder::eval::cuda::run_product: raising the product kernel's shared memory");
    });
  }
  const dim3 grid(unsigned(g.x), unsigned(g.y));
  product_kernel<P><<<grid, P::threads, bytes, stream>>>(p);
  check(cudaGetLastError(), "solder::eval::cuda::run_product: launching the product kernel");
}

}  // namespace solder::eval::cuda
