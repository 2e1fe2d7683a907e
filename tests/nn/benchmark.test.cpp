// Tests for solder/benchmark.hpp without Google Benchmark: the work of a call from cost<Model>
// against a hand count, the roofline arithmetic, case names, and register_chain with a stand-in
// for Google Benchmark's State and RegisterBenchmark (found by the same lookup as the real ones).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/benchmark.hpp"
#include "solder/optim/sgd.hpp"

namespace {

using namespace solder;
using bench::pass;

// Kernels: k0 = linear<4, 8> + relu + dropout (one GEMM), k1 = linear<8, 3>.
using tiny = nn::chain<nn::linear<4, 8>, nn::relu, nn::dropout<0.5f>, nn::linear<8, 3>>;

// By hand, per sample (FLOPs: 2 per multiply-add, 1 per add, compare or mask):
//   k0 forward  2*4*8 + 8 (bias) + 8 (relu) + 2*8 (dropout: mask, scale)       =  96
//   k1 forward  2*8*3 + 3                                                         =  51
//   k0 backward 2*4*8 + 8 (bias) + 2*8 (relu) + 2*8 (dropout)                     = 104
//               (the chain's first kernel forms no gradient for the chain's input: no dx)
//   k1 backward 4*8*3 + 3                                                         =  99
// Bytes (float32): forward reads x and writes y (relu and dropout differentiate from the output,
// so no pre-activation is kept): k0 4*(4 + 8) = 48, k1 4*(8 + 3) = 44. Backward of a GEMM
// kernel: 4*(5*out + 2*in), k1 4*(15 + 16) = 124; without dx 4*(4*out + in), k0 4*(32 + 4) =
// 144. Weights: k0 4*(32 + 8) = 160, k1 4*(24 + 3) = 108 bytes, read once per call.
constexpr std::size_t batch = 32;
constexpr double weights = 160 + 108;
constexpr bench::work forward_by_hand{batch * (96.0 + 51.0), batch * (48.0 + 44.0) + weights};
constexpr bench::work backward_by_hand{batch * (104.0 + 99.0), batch * (144.0 + 124.0) + 2 * weights};

// The counts are constants for a constant batch.
static_assert(bench::chain_work<tiny>::model(pass::forward_train, batch) == forward_by_hand);
static_assert(bench::chain_work<tiny>::model(pass::forward_eval, batch) == forward_by_hand);  // nothing kept
static_assert(bench::chain_work<tiny>::model(pass::backward, batch) == backward_by_hand);
// A training step adds AdamW's pass: weights and gradients read, both moments read and written,
// weights written.
static_assert(bench::chain_work<tiny>::model<optim::adamw>(pass::train_step, batch) ==
              forward_by_hand + backward_by_hand + bench::work{0, 7 * weights});
static_assert(bench::chain_work<tiny>::kernel<1>(pass::forward_train, batch) == bench::work{batch * 51.0, batch * 44.0 + 108});

}  // namespace

// A stand-in for Google Benchmark: a State that runs a fixed number of iterations and keeps
// counters, and a RegisterBenchmark that keeps what it is given.
namespace stand_in {

struct state {
  std::int64_t planned = 3, done = 0;
  std::map<std::string, double> counters;
  std::string label, error;

  struct iterator {
    std::int64_t i;
    bool operator!=(const iterator& o) const { return i != o.i; }
    iterator& operator++() {
      ++i;
      return *this;
    }
    int operator*() const { return 0; }
  };
  iterator begin() { return {0}; }
  iterator end() {
    done = planned;
    return {planned};
  }
  std::int64_t iterations() const { return done; }
  void SetLabel(const std::string& l) { label = l; }
  void SkipWithError(const char* e) { error = e; }
};

struct registered {
  std::string name;
  std::function<void(state&)> run;
  bool real_time = false;
  registered* UseRealTime() {
    real_time = true;
    return this;
  }
};

inline std::vector<std::unique_ptr<registered>>& registry() {
  static std::vector<std::unique_ptr<registered>> r;
  return r;
}

template <class F>
registered* RegisterBenchmark(const char* name, F&& f) {
  registry().push_back(std::make_unique<registered>(registered{name, std::forward<F>(f)}));
  return registry().back().get();
}

}  // namespace stand_in

TEST_CASE("bench::rates_of: rates and fractions of the roofline", "[bench]") {
  const bench::roofline r{100.0, 20.0};                  // 100 GFLOP/s, 20 GB/s
  const bench::work compute{2e6, 1e4}, memory{1e5, 4e6};  // 20 us vs 0.5 us; 1 us vs 200 us
  CHECK(r.floor_seconds(compute) == Approx(20e-6).epsilon(1e-12));
  CHECK(r.compute_bound(compute));
  CHECK(r.floor_seconds(memory) == Approx(200e-6).epsilon(1e-12));
  CHECK_FALSE(r.compute_bound(memory));

  const bench::rates at_half = bench::rates_of(compute, 40e-6, r);  // twice the floor
  CHECK(at_half.gflops == Approx(50.0));
  CHECK(at_half.gbps == Approx(0.25));
  CHECK(at_half.peak_fraction == Approx(0.5));
  CHECK(at_half.floor_fraction == Approx(0.5));
  const bench::rates streaming = bench::rates_of(memory, 250e-6, r);
  CHECK(streaming.gbps == Approx(16.0));
  CHECK(streaming.floor_fraction == Approx(0.8));  // bytes bound it, not FLOPs
  CHECK(streaming.peak_fraction == Approx(0.004));
}

TEST_CASE("bench: the FMA peak probe tries chain counts the registers hold, and keeps the best", "[bench]") {
  namespace d = solder::bench::detail;
  std::vector<int> counts;
  [&]<int... C>(std::integer_sequence<int, C...>) { counts = {C...}; }(d::fma_chain_counts{});
  const int registers = std::is_base_of_v<xsimd::avx512f, eval::cpu::arch> ? 32 : 16;
  for (int c : counts) {
    CAPTURE(c);
    CHECK(c + 2 <= registers);  // the chains and the loop's two constants
    CHECK(c >= 6);
    // The dispatch runs the loop of that count: the same value as the loop called directly.
    float direct = 0;
    [&]<int... C>(std::integer_sequence<int, C...>) {
      ((c == C ? (direct = d::run_fma_chains<C>(64), true) : false) || ...);
    }(d::fma_chain_counts{});
    CHECK(d::run_fma_chains_of(c, 64) == direct);
  }
  CHECK(d::run_fma_chains_of(7, 64) == 0.0f);  // not a count the probe tries
  const int best = solder::bench::fma_peak_chains(1);
  CHECK(std::find(counts.begin(), counts.end(), best) != counts.end());
  CHECK(solder::bench::fma_peak_gflops(1) > 0.0);
  CHECK(solder::bench::fma_peak_chains(1) == best);  // measured once, then kept
}

TEST_CASE("bench::case_name: <model>[/<kernel>]/<pass>/<fused|unfused>/<batch>", "[bench]") {
  CHECK(bench::case_name("mlp", "", pass::forward_train, true, 256) == "mlp/forward_train/fused/256");
  CHECK(bench::case_name("mlp", bench::kernel_id(1, "linear+relu+dropout"), pass::backward, false, 32) ==
        "mlp/k1:linear+relu+dropout/backward/unfused/32");
  CHECK(bench::case_name("m", "", pass::forward_eval, true, 1) == "m/forward_eval/fused/1");
  CHECK(bench::case_name("m", "", pass::train_step, false, 7) == "m/train_step/unfused/7");
}

TEST_CASE("bench::copy_bytes_for: the copy that stands for a working set", "[bench]") {
  CHECK(bench::copy_bytes_for(0) == 4096);              // at least 4 KiB
  CHECK(bench::copy_bytes_for(2 << 20) == 1 << 20);     // half of the working set
  CHECK(bench::copy_bytes_for(3.5 * (1 << 20)) == 2 << 20);  // the nearest power of two
  CHECK(bench::copy_bytes_for(1e12) == 64 << 20);       // at most 64 MiB
}

TEST_CASE("bench::register_chain: every case registered, run and counted from cost<Model>", "[bench]") {
  stand_in::registry().clear();
  const auto cases = bench::register_chain<tiny, optim::adamw, stand_in::state>("tiny", {.batch = batch, .seed = 5});
  const std::vector<std::string> expected = {
      "tiny/forward_eval/unfused/32",
      "tiny/forward_eval/fused/32",
      "tiny/forward_train/unfused/32",
      "tiny/forward_train/fused/32",
      "tiny/backward/unfused/32",
      "tiny/backward/fused/32",
      "tiny/train_step/unfused/32",
      "tiny/train_step/fused/32",
      "tiny/k0:linear+relu+dropout/forward_eval/unfused/32",
      "tiny/k0:linear+relu+dropout/forward_eval/fused/32",
      "tiny/k0:linear+relu+dropout/forward_train/unfused/32",
      "tiny/k0:linear+relu+dropout/forward_train/fused/32",
      "tiny/k0:linear+relu+dropout/backward/unfused/32",
      "tiny/k0:linear+relu+dropout/backward/fused/32",
      "tiny/k1:linear/forward_eval/fused/32",  // one layer: nothing to compare with
      "tiny/k1:linear/forward_train/fused/32",
      "tiny/k1:linear/backward/fused/32",
  };
  REQUIRE(cases.size() == expected.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CHECK(cases[i]->name == expected[i]);
    CHECK(cases[i]->real_time);
  }

  std::map<std::string, stand_in::state> states;
  for (const auto* c : cases) c->run(states[c->name]);
  for (const auto& [name, s] : states) {
    INFO(name);
    CHECK(s.error.empty());
    CHECK(s.counters.at("GFLOPs") > 0);
    CHECK(s.counters.at("GBps") > 0);
    CHECK(s.counters.at("floor_fraction") > 0);
    CHECK(s.counters.at("floor_fraction") >= s.counters.at("peak_fraction"));
    CHECK((s.label == "compute-bound" || s.label == "memory-bound"));
    // A fused case is compared with the unfused one that ran before it.
    const bool paired = name.find("/fused/") != std::string::npos && name.find("k1:") == std::string::npos;
    CHECK(s.counters.count("fused_speedup") == (paired ? 1u : 0u));
  }

  // What each case counted is cost<Model>'s work for its pass: the fused model's, the unfused
  // model's (the same FLOPs; more bytes, every layer writing its output), a kernel's own.
  const auto result = [](const std::string& name) {
    for (const auto& r : bench::results())
      if (r.name == name) return r;
    FAIL("no result for " << name);
    return bench::case_result{};
  };
  using unfused = nn::unfused_chain<nn::linear<4, 8>, nn::relu, nn::dropout<0.5f>, nn::linear<8, 3>>;
  CHECK(result("tiny/forward_train/fused/32").per_call == forward_by_hand);
  CHECK(result("tiny/backward/fused/32").per_call == backward_by_hand);
  CHECK(result("tiny/forward_train/unfused/32").per_call == bench::chain_work<unfused>::model(pass::forward_train, batch));
  CHECK(result("tiny/forward_train/unfused/32").per_call.flops == forward_by_hand.flops);
  CHECK(result("tiny/forward_train/unfused/32").per_call.bytes > forward_by_hand.bytes);
  CHECK(result("tiny/k0:linear+relu+dropout/backward/unfused/32").per_call ==
        bench::chain_work<unfused>::kernels_in(0, 3, pass::backward, batch));
  CHECK(result("tiny/k1:linear/backward/fused/32").per_call == bench::chain_work<tiny>::kernel<1>(pass::backward, batch));
  const bench::case_result fused = result("tiny/train_step/fused/32");
  CHECK(fused.fused_speedup == Approx(result("tiny/train_step/unfused/32").seconds / fused.seconds));
  CHECK(fused.limits.peak_gflops > 0);
  CHECK(fused.limits.gbps > 0);
}

TEST_CASE("bench::register_chain: a chain that is not a classifier trains on mean squared error", "[bench]") {
  using regression = nn::chain<nn::linear<4, 1>>;  // one output: no classes to label
  stand_in::registry().clear();
  const auto cases = bench::register_chain<regression, optim::sgd, stand_in::state>(
      "regression", {.batch = 5, .forward_eval = false, .forward_train = false, .backward = false, .kernels = false},
      {.lr = 0.1f});
  REQUIRE(cases.size() == 1);  // one kernel: no unfused case
  CHECK(cases[0]->name == "regression/train_step/fused/5");
  stand_in::state s;
  cases[0]->run(s);
  CHECK(s.error.empty());
  CHECK(s.counters.at("GBps") > 0);
  // SGD's pass: weight and gradient read, weight written; 5 parameters, 20 bytes.
  const bench::work step = bench::chain_work<regression>::model<optim::sgd>(pass::train_step, 5);
  CHECK(step == bench::chain_work<regression>::model(pass::forward_train, 5) +
                    bench::chain_work<regression>::model(pass::backward, 5) + bench::work{0, 3 * 20.0});
}
