// common.cuh: what every CUDA benchmark shares: the device's figures, seeded data made on the
// device, rotated buffer sets, the event timer that leaves host overhead out, and the context lines.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "solder/cuda.hpp"

namespace solder_bench::gpu {

using solder::eval::cuda::check;

/// Untimed passes before the timed ones: at least this many, and two over every buffer set.
inline constexpr std::size_t warmup_passes = 5;
/// Data that passes through L2 between two uses of one buffer set, in multiples of L2's size.
inline constexpr std::size_t rotation_l2_multiple = 2;

// ---------------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------------

struct device_info {
  std::string name;
  int memory_clock_mhz = 0, bus_bits = 0;
  double peak_gbps = 0;  // 2 (double data rate) x memory clock x bus width: the data sheet's figure
  std::size_t l2_bytes = 0;
  int multiprocessors = 0;
};

inline device_info& device() {
  static device_info d;
  return d;
}

inline device_info read_device() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  int mem_clock_khz = 0;  // cudaDeviceProp lost memoryClockRate in CUDA 13; the attribute remains
  check(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev), "cudaDeviceGetAttribute");
  device_info d;
  d.name = p.name;
  d.memory_clock_mhz = mem_clock_khz / 1000;
  d.bus_bits = p.memoryBusWidth;
  d.peak_gbps = 2.0 * mem_clock_khz * 1e3 * (p.memoryBusWidth / 8.0) * 1e-9;
  d.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
  d.multiprocessors = p.multiProcessorCount;
  return d;
}

inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

/// How many buffer sets of `set_bytes` to cycle so that rotation_l2_multiple x L2 of other data
/// passes between two uses of one set (at least 2), as many as fit in 90% of the free memory.
inline std::size_t rotation_sets(std::size_t set_bytes) {
  const std::size_t spread = rotation_l2_multiple * device().l2_bytes;
  std::size_t sets = 1 + std::max<std::size_t>(1, (spread + set_bytes - 1) / set_bytes);
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return std::max<std::size_t>(1, std::min(sets, free / 10 * 9 / set_bytes));
}

/// Reads the device, keeps freed memory in the stream-ordered pool and adds the context lines
/// (device, bandwidth, L2, multiprocessors, runtime/driver, host CPU). Call once, before the cases.
inline void start_device() {
  device() = read_device();
  // Freed blocks stay in the stream-ordered pool (as in PyTorch's caching allocator), so the
  // scratch of a pass comes from it, not from the driver, in every iteration.
  cudaMemPool_t pool = nullptr;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetDefaultMemPool(&pool, dev), "cudaDeviceGetDefaultMemPool");
  std::uint64_t keep_all = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all), "cudaMemPoolSetAttribute");
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);

  const device_info& d = device();
  char peak[96];
  std::snprintf(peak, sizeof peak, "%.0f (2 x %d MHz memory clock x %d-bit bus)", d.peak_gbps, d.memory_clock_mhz, d.bus_bits);
  benchmark::AddCustomContext("cuda_device", d.name);
  benchmark::AddCustomContext("cuda_peak_GBps", peak);
  benchmark::AddCustomContext("cuda_l2_MiB", std::to_string(d.l2_bytes >> 20));
  benchmark::AddCustomContext("cuda_multiprocessors", std::to_string(d.multiprocessors));
  benchmark::AddCustomContext("cuda_runtime_driver", std::to_string(runtime) + " / " + std::to_string(driver));
  benchmark::AddCustomContext("cpu_model", cpu_model());
}

/// Whether a CUDA device is present; prints the one line saying nothing is measured where not.
inline bool have_device(const char* binary) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device (%s); nothing measured\n", binary,
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Data and timing
// ---------------------------------------------------------------------------------------------

/// p[i] uniform in [lo, hi) from a hash of (seed, i) (splitmix64): made on the device, fast at 1 GiB.
__global__ void fill_uniform_kernel(float* p, std::size_t n, std::uint64_t seed, float lo, float hi) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p[i] = lo + (hi - lo) * float(z >> 40) * 0x1p-24f;
  }
}

inline void fill_uniform(float* p, std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  fill_uniform_kernel<<<unsigned(device().multiprocessors * 8), 256, 0, solder::current_stream()>>>(p, n, seed, lo, hi);
  check(cudaGetLastError(), "fill_uniform_kernel");
}

/// Holds the stream until the host sets *release (or limit_ns passes: then *expired = 1), so the
/// events and the pass behind it are all queued before the GPU reaches them.
__global__ void hold_kernel(const volatile int* release, volatile int* expired, unsigned long long limit_ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*release == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > limit_ns) {
      *expired = 1;
      return;
    }
  }
}

/// Times single passes on the GPU with CUDA events on the current stream. Each pass is queued
/// behind hold_kernel, released once its start event, the pass and its stop event are queued:
/// the time between the events is the pass's alone, without the launch latency (microseconds,
/// against tens of them for a 4096x4096 forward) that recording the start event first would add.
class gpu_timer {
 public:
  gpu_timer() : stream_(solder::current_stream()) {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    check(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags_), flags_, 0), "cudaHostGetDevicePointer");
  }
  ~gpu_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaFreeHost(flags_);
  }
  gpu_timer(const gpu_timer&) = delete;
  gpu_timer& operator=(const gpu_timer&) = delete;

  /// Seconds `pass` (which queues work on the current stream) takes on the GPU.
  template <class F>
  double seconds(F&& pass) {
    volatile int* flags = flags_;
    flags[0] = 0;
    flags[1] = 0;
    hold_kernel<<<1, 1, 0, stream_>>>(device_flags_, device_flags_ + 1, hold_limit_ns);
    check(cudaGetLastError(), "hold_kernel");
    try {
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      pass();
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    } catch (...) {
      flags[0] = 1;
      throw;
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    flags[0] = 1;
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    if (flags[1] != 0) throw std::runtime_error("queueing one pass took over 0.5 s: the time would not be the GPU's");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms * 1e-3;
  }

 private:
  static constexpr unsigned long long hold_limit_ns = 500'000'000;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  int* flags_ = nullptr;  // [0] release, [1] expired; host memory the GPU reads
  int* device_flags_ = nullptr;
};

/// Warm-up over every set, then Google Benchmark's iterations, each one pass on set k (cycling)
/// timed by gpu_timer. Returns the mean seconds per pass.
template <class Pass>
double timed_seconds(benchmark::State& state, std::size_t sets, Pass&& pass) {
  gpu_timer timer;
  for (std::size_t w = 0; w < std::max(warmup_passes, 2 * sets); ++w) pass(w % sets);
  check(cudaStreamSynchronize(solder::current_stream()), "cudaStreamSynchronize");
  double total = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    const double s = timer.seconds([&] { pass(k); });
    state.SetIterationTime(s);
    total += s;
    k = (k + 1) % sets;
  }
  return total / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
}

/// The median seconds of `count` timed passes over `sets` sets, after the warm-up: for a rate a
/// case needs and a filtered run did not measure.
template <class Pass>
double median_seconds(std::size_t sets, std::size_t count, Pass&& pass) {
  for (std::size_t w = 0; w < std::max(warmup_passes, 2 * sets); ++w) pass(w % sets);
  gpu_timer timer;
  std::vector<double> t;
  for (std::size_t i = 0; i < count; ++i) t.push_back(timer.seconds([&] { pass(i % sets); }));
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

/// Runs a case, reporting a CUDA, cuBLASLt or solder error (out of memory, say) as the case's error.
template <class F>
void guarded(benchmark::State& state, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// Rows `rows` of a device matrix of `cols` columns, copied to the host once the current stream
/// has finished (it does not wait for the legacy default stream that cudaMemcpy uses).
inline std::vector<float> host_rows(const float* device_data, std::size_t cols, const std::vector<std::size_t>& rows) {
  check(cudaStreamSynchronize(solder::current_stream()), "cudaStreamSynchronize");
  std::vector<float> out(rows.size() * cols);
  for (std::size_t i = 0; i < rows.size(); ++i)
    check(cudaMemcpy(out.data() + i * cols, device_data + rows[i] * cols, cols * sizeof(float), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  return out;
}

/// A benchmark binary's main: without a device, one line and exit 0; else the context lines
/// (start_device), then, on a stream of its own, `register_cases()` (it adds context and registers
/// cases; what it returns, a library handle say, is kept until the cases have run), the cases
/// run, and an error outside any case reported on stderr with exit 1.
template <class Register>
int run_benchmarks(int argc, char** argv, Register&& register_cases) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!have_device("solder CUDA bench")) return 0;
  try {
    start_device();
    solder::stream s;
    solder::stream_guard on(s);
    if constexpr (std::is_void_v<decltype(register_cases())>) {
      register_cases();
      benchmark::RunSpecifiedBenchmarks();
    } else {
      [[maybe_unused]] const auto kept = register_cases();
      benchmark::RunSpecifiedBenchmarks();
    }
    s.synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solder CUDA bench: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace solder_bench::gpu
