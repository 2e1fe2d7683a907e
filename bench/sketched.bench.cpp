// sketched.bench.cpp: the sketched linear layer, y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b,
// at the configurations of Panther's benchmarks, against a dense linear layer of the same In and
// Out. One thread unless the name says otherwise.
//
// Cases: BM_sketched_linear_{fwd,bwd}/<impl>/<B>x<In>x<Out>_L<L>_k<k>, impl in
//   solder         strategy (a): x [S1 | U2] -> h [B, 2Lk], then h [U1; S2] / (2L) + b, the signs
//                  generated while the products pack them (training's forward; backward: the
//                  gate pass, dh and dS2 from the second product, dS1 and dx from the first)
//   solder_folded  strategy (b), inference: x W_eff + b, W_eff folded once and packed (fwd only)
//   dense          nn::linear_block<nn::linear<In, Out>>: x W^T + b with W packed once (fwd), and
//                  its backward (dW = g^T x, dx = g W)
// Counters: GFLOPs (the FLOPs each form performs: 4 B Lk (In + Out) for (a), 2 B In Out for (b)
// and dense; backward 6 B Lk (In + Out) and 4 B In Out), roofline (GFLOPs / BM_peak_fma's peak in this process),
// param_bytes (what the layer stores) and panther_param_bytes (Panther's layer: U1 and U2 stored
// as large as S1 and S2).
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "common.hpp"
#include "solder/nn/linear_block.hpp"
#include "solder/nn/sketched_linear.hpp"

namespace {

using namespace solder_bench;
using solder::dyn;
using solder::shape;
namespace nn = solder::nn;

enum seed : std::uint64_t { seed_x = 31, seed_dy = 32, seed_layer = 33 };

template <std::size_t In, std::size_t Out, std::size_t L, std::size_t K>
struct problem {
  using two = nn::sketched_linear<In, Out, L, K, true, nn::sketch_strategy::two_products, true>;
  using folded = nn::sketched_linear<In, Out, L, K, true, nn::sketch_strategy::folded, true>;
  std::size_t B;
  nn::sketched_block<two> sketched{seed_layer};
  nn::sketched_block<folded> folded_block{seed_layer};
  nn::linear_block<nn::linear<In, Out>> dense{seed_layer};
  solder::tensor<float, shape<dyn, In>> x, dx;
  solder::tensor<float, shape<dyn, Out>> y, dy;

  explicit problem(std::size_t b) : B(b), x(b), dx(b), y(b), dy(b) {
    fill_uniform({x.data(), x.size()}, seed_x);
    fill_uniform({dy.data(), dy.size()}, seed_dy);
    folded_block.eval();
    folded_block.pack_weights();
    dense.pack_weights();
  }
  static double two_flops(std::size_t b) { return double(b) * (two::two_products_flops - Out); }
  static double dense_flops(std::size_t b) { return 2.0 * double(b) * double(In) * double(Out); }
};

struct config {
  std::size_t B, In, Out, L, K;
  std::string name() const {
    return std::to_string(B) + "x" + std::to_string(In) + "x" + std::to_string(Out) + "_L" + std::to_string(L) + "_k" +
           std::to_string(K);
  }
};

template <std::size_t In, std::size_t Out, std::size_t L, std::size_t K>
problem<In, Out, L, K>& problem_for(std::size_t B) {
  static std::map<std::size_t, std::unique_ptr<problem<In, Out, L, K>>> made;
  auto& p = made[B];
  if (!p) p = std::make_unique<problem<In, Out, L, K>>(B);
  return *p;
}

enum class impl { solder, solder_folded, dense };

template <std::size_t In, std::size_t Out, std::size_t L, std::size_t K>
void run_case(benchmark::State& state, bool backward, impl which, config c) {
  using P = problem<In, Out, L, K>;
  auto& p = problem_for<In, Out, L, K>(c.B);
  peak_gflops(1);
  solder::set_num_threads(1);
  // The two forms compute the same layer: check before timing.
  if (!backward && which == impl::solder_folded) {
    p.sketched.forward(p.x, p.y);
    const solder::tensor<float, shape<dyn, Out>> want = p.y;
    p.folded_block.forward(p.x, p.y);
    double d = 0, m = 0;
    for (std::size_t i = 0; i < p.y.size(); ++i) {
      d = std::max(d, double(std::fabs(p.y[i] - want[i])));
      m = std::max(m, double(std::fabs(want[i])));
    }
    if (d > 1e-4 * m) return state.SkipWithError("the folded and two-products forms differ");
  }
  auto call = [&] {
    switch (which) {
      case impl::solder:
        if (backward) p.sketched.backward(p.x, p.y, p.dy, p.dx);
        else p.sketched.forward(p.x, p.y);
        break;
      case impl::solder_folded: p.folded_block.forward(p.x, p.y); break;
      case impl::dense:
        if (backward) p.dense.backward(p.x, p.y, p.dy, p.dx);
        else p.dense.forward(p.x, p.y);
        break;
    }
  };
  if (backward) {  // the output and h of a forward first
    if (which == impl::solder) p.sketched.forward(p.x, p.y);
    else p.dense.forward(p.x, p.y);
  }
  call();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double fwd = which == impl::solder ? P::two_flops(c.B) : P::dense_flops(c.B);
  // Backward: dS2 and dh from the second product, dS1 and dx from the first, 6 B Lk (In + Out)
  // for (a); dW and dx, 4 B In Out, for dense.
  const double bwd = which == impl::solder ? 1.5 * fwd : 2 * fwd;
  set_flop_counters(state, backward ? bwd : fwd, seconds, 1);
  const double params = which == impl::dense ? double(In * Out + Out) : double(P::two::stored_floats);
  state.counters["param_bytes"] = 4.0 * params;
  state.counters["panther_param_bytes"] = 4.0 * double(P::two::panther_floats);
}

template <std::size_t B, std::size_t In, std::size_t Out, std::size_t L, std::size_t K>
void register_config() {
  const config c{B, In, Out, L, K};
  for (bool backward : {false, true})
    for (impl which : {impl::solder, impl::solder_folded, impl::dense}) {
      if (backward && which == impl::solder_folded) continue;  // inference only
      const char* names[] = {"solder/", "solder_folded/", "dense/"};
      const std::string name =
          std::string("BM_sketched_linear_") + (backward ? "bwd/" : "fwd/") + names[int(which)] + c.name();
      benchmark::RegisterBenchmark(name.c_str(), run_case<In, Out, L, K>, backward, which, c)->Unit(benchmark::kMillisecond);
    }
}

const bool registered = [] {
  register_config<256, 2048, 1024, 8, 128>();
  register_config<256, 1024, 512, 2, 16>();
  register_config<256, 1024, 512, 2, 32>();
  register_config<256, 1024, 512, 2, 64>();
  register_config<256, 1024, 512, 4, 16>();
  register_config<256, 1024, 512, 4, 32>();
  register_config<256, 1024, 512, 4, 64>();
  register_config<256, 1024, 512, 8, 16>();
  register_config<256, 1024, 512, 8, 32>();
  register_config<256, 1024, 512, 8, 64>();
  register_config<256, 4096, 4096, 1, 16>();
  return true;
}();

}  // namespace
