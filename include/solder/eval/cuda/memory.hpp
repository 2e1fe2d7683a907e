// eval/cuda/memory.hpp: device_array<T>, device memory from the stream-ordered allocator (the one
// way solder allocates device memory).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/stream_ledger.hpp"

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
/// stream and freed with cudaFreeAsync on the stream it was last used on (stream_ledger): its
/// owner notes each use on a stream with used_on(s) before queuing the work; when the stream
/// changes, an event recorded on the previous one captures its uses, and the free waits for
/// those events. Without used_on calls it is freed on the allocation's stream. The stream of
/// the last use must outlive the array. Movable, not copyable; empty (null, 0 elements) when
/// default-constructed or moved from.
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
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        ledger_(std::exchange(other.ledger_, ledger_type())) {}
  device_array& operator=(device_array&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      ledger_ = std::exchange(other.ledger_, ledger_type());
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// The stream the memory will be freed on: the last one a use was noted on (the
  /// allocation's until then).
  cudaStream_t stream() const noexcept { return ledger_.last(); }

  /// Notes that work on `s` is about to use the memory: where s is not the stream of the last
  /// use, an event on that stream captures its queued work, and the free will wait for it.
  /// Throws cuda_error where the event cannot be made or recorded.
  void used_on(cudaStream_t s) const {
    if (!data_ || s == ledger_.last()) return;
    auto* e = ledger_.use(s);
    if (e->recorded) {
      check(cudaEventRecord(e->event, e->stream), "cudaEventRecord (a device buffer's uses on its previous stream)");
      return;
    }
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    if (const cudaError_t r = cudaEventRecord(event, e->stream); r != cudaSuccess) {
      (void)cudaEventDestroy(event);
      check(r, "cudaEventRecord (a device buffer's uses on its previous stream)");
    }
    e->event = event;
    e->recorded = true;
  }

 private:
  using ledger_type = stream_ledger<cudaStream_t, cudaEvent_t>;

  device_array(T* data, std::size_t size, cudaStream_t stream) noexcept : data_(data), size_(size), ledger_(stream) {}

  void reset() noexcept {
    // Errors are ignored: at process exit the runtime may already be unloaded.
    if (data_) {
      const cudaStream_t last = ledger_.last();
      ledger_.for_each_wait([&](const auto& e) {
        if (cudaStreamWaitEvent(last, e.event, 0) != cudaSuccess) (void)cudaGetLastError();
      });
      if (cudaFreeAsync(data_, last) != cudaSuccess) (void)cudaGetLastError();
      ledger_.for_each_entry([](auto& e) {
        if (e.recorded && cudaEventDestroy(e.event) != cudaSuccess) (void)cudaGetLastError();
      });
    }
    data_ = nullptr;
    size_ = 0;
    ledger_ = ledger_type();
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  mutable ledger_type ledger_;  // noting a use changes where the memory is freed, not the memory
};

}  // namespace solder::eval::cuda
