// eval/cuda/executor.hpp: executor<cuda>, the CUDA backend as the rest of solder sees it (chosen
// by tag, backend.hpp): assignments into device tensors run as one fused pass on the calling
// thread's current stream (solder::current_stream(), set by solder::stream_guard). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include "solder/backend.hpp"
#include "solder/eval/cuda/kernels.hpp"
#include "solder/eval/cuda/stream.hpp"
#include "solder/expr/write.hpp"

namespace solder {

/// The CUDA backend: evaluates into device memory.
template <>
struct executor<cuda> {
  /// Evaluates several writes in ONE pass over their common shape (see solder::assign_all),
  /// queued on the current stream: the call returns before the GPU has finished.
  template <class W0, class... Ws>
  static void run(const W0& w0, const Ws&... ws) {
    eval::cuda::run_writes(current_stream(), w0, ws...);
  }
  /// out = e in one pass.
  template <class Out, class E>
  static void assign(const Out& out, const E& e) {
    run(write(out, e));
  }
};

}  // namespace solder
