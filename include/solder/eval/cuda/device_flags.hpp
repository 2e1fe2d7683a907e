// eval/cuda/device_flags.hpp: per_device_flags, a setting made once on each CUDA device (not
// once per process): a kernel attribute, for one, belongs to the device current when it is set.
// Plain host code without CUDA headers, so the host suite tests the bookkeeping.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

namespace solder::eval::cuda {

/// One flag per device ordinal, set once a setting has succeeded on that device. ensure(d, make)
/// runs make() unless device d's flag is set, and sets it when make() returns; a make() that
/// throws leaves it clear, so the next call tries again. Thread-safe: make() runs under a lock,
/// at most once per device while it succeeds. Ordinals below 64 are checked without the lock.
class per_device_flags {
 public:
  /// Whether the setting has been made on `device`.
  bool is_set(int device) const {
    if (device < 0) return false;
    if (device < fast_devices) return (fast_.load(std::memory_order_acquire) >> device) & 1u;
    const std::lock_guard<std::mutex> lock(mutex_);
    return std::size_t(device) < slow_.size() && slow_[std::size_t(device)];
  }

  /// Runs make() for `device` unless it has already succeeded there.
  template <class Make>
  void ensure(int device, Make&& make) {
    static_assert(std::is_void_v<decltype(make())>, "per_device_flags::ensure: make() reports failure by throwing");
    if (device < 0) return make();  // no device's ordinal: nothing to remember it by
    if (is_set(device)) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (device < fast_devices) {
      if ((fast_.load(std::memory_order_relaxed) >> device) & 1u) return;  // set while this call waited
      make();
      fast_.fetch_or(std::uint64_t(1) << device, std::memory_order_release);
    } else {
      const std::size_t d = std::size_t(device);
      if (d < slow_.size() && slow_[d]) return;
      make();
      if (slow_.size() <= d) slow_.resize(d + 1, false);
      slow_[d] = true;
    }
  }

 private:
  static constexpr int fast_devices = 64;
  std::atomic<std::uint64_t> fast_{0};
  mutable std::mutex mutex_;
  std::vector<bool> slow_;  // ordinals from fast_devices on
};

}  // namespace solder::eval::cuda
