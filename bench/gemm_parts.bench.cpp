// gemm_parts.bench.cpp: where the time of one GEMM call goes at the smallest bench shape,
// relu(x W^T + b) at (M, N, K) = (64, 1024, 1024), single thread. The shape where solder's
// lead over oneDNN is smallest relative to the target (docs/gemm.md, "What bounds M = 64").
//
// BM_gemm_parts/64x1024x1024 times, in every iteration and in a shuffled order, three calls:
//   full       cpu::gemm with bias_relu_epilogue and W pre-packed (solder_kernel in
//              gemm.bench.cpp): the real call
//   kernel     the micro-kernel's rate at this shape: the same A packing, the same tiles (5 of
//              12-13 rows x 32 panels), the same FMAs and epilogue, each call over all of K, but
//              every call reads panel 0 of packed B (128 KiB, which stays in L2), so B costs no
//              memory traffic. Not a product (its output is not checked): a ceiling
//   pack_a     the packing of A alone (a transpose of x into 13-row panels)
// and reports, as medians over the iterations of per-iteration ratios (steadier than ratios of
// medians on this shared host): full_roofline and kernel_roofline (GFLOP/s over the FMA peak of
// this process, gemm.bench.cpp), kernel_speedup (full time / kernel time) and pack_a_share
// (pack_a time / full time).
#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "common.hpp"
#include "solder/eval/cpu/gemm.hpp"
#include "support/gemm_epilogues.hpp"

namespace {

using namespace solder_bench;
namespace cpu = solder::eval::cpu;  // the CPU backend's GEMM internals
namespace gd = solder::eval::cpu::gemm_detail;

constexpr std::size_t M = 64, N = 1024, K = 1024;

/// Packs A into the calling thread's workspace as every GEMM call does; returns it.
const float* pack_a_only(const float* A) {
  constexpr std::size_t MR = cpu::gemm_blocking::mr;
  const gd::row_tiles tiling(M, MR);
  float* packed_a = gd::thread_workspace(gd::workspace_slot::packed_a, tiling.count * MR * K);
  gd::pack_a<MR>(A, K, false, tiling, 0, tiling.count, K, packed_a);
  benchmark::DoNotOptimize(packed_a);
  return packed_a;
}

/// The "kernel" call above: panel-major, each tile over all of K, B always panel 0.
void kernel_rate(const float* A, const float* packed_b, solder::test::bias_relu_epilogue epi) {
  using blocking = cpu::gemm_blocking;
  constexpr std::size_t MR = blocking::mr, NV = blocking::nv, NR = blocking::nr;
  static_assert(N % NR == 0, "every panel is full at this shape");
  const gd::row_tiles tiling(M, MR);
  const float* packed_a = pack_a_only(A);
  constexpr auto& kernels = gd::kernel_table<NV, MR, solder::test::bias_relu_epilogue>;
  for (std::size_t p = 0; p < N / NR; ++p)
    for (std::size_t i = 0; i < tiling.count; ++i) {
      gd::tile_job job{};
      job.kc = K;
      job.first = job.last = true;
      job.a = packed_a + i * K * MR;
      job.b = packed_b;  // panel 0, whatever p is
      job.m0 = tiling.begin(i);
      job.mr = tiling.rows(i);
      job.n0 = p * NR;
      job.nr = NR;
      kernels[gd::kernel_index(job.mr)](job, epi);
    }
}

void parts_case(benchmark::State& state) {
  aligned_buffer<float> x(M * K), w(N * K), b(N), y(M * N), y_kernel(M * N);
  fill_uniform(x.span(), 11);
  fill_uniform(w.span(), 12);
  fill_uniform(b.span(), 13, -0.5f, 0.5f);
  const solder::packed_matrix<N, K, /*TransB=*/true> wp(w.data(), K);
  const double peak = peak_gflops(1);

  const auto full = [&] { cpu::gemm<N, K, false, true>(M, x.data(), K, wp, solder::test::bias_relu_epilogue{b.data(), y.data(), N}, 1); };
  const auto kernel = [&] { kernel_rate(x.data(), wp.data(), solder::test::bias_relu_epilogue{b.data(), y_kernel.data(), N}); };
  const auto pack = [&] { pack_a_only(x.data()); };
  full(), kernel(), pack();  // warm-up: workspaces allocated, code paged in

  std::vector<double> t_full, t_kernel, speedup, share;
  std::mt19937 order_rng(7);
  int order[3] = {0, 1, 2};
  for (auto _ : state) {
    std::shuffle(order, order + 3, order_rng);
    double t[3];
    for (int which : order) t[which] = which == 0 ? time_call(full) : which == 1 ? time_call(kernel) : time_call(pack);
    t_full.push_back(t[0]);
    t_kernel.push_back(t[1]);
    speedup.push_back(t[0] / t[1]);
    share.push_back(t[2] / t[0]);
  }
  const double flops = 2.0 * M * N * K;
  state.counters["full_roofline"] = flops / paired_times::median(t_full) * 1e-9 / peak;
  state.counters["kernel_roofline"] = flops / paired_times::median(t_kernel) * 1e-9 / peak;
  state.counters["kernel_speedup"] = paired_times::median(speedup);
  state.counters["pack_a_share"] = paired_times::median(share);
}

const bool registered = [] {
  benchmark::RegisterBenchmark("BM_gemm_parts/64x1024x1024", parts_case)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(400);
  return true;
}();

}  // namespace
