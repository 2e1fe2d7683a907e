// linear_dropout.bench.cpp: y = dropout(relu(x W^T + b)), p = 0.1, training mode, PyTorch's
// linear layout (x [M, K], W [N, K], b [N]), forward and backward, solder's fused layer against
// the same math run op by op with solder's own kernels.
//
// Cases: BM_linear_bias_relu_dropout_{fwd,bwd}/<impl>/<M>x<N>x<K>[/threads:2], impl in
//   solder   nn::linear_block<nn::linear<K, N>, nn::relu, nn::dropout<0.1f>>: forward = ONE GEMM with
//            bias, relu and dropout in its epilogue (weights packed once, as for inference and
//            once per optimizer step in training); backward = one pass for the gate g and db
//            (read from the saved output y), then dW = g^T x and dx = g W
//   unfused  forward: the GEMM stores z, then three elementwise passes (+ b, relu, dropout) with
//            temporaries, as an eager framework runs it; backward: mask pass, relu-gate pass
//            (reading the saved pre-activation), db pass, then the same two GEMMs
// Counters: GFLOPs (forward 2MNK, backward 4MNK per call) and roofline (GFLOPs / BM_peak_fma's
// peak on the same number of threads, measured in this process).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "common.hpp"
#include "solder/nn/linear_block.hpp"
#include "support/gemm_epilogues.hpp"

namespace {

using namespace solder_bench;
using solder::dyn;
using solder::shape;
using solder::tensor_ref;

constexpr float drop_p = 0.1f;
enum seed : std::uint64_t { seed_x = 21, seed_w = 22, seed_b = 23, seed_dy = 24 };

/// One shape's layer and data, built outside any timing and kept for the run.
template <std::size_t N, std::size_t K>
struct problem {
  using layer_type = solder::nn::linear_block<solder::nn::linear<K, N>, solder::nn::relu, solder::nn::dropout<drop_p>>;
  using X = shape<dyn, K>;
  using Y = shape<dyn, N>;
  std::size_t M;
  layer_type layer;
  solder::tensor<float, X> x, dx;
  solder::tensor<float, Y> y, dy, z, t1, t2, g;  // z, t1, t2, g: the unfused version's tensors
  solder::tensor<float, shape<N>> db;

  explicit problem(std::size_t m) : M(m), x(m), dx(m), y(m), dy(m), z(m), t1(m), t2(m), g(m) {
    fill_uniform({x.data(), x.size()}, seed_x);
    fill_uniform({layer.linear.weight.data(), layer.linear.weight.size()}, seed_w, -0.05f, 0.05f);
    fill_uniform({layer.linear.bias.data(), N}, seed_b, -0.5f, 0.5f);
    fill_uniform({dy.data(), dy.size()}, seed_dy);
    layer.train();
    layer.pack_weights();
    layer.forward(x, y);  // the output the backward reads, and the mask both versions use
  }
  solder::philox_state rng() const { return layer.tail.template layer<1>().rng; }
  const auto& w() const { return layer.linear.weight; }
  const auto& b() const { return layer.linear.bias; }

  // ---- forward -------------------------------------------------------------------------------
  void solder_fwd() { layer.forward(x, y); }
  void unfused_fwd() {
    z = solder::matmul(x, solder::transpose(w()));
    t1 = z + b();
    t2 = solder::relu(t1);
    y = solder::dropout(t2, drop_p, rng());
  }
  // ---- backward ------------------------------------------------------------------------------
  void solder_bwd() { layer.backward(x, y, dy, dx); }
  void unfused_bwd() {
    t1 = solder::dropout(dy, drop_p, rng());                // dropout's backward: the mask again
    g = solder::where(t2 > 0.0f, t1, 0.0f);                 // relu's backward (t2 = relu(z + b))
    db = solder::sum<0>(g);                                 // the bias gradient
    solder::eval::cpu::gemm_dyn_k<K, true, false>(N, M, g.data(), N, x.data(), K,
                                            solder::test::store_epilogue{layer.linear.weight_grad.data(), K});
    dx = solder::matmul(g, w());
  }
};

struct shape3 {
  std::size_t M, N, K;
  int threads;
  std::string name() const {
    return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
           (threads > 1 ? "/threads:" + std::to_string(threads) : "");
  }
};

template <std::size_t N, std::size_t K>
problem<N, K>& problem_for(std::size_t M) {
  static std::map<std::size_t, std::unique_ptr<problem<N, K>>> made;
  auto& p = made[M];
  if (!p) {
    p = std::make_unique<problem<N, K>>(M);
    p->unfused_fwd();  // t2 = relu(z + b) for the unfused backward
  }
  return *p;
}

/// Relative difference of two outputs (max |a - b| / max |b|): the fused and unfused versions
/// must agree before either is timed.
double max_rel_diff(const float* a, const float* b, std::size_t n) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return m > 0 ? d / m : d;
}

template <std::size_t N, std::size_t K>
void run_case(benchmark::State& state, bool backward, bool fused, shape3 s) {
  auto& pb = problem_for<N, K>(s.M);
  peak_gflops(s.threads);  // calibrated before anything of this case runs
  solder::set_num_threads(s.threads);
  // Check: the fused and unfused versions agree on this problem.
  if (backward) {
    pb.solder_bwd();
    const auto dx = pb.dx;
    const auto dw = pb.layer.linear.weight_grad;
    pb.unfused_bwd();
    if (max_rel_diff(dx.data(), pb.dx.data(), dx.size()) > 1e-5 ||
        max_rel_diff(dw.data(), pb.layer.linear.weight_grad.data(), dw.size()) > 1e-5 ||
        max_rel_diff(pb.layer.linear.bias_grad.data(), pb.db.data(), N) > 1e-5)
      return state.SkipWithError("fused and unfused backward differ");
  } else {
    pb.solder_fwd();  // draws a fresh mask; the unfused version then uses the same one
    const auto y = pb.y;
    pb.unfused_fwd();
    if (max_rel_diff(y.data(), pb.y.data(), y.size()) > 1e-6) return state.SkipWithError("fused and unfused forward differ");
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (backward)
      fused ? pb.solder_bwd() : pb.unfused_bwd();
    else
      fused ? pb.solder_fwd() : pb.unfused_fwd();
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = (backward ? 4.0 : 2.0) * double(s.M) * double(N) * double(K);
  set_flop_counters(state, flops, seconds, s.threads);
}

template <std::size_t M, std::size_t N, std::size_t K>
void register_shape() {
  for (bool backward : {false, true})
    for (int threads : {1, 2})
      for (bool fused : {true, false}) {
        const shape3 s{M, N, K, threads};
        const std::string name = std::string("BM_linear_bias_relu_dropout_") + (backward ? "bwd/" : "fwd/") +
                                 (fused ? "solder/" : "unfused/") + s.name();
        auto* b = benchmark::RegisterBenchmark(name.c_str(), run_case<N, K>, backward, fused, s);
        b->Unit(benchmark::kMillisecond);
        if (threads > 1) b->UseRealTime();
      }
}

const bool registered = [] {
  register_shape<64, 1024, 1024>();
  register_shape<256, 1024, 2048>();
  register_shape<1024, 4096, 4096>();
  return true;
}();

}  // namespace
