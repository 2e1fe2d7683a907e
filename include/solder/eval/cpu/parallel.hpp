// eval/cpu/parallel.hpp: how many threads solder's CPU kernels use, and the one parallel loop.
// Work is always cut the same way, whatever the thread count, so results are bitwise identical
// for any number of threads: threads only choose who runs which piece.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "solder/config.hpp"
#include "solder/host.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace solder {

namespace detail {
inline int& thread_setting() {
  static int n = [] {
    if (const char* env = std::getenv("SOLDER_NUM_THREADS")) {
      int v = std::atoi(env);
      if (v >= 1) return v;
    }
    const unsigned hw = online_cpus();
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

namespace eval::cpu {

/// The floating-point control state of the calling thread (SSE's MXCSR: rounding, flush to
/// zero, denormals are zero), carried into the worker threads of a parallel loop so every
/// piece of work is computed the same way whichever thread runs it.
struct fp_state {
#if defined(__SSE__)
  unsigned int csr = _mm_getcsr();
  void apply() const { _mm_setcsr(csr); }
#else
  void apply() const {}
#endif
};

/// While alive, float arithmetic on this thread (and in solder's parallel loops started from
/// it) flushes denormal results to zero and reads denormal inputs as zero. Late in training,
/// gradients and Adam's second moments drift into the denormal range, where every operation
/// takes a microcode assist (measured: a digits-MLP training step 3-4x slower); TensorFlow
/// flushes them on the CPU for the same reason. Values below 1.2e-38 become 0.
class flush_denormals {
 public:
  explicit flush_denormals(bool on = true) {
#if defined(__SSE__)
    if (on) _mm_setcsr(saved.csr | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
#else
    (void)on;
#endif
  }
  ~flush_denormals() { saved.apply(); }
  flush_denormals(const flush_denormals&) = delete;
  flush_denormals& operator=(const flush_denormals&) = delete;

 private:
  fp_state saved;
};

/// A hint to the core that this thread is waiting for another (x86 PAUSE).
inline void spin_pause() {
#if defined(__SSE2__)
  _mm_pause();
#endif
}

/// Spins until done() (a condition another running thread of the same loop makes true soon),
/// giving the core away after a while: the loop's threads may outnumber the cores.
template <class Done>
void spin_until(Done&& done) {
  for (unsigned spins = 0; !done(); ++spins) {
    spin_pause();
    if (spins >= 1024) std::this_thread::yield();
  }
}

/// How long the calling thread of a parallel loop spins for the other threads before it reaches
/// the loop's end barrier.
inline constexpr std::chrono::microseconds caller_spin{20};

/// Runs body(i) for i in [0, n), spread over up to `threads` threads: thread j of t runs
/// [n j / t, n (j + 1) / t). Where idle workers sleep (OMP_WAIT_POLICY=PASSIVE), every barrier
/// a thread reaches first costs it a sleep and a wake-up of tens of microseconds, so the loop
/// has one barrier, the region's end (no worksharing loop with its own), and the calling thread,
/// which runs on after the region, spins up to caller_spin for the others before it reaches it
/// (docs/gemm.md, "Two threads").
template <class F>
void parallel_for(std::size_t n, int threads, F&& body) {
#if defined(_OPENMP)
  if (threads > 1 && n > 1) {
    const int t = int(n < std::size_t(threads) ? n : std::size_t(threads));
    const fp_state caller;
    std::atomic<std::size_t> finished{0};
#pragma omp parallel num_threads(t)
    {
      const fp_state own;
      caller.apply();
      const std::size_t team = std::size_t(omp_get_num_threads()), j = std::size_t(omp_get_thread_num());
      for (std::size_t i = n * j / team; i < n * (j + 1) / team; ++i) body(i);
      own.apply();
      finished.fetch_add(1, std::memory_order_release);
      if (j == 0) {
        // At most caller_spin: past it the caller sleeps as before (the others may need its core).
        const auto until = std::chrono::steady_clock::now() + caller_spin;
        for (unsigned spins = 1; finished.load(std::memory_order_acquire) < team; ++spins) {
          spin_pause();
          if (spins % 64 == 0 && std::chrono::steady_clock::now() > until) break;
        }
      }
    }
    return;
  }
#endif
  (void)threads;
  for (std::size_t i = 0; i < n; ++i) body(i);
}

}  // namespace eval::cpu
}  // namespace solder
