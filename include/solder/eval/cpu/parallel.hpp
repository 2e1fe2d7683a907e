// eval/cpu/parallel.hpp: how many threads solder's CPU kernels use, and the one parallel loop.
// Work is always cut the same way, whatever the thread count, so results are bitwise identical
// for any number of threads: threads only choose who runs which piece.
#pragma once

#include <cstdlib>
#include <thread>

#include "solder/config.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace solder {

namespace detail {
inline int& thread_setting() {
  static int n = [] {
    if (const char* env = std::getenv("SOLDER_NUM_THREADS")) {
      int v = std::atoi(env);
      if (v >= 1) return v;
    }
    unsigned hw = std::thread::hardware_concurrency();
    return hw ? int(hw) : 1;
  }();
  return n;
}
}  // namespace detail

/// Threads solder's CPU kernels may use (default: SOLDER_NUM_THREADS, else every core).
inline int num_threads() { return detail::thread_setting(); }
/// Sets the thread count for all later calls; n >= 1.
inline void set_num_threads(int n) {
  SOLDER_ASSERT(n >= 1, "solder::set_num_threads: the thread count must be at least 1");
  detail::thread_setting() = n;
}

namespace cpu {

/// Runs body(i) for i in [0, n), spread over up to `threads` threads (static schedule).
template <class F>
void parallel_for(std::size_t n, int threads, F&& body) {
#if defined(_OPENMP)
  if (threads > 1 && n > 1) {
    const int t = int(n < std::size_t(threads) ? n : std::size_t(threads));
#pragma omp parallel for num_threads(t) schedule(static)
    for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) body(std::size_t(i));
    return;
  }
#endif
  (void)threads;
  for (std::size_t i = 0; i < n; ++i) body(i);
}

}  // namespace cpu
}  // namespace solder
