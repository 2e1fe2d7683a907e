// eval/cuda/layout_kernels.hpp: the launches of eval/cuda/layout.hpp's bodies on a stream
// (nvcc only): NHWC -> NCHW (with the conv's bias, optionally) and NCHW -> NHWC as 32 x 32
// tiles through shared memory (a thread per element where a side is narrower than 8), the
// per-channel sums (a conv's db) a warp per channel. Each call queues one kernel
// and returns; errors of the launch throw solder::cuda_error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cuda/layout.hpp"
#include "solder/eval/cuda/row_kernels.hpp"

namespace solder::eval::cuda {

/// A block of transpose_tile x transpose_tile_rows threads per tile of t, grid-stride over the
/// tiles: load, barrier, store, barrier (before the buffer is refilled).
template <std::size_t R, std::size_t S>
__global__ void __launch_bounds__(transpose_tile* transpose_tile_rows) transpose_kernel(batched_transpose<R, S> t) {
  __shared__ transpose_tile_buffer tile;
  const std::size_t blocks = t.blocks();
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    t.load(b, threadIdx.x, threadIdx.y, tile);
    __syncthreads();
    t.store(b, threadIdx.x, threadIdx.y, tile);
    __syncthreads();
  }
}

namespace detail {

/// A reorder body's launch: its tiles where they pay (batched_transpose::tiled), else a thread
/// per element. Either writes the same bits.
template <class Body>
void launch_reorder(const Body& body, cudaStream_t stream, const char* what) {
  const auto t = body.tiles();
  if constexpr (decltype(t)::tiled) {
    const std::size_t blocks = t.blocks();
    if (blocks == 0) return;
    transpose_kernel<<<unsigned(blocks < max_grid_blocks ? blocks : max_grid_blocks), dim3(transpose_tile, transpose_tile_rows),
                       0, stream>>>(t);
    check(cudaGetLastError(), what);
  } else {
    launch_elements(body, body.elements(), stream, what);
  }
}

}  // namespace detail

/// y [batch, C, H, W] = x [batch, H, W, C] (+ bias[c] where body.bias is set); x, y device
/// memory, not overlapping.
template <std::size_t C, std::size_t H, std::size_t W>
void nhwc_to_nchw(const nhwc_to_nchw_body<C, H, W>& body, cudaStream_t stream) {
  detail::launch_reorder(body, stream, "solder::eval::cuda::nhwc_to_nchw: launching");
}

/// y [batch, H, W, C] = x [batch, C, H, W]; x, y device memory, not overlapping.
template <std::size_t C, std::size_t H, std::size_t W>
void nchw_to_nhwc(const nchw_to_nhwc_body<C, H, W>& body, cudaStream_t stream) {
  detail::launch_reorder(body, stream, "solder::eval::cuda::nchw_to_nhwc: launching");
}

/// sums[c] = the sum of g over the batch and the pixels of channel c, for c in [0, C), in the
/// fixed order of channel_sums_body (the same bits every run, and as the host's); overwrites
/// sums (C floats of device memory).
template <std::size_t C, std::size_t H, std::size_t W, bool ChannelsLast>
void channel_sums(const channel_sums_body<C, H, W, ChannelsLast>& body, cudaStream_t stream) {
  detail::launch_rows(body, C, stream, "solder::eval::cuda::channel_sums: launching");
}

}  // namespace solder::eval::cuda
