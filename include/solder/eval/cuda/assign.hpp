// eval/cuda/assign.hpp: the CUDA backend's pass kernels and their launch (nvcc only): the
// __global__ templates that run a pass of eval/cuda/pass.hpp, and run_writes, which checks the
// writes, picks the walk and the vector path, and launches them on a stream.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "solder/eval/cuda/evaluator.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/pass.hpp"
#include "solder/eval/cuda/product_kernel.hpp"

namespace solder::eval::cuda {

/// Threads per block of the flat walk.
inline constexpr unsigned flat_threads_per_block = 256;

/// The elementwise pass: every thread its items, grid-stride.
template <class P>
__global__ void __launch_bounds__(flat_threads_per_block) flat_kernel(P p) {
  P local = p;  // the evaluators keep the item's random bits
  auto a = local.start();
  local.flat(std::size_t(blockIdx.x) * blockDim.x + threadIdx.x, std::size_t(gridDim.x) * blockDim.x, a);
}

/// The column walk: the block's chunk of rows, then each column write's row lanes added in
/// order into the chunk's partial.
template <class P, class T, std::size_t... W>
__global__ void __launch_bounds__(column_threads) column_kernel(P p) {
  __shared__ T scratch[row_lanes * tile];
  P local = p;
  auto a = local.start();
  local.column(blockIdx.x, threadIdx.x, a);
  (
      [&] {
        __syncthreads();
        P::template column_deposit<W>(threadIdx.x, a, scratch);
        __syncthreads();
        local.template column_combine<W>(blockIdx.x, threadIdx.x, scratch);
      }(),
      ...);
}

/// Column c of write W: the chunks' partials added in order.
template <class P, std::size_t W>
__global__ void column_finish_kernel(P p) {
  const std::size_t c = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < P::cols) p.template column_finish<W>(c);
}

/// The scalar walk: every thread its items, then each scalar write's block tree.
template <class P, class T, std::size_t... W>
__global__ void __launch_bounds__(all_threads) all_kernel(P p) {
  __shared__ T scratch[all_threads];
  P local = p;
  auto a = local.start();
  local.flat(std::size_t(blockIdx.x) * blockDim.x + threadIdx.x, std::size_t(gridDim.x) * blockDim.x, a);
  (
      [&] {
        __syncthreads();
        P::template all_deposit<W>(threadIdx.x, a, scratch);
        for (unsigned half = all_threads / 2; half > 0; half /= 2) {
          __syncthreads();
          local.template all_tree<W>(threadIdx.x, half, scratch);
        }
        __syncthreads();
        if (threadIdx.x == 0) local.template all_block_result<W>(blockIdx.x, scratch);
      }(),
      ...);
}

/// The scalar write W: the blocks' results added in order, by one thread.
template <class P, std::size_t W>
__global__ void all_finish_kernel(P p) {
  p.template all_finish<W>();
}

/// Multiprocessors of the current device (cached per device): the flat walk's grid is a few
/// blocks per multiprocessor, and grid-strides over the rest.
inline unsigned multiprocessors() {
  static int cached[64] = {};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= 64) dev = 0;
  if (cached[dev] == 0) check(cudaDeviceGetAttribute(&cached[dev], cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return unsigned(cached[dev]);
}

/// Launches the kernels of a pass on a stream: the device form of the runner that dispatch()
/// (pass.hpp) hands the chosen pass to; tests/support/grid.hpp has the host form.
struct device_runner {
  cudaStream_t stream;

  /// The elementwise pass: a few blocks per multiprocessor, grid-stride over the rest.
  template <class P>
  void flat(P& p) const {
    const std::size_t want = (p.flat_threads() + flat_threads_per_block - 1) / flat_threads_per_block;
    const std::size_t most = std::size_t(multiprocessors()) * (2048 / flat_threads_per_block);
    flat_kernel<P><<<unsigned(want < most ? want : most), flat_threads_per_block, 0, stream>>>(p);
    check(cudaGetLastError(), "the elementwise pass's launch");
  }

  /// The column walk, then one short kernel per column write adding its chunks.
  template <class P, std::size_t... W>
  void columns(P& p, std::index_sequence<W...>) const {
    using T = typename P::value_type;
    const std::size_t chunks = p.chunks();
    device_array<T> scratch[] = {(void(W), device_array<T>::allocate(chunks * P::cols, stream))...};
    std::size_t k = 0;
    ((std::get<W>(p.writers).partial = scratch[k++].data()), ...);
    column_kernel<P, T, W...><<<unsigned(chunks * P::column_tiles()), column_threads, 0, stream>>>(p);
    check(cudaGetLastError(), "the column pass's launch");
    ((column_finish_kernel<P, W><<<unsigned((P::cols + 255) / 256), 256, 0, stream>>>(p),
      check(cudaGetLastError(), "the column sums' launch")),
     ...);
  }

  /// The scalar walk on its fixed grid, then one thread per scalar write adding the blocks.
  template <class P, std::size_t... W>
  void all(P& p, std::index_sequence<W...>) const {
    using T = typename P::value_type;
    const std::size_t blocks = p.all_blocks();
    device_array<T> scratch[] = {(void(W), device_array<T>::allocate(blocks, stream))...};
    std::size_t k = 0;
    ((std::get<W>(p.writers).partial = scratch[k++].data()), ...);
    all_kernel<P, T, W...><<<unsigned(blocks), all_threads, 0, stream>>>(p);
    check(cudaGetLastError(), "the reduction pass's launch");
    ((all_finish_kernel<P, W><<<1, 1, 0, stream>>>(p), check(cudaGetLastError(), "the reduction's final sum launch")), ...);
  }
};

/// Evaluates the writes in one pass (and, for reductions, a short final kernel) on `stream`:
/// the CUDA form of solder::assign_all. A write holding a matrix product runs as one product
/// whose epilogue is the rest of its expression. Returns once the kernels are queued.
template <class W0, class... Ws>
void run_writes(cudaStream_t stream, const W0& w0, const Ws&... ws) {
  require_device_once();
  if constexpr (holds_product<W0> || (holds_product<Ws> || ...)) {
    static_assert(sizeof...(Ws) == 0,
                  "solder::assign_all (CUDA): a write holding a matrix product runs alone; assign the other writes separately");
    run_product(stream, product_of(w0));
  } else {
    device_runner runner{stream};
    dispatch(runner, w0, ws...);
  }
}

}  // namespace solder::eval::cuda
