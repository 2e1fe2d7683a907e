// bias_relu_dropout.cu: y = dropout(relu(x + b)) forward and backward on a CUDA device, against a device-to-device copy.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "solder/cuda.hpp"
#include "solder/nn/elementwise_block.hpp"

namespace {

using solder::eval::cuda::check;

constexpr float drop_p = 0.1f;

/// Seeds of the data, fixed so every run sees the same numbers.
enum seed : std::uint64_t { seed_x = 1, seed_b = 2, seed_dy = 4 };

/// Untimed passes before the timed ones: at least this many, and two over every buffer set.
constexpr std::size_t warmup_passes = 5;
/// Data that passes through L2 between two uses of one buffer set, in multiples of L2's size.
constexpr std::size_t rotation_l2_multiple = 2;

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

device_info& device() {
  static device_info d;
  return d;
}

device_info read_device() {
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

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

/// How many buffer sets of `set_bytes` to cycle so that rotation_l2_multiple x L2 of other data
/// passes between two uses of one set (at least 2), as many as fit in 90% of the free memory.
std::size_t rotation_sets(std::size_t set_bytes) {
  const std::size_t spread = rotation_l2_multiple * device().l2_bytes;
  std::size_t sets = 1 + std::max<std::size_t>(1, (spread + set_bytes - 1) / set_bytes);
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return std::max<std::size_t>(1, std::min(sets, free / 10 * 9 / set_bytes));
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

void fill_uniform(float* p, std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
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
/// timed by gpu_timer. Sets bytes, GBps and peak_fraction; returns GBps.
template <class Pass>
double run_timed(benchmark::State& state, std::size_t sets, double bytes, Pass&& pass) {
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
  const double gbps = bytes * static_cast<double>(state.iterations()) / total * 1e-9;
  state.counters["bytes"] = bytes;
  state.counters["GBps"] = gbps;
  state.counters["peak_fraction"] = gbps / device().peak_gbps;
  return gbps;
}

/// The copy's GB/s per shape (B, N): set by the copy case, else measured on first use.
std::map<std::pair<std::size_t, std::size_t>, double>& copy_rates() {
  static std::map<std::pair<std::size_t, std::size_t>, double> rates;
  return rates;
}

/// Rows `rows` of a device matrix of `cols` columns, copied to the host once the current stream
/// has finished (it does not wait for the legacy default stream that cudaMemcpy uses).
std::vector<float> host_rows(const float* device_data, std::size_t cols, const std::vector<std::size_t>& rows) {
  check(cudaStreamSynchronize(solder::current_stream()), "cudaStreamSynchronize");
  std::vector<float> out(rows.size() * cols);
  for (std::size_t i = 0; i < rows.size(); ++i)
    check(cudaMemcpy(out.data() + i * cols, device_data + rows[i] * cols, cols * sizeof(float), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  return out;
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// Relative tolerance of one element: an add, a max and a multiply in float, a few ulps apart
/// however the scale is folded.
constexpr double element_rel_tol = 1e-5;
/// Relative tolerance of db against a double sum of the column, relative to the sum of |terms|:
/// up to 16384 float additions in a fixed tree, about 200 roundings deep at most.
constexpr double column_sum_rel_tol = 1e-4;

template <std::size_t N>
struct cases {
  using S = solder::shape<solder::dyn, N>;
  using matrix = solder::tensor<float, S, solder::device>;
  using vector = solder::tensor<float, solder::shape<N>, solder::device>;
  using layer_type = solder::nn::bias_relu_dropout<N, drop_p>;
  static constexpr auto train = solder::nn::mode::train;

  /// Only its dropout's Philox stream is used: the bias is a device leaf of the expression.
  static layer_type& layer() {
    static layer_type l;
    return l;
  }
  static float keep_scale() { return layer().template layer<2>().scale(); }

  static matrix filled(std::size_t rows, std::uint64_t seed) {
    matrix m(rows, solder::uninitialized);
    fill_uniform(m.data(), m.size(), seed);
    return m;
  }
  static vector bias() {
    vector b(solder::uninitialized);
    fill_uniform(b.data(), N, seed_b, -0.5f, 0.5f);
    return b;
  }

  /// The layer's training forward: a fresh mask, then y = dropout(relu(x + b)) in one pass.
  static void forward(const matrix& x, const vector& b, matrix& y) {
    layer().advance();
    solder::assign(y.ref(), layer().template expression<train>(x.ref(), b.ref()));
  }
  /// The layer's backward_from_output: dx = g and db = column sums of g in one pass, where
  /// g = (y > 0 ? dy * scale : 0) is read from the saved output y.
  static void backward(const matrix& y, const matrix& dy, matrix& dx, vector& db) {
    const auto g = layer().template gate_from_output<train>(y.ref(), dy.ref());
    solder::assign_all(solder::write(dx.ref(), g), solder::write(db.ref(), solder::sum_to<solder::shape<N>>(g)));
  }

  static double copy_bytes(std::size_t rows) { return 2.0 * rows * N * sizeof(float); }

  struct copy_set {
    matrix x, y;
  };
  static std::vector<copy_set> copy_sets(std::size_t rows) {
    std::vector<copy_set> sets;
    for (std::size_t k = 0, n = rotation_sets(copy_bytes(rows)); k < n; ++k)
      sets.push_back({filled(rows, seed_x + 16 * k), matrix(rows, solder::uninitialized)});
    return sets;
  }
  /// The floor: y = x as one cudaMemcpyAsync, the same bytes read and written as the forward.
  static void copy_pass(copy_set& s) {
    check(cudaMemcpyAsync(s.y.data(), s.x.data(), s.x.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                          solder::current_stream()),
          "cudaMemcpyAsync");
  }

  /// The copy's GB/s for this shape: the copy case's, or the median of 31 timed copies.
  static double copy_gbps(std::size_t rows) {
    auto& rates = copy_rates();
    if (auto it = rates.find({rows, N}); it != rates.end()) return it->second;
    auto sets = copy_sets(rows);
    for (std::size_t w = 0; w < std::max(warmup_passes, 2 * sets.size()); ++w) copy_pass(sets[w % sets.size()]);
    gpu_timer timer;
    std::vector<double> t;
    for (std::size_t i = 0; i < 31; ++i) t.push_back(timer.seconds([&] { copy_pass(sets[i % sets.size()]); }));
    std::nth_element(t.begin(), t.begin() + 15, t.end());
    return rates[{rows, N}] = copy_bytes(rows) / t[15] * 1e-9;
  }

  static void set_roofline(benchmark::State& state, double gbps, std::size_t rows) {
    const double copy = copy_gbps(rows);
    state.counters["copy_GBps"] = copy;
    state.counters["roofline"] = gbps / copy;
  }

  static void copy(benchmark::State& state, std::size_t rows) {
    auto sets = copy_sets(rows);
    const double gbps = run_timed(state, sets.size(), copy_bytes(rows), [&](std::size_t k) { copy_pass(sets[k]); });
    copy_rates()[{rows, N}] = gbps;
    state.counters["copy_GBps"] = gbps;
    state.counters["roofline"] = 1.0;
    state.SetLabel(std::to_string(sets.size()) + " buffer sets");
  }

  /// "" when rows of y hold dropout(relu(x + b)): every nonzero (x + b) * scale, zero where
  /// x + b <= 0, and the kept fraction of the positive ones 1 - p within 0.05.
  static std::string check_forward(const matrix& x, const vector& b, const matrix& y) {
    const std::vector<std::size_t> rows = {0, x.batch() / 2, x.batch() - 1};
    const auto hx = host_rows(x.data(), N, rows), hy = host_rows(y.data(), N, rows), hb = host_rows(b.data(), N, {0});
    const double scale = keep_scale();
    std::size_t positive = 0, kept = 0;
    for (std::size_t i = 0; i < hx.size(); ++i) {
      const double pre = double(hx[i]) + hb[i % N], want = pre * scale;
      if (hy[i] != 0.0f && (pre <= 0 || std::abs(hy[i] - want) > element_rel_tol * std::abs(want)))
        return "y[" + std::to_string(rows[i / N]) + ", " + std::to_string(i % N) + "] is " + std::to_string(hy[i]) +
               ", expected 0 or " + std::to_string(want);
      positive += pre > 0;
      kept += hy[i] != 0.0f;
    }
    const double fraction = double(kept) / double(positive);
    if (std::abs(fraction - (1.0 - drop_p)) > 0.05) return "keeps " + std::to_string(fraction) + " of the positive elements";
    return "";
  }

  /// "" when rows of dx hold (y > 0 ? dy * scale : 0) and db a few column sums of dx.
  static std::string check_backward(const matrix& y, const matrix& dy, const matrix& dx, const vector& db) {
    const std::vector<std::size_t> rows = {0, y.batch() / 2, y.batch() - 1};
    const auto hy = host_rows(y.data(), N, rows), hdy = host_rows(dy.data(), N, rows), hdx = host_rows(dx.data(), N, rows);
    const double scale = keep_scale();
    for (std::size_t i = 0; i < hy.size(); ++i) {
      const double want = hy[i] > 0 ? hdy[i] * scale : 0.0;
      if (std::abs(hdx[i] - want) > element_rel_tol * std::abs(want))
        return "dx[" + std::to_string(rows[i / N]) + ", " + std::to_string(i % N) + "] is " + std::to_string(hdx[i]) +
               ", expected " + std::to_string(want);
    }
    const auto hdb = host_rows(db.data(), N, {0});
    std::vector<float> column(dx.batch());
    for (std::size_t c : {std::size_t{0}, std::size_t{1}, N / 2, N - 1}) {
      check(cudaMemcpy2D(column.data(), sizeof(float), dx.data() + c, N * sizeof(float), sizeof(float), dx.batch(),
                         cudaMemcpyDeviceToHost),
            "cudaMemcpy2D");
      double sum = 0, magnitude = 0;
      for (float v : column) sum += v, magnitude += std::abs(v);
      if (std::abs(hdb[c] - sum) > column_sum_rel_tol * magnitude)
        return "db[" + std::to_string(c) + "] is " + std::to_string(hdb[c]) + ", the column sum of dx " + std::to_string(sum);
    }
    return "";
  }

  struct fwd_set {
    matrix x, y;
  };
  static void fwd(benchmark::State& state, std::size_t rows) {
    const double bytes = 2.0 * rows * N * sizeof(float);  // reads x, writes y
    const vector b = bias();
    std::vector<fwd_set> sets;
    for (std::size_t k = 0, n = rotation_sets(bytes); k < n; ++k)
      sets.push_back({filled(rows, seed_x + 16 * k), matrix(rows, solder::uninitialized)});
    forward(sets[0].x, b, sets[0].y);
    if (const std::string err = check_forward(sets[0].x, b, sets[0].y); !err.empty()) return state.SkipWithError(err.c_str());
    const double gbps = run_timed(state, sets.size(), bytes, [&](std::size_t k) { forward(sets[k].x, b, sets[k].y); });
    set_roofline(state, gbps, rows);
    state.SetLabel(std::to_string(sets.size()) + " buffer sets");
  }

  struct bwd_set {
    matrix y, dy, dx;
  };
  static void bwd(benchmark::State& state, std::size_t rows) {
    const double bytes = 3.0 * rows * N * sizeof(float);  // reads y and dy, writes dx
    const vector b = bias();
    vector db(solder::uninitialized);
    std::vector<bwd_set> sets;
    {
      const matrix x = filled(rows, seed_x);
      for (std::size_t k = 0, n = rotation_sets(bytes); k < n; ++k) {
        sets.push_back({matrix(rows, solder::uninitialized), filled(rows, seed_dy + 16 * k), matrix(rows, solder::uninitialized)});
        forward(x, b, sets[k].y);  // each set's saved output, with its own mask
      }
    }
    backward(sets[0].y, sets[0].dy, sets[0].dx, db);
    if (const std::string err = check_backward(sets[0].y, sets[0].dy, sets[0].dx, db); !err.empty())
      return state.SkipWithError(err.c_str());
    const double gbps =
        run_timed(state, sets.size(), bytes, [&](std::size_t k) { backward(sets[k].y, sets[k].dy, sets[k].dx, db); });
    set_roofline(state, gbps, rows);
    state.SetLabel(std::to_string(sets.size()) + " buffer sets");
  }
};

/// Runs a case, reporting a CUDA or solder error (out of memory, say) as the case's error.
template <void (*Case)(benchmark::State&, std::size_t)>
void guarded(benchmark::State& state, std::size_t rows) {
  try {
    Case(state, rows);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

template <std::size_t N>
void register_shape(std::size_t rows) {
  const std::string shape = std::to_string(rows) + "x" + std::to_string(N);
  // The copy first: the cases after it compare with the rate it measured.
  const std::pair<const char*, void (*)(benchmark::State&, std::size_t)> list[] = {
      {"BM_cuda_copy/", guarded<&cases<N>::copy>},
      {"BM_cuda_bias_relu_dropout_fwd/", guarded<&cases<N>::fwd>},
      {"BM_cuda_bias_relu_dropout_bwd/", guarded<&cases<N>::bwd>},
  };
  for (const auto& [prefix, fn] : list)
    benchmark::RegisterBenchmark((prefix + shape).c_str(), fn, rows)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::printf("solder CUDA bench: no CUDA device (%s); nothing measured\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return 0;
  }
  try {
    device() = read_device();
    // Freed blocks stay in the stream-ordered pool (as in PyTorch's caching allocator), so the
    // backward's scratch comes from it, not from the driver, in every iteration.
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
    std::snprintf(peak, sizeof peak, "%.0f (2 x %d MHz memory clock x %d-bit bus)", d.peak_gbps, d.memory_clock_mhz,
                  d.bus_bits);
    benchmark::AddCustomContext("cuda_device", d.name);
    benchmark::AddCustomContext("cuda_peak_GBps", peak);
    benchmark::AddCustomContext("cuda_l2_MiB", std::to_string(d.l2_bytes >> 20));
    benchmark::AddCustomContext("cuda_multiprocessors", std::to_string(d.multiprocessors));
    benchmark::AddCustomContext("cuda_runtime_driver", std::to_string(runtime) + " / " + std::to_string(driver));
    benchmark::AddCustomContext("cpu_model", cpu_model());

    solder::stream s;
    solder::stream_guard on(s);
    register_shape<4096>(4096);
    register_shape<16384>(16384);
    benchmark::RunSpecifiedBenchmarks();
    s.synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solder CUDA bench: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
