// benchmark.hpp: Google Benchmark cases for any chain, registered by one call: the forward (in
// evaluation and in training mode), the backward, the training step and each planned kernel
// alone, each fused and as the same layers run one kernel per layer, with GFLOP/s and GB/s from
// cost<Model> and the fraction of this host's measured roofline that each case reaches.
//
//   #include <benchmark/benchmark.h>
//   #include "solder/benchmark.hpp"
//
//   int main(int argc, char** argv) {
//     benchmark::Initialize(&argc, argv);
//     solder::bench::register_chain<mlp>("mlp", {.batch = 256});  // mlp/forward_train/fused/256, ...
//     benchmark::RunSpecifiedBenchmarks();
//     std::cout << solder::bench::roofline_report{};              // every case against the roofline
//   }
//
// This header does not include <benchmark/benchmark.h>: that header starts a static initializer
// which needs Google Benchmark's library in every program that includes it, and solder's
// headers compile and link alone. The program that registers cases includes it (it calls
// benchmark::Initialize), and register_chain finds benchmark::RegisterBenchmark there, by
// argument-dependent lookup through benchmark::State, when it is instantiated.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <iomanip>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/cost.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/executor.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/memory.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/criterion.hpp"
#include "solder/optim/adam.hpp"

namespace benchmark {
class State;  // Google Benchmark's; only named here (see register_chain)
}  // namespace benchmark

namespace solder::bench {

// ---------------------------------------------------------------------------------------------
// The work of a call, from cost<Model>
// ---------------------------------------------------------------------------------------------

/// What a case runs: a forward in evaluation mode (dropout off, weights packed, batch_norm
/// folded) or in training mode, a backward after one training forward, or a training step
/// (forward, loss, backward, optimizer step).
enum class pass { forward_eval, forward_train, backward, train_step };

constexpr std::string_view pass_name(pass p) {
  switch (p) {
    case pass::forward_eval: return "forward_eval";
    case pass::forward_train: return "forward_train";
    case pass::backward: return "backward";
    case pass::train_step: return "train_step";
  }
  return "";
}

/// What one call does: FLOPs, and bytes read plus bytes written.
struct work {
  double flops = 0, bytes = 0;
  friend constexpr work operator+(work a, work b) { return {a.flops + b.flops, a.bytes + b.bytes}; }
  friend constexpr bool operator==(work, work) = default;
};

/// The parameter-sized arrays an optimizer's step reads and writes: at least the weight and its
/// gradient read and the weight written; Adam and AdamW also read and write both moments.
template <class Optimizer>
inline constexpr double optimizer_arrays = 3;
template <bool Decoupled>
inline constexpr double optimizer_arrays<optim::basic_adam<Decoupled>> = 7;

/// The work of Model's calls on `batch` samples, from cost<Model> (per sample) and the weights
/// (once per call); constant expressions for a constant batch.
///   forward:  batch x forward FLOPs;  batch x forward bytes + weights
///             (in evaluation mode without what a kernel keeps for backward)
///   backward: batch x backward FLOPs; batch x backward bytes + weights read + gradients written
///   training step: forward + backward, and the optimizer's pass over its arrays
template <class Model>
struct chain_work {
  using model_cost = cost<Model>;
  static constexpr std::size_t kernels = Model::kernels;

  /// Planned kernel K alone (pass::train_step: its forward and backward).
  template <std::size_t K>
  static constexpr work kernel(pass p, std::size_t batch) {
    using k = typename model_cost::template kernel<K>;
    const double n = double(batch);
    switch (p) {
      case pass::forward_eval:
        return {n * k::forward_flops, n * (k::forward_bytes - 4.0 * double(k::saved)) + k::weight_bytes};
      case pass::forward_train:
        return {n * k::forward_flops, n * k::forward_bytes + k::weight_bytes};
      case pass::backward:
        return {n * k::backward_flops, n * k::backward_bytes + 2.0 * k::weight_bytes};
      case pass::train_step:
        return kernel<K>(pass::forward_train, batch) + kernel<K>(pass::backward, batch);
    }
    return {};
  }

  /// Kernels [first, last) run one after the other.
  static constexpr work kernels_in(std::size_t first, std::size_t last, pass p, std::size_t batch) {
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      work w;
      ((w = K >= first && K < last ? w + kernel<K>(p, batch) : w), ...);
      return w;
    }(std::make_index_sequence<kernels>{});
  }

  /// The whole model; a training step adds the optimizer's pass (the loss is left out: it
  /// moves the output alone).
  template <class Optimizer = optim::adamw>
  static constexpr work model(pass p, std::size_t batch) {
    const work w = kernels_in(0, kernels, p, batch);
    return p == pass::train_step ? w + work{0, optimizer_arrays<Optimizer> * model_cost::weight_bytes} : w;
  }
};

// ---------------------------------------------------------------------------------------------
// This host's roofline: FMA peak and copy bandwidth, measured once per process
// ---------------------------------------------------------------------------------------------

/// The limits a case is held against: GFLOP/s of independent FMAs, GB/s of a copy.
struct roofline {
  double peak_gflops = 0, gbps = 0;
  constexpr double compute_seconds(work w) const { return w.flops / (peak_gflops * 1e9); }
  constexpr double memory_seconds(work w) const { return w.bytes / (gbps * 1e9); }
  /// The least time w can take here: max(flops / peak, bytes / bandwidth).
  constexpr double floor_seconds(work w) const { return std::max(compute_seconds(w), memory_seconds(w)); }
  constexpr bool compute_bound(work w) const { return compute_seconds(w) >= memory_seconds(w); }
};

/// A case's rates: GFLOP/s and GB/s, the fraction of the FMA peak, and floor time / time (1:
/// as fast as the roofline allows; the larger of the compute and the memory fraction).
struct rates {
  double gflops = 0, gbps = 0, peak_fraction = 0, floor_fraction = 0;
  bool compute_bound = false;
};
constexpr rates rates_of(work w, double seconds, roofline r) {
  return {w.flops / seconds * 1e-9, w.bytes / seconds * 1e-9, r.compute_seconds(w) / seconds, r.floor_seconds(w) / seconds,
          r.compute_bound(w)};
}

namespace detail {

using clock = std::chrono::steady_clock;

inline double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

/// Makes the compiler treat the memory at p as read and written here (Google Benchmark's
/// DoNotOptimize and ClobberMemory in one), so no timed call is dropped or moved.
inline void keep(const void* p) {
#if defined(__GNUC__)
  asm volatile("" : : "r"(p) : "memory");
#else
  static const void* volatile sink;
  sink = p;
#endif
}

/// The rate of run(reps), which does `units` reps times: the fastest of 31 samples, each with
/// reps chosen to last about 0.2 ms, after 2 runs that warm caches and pages. The fastest, not
/// the median, and short samples: other processes on the host can only slow a sample down, and
/// a short one often runs whole between two of theirs.
template <class F>
double best_rate(F&& run, double units) {
  run(1);
  run(1);
  auto t0 = clock::now();
  run(1);
  const int reps = std::max(1, int(2e-4 / std::max(seconds_since(t0), 1e-9)));
  double best = 0;
  for (int s = 0; s < 31; ++s) {
    t0 = clock::now();
    run(reps);
    best = std::max(best, units * reps / seconds_since(t0));
  }
  return best;
}

/// f(piece) for each of `threads` pieces, one a thread, in one parallel region: a sample's
/// threads start once, not once a repetition.
template <class F>
void on_threads(int threads, F&& f) {
  eval::cpu::parallel_for(std::size_t(threads), threads, f);
}

/// The peak's loop: `Chains` independent chains of vector FMAs, `steps` rounds of them; returns a
/// value that depends on all of them. The start values are volatile reads, so a call is never
/// folded or hoisted. solder_bench's BM_peak_fma runs the same loop.
inline constexpr long fma_steps = 1L << 15;  // ~0.08 ms on a 200 GFLOP/s core
template <int Chains>
[[gnu::noinline]] float run_fma_chains(long steps = fma_steps) {
  using V = executor<cpu>::vec;
  static volatile float start = 1e-3f, scale = 0.999f, shift = 1e-4f;  // converges to 0.1: no overflow, no subnormals
  V acc[Chains];
  for (int i = 0; i < Chains; ++i) acc[i] = V(start * float(i));
  const V m(scale), c(shift);
  for (long k = 0; k < steps; ++k) {
#pragma GCC unroll 32
    for (int i = 0; i < Chains; ++i) acc[i] = eval::cpu::fma(acc[i], m, c);  // as the GEMM micro-kernel
  }
  for (int i = 1; i < Chains; ++i) acc[0] += acc[i];
  alignas(64) float lanes[V::size];
  acc[0].store_aligned(lanes);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

/// The chain counts the probe tries. The FMA pipes need latency x ports independent chains (8
/// for 4 cycles on two ports, more where the latency is longer), and the chains with the loop's
/// two constants must fit the vector registers (32 with AVX-512, 16 with AVX2 or SSE): past that
/// they spill, and the loop measures the loads and stores (16 chains on AVX2 ran at 0.56 of 14).
using fma_chain_counts = std::conditional_t<std::is_base_of_v<xsimd::avx512f, eval::cpu::arch>,
                                            std::integer_sequence<int, 8, 12, 16, 20, 24, 28>,
                                            std::integer_sequence<int, 6, 8, 10, 12, 14>>;

/// run_fma_chains with the chain count a runtime value (one of fma_chain_counts); 0 otherwise.
inline float run_fma_chains_of(int chains, long steps) {
  float out = 0;
  [&]<int... C>(std::integer_sequence<int, C...>) {
    ((chains == C ? (out = run_fma_chains<C>(steps), true) : false) || ...);
  }(fma_chain_counts{});
  return out;
}

/// The rate of the loop of `chains` chains on `threads` threads, in GFLOP/s (best_rate's best).
inline double measure_fma_rate(int threads, int chains) {
  const double flops = 2.0 * chains * double(executor<cpu>::vec::size) * double(fma_steps) * threads;
  std::vector<float> sums(static_cast<std::size_t>(threads));
  const double rate = best_rate(
      [&](int reps) {
        on_threads(threads, [&](std::size_t t) {
          for (int r = 0; r < reps; ++r) sums[t] += run_fma_chains_of(chains, fma_steps);
        });
        keep(sums.data());
      },
      flops);
  return rate * 1e-9;
}

/// The FMA peak on `threads` threads: the best of every chain count, and the count it took.
struct fma_peak {
  double gflops = 0;
  int chains = 0;
};
inline fma_peak measure_fma_peak(int threads) {
  fma_peak best;
  [&]<int... C>(std::integer_sequence<int, C...>) {
    for (int chains : {C...})
      if (const double r = measure_fma_rate(threads, chains); r > best.gflops) best = {r, chains};
  }(fma_chain_counts{});
  return best;
}

inline double measure_copy(int threads, std::size_t bytes) {
  aligned_array<std::byte> from = allocate_aligned<std::byte>(bytes), to = allocate_aligned<std::byte>(bytes);
  std::memset(from.get(), 1, bytes);  // every page touched before any timing
  std::memset(to.get(), 0, bytes);
  const std::size_t pieces = std::size_t(threads), piece = bytes / pieces / 64 * 64;
  const double rate = best_rate(
      [&](int reps) {
        on_threads(threads, [&](std::size_t i) {
          const std::size_t first = i * piece, last = i + 1 == pieces ? bytes : first + piece;
          for (int r = 0; r < reps; ++r) {
            std::memcpy(to.get() + first, from.get() + first, last - first);
            keep(to.get() + first);
          }
        });
      },
      2.0 * double(bytes));
  return rate * 1e-9;
}

/// Measured limits by thread count (and copy size), kept for the process. Cases run one at a time.
struct limits_cache {
  std::map<int, fma_peak> peak;
  std::map<std::pair<int, std::size_t>, double> copy;
};
inline limits_cache& limits() {
  static limits_cache c;
  return c;
}
inline const fma_peak& peak_on(int threads) {
  auto& peak = limits().peak;
  if (auto it = peak.find(threads); it != peak.end()) return it->second;
  return peak[threads] = measure_fma_peak(threads);
}

}  // namespace detail

/// This host's FP32 FMA peak on `threads` threads, in GFLOP/s: independent FMA chains on the
/// vectors this build compiles for (-march=native: the host's widest), the best of several
/// chain counts (detail::fma_chain_counts). Measured on first use (tens of milliseconds), then
/// kept.
inline double fma_peak_gflops(int threads) { return detail::peak_on(threads).gflops; }
/// The chain count that gave fma_peak_gflops(threads).
inline int fma_peak_chains(int threads) { return detail::peak_on(threads).chains; }

/// The bytes of the copy that stands for a working set: half of it copied into the other half,
/// a power of two from 4 KiB to 64 MiB (the nearest; beyond 64 MiB memory is as slow as it gets).
constexpr std::size_t copy_bytes_for(double working_set_bytes) {
  std::size_t b = std::size_t(4) << 10;
  while (b < (std::size_t(64) << 20) && double(b) * 1.5 < working_set_bytes / 2) b *= 2;
  return b;
}

/// This host's copy bandwidth on `threads` threads, in GB/s of bytes read plus bytes written,
/// for a copy spanning about `working_set_bytes` (so a kernel whose data sits in L1 or L2 is
/// held against L1 or L2, and a larger one against memory). glibc's memcpy, each thread a
/// contiguous piece; measured on first use of each size, then kept.
inline double copy_gbps(int threads, double working_set_bytes) {
  const std::size_t bytes = copy_bytes_for(working_set_bytes);
  auto& copy = detail::limits().copy;
  if (auto it = copy.find({threads, bytes}); it != copy.end()) return it->second;
  return copy[{threads, bytes}] = detail::measure_copy(threads, bytes);
}

/// The roofline a case with work w is held against on `threads` threads.
inline roofline host_roofline(int threads, work w) { return {fma_peak_gflops(threads), copy_gbps(threads, w.bytes)}; }

// ---------------------------------------------------------------------------------------------
// Names, options, results
// ---------------------------------------------------------------------------------------------

/// "k<K>:<kernel>", how a planned kernel appears in its cases' names: "k0:linear+relu+dropout".
inline std::string kernel_id(std::size_t k, std::string_view kernel) {
  return "k" + std::to_string(k) + ":" + std::string(kernel);
}

/// A case's name: "<model>/<pass>/<fused|unfused>/<batch>", with the kernel's id after the
/// model's name for a kernel's case: "mlp/k0:linear+relu+dropout/forward_train/fused/256".
inline std::string case_name(std::string_view model, std::string_view kernel, pass p, bool fused, std::size_t batch) {
  std::string s(model);
  if (!kernel.empty()) s.append("/").append(kernel);
  s.append("/").append(pass_name(p)).append(fused ? "/fused/" : "/unfused/").append(std::to_string(batch));
  return s;
}

/// What register_chain registers, and how the cases run.
struct options {
  std::size_t batch = 256;  // samples per call
  int threads = 1;          // solder::set_num_threads while a case runs (and the roofline's)
  bool forward_eval = true, forward_train = true, backward = true, train_step = true;  // the passes
  bool kernels = true;  // each planned kernel alone too (its forwards and backward)
  bool unfused = true;  // beside each fused case, the same layers one kernel per layer
  std::uint64_t seed = 1;  // parameters and data
};

/// The last measurement of a case.
struct case_result {
  std::string name;
  int threads = 1;
  double seconds = 0;  // per call, wall clock
  work per_call;
  roofline limits;
  rates measured;
  double fused_speedup = 0;  // the unfused case's seconds / these seconds; 0 where it did not run
};

namespace detail {
struct result_table {
  std::vector<case_result> rows;  // in the order the cases first ran
  std::map<std::string, std::size_t, std::less<>> index;
};
inline result_table& result_rows() {
  static result_table t;
  return t;
}
inline void record(case_result r) {
  auto& t = result_rows();
  if (auto it = t.index.find(r.name); it != t.index.end()) {
    t.rows[it->second] = std::move(r);
  } else {
    t.index.emplace(r.name, t.rows.size());
    t.rows.push_back(std::move(r));
  }
}
inline const case_result* find_result(std::string_view name) {
  auto& t = result_rows();
  auto it = t.index.find(name);
  return it == t.index.end() ? nullptr : &t.rows[it->second];
}
}  // namespace detail

/// Every case run so far in this process, its last measurement each, in the order they first ran.
inline const std::vector<case_result>& results() { return detail::result_rows().rows; }

/// `std::cout << roofline_report{}`: the limits measured in this process, then the cases run so
/// far, each with its time per call, rates, fractions of the FMA peak and of the roofline floor,
/// what bounds it (FLOPs or bytes), and the speed-up of a fused case over its unfused one.
struct roofline_report {
  friend std::ostream& operator<<(std::ostream& os, roofline_report) {
    const auto flags = os.flags();
    const auto precision = os.precision();
    os << std::fixed << std::setprecision(1) << "this host's roofline, measured in this process:\n";
    for (const auto& [threads, peak] : detail::limits().peak)
      os << "  FMA peak, " << threads << (threads == 1 ? " thread: " : " threads: ") << peak.gflops << " GFLOP/s ("
         << peak.chains << " chains)\n";
    int shown = 0;  // the thread count of the copies on the current line
    for (const auto& [key, gbps] : detail::limits().copy) {
      const auto [threads, bytes] = key;
      if (threads != shown)
        os << (shown ? "\n" : "") << "  copy (GB/s), " << threads << (threads == 1 ? " thread:" : " threads:");
      else
        os << ",";
      shown = threads;
      os << " " << (bytes >= (1u << 20) ? bytes >> 20 : bytes >> 10) << (bytes >= (1u << 20) ? " MiB " : " KiB ") << gbps;
    }
    if (shown) os << "\n";

    std::size_t width = 4;
    for (const case_result& r : results()) width = std::max(width, r.name.size());
    os << "  " << std::left << std::setw(int(width)) << "case" << std::right << std::setw(13) << "time/call"
       << std::setw(10) << "GFLOP/s" << std::setw(9) << "GB/s" << std::setw(9) << "of peak" << std::setw(10)
       << "of floor" << std::setw(8) << "bound" << std::setw(10) << "speed-up" << "\n";
    for (const case_result& r : results()) {
      os << "  " << std::left << std::setw(int(width)) << r.name << std::right << std::setprecision(2) << std::setw(10)
         << r.seconds * 1e6 << " us" << std::setprecision(1) << std::setw(10) << r.measured.gflops << std::setw(9)
         << r.measured.gbps << std::setw(8) << 100 * r.measured.peak_fraction << "%" << std::setw(9)
         << 100 * r.measured.floor_fraction << "%" << std::setw(8) << (r.measured.compute_bound ? "FLOPs" : "bytes");
      if (r.fused_speedup > 0) os << std::setprecision(2) << std::setw(9) << r.fused_speedup << "x";
      os << "\n";
    }
    os.flags(flags);
    os.precision(precision);
    return os;
  }
};

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

namespace detail {

template <class>
inline constexpr bool always_false = false;

/// Model with every layer its own kernel (nn::unfused_chain of the same layers and input).
template <class Model>
struct unfused_of;
template <class Config, class... Layers>
struct unfused_of<nn::basic_chain<Config, Layers...>> {
  using type = nn::basic_chain<nn::chain_config<false, typename Config::input, typename Config::space>, Layers...>;
};
template <class Model>
using unfused_t = typename unfused_of<Model>::type;

/// Whether a training step trains Model as a classifier (cross-entropy on integer labels) or
/// by mean squared error on a target of its output's shape.
template <class Model>
inline constexpr bool classifier = Model::output_shape.rank == 1 && Model::out_features >= 2;

/// The sample shapes of planned kernel K's input and output, as tensor shapes of a batch.
template <class Model, std::size_t K>
struct kernel_shapes {
  using group = std::tuple_element_t<K, typename Model::groups>;
  using out = typename Model::widths::template batch_after<group::first + group::size - 1>;
};
template <class Model, std::size_t K>
struct kernel_input {
  using type = typename kernel_shapes<Model, K - 1>::out;
};
template <class Model>
struct kernel_input<Model, 0> {
  using type = typename Model::widths::input_batch;
};

inline void fill_uniform(float* p, std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::size_t i = 0; i < n; ++i) p[i] = dist(gen);
}

/// solder::set_num_threads(n) while alive.
class thread_scope {
 public:
  explicit thread_scope(int n) : saved(num_threads()) { set_num_threads(n); }
  ~thread_scope() { set_num_threads(saved); }
  thread_scope(const thread_scope&) = delete;
  thread_scope& operator=(const thread_scope&) = delete;

 private:
  int saved;
};

/// What a registered case runs and counts.
struct case_spec {
  std::string name;
  pass what = pass::forward_train;
  std::size_t batch = 1;
  int threads = 1;
  std::uint64_t seed = 1;
  work per_call;
  std::string baseline;  // the unfused case it is compared with ("" for none)
};

/// Times `call` in Google Benchmark's loop on the wall clock (after 3 untimed calls), and sets
/// the case's counters: GFLOPs, GBps, peak_fraction, floor_fraction (and fused_speedup where
/// the unfused case ran before), the label saying whether FLOPs or bytes bound it.
template <class State, class F>
void measure(State& state, const case_spec& spec, F&& call) {
  const roofline limits = host_roofline(spec.threads, spec.per_call);  // calibrated before any timing
  const executor<cpu>::flush_denormals flush;  // as the chain's own calls run
  for (int i = 0; i < 3; ++i) call();
  const auto t0 = clock::now();
  for ([[maybe_unused]] auto _ : state) call();
  const double seconds = seconds_since(t0) / double(std::max<std::int64_t>(std::int64_t(state.iterations()), 1));

  case_result r{spec.name, spec.threads, seconds, spec.per_call, limits, rates_of(spec.per_call, seconds, limits), 0};
  state.counters["GFLOPs"] = r.measured.gflops;
  state.counters["GBps"] = r.measured.gbps;
  state.counters["peak_fraction"] = r.measured.peak_fraction;
  state.counters["floor_fraction"] = r.measured.floor_fraction;
  if (const case_result* unfused = spec.baseline.empty() ? nullptr : find_result(spec.baseline)) {
    r.fused_speedup = unfused->seconds / seconds;
    state.counters["fused_speedup"] = r.fused_speedup;
  }
  state.SetLabel(r.measured.compute_bound ? "compute-bound" : "memory-bound");
  record(std::move(r));
}

/// Runs f, reporting an exception as the case's error.
template <class State, class F>
void guarded(State& state, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// A whole-model case: Model's forward_into, backward or train_step on random data.
template <class Model, class Optimizer, class State>
void run_model_case(State& state, const case_spec& spec, const typename Optimizer::options& optimizer) {
  guarded(state, [&] {
    const thread_scope threads(spec.threads);
    const std::size_t n = spec.batch;
    Model model(spec.seed);
    typename Model::input_tensor x(n, uninitialized);
    typename Model::output_tensor out(n), dy(n, uninitialized);
    fill_uniform(x.data(), x.size(), spec.seed + 1, -1.0f, 1.0f);
    fill_uniform(dy.data(), dy.size(), spec.seed + 2, -1.0f / float(n), 1.0f / float(n));
    const typename Model::input_ref xs(x.data(), n);
    switch (spec.what) {
      case pass::forward_eval:
      case pass::forward_train:
        if (spec.what == pass::forward_eval) model.eval();
        measure(state, spec, [&] {
          model.forward_into(xs, out.ref());
          keep(out.data());
        });
        break;
      case pass::backward:
        model.forward_into(xs, out.ref());
        measure(state, spec, [&] {
          model.backward(typename Model::output_ref(dy.data(), n));
          keep(&model);
        });
        break;
      case pass::train_step: {
        Optimizer opt(model.params(), optimizer);
        if constexpr (classifier<Model>) {
          std::vector<std::int32_t> labels(n);
          for (std::size_t i = 0; i < n; ++i) labels[i] = std::int32_t((i * 7 + 3) % Model::out_features);
          measure(state, spec, [&] {
            model.train_step(xs, labels, opt);
            keep(&model);
          });
        } else {
          typename Model::output_tensor target(n, uninitialized);
          fill_uniform(target.data(), target.size(), spec.seed + 3, 0.0f, 1.0f);
          measure(state, spec, [&] {
            model.train_step(xs, target, opt, nn::mse_loss{});
            keep(&model);
          });
        }
        break;
      }
    }
  });
}

/// Planned kernels [K0, K1) of Model, run alone on random data the way the chain runs them:
/// each block's forward into its own buffer; backward last kernel first, the first kernel of
/// the model writing parameter gradients only where its block can.
template <class Model, std::size_t K0, std::size_t K1>
class kernel_run {
  template <std::size_t K>
  using in_shape = typename kernel_input<Model, K>::type;
  template <std::size_t K>
  using out_shape = typename kernel_shapes<Model, K>::out;
  template <class Seq>
  struct buffers;
  template <std::size_t... I>
  struct buffers<std::index_sequence<I...>> {
    using type = std::tuple<tensor<float, out_shape<K0 + I>>...>;
    static type make(std::size_t n) { return type(tensor<float, out_shape<K0 + I>>(n)...); }
  };
  using outputs = buffers<std::make_index_sequence<K1 - K0>>;

 public:
  kernel_run(Model& m, std::size_t batch, std::uint64_t seed)
      : model(m), n(batch), x(batch, uninitialized), dx(batch), acts(outputs::make(batch)), grads(outputs::make(batch)) {
    fill_uniform(x.data(), x.size(), seed + 1, -1.0f, 1.0f);
    auto& dy = std::get<K1 - 1 - K0>(grads);  // dL/d(last output); no kernel here writes it
    fill_uniform(dy.data(), dy.size(), seed + 2, -1.0f / float(batch), 1.0f / float(batch));
  }

  void forward() {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (forward_kernel<K0 + I>(), ...); }(std::make_index_sequence<K1 - K0>{});
    keep(std::get<K1 - 1 - K0>(acts).data());
  }
  void backward() {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (backward_kernel<K1 - 1 - I>(), ...); }(std::make_index_sequence<K1 - K0>{});
    keep(&model);
  }

 private:
  Model& model;
  std::size_t n;
  tensor<float, in_shape<K0>> x, dx;
  typename outputs::type acts, grads;

  template <std::size_t K>
  auto input() const {
    if constexpr (K == K0)
      return tensor_ref<const float, in_shape<K0>>(x.data(), n);
    else
      return tensor_ref<const float, out_shape<K - 1>>(std::get<K - 1 - K0>(acts).data(), n);
  }
  template <std::size_t K>
  auto input_grad() {
    if constexpr (K == K0)
      return tensor_ref<float, in_shape<K0>>(dx.data(), n);
    else
      return tensor_ref<float, out_shape<K - 1>>(std::get<K - 1 - K0>(grads).data(), n);
  }
  template <std::size_t K>
  void forward_kernel() {
    std::get<K>(model.blocks).forward(input<K>(), tensor_ref<float, out_shape<K>>(std::get<K - K0>(acts).data(), n));
  }
  template <std::size_t K>
  void backward_kernel() {
    auto& b = std::get<K>(model.blocks);
    const auto xk = input<K>();
    const tensor_ref<const float, out_shape<K>> y(std::get<K - K0>(acts).data(), n), dy(std::get<K - K0>(grads).data(), n);
    if constexpr (K == 0 && requires { b.backward_params(xk, y, dy); })
      b.backward_params(xk, y, dy);
    else
      b.backward(xk, y, dy, input_grad<K>());
  }
};

/// A kernel's case: Model's kernels [K0, K1) alone (one planned kernel, or the unfused kernels
/// of the layers one fused kernel holds).
template <class Model, std::size_t K0, std::size_t K1, class State>
void run_kernel_case(State& state, const case_spec& spec) {
  guarded(state, [&] {
    const thread_scope threads(spec.threads);
    Model model(spec.seed);
    if (spec.what == pass::forward_eval)
      model.eval();
    else
      model.train();
    kernel_run<Model, K0, K1> run(model, spec.batch, spec.seed);
    if (spec.what == pass::backward) {
      run.forward();
      measure(state, spec, [&] { run.backward(); });
    } else {
      measure(state, spec, [&] { run.forward(); });
    }
  });
}

/// A case as Google Benchmark calls it. Its State parameter also makes benchmark:: a namespace
/// of the registration call's arguments, where RegisterBenchmark is then found.
template <class State>
struct case_runner {
  std::function<void(State&)> run;
  void operator()(State& state) const { run(state); }
};

/// Adds every case of Model that o asks for through add(name, run).
template <class Model, class Optimizer, class State, class Add>
void add_chain_cases(const std::string& name, const options& o, const typename Optimizer::options& optimizer, Add&& add) {
  using unfused = unfused_t<Model>;
  // Nothing to compare where the plan already runs one kernel per layer.
  const bool compare = o.unfused && Model::fused && unfused::kernels != Model::kernels;
  std::vector<pass> passes;
  if (o.forward_eval) passes.push_back(pass::forward_eval);
  if (o.forward_train) passes.push_back(pass::forward_train);
  if (o.backward) passes.push_back(pass::backward);
  const auto spec = [&](std::string case_name, pass p, work w, std::string baseline) {
    return case_spec{std::move(case_name), p, o.batch, o.threads, o.seed, w, std::move(baseline)};
  };

  // The whole model; the unfused case runs first, so the fused one can report its speed-up.
  std::vector<pass> model_passes = passes;
  if (o.train_step) model_passes.push_back(pass::train_step);
  for (const pass p : model_passes) {
    std::string baseline;
    if (compare) {
      baseline = case_name(name, "", p, false, o.batch);
      add(baseline, [s = spec(baseline, p, chain_work<unfused>::template model<Optimizer>(p, o.batch), ""),
                     optimizer](State& st) { run_model_case<unfused, Optimizer>(st, s, optimizer); });
    }
    const std::string fused = case_name(name, "", p, Model::fused, o.batch);
    add(fused, [s = spec(fused, p, chain_work<Model>::template model<Optimizer>(p, o.batch), baseline),
                optimizer](State& st) { run_model_case<Model, Optimizer>(st, s, optimizer); });
  }
  if (!o.kernels) return;

  // Each planned kernel alone, after the unfused kernels of its layers (where it holds several).
  static_assert(unfused::kernels == Model::layer_count, "solder::bench: an unfused chain runs one kernel per layer");
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (
        [&] {
          using group = std::tuple_element_t<K, typename Model::groups>;
          constexpr std::size_t first = group::first, last = group::first + group::size;
          const std::string kernel = kernel_id(K, Model::template kernel_name<group>());
          for (const pass p : passes) {
            std::string baseline;
            if (compare && group::size > 1) {
              baseline = case_name(name, kernel, p, false, o.batch);
              add(baseline, [s = spec(baseline, p, chain_work<unfused>::kernels_in(first, last, p, o.batch), "")](State& st) {
                run_kernel_case<unfused, first, last>(st, s);
              });
            }
            const std::string fused = case_name(name, kernel, p, Model::fused, o.batch);
            add(fused, [s = spec(fused, p, chain_work<Model>::template kernel<K>(p, o.batch), baseline)](State& st) {
              run_kernel_case<Model, K, K + 1>(st, s);
            });
          }
        }(),
        ...);
  }(std::make_index_sequence<Model::kernels>{});
}

}  // namespace detail

/// Registers Google Benchmark cases for Model on o.batch samples and returns them (each a
/// benchmark::internal::Benchmark*, for ->Unit(...), ->Repetitions(...) and the like):
///   <name>/<pass>/unfused/<batch> then <name>/<pass>/fused/<batch>, for the passes forward_eval,
///       forward_train, backward and train_step (Optimizer, default AdamW with `optimizer`'s
///       options; cross-entropy on labels for a classifier, else mean squared error);
///   <name>/k<K>:<kernel>/<pass>/... for each planned kernel, forwards and backward.
/// Counters (from cost<Model> and the wall-clock time): GFLOPs, GBps, peak_fraction (of this
/// host's FMA peak), floor_fraction (roofline floor time / time), fused_speedup on fused cases.
/// Include <benchmark/benchmark.h> in the calling file (see the top of this header).
template <class Model, class Optimizer = optim::adamw, class State = ::benchmark::State>
auto register_chain(const std::string& name, const options& o = {}, const typename Optimizer::options& optimizer = {}) {
  using runner = detail::case_runner<State>;
  if constexpr (!requires(runner r) { RegisterBenchmark("", r); }) {
    static_assert(detail::always_false<State>,
                  "solder::bench::register_chain: Google Benchmark is not declared here; #include "
                  "<benchmark/benchmark.h> in this file and link benchmark::benchmark");
  } else {
    using handle = decltype(RegisterBenchmark("", std::declval<runner>()));
    std::vector<handle> cases;
    detail::add_chain_cases<Model, Optimizer, State>(name, o, optimizer, [&](const std::string& case_name, auto run) {
      handle h = RegisterBenchmark(case_name.c_str(), runner{std::move(run)});
      h->UseRealTime();  // solder's threads work while the calling thread waits
      cases.push_back(h);
    });
    return cases;
  }
}

}  // namespace solder::bench
