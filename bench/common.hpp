// common.hpp: what every solder benchmark shares: aligned buffers, seeded data, row splitting
// over OpenMP threads, the memory floors (copy passes) and the GBps / roofline counters.
#pragma once

#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace solder_bench {

// ---------------------------------------------------------------------------------------------
// Buffers and data
// ---------------------------------------------------------------------------------------------

/// Bytes of a transparent huge page on x86-64.
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// Asks the kernel to back [p, p + bytes) with huge pages (THP is in `madvise` mode here), so
/// a 64 MiB stream does not walk 16k page-table entries. Only whole 2 MiB pages inside the range
/// are advised; call it before the first touch. Every buffer of every peer gets the same
/// treatment (xtensor containers included), so no implementation gains from it alone.
inline void advise_huge_pages(void* p, std::size_t bytes) {
  auto first = (reinterpret_cast<std::uintptr_t>(p) + huge_page_bytes - 1) & ~(huge_page_bytes - 1);
  auto last = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(huge_page_bytes - 1);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

/// n elements of T on 64-byte boundaries (2 MiB boundaries from 2 MiB up, with huge pages
/// advised); zero-filled on construction so every page is touched before any timing.
template <class T>
class aligned_buffer {
 public:
  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t n) : n_(n) {
    std::size_t bytes = std::max<std::size_t>(n * sizeof(T), 64);
    std::size_t align = bytes >= huge_page_bytes ? huge_page_bytes : 64;
    bytes = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of align
    p_ = static_cast<T*>(std::aligned_alloc(align, bytes));
    if (p_ == nullptr) throw std::bad_alloc();
    if (align == huge_page_bytes) advise_huge_pages(p_, bytes);
    std::memset(static_cast<void*>(p_), 0, bytes);
  }
  aligned_buffer(aligned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  aligned_buffer& operator=(aligned_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  ~aligned_buffer() { std::free(p_); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  std::span<T> span() { return {p_, n_}; }
  std::span<const T> span() const { return {p_, n_}; }
  T& operator[](std::size_t i) { return p_[i]; }
  const T& operator[](std::size_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Uniform floats in [lo, hi) from a fixed seed: every run and every peer sees the same data.
inline void fill_uniform(std::span<float> out, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& v : out) v = dist(gen);
}

/// Dropout keep mask from a fixed seed: 1 with probability 1 - p, else 0 (PyTorch's meaning).
inline void fill_keep_mask(std::span<std::uint8_t> out, std::uint64_t seed, float p) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution keep(1.0 - static_cast<double>(p));
  for (std::uint8_t& v : out) v = keep(gen) ? 1 : 0;
}

/// "BxN", the shape part of a case name.
inline std::string shape_name(std::int64_t rows, std::int64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

/// Calls fn(i0, i1) once per OpenMP thread with that thread's contiguous block of [0, count)
/// (rows, usually); threads == 1 calls fn(0, count) on the caller without entering OpenMP. This
/// is how every `/threads:2` case splits its work: one team of `threads`, equal blocks.
template <class F>
void parallel_blocks(int threads, std::int64_t count, F&& fn) {
  if (threads <= 1) {
    fn(std::int64_t{0}, count);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    fn(count * t / n, count * (t + 1) / n);
  }
}

// ---------------------------------------------------------------------------------------------
// Memory floors: the passes that move the same bytes and do nothing else
// ---------------------------------------------------------------------------------------------

/// Output size from which streaming (non-temporal) stores beat regular ones on this machine.
/// Measured (bench/README.md): at 4 MiB regular stores win by ~3% (the output is still in
/// cache and is read back next iteration); at 64 MiB streaming stores win by ~50%, because they
/// skip the read-for-ownership of every output line.
inline constexpr std::size_t streaming_store_min_bytes = std::size_t{16} << 20;

/// Prefetch distances that measured best (sweep of 0, 512 B, 1, 2, 4, 8 KiB with T0 and T1
/// hints in bench/README.md): the copy wants 4 KiB ahead into L2, the 2-input pass 1 KiB into L1
/// per input stream.
inline constexpr std::size_t copy_prefetch_bytes = 4096;
inline constexpr std::size_t mul_prefetch_bytes = 1024;

/// y[i] = x[i] for n floats with glibc memcpy (regular stores; glibc switches to streaming stores
/// only above a threshold derived from the host's 480 MiB L3, so never here).
inline void copy_memcpy(const float* x, float* y, std::size_t n) { std::memcpy(y, x, n * sizeof(float)); }

/// y[i] = x[i] for n floats, the fastest this machine allows: AVX-512 loads of 4 cache lines per
/// step, stores streamed past the cache with an L2 prefetch copy_prefetch_bytes ahead when
/// Streaming is true. x and y 64-byte aligned. Compiled for AVX-512 whatever the flags (the floor
/// is what the machine can do, not what the build targets); call it on AVX-512 machines only
/// (copy_nt picks it or copy_avx2 for the host).
template <bool Streaming>
__attribute__((target("avx512f"))) inline void copy_avx512(const float* __restrict x, float* __restrict y,
                                                           std::size_t n) {
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if constexpr (Streaming) {
      const char* ahead = reinterpret_cast<const char*>(x + i) + copy_prefetch_bytes;
      _mm_prefetch(ahead, _MM_HINT_T1);
      _mm_prefetch(ahead + 64, _MM_HINT_T1);
      _mm_prefetch(ahead + 128, _MM_HINT_T1);
      _mm_prefetch(ahead + 192, _MM_HINT_T1);
    }
    const __m512 a = _mm512_load_ps(x + i), b = _mm512_load_ps(x + i + 16);
    const __m512 c = _mm512_load_ps(x + i + 32), d = _mm512_load_ps(x + i + 48);
    if constexpr (Streaming) {
      _mm512_stream_ps(y + i, a);
      _mm512_stream_ps(y + i + 16, b);
      _mm512_stream_ps(y + i + 32, c);
      _mm512_stream_ps(y + i + 48, d);
    } else {
      _mm512_store_ps(y + i, a);
      _mm512_store_ps(y + i + 16, b);
      _mm512_store_ps(y + i + 32, c);
      _mm512_store_ps(y + i + 48, d);
    }
  }
  for (; i < n; ++i) y[i] = x[i];
  if constexpr (Streaming) _mm_sfence();  // streaming stores are weakly ordered
}

/// copy_avx512 for hosts without AVX-512: the same steps with AVX2 registers.
template <bool Streaming>
__attribute__((target("avx2"))) inline void copy_avx2(const float* __restrict x, float* __restrict y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if constexpr (Streaming) {
      const char* ahead = reinterpret_cast<const char*>(x + i) + copy_prefetch_bytes;
      _mm_prefetch(ahead, _MM_HINT_T1);
      _mm_prefetch(ahead + 64, _MM_HINT_T1);
      _mm_prefetch(ahead + 128, _MM_HINT_T1);
      _mm_prefetch(ahead + 192, _MM_HINT_T1);
    }
    __m256 v[8];
    for (int k = 0; k < 8; ++k) v[k] = _mm256_load_ps(x + i + 8 * k);
    for (int k = 0; k < 8; ++k) {
      if constexpr (Streaming)
        _mm256_stream_ps(y + i + 8 * k, v[k]);
      else
        _mm256_store_ps(y + i + 8 * k, v[k]);
    }
  }
  for (; i < n; ++i) y[i] = x[i];
  if constexpr (Streaming) _mm_sfence();
}

/// True when the host runs AVX-512 (checked once): the floors use the widest vectors the
/// machine has, whatever the build's flags.
inline bool host_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

/// The copy floor with the host's widest vectors.
template <bool Streaming>
inline void copy_nt(const float* x, float* y, std::size_t n) {
  if (host_has_avx512())
    copy_avx512<Streaming>(x, y, n);
  else
    copy_avx2<Streaming>(x, y, n);
}

/// y[i] = a[i] * b[i], the plainest 2-read 1-write pass (the compiler vectorizes it; regular stores).
inline void mul_plain(const float* __restrict a, const float* __restrict b, float* __restrict y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

/// The L1 prefetch of one mul step: the two cache lines of a and of b mul_prefetch_bytes ahead.
inline void prefetch_step(const float* a, const float* b) {
  const char* pa = reinterpret_cast<const char*>(a) + mul_prefetch_bytes;
  const char* pb = reinterpret_cast<const char*>(b) + mul_prefetch_bytes;
  _mm_prefetch(pa, _MM_HINT_T0);
  _mm_prefetch(pa + 64, _MM_HINT_T0);
  _mm_prefetch(pb, _MM_HINT_T0);
  _mm_prefetch(pb + 64, _MM_HINT_T0);
}

/// y[i] = a[i] * b[i] with AVX-512, 2 cache lines per step; streaming stores plus an L1 prefetch
/// of both inputs mul_prefetch_bytes ahead when Streaming is true. All pointers 64-byte aligned;
/// AVX-512 whatever the flags, as copy_avx512.
template <bool Streaming>
__attribute__((target("avx512f"))) inline void mul_avx512(const float* __restrict a, const float* __restrict b,
                                                          float* __restrict y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if constexpr (Streaming) prefetch_step(a + i, b + i);
    const __m512 p = _mm512_mul_ps(_mm512_load_ps(a + i), _mm512_load_ps(b + i));
    const __m512 q = _mm512_mul_ps(_mm512_load_ps(a + i + 16), _mm512_load_ps(b + i + 16));
    if constexpr (Streaming) {
      _mm512_stream_ps(y + i, p);
      _mm512_stream_ps(y + i + 16, q);
    } else {
      _mm512_store_ps(y + i, p);
      _mm512_store_ps(y + i + 16, q);
    }
  }
  for (; i < n; ++i) y[i] = a[i] * b[i];
  if constexpr (Streaming) _mm_sfence();
}

/// mul_avx512 for hosts without AVX-512: the same steps with AVX2 registers.
template <bool Streaming>
__attribute__((target("avx2"))) inline void mul_avx2(const float* __restrict a, const float* __restrict b,
                                                     float* __restrict y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if constexpr (Streaming) prefetch_step(a + i, b + i);
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_mul_ps(_mm256_load_ps(a + i + 8 * k), _mm256_load_ps(b + i + 8 * k));
    for (int k = 0; k < 4; ++k) {
      if constexpr (Streaming)
        _mm256_stream_ps(y + i + 8 * k, v[k]);
      else
        _mm256_store_ps(y + i + 8 * k, v[k]);
    }
  }
  for (; i < n; ++i) y[i] = a[i] * b[i];
  if constexpr (Streaming) _mm_sfence();
}

/// The 2-read 1-write floor with the host's widest vectors.
template <bool Streaming>
inline void mul_nt(const float* a, const float* b, float* y, std::size_t n) {
  if (host_has_avx512())
    mul_avx512<Streaming>(a, b, y, n);
  else
    mul_avx2<Streaming>(a, b, y, n);
}

/// The fastest copy of n floats: streaming stores for outputs of streaming_store_min_bytes and
/// more, regular stores below (the choice per shape described in bench/README.md).
inline void copy_fastest(const float* x, float* y, std::size_t n) {
  if (n * sizeof(float) >= streaming_store_min_bytes)
    copy_nt<true>(x, y, n);
  else
    copy_nt<false>(x, y, n);
}

/// The fastest 2-read 1-write pass over n floats, chosen the same way as copy_fastest.
inline void mul_fastest(const float* a, const float* b, float* y, std::size_t n) {
  if (n * sizeof(float) >= streaming_store_min_bytes)
    mul_nt<true>(a, b, y, n);
  else
    mul_nt<false>(a, b, y, n);
}

// ---------------------------------------------------------------------------------------------
// Timing outside Google Benchmark (floor calibration) and counters
// ---------------------------------------------------------------------------------------------

/// Median GB/s of `pass` moving `bytes` per call: 2 warm-up calls, then `runs` timings, each of
/// enough back-to-back calls to last about 2 ms (so a 4 MiB pass is not timed one at a time).
template <class F>
double measure_gbps(F&& pass, double bytes, int runs = 15) {
  using clock = std::chrono::steady_clock;
  pass();
  auto t0 = clock::now();
  pass();
  const double once = std::chrono::duration<double>(clock::now() - t0).count();
  const int inner = std::max(1, static_cast<int>(2e-3 / std::max(once, 1e-7)));
  std::vector<double> rates;
  for (int r = 0; r < runs; ++r) {
    t0 = clock::now();
    for (int k = 0; k < inner; ++k) {
      pass();
      benchmark::ClobberMemory();
    }
    const double s = std::chrono::duration<double>(clock::now() - t0).count() / inner;
    rates.push_back(bytes / s * 1e-9);
  }
  std::nth_element(rates.begin(), rates.begin() + runs / 2, rates.end());
  return rates[runs / 2];
}

/// A memory floor: measures itself in GB/s (e.g. a measure_gbps of a copy pass).
using floor_measure = std::function<double()>;

/// The roofline denominator for `key` (direction, shape, threads: "fwd/4096x4096/threads:2"):
/// on first use, measures every floor in `floors` with its own calibration loop and keeps the
/// fastest; later calls return the cached figure. Not thread-safe (cases run one at a time).
inline double floor_gbps(const std::string& key, const std::vector<floor_measure>& floors) {
  static std::map<std::string, double> cache;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  double best = 0;
  for (const auto& f : floors) best = std::max(best, f());
  cache.emplace(key, best);
  return best;
}

/// Sets the two counters of a memory-bound case, from the wall-clock `seconds` the timed loop took
/// (so single- and multi-threaded cases and the floor calibration use the same clock):
/// GBps = bytes_per_iteration * iterations / seconds * 1e-9,
/// roofline = GBps / floor (fraction of the fastest floor for the same direction, shape, threads).
/// Plain counters rather than kIsRate ones, so the console prints numbers, not "0.95/s".
inline void set_memory_counters(benchmark::State& state, double bytes_per_iteration, double seconds, double floor) {
  const double gbps = bytes_per_iteration * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GBps"] = gbps;
  state.counters["roofline"] = gbps / floor;
}

// ---------------------------------------------------------------------------------------------
// Paired timing: two implementations call by call
// ---------------------------------------------------------------------------------------------

/// Per-call times of two implementations timed in alternation (see time_pairs).
struct paired_times {
  std::vector<double> a, b;  // seconds per call

  static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }
  /// Median over the pairs of b's time / a's time: how many times faster a is than b.
  double speedup_of_a() const {
    std::vector<double> r(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) r[i] = b[i] / a[i];
    return median(r);
  }
};

/// Each benchmark iteration runs `fa` once and `fb` once, timed separately, alternating which goes
/// first. On a shared host whose speed drifts (another tenant on the sibling hyperthread, memory
/// traffic of other machines), the two calls of a pair see nearly the same machine, so the
/// median of their per-pair ratio is far steadier than a ratio of two separately timed cases.
/// Seconds one call of f takes on the wall clock, its memory writes included.
template <class F>
double time_call(F&& f) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  f();
  benchmark::ClobberMemory();
  return std::chrono::duration<double>(clock::now() - t0).count();
}

template <class FA, class FB>
paired_times time_pairs(benchmark::State& state, FA&& fa, FB&& fb) {
  paired_times t;
  bool a_first = true;
  for (auto _ : state) {
    if (a_first) {
      t.a.push_back(time_call(fa));
      t.b.push_back(time_call(fb));
    } else {
      t.b.push_back(time_call(fb));
      t.a.push_back(time_call(fa));
    }
    a_first = !a_first;
  }
  return t;
}

/// The FMA peak in GFLOP/s on `threads` threads, measured once per process (gemm.bench.cpp):
/// the denominator of every `roofline` counter of the GEMM benchmarks.
double peak_gflops(int threads);
/// GFLOPs = flops per iteration x iterations / wall seconds; roofline = GFLOPs / peak_gflops.
void set_flop_counters(benchmark::State& state, double flops_per_iteration, double seconds, int threads);

}  // namespace solder_bench
