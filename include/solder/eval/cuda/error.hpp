// eval/cuda/error.hpp: CUDA runtime errors as solder::error exceptions naming the call that
// failed, and the check that a device is present. Host code: compiles with any C++ compiler
// that finds cuda_runtime.h (programs link CUDA::cudart).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "solder/config.hpp"

namespace solder {

/// A CUDA runtime call failed; what() names the call and CUDA's message.
struct cuda_error : error {
  cudaError_t code;
  cuda_error(cudaError_t c, const std::string& what) : error(what), code(c) {}
};

namespace eval::cuda {

/// Throws cuda_error "solder: <what> failed: <CUDA's message>" unless `e` is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear a sticky-free error so the next call starts clean
    throw cuda_error(e, std::string("solder: ") + what + " failed: " + cudaGetErrorString(e));
  }
}

/// The number of CUDA devices this process sees (0 without a device or driver).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Throws cuda_error when no CUDA device is present: the first thing every device entry point
/// checks, so a machine without a GPU gets one clear message instead of a failed launch.
inline void require_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    throw cuda_error(e == cudaSuccess ? cudaErrorNoDevice : e,
                     std::string("solder: no CUDA device is present (") +
                         (e == cudaSuccess ? "cudaGetDeviceCount found 0 devices" : cudaGetErrorString(e)) +
                         "); device tensors and kernels need one");
  }
}

}  // namespace eval::cuda
}  // namespace solder
