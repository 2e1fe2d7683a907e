// eval/cuda/memory.hpp: device_array<T>, device memory from the stream-ordered allocator (the one
// way solder allocates device memory).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "solder/eval/cuda/error.hpp"

namespace solder::eval::cuda {

/// As require_device(), but a success is remembered for the process, so allocations do not ask
/// the driver every time.
inline void require_device_once() {
  [[maybe_unused]] static const bool present = [] {
    require_device();  // a throw leaves `present` uninitialized, so the next call asks again
    return true;
  }();
}

/// An owning pointer to n elements of T in device memory, allocated with cudaMallocAsync on a
/// stream and freed with cudaFreeAsync on the same stream, which must outlive the array.
/// Movable, not copyable; empty (null, 0 elements) when default-constructed or moved from.
template <class T>
class device_array {
 public:
  device_array() = default;

  /// n uninitialized elements, usable by work queued on `stream` after this call (or on other
  /// streams once they wait for it). Throws cuda_error naming the byte count on failure, and
  /// "no CUDA device" where none is present.
  static device_array allocate(std::size_t n, cudaStream_t stream) {
    require_device_once();
    if (n == 0) return device_array();
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw cuda_error(cudaErrorMemoryAllocation,
                       "solder: cannot allocate " + std::to_string(n) + " elements of " +
                           std::to_string(sizeof(T)) + " bytes: the byte count overflows");
    const std::size_t bytes = n * sizeof(T);
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, stream);
    if (e != cudaSuccess) check(e, ("cudaMallocAsync of " + std::to_string(bytes) + " bytes").c_str());
    return device_array(static_cast<T*>(p), n, stream);
  }

  ~device_array() { reset(); }

  device_array(device_array&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), stream_(other.stream_) {}
  device_array& operator=(device_array&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      stream_ = other.stream_;
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// The stream the memory was allocated on, and will be freed on.
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  device_array(T* data, std::size_t size, cudaStream_t stream) noexcept : data_(data), size_(size), stream_(stream) {}

  void reset() noexcept {
    // Errors are ignored: at process exit the runtime may already be unloaded.
    if (data_ && cudaFreeAsync(data_, stream_) != cudaSuccess) (void)cudaGetLastError();
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace solder::eval::cuda
