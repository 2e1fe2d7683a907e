// eval/cuda/layout_kernels.hpp: the launches of eval/cuda/layout.hpp's bodies on a stream
// (nvcc only): NHWC -> NCHW (with the conv's bias, optionally) and NCHW -> NHWC a thread per
// element, the per-channel sums (a conv's db) a warp per channel. Each call queues one kernel
// and returns; errors of the launch throw solder::cuda_error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cuda/layout.hpp"
#include "solder/eval/cuda/row_kernels.hpp"

namespace solder::eval::cuda {

/// y [batch, C, H, W] = x [batch, H, W, C] (+ bias[c] where body.bias is set); x, y device
/// memory, not overlapping.
template <std::size_t C, std::size_t H, std::size_t W>
void nhwc_to_nchw(const nhwc_to_nchw_body<C, H, W>& body, cudaStream_t stream) {
  detail::launch_elements(body, body.elements(), stream, "solder::eval::cuda::nhwc_to_nchw: launching");
}

/// y [batch, H, W, C] = x [batch, C, H, W]; x, y device memory, not overlapping.
template <std::size_t C, std::size_t H, std::size_t W>
void nchw_to_nhwc(const nchw_to_nhwc_body<C, H, W>& body, cudaStream_t stream) {
  detail::launch_elements(body, body.elements(), stream, "solder::eval::cuda::nchw_to_nhwc: launching");
}

/// sums[c] = the sum of g over the batch and the pixels of channel c, for c in [0, C), in the
/// fixed order of channel_sums_body (the same bits every run, and as the host's); overwrites
/// sums (C floats of device memory).
template <std::size_t C, std::size_t H, std::size_t W, bool ChannelsLast>
void channel_sums(const channel_sums_body<C, H, W, ChannelsLast>& body, cudaStream_t stream) {
  detail::launch_rows(body, C, stream, "solder::eval::cuda::channel_sums: launching");
}

}  // namespace solder::eval::cuda
