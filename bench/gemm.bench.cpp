// gemm.bench.cpp: y = relu(x W^T + b), PyTorch's linear layer plus ReLU, x [M, K], W [N, K],
// b [N]: solder's GEMM with the bias and ReLU applied to the register tile, against OpenBLAS
// followed by a separate bias + ReLU pass, oneDNN's matmul with bias and a ReLU post-op, and
// Eigen. Also the FMA peak that the `roofline` counter divides by.
//
// Cases: BM_peak_fma[/threads:2] (the best chain count), BM_peak_fma_chains/<n> (n chains, one
// thread) and BM_linear_bias_relu_fwd/<impl>/<M>x<N>x<K>[/threads:2]
// (Google Benchmark appends /real_time to the 2-thread names). Method and figures: docs/gemm.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common.hpp"
#include "solder/benchmark.hpp"
#include "solder/eval/cpu/gemm.hpp"
#include "solder/nn/linear_block.hpp"
#include "support/gemm_epilogues.hpp"

#if SOLDER_BENCH_HAS_OPENBLAS
#include <cblas.h>
#endif
#if SOLDER_BENCH_HAS_DNNL
#include <dnnl.hpp>
#endif
#if SOLDER_BENCH_HAS_EIGEN
#include <Eigen/Core>
#endif

namespace {

using namespace solder_bench;

// ---------------------------------------------------------------------------------------------
// The FMA peak: independent chains of vector FMAs, as many as give the best rate on this host
// (solder/benchmark.hpp tries every count its registers allow)
// ---------------------------------------------------------------------------------------------

using solder::bench::detail::run_fma_chains_of;  // the loop solder/benchmark.hpp's peak runs
constexpr long fma_steps_per_call = 1L << 20;  // ~2.5 ms at 214 GFLOP/s

/// Flops of one run of `chains` chains for fma_steps_per_call steps on each of `threads` threads.
double fma_flops(int threads, int chains) {
  return 2.0 * chains * double(solder::eval::cpu::float_lanes) * double(fma_steps_per_call) * threads;
}

/// One round of the loop: every thread runs the chains once (an OpenMP team of `threads`).
void fma_round(int threads, int chains) {
  float sink = 0;
  if (threads <= 1) {
    sink = run_fma_chains_of(chains, fma_steps_per_call);
  } else {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += run_fma_chains_of(chains, fma_steps_per_call);
  }
  benchmark::DoNotOptimize(sink);
}

/// The chain count of the peak on `threads` threads: the best of the counts solder's probe tries.
int peak_chains(int threads) { return solder::bench::fma_peak_chains(threads); }

}  // namespace

// Shared with the other GEMM benchmarks (declared in common.hpp).
namespace solder_bench {

/// The FMA peak in GFLOP/s on `threads` threads, measured once per process (median of 15
/// rounds after 2 warm-up rounds) and cached: the denominator of every `roofline` counter.
double peak_gflops(int threads) {
  static std::map<int, double> cache;
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  using clock = std::chrono::steady_clock;
  const int chains = peak_chains(threads);
  fma_round(threads, chains);
  fma_round(threads, chains);
  std::vector<double> rates;
  for (int r = 0; r < 15; ++r) {
    const auto t0 = clock::now();
    fma_round(threads, chains);
    rates.push_back(fma_flops(threads, chains) / std::chrono::duration<double>(clock::now() - t0).count() * 1e-9);
  }
  std::nth_element(rates.begin(), rates.begin() + 7, rates.end());
  return cache[threads] = rates[7];
}

/// GFLOPs = flops per iteration x iterations / wall seconds; roofline = GFLOPs / FMA peak on
/// the same number of threads (calibrated in this process).
void set_flop_counters(benchmark::State& state, double flops_per_iteration, double seconds, int threads) {
  const double gflops = flops_per_iteration * double(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOPs"] = gflops;
  state.counters["roofline"] = gflops / peak_gflops(threads);
}

}  // namespace solder_bench

namespace {

/// The loop with `chains` chains (0: the peak's count on this host, found once per process).
void peak_case(benchmark::State& state, int threads, int chains) {
  if (chains == 0) chains = peak_chains(threads);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) fma_round(threads, chains);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  set_flop_counters(state, fma_flops(threads, chains), seconds, threads);
  state.counters["chains"] = chains;
}

// ---------------------------------------------------------------------------------------------
// The problem: y = relu(x W^T + b)
// ---------------------------------------------------------------------------------------------

/// Seeds of the data, fixed so every run and every implementation sees the same numbers.
enum seed : std::uint64_t { seed_x = 11, seed_w = 12, seed_b = 13 };

struct shape {
  std::size_t M, N, K;
  int threads;
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
  std::string name() const {
    return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
           (threads > 1 ? "/threads:" + std::to_string(threads) : "");
  }
};

/// The shapes of the acceptance criteria (docs/gemm.md), each on 1 and 2 threads.
constexpr std::size_t shape_list[][3] = {{64, 1024, 1024}, {256, 1024, 2048}, {1024, 4096, 4096}};

/// Inputs and output of one shape, shared by every implementation; weight packs of each
/// implementation are made outside any timing and kept with it.
struct problem {
  std::size_t M, N, K;
  aligned_buffer<float> x, w, b, y;  // x [M, K], W [N, K] (PyTorch's layout), b [N], y [M, N]
  std::shared_ptr<void> solder_weights, solder_layer;
  std::map<int, std::shared_ptr<void>> onednn;  // per thread count: the primitive and its weights

  problem(std::size_t m, std::size_t n, std::size_t k) : M(m), N(n), K(k), x(m * k), w(n * k), b(n), y(m * n) {
    fill_uniform(x.span(), seed_x);
    fill_uniform(w.span(), seed_w);
    fill_uniform(b.span(), seed_b, -0.5f, 0.5f);
  }
};

problem& problem_for(const shape& s) {
  static std::map<std::tuple<std::size_t, std::size_t, std::size_t>, std::unique_ptr<problem>> problems;
  auto& p = problems[{s.M, s.N, s.K}];
  if (!p) p = std::make_unique<problem>(s.M, s.N, s.K);
  return *p;
}

/// y = relu(y + b) in place over rows [r0, r1): the separate pass of the unfused peers.
void bias_relu_rows(problem& pb, std::size_t r0, std::size_t r1) {
  const float* b = pb.b.data();
  for (std::size_t r = r0; r < r1; ++r) {
    float* y = pb.y.data() + r * pb.N;
    for (std::size_t n = 0; n < pb.N; ++n) y[n] = std::max(y[n] + b[n], 0.0f);
  }
}

[[maybe_unused]] void bias_relu_pass(problem& pb, int threads) {
  parallel_blocks(threads, std::int64_t(pb.M), [&](std::int64_t r0, std::int64_t r1) {
    bias_relu_rows(pb, std::size_t(r0), std::size_t(r1));
  });
}

/// Unit roundoff of float.
constexpr double float_u = 0x1p-24;

/// Checks rows 0, M/2 and M-1 of y against a double-precision reference: a float dot product
/// of length K is within K u sum |x_k w_k| of the exact one (any summation order; the bias add
/// and ReLU add one rounding). Returns an error message, empty when all agree.
std::string check(const problem& pb) {
  for (std::size_t r : {std::size_t{0}, pb.M / 2, pb.M - 1})
    for (std::size_t n = 0; n < pb.N; ++n) {
      double dot = pb.b[n], mag = std::abs(pb.b[n]);
      for (std::size_t k = 0; k < pb.K; ++k) {
        const double t = double(pb.x[r * pb.K + k]) * double(pb.w[n * pb.K + k]);
        dot += t;
        mag += std::abs(t);
      }
      const double want = std::max(dot, 0.0), got = pb.y[r * pb.N + n];
      if (!(std::abs(got - want) <= double(pb.K + 2) * float_u * mag))
        return "y[" + std::to_string(r) + "][" + std::to_string(n) + "] = " + std::to_string(got) + ", expected " +
               std::to_string(want);
    }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Implementations: prepare (outside timing) and run
// ---------------------------------------------------------------------------------------------

/// One implementation: `prepare` packs weights and builds what the runs reuse (not timed);
/// `run` computes y on `threads` threads; `settle`, if set, runs after the timed loop (not
/// timed) so the implementation leaves the machine idle for the next case.
struct impl {
  std::string name;
  std::function<void(problem&, int threads)> prepare, run;
  std::function<void(int threads)> settle = nullptr;
  /// If set and it returns a reason, the implementation is not measured (the case says why).
  std::function<std::string()> unfit = nullptr;
};

/// Marks the case skipped, saying why, when `im` cannot be measured fairly on this machine.
bool skip_if_unfit(benchmark::State& state, const impl& im) {
  const std::string why = im.unfit ? im.unfit() : std::string();
  if (!why.empty()) state.SkipWithError((im.name + ": " + why).c_str());
  return !why.empty();
}

// solder: the layer as a user writes it, nn::linear_block<nn::linear<K, N>, nn::relu> in eval mode
// with its weights packed once (pack_weights): one GEMM whose epilogue is the expression
// relu(tile + b), evaluated on each register tile before its single store.
template <std::size_t N, std::size_t K>
using solder_layer = solder::nn::linear_block<solder::nn::linear<K, N>, solder::nn::relu>;

template <std::size_t N, std::size_t K>
void solder_prepare(problem& pb, int) {
  if (pb.solder_layer) return;
  auto layer = std::make_shared<solder_layer<N, K>>();
  std::copy(pb.w.data(), pb.w.data() + N * K, layer->linear.weight.data());
  std::copy(pb.b.data(), pb.b.data() + N, layer->linear.bias.data());
  layer->eval();
  layer->pack_weights();
  pb.solder_layer = layer;
}
template <std::size_t N, std::size_t K>
void solder_run(problem& pb, int threads) {
  auto& layer = *static_cast<solder_layer<N, K>*>(pb.solder_layer.get());
  solder::set_num_threads(threads);
  layer.forward(solder::tensor_ref<const float, solder::shape<solder::dyn, K>>(pb.x.data(), pb.M),
                solder::tensor_ref<float, solder::shape<solder::dyn, N>>(pb.y.data(), pb.M));
}

// solder_kernel: the GEMM called directly with its hand-written bias + ReLU epilogue
// (solder::test::bias_relu_epilogue), W packed once: what the generic epilogue above is measured against.
template <std::size_t N, std::size_t K>
using solder_weights = solder::packed_matrix<N, K, /*TransB=*/true>;

template <std::size_t N, std::size_t K>
void kernel_prepare(problem& pb, int) {
  if (!pb.solder_weights) pb.solder_weights = std::make_shared<solder_weights<N, K>>(pb.w.data(), K);
}
template <std::size_t N, std::size_t K>
void kernel_run(problem& pb, int threads) {
  const auto& w = *static_cast<const solder_weights<N, K>*>(pb.solder_weights.get());
  solder::eval::cpu::gemm<N, K, false, true>(pb.M, pb.x.data(), K, w, solder::test::bias_relu_epilogue{pb.b.data(), pb.y.data(), N},
                                       threads);
}

/// Dispatches a shape to the solder instantiation for its (N, K).
template <std::size_t N, std::size_t K>
bool solder_dispatch(problem& pb, int threads, bool prepare, bool kernel) {
  if (pb.N != N || pb.K != K) return false;
  if (kernel)
    prepare ? kernel_prepare<N, K>(pb, threads) : kernel_run<N, K>(pb, threads);
  else
    prepare ? solder_prepare<N, K>(pb, threads) : solder_run<N, K>(pb, threads);
  return true;
}
void solder_call(problem& pb, int threads, bool prepare, bool kernel) {
  (void)(solder_dispatch<1024, 1024>(pb, threads, prepare, kernel) || solder_dispatch<1024, 2048>(pb, threads, prepare, kernel) ||
         solder_dispatch<4096, 4096>(pb, threads, prepare, kernel));
}

#if SOLDER_BENCH_HAS_OPENBLAS
// OpenBLAS: sgemm with W transposed (it packs W inside every call; it has no pre-packed sgemm),
// then bias + ReLU as a second pass over y.
//
// Debian's OpenBLAS (pthreads) keeps its worker spinning for about 100 ms after a
// multi-threaded call (measured: a full core), which would slow whichever case the random
// interleaving runs next; openblas_settle waits that out, outside any timing.
void openblas_settle(int threads) {
  if (threads > 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
}
// OpenBLAS (DYNAMIC_ARCH) picks its kernels from the CPU model when it loads; 0.3.21 (Debian
// bookworm) does not know this host's model 207 and falls back to Prescott (SSE3) kernels, 30
// GFLOP/s where its AVX-512 ones reach 110-164. Only the environment, read before main, can
// change that: OPENBLAS_CORETYPE=SkylakeX. Without it, the OpenBLAS cases report an error
// rather than a number that measures the wrong kernels.
std::string openblas_unfit() {
#if defined(__AVX512F__)
  const std::string core = openblas_get_corename();
  if (core == "Prescott" || core == "Core2" || core == "Nehalem" || core == "Sandybridge")
    return "OpenBLAS chose its " + core + " kernels on this AVX-512 CPU (model unknown to it); "
           "run with OPENBLAS_CORETYPE=SkylakeX";
#endif
  return "";
}

void openblas_run(problem& pb, int threads) {
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(pb.M), int(pb.N), int(pb.K), 1.0f, pb.x.data(), int(pb.K),
              pb.w.data(), int(pb.K), 0.0f, pb.y.data(), int(pb.N));
  bias_relu_pass(pb, threads);
}
#endif

#if SOLDER_BENCH_HAS_DNNL
// oneDNN: matmul primitive with a bias and an eltwise ReLU post-op; weights declared with
// format `any` and reordered once into the layout the primitive chose. oneDNN's OpenMP runtime
// uses omp_get_max_threads(), so the thread count is set before creating and running it.
struct onednn_state {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, bias, dst;
};

void onednn_prepare(problem& pb, int threads) {
  if (pb.onednn.count(threads)) return;
  using namespace dnnl;
  using dt = memory::data_type;
  using tag = memory::format_tag;
  omp_set_num_threads(threads);
  auto st = std::make_shared<onednn_state>();
  const memory::dim M = memory::dim(pb.M), N = memory::dim(pb.N), K = memory::dim(pb.K);
  const memory::desc src_md({M, K}, dt::f32, tag::ab), wei_any({K, N}, dt::f32, tag::any),
      wei_user_md({K, N}, dt::f32, tag::ba),  // W stored [N, K] is W^T [K, N] in column-major
      bias_md({1, N}, dt::f32, tag::ab), dst_md({M, N}, dt::f32, tag::ab);
  post_ops ops;
  ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
  primitive_attr attr;
  attr.set_post_ops(ops);
  const matmul::primitive_desc pd(matmul::desc(src_md, wei_any, bias_md, dst_md), attr, st->eng);
  st->prim = matmul(pd);
  memory wei_user(wei_user_md, st->eng, pb.w.data());
  st->wei = memory(pd.weights_desc(), st->eng);
  reorder(wei_user, st->wei).execute(st->strm, wei_user, st->wei);
  st->strm.wait();
  st->src = memory(pd.src_desc(), st->eng, pb.x.data());
  st->bias = memory(bias_md, st->eng, pb.b.data());
  st->dst = memory(pd.dst_desc(), st->eng, pb.y.data());
  pb.onednn[threads] = st;
}

void onednn_run(problem& pb, int threads) {
  omp_set_num_threads(threads);
  auto& st = *static_cast<onednn_state*>(pb.onednn.at(threads).get());
  st.prim.execute(st.strm, {{DNNL_ARG_SRC, st.src}, {DNNL_ARG_WEIGHTS, st.wei}, {DNNL_ARG_BIAS, st.bias}, {DNNL_ARG_DST, st.dst}});
  st.strm.wait();
}
#endif

#if SOLDER_BENCH_HAS_EIGEN
// Eigen 3.4: y = x * W^T over Maps (Eigen packs W inside every product), then bias + ReLU as
// one array expression per row.
void eigen_run(problem& pb, int threads) {
  using rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::setNbThreads(threads);
  Eigen::Map<const rm> x(pb.x.data(), Eigen::Index(pb.M), Eigen::Index(pb.K));
  Eigen::Map<const rm> w(pb.w.data(), Eigen::Index(pb.N), Eigen::Index(pb.K));
  Eigen::Map<rm> y(pb.y.data(), Eigen::Index(pb.M), Eigen::Index(pb.N));
  y.noalias() = x * w.transpose();
  Eigen::Map<const Eigen::RowVectorXf> b(pb.b.data(), Eigen::Index(pb.N));
  parallel_blocks(threads, std::int64_t(pb.M), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) y.row(r).array() = (y.row(r).array() + b.array()).max(0.0f);
  });
}
#endif

std::vector<impl> impls() {
  std::vector<impl> list;
  list.push_back({"solder", [](problem& pb, int t) { solder_call(pb, t, true, false); },
                  [](problem& pb, int t) { solder_call(pb, t, false, false); }});
  list.push_back({"solder_kernel", [](problem& pb, int t) { solder_call(pb, t, true, true); },
                  [](problem& pb, int t) { solder_call(pb, t, false, true); }});
#if SOLDER_BENCH_HAS_OPENBLAS
  list.push_back({"openblas_then_epilogue", [](problem&, int) {}, openblas_run, openblas_settle, openblas_unfit});
#endif
#if SOLDER_BENCH_HAS_DNNL
  list.push_back({"onednn_postops", onednn_prepare, onednn_run});
#endif
#if SOLDER_BENCH_HAS_EIGEN
  list.push_back({"eigen", [](problem&, int) {}, eigen_run});
#endif
  return list;
}

void linear_case(benchmark::State& state, const impl& im, shape s) {
  if (skip_if_unfit(state, im)) return;
  problem& pb = problem_for(s);
  peak_gflops(s.threads);  // calibrate before anything of this case runs
  im.prepare(pb, s.threads);
  std::fill(pb.y.data(), pb.y.data() + pb.y.size(), -1.0f);
  im.run(pb, s.threads);  // warm-up, and the output that is checked
  if (const std::string err = check(pb); !err.empty()) {
    state.SkipWithError((im.name + ": " + err).c_str());
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    im.run(pb, s.threads);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  set_flop_counters(state, s.flops(), seconds, s.threads);
  if (im.settle) im.settle(s.threads);
}

/// `a` against `b` call by call (time_pairs): speedup = median over the pairs of b's time / a's
/// time, and each one's GFLOP/s from its median call. The ratio to quote on a shared host.
void paired_case(benchmark::State& state, const impl& a, const impl& b, shape s) {
  if (skip_if_unfit(state, a) || skip_if_unfit(state, b)) return;
  problem& pb = problem_for(s);
  for (const impl* im : {&a, &b}) {
    im->prepare(pb, s.threads);
    std::fill(pb.y.data(), pb.y.data() + pb.y.size(), -1.0f);
    im->run(pb, s.threads);
    if (const std::string err = check(pb); !err.empty()) {
      state.SkipWithError((im->name + ": " + err).c_str());
      return;
    }
  }
  const paired_times t = time_pairs(state, [&] { a.run(pb, s.threads); }, [&] { b.run(pb, s.threads); });
  state.counters["speedup"] = t.speedup_of_a();
  state.counters[a.name + "_GFLOPs"] = s.flops() / paired_times::median(t.a) * 1e-9;
  state.counters[b.name + "_GFLOPs"] = s.flops() / paired_times::median(t.b) * 1e-9;
  if (a.settle) a.settle(s.threads);
  if (b.settle) b.settle(s.threads);
}

/// Pairs per paired case: about 1 s of calls at this machine's speed.
int pairs_for(const shape& s) { return s.M <= 64 ? 400 : s.M <= 256 ? 60 : 4; }

/// Peak first (it is also the calibration), then per shape and thread count every
/// implementation back to back; then the paired cases, solder against each peer it is judged by.
const bool registered = [] {
  for (int threads : {1, 2}) {
    auto* b = benchmark::RegisterBenchmark(threads > 1 ? "BM_peak_fma/threads:2" : "BM_peak_fma", peak_case, threads, 0);
    b->Unit(benchmark::kMillisecond);
    if (threads > 1) b->UseRealTime();
  }
  // Each chain count the probe tries, one thread: the peak is the best of them.
  [&]<int... C>(std::integer_sequence<int, C...>) {
    for (int chains : {C...}) {
      const std::string name = "BM_peak_fma_chains/" + std::to_string(chains);
      benchmark::RegisterBenchmark(name.c_str(), peak_case, 1, chains)->Unit(benchmark::kMillisecond);
    }
  }(solder::bench::detail::fma_chain_counts{});
  static const std::vector<impl> list = impls();
  for (const auto& mnk : shape_list)
    for (int threads : {1, 2})
      for (const impl& im : list) {
        const shape s{mnk[0], mnk[1], mnk[2], threads};
        const std::string name = "BM_linear_bias_relu_fwd/" + im.name + "/" + s.name();
        auto* b = benchmark::RegisterBenchmark(name.c_str(), linear_case, im, s);
        b->Unit(benchmark::kMillisecond);
        // The team's wall time is what matters; Google Benchmark then appends "/real_time".
        if (threads > 1) b->UseRealTime();
      }
  const auto find = [](const std::string& name) -> const impl* {
    for (const impl& im : list)
      if (im.name == name) return &im;
    return nullptr;
  };
  for (const char* peer : {"onednn_postops", "solder_kernel"}) {
    const impl* a = find("solder");
    const impl* b = find(peer);
    if (a == nullptr || b == nullptr) continue;
    for (const auto& mnk : shape_list)
      for (int threads : {1, 2}) {
        const shape s{mnk[0], mnk[1], mnk[2], threads};
        const std::string name = "BM_linear_bias_relu_fwd_paired/solder_vs_" + b->name + "/" + s.name();
        auto* c = benchmark::RegisterBenchmark(name.c_str(), paired_case, *a, *b, s);
        c->Unit(benchmark::kMillisecond)->Iterations(pairs_for(s));
        if (threads > 1) c->UseRealTime();
      }
  }
  return true;
}();

}  // namespace
