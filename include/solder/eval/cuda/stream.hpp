// eval/cuda/stream.hpp: an owned CUDA stream, the calling thread's current stream, and the guard
// that sets it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "solder/eval/cuda/error.hpp"

namespace solder {

/// An owned CUDA stream, created non-blocking: it does not wait for the legacy default stream.
/// Movable, not copyable; a moved-from stream holds none (converts to 0, the default stream).
class stream {
 public:
  /// Creates a stream; throws cuda_error when no device is present or creation fails.
  stream() {
    eval::cuda::require_device();
    eval::cuda::check(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  /// Work already queued still completes; CUDA releases the stream after it.
  ~stream() { reset(); }

  stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  cudaStream_t get() const noexcept { return handle_; }
  operator cudaStream_t() const noexcept { return handle_; }  // NOLINT: implicit, to pass it to CUDA calls

  /// Waits until all work queued on the stream has completed; throws cuda_error on failure.
  void synchronize() const { eval::cuda::check(cudaStreamSynchronize(handle_), "cudaStreamSynchronize"); }

 private:
  void reset() noexcept {
    // Errors are ignored: at process exit the runtime may already be unloaded.
    if (handle_ && cudaStreamDestroy(handle_) != cudaSuccess) (void)cudaGetLastError();
    handle_ = nullptr;
  }

  cudaStream_t handle_ = nullptr;
};

namespace detail {
inline cudaStream_t& current_stream_slot() noexcept {
  thread_local cudaStream_t current = nullptr;
  return current;
}
}  // namespace detail

/// The calling thread's current stream, on which every solder device operation without an
/// explicit stream runs: 0 (the default stream) unless a stream_guard has set another.
inline cudaStream_t current_stream() noexcept { return detail::current_stream_slot(); }

/// Makes `s` the calling thread's current stream while alive and restores the previous one on
/// destruction, as PyTorch's CUDAStreamGuard. `s` must outlive the guard.
class stream_guard {
 public:
  explicit stream_guard(cudaStream_t s) noexcept : previous_(std::exchange(detail::current_stream_slot(), s)) {}
  /// A temporary stream would be destroyed while still current.
  explicit stream_guard(stream&&) = delete;
  ~stream_guard() { detail::current_stream_slot() = previous_; }

  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;

  /// The stream that was current before this guard, and will be again after it.
  cudaStream_t previous() const noexcept { return previous_; }

 private:
  cudaStream_t previous_;
};

}  // namespace solder
