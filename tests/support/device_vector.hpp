// support/device_vector.hpp: a device copy of a std::vector for the GPU test programs
// (tests/cuda/), on solder's device_array and the default stream (nvcc or the toolkit's
// cuda_runtime.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"

namespace solder::test::gpu {

/// A device copy of a std::vector, read back after the device's work is done.
template <class T>
class device_vector {
 public:
  explicit device_vector(std::size_t n) : a_(eval::cuda::device_array<T>::allocate(n ? n : 1, nullptr)), n_(n) {}
  explicit device_vector(const std::vector<T>& v) : device_vector(v.size()) { put(v); }
  T* get() const { return a_.data(); }
  void put(const std::vector<T>& v) const {
    eval::cuda::check(cudaMemcpy(get(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  std::vector<T> read() const {
    std::vector<T> v(n_);
    eval::cuda::check(cudaDeviceSynchronize(), "the kernels");
    eval::cuda::check(cudaMemcpy(v.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    return v;
  }

 private:
  eval::cuda::device_array<T> a_;
  std::size_t n_;
};

}  // namespace solder::test::gpu
