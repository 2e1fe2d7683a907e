// memory.hpp: 64-byte aligned host buffers, the one way solder allocates host memory (tensors,
// GEMM workspaces, packed weights, reduction scratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#if __has_include(<sys/mman.h>)
#include <sys/mman.h>
#endif

#include "solder/config.hpp"

namespace solder {

namespace detail {
struct aligned_free {
  void operator()(void* p) const noexcept { std::free(p); }
};
}  // namespace detail

/// An owning pointer to an aligned array of T on the heap.
template <class T>
using aligned_array = std::unique_ptr<T[], detail::aligned_free>;

/// n elements of T (uninitialized), 64-byte aligned; the size is rounded up to whole cache
/// lines, as std::aligned_alloc requires. Throws std::bad_alloc.
template <class T>
aligned_array<T> allocate_aligned(std::size_t n) {
  std::size_t bytes = (n * sizeof(T) + alignment - 1) / alignment * alignment;
  if (bytes == 0) bytes = alignment;
  void* p = std::aligned_alloc(alignment, bytes);
  if (!p) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  // Large buffers are streamed: 2 MiB pages spare the TLB a miss every 4 KiB (the hint is
  // advisory; where transparent huge pages are off it does nothing).
  constexpr std::size_t huge_page = std::size_t(2) << 20;
  if (bytes >= 2 * huge_page) {
    const auto first = (reinterpret_cast<std::uintptr_t>(p) + huge_page - 1) & ~(huge_page - 1);
    const auto last = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(huge_page - 1);
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#endif
  return aligned_array<T>(static_cast<T*>(p));
}

/// An aligned buffer that only grows: scratch memory reused across calls, so a warm loop
/// allocates nothing.
template <class T>
class growing_buffer {
 public:
  /// At least n elements; the contents are kept only while n does not grow.
  T* get(std::size_t n) {
    if (n > size_) {
      data_ = allocate_aligned<T>(n);
      size_ = n;
    }
    return data_.get();
  }

 private:
  aligned_array<T> data_;
  std::size_t size_ = 0;
};

}  // namespace solder
