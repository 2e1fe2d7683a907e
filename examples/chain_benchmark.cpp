// examples/chain_benchmark.cpp: microbenchmarks of your own chains with solder/benchmark.hpp. An
// MLP with dropout and a small CNN become Google Benchmark cases (forward, backward, training
// step and each planned kernel alone, fused and one kernel per layer) whose counters give GFLOP/s,
// GB/s and the fraction of this host's roofline; after the run, a table of every case against
// the roofline, with the fused kernels' speed-up over their layers run one at a time.
//
// Usage: chain_benchmark [Google Benchmark flags], e.g. --benchmark_filter=mlp/k0
// Without --benchmark_min_time each case runs about 0.05 s: a few seconds in all.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "solder/benchmark.hpp"
#include "solder/host_report.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/pool.hpp"

namespace {

using namespace solder;

// 64 -> 256 -> 128 -> 10, ReLU and dropout: 3 kernels, two GEMMs with relu+dropout epilogues.
using mlp = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>,  //
                      nn::linear<256, 128>, nn::relu, nn::dropout<0.1f>,  //
                      nn::linear<128, 10>>;

// [1, 8, 8] -> conv 3x3 + batch_norm + relu -> [16, 8, 8] -> conv 3x3 + batch_norm + relu ->
// [32, 8, 8] -> max pool 2 -> [32, 4, 4] -> flatten, dropout -> 10 (examples/digits_cnn.cpp).
using cnn = nn::chain<nn::input<1, 8, 8>,                                            //
                      nn::conv2d<1, 16, 3, 3, 1, 1>, nn::batch_norm<16>, nn::relu,   //
                      nn::conv2d<16, 32, 3, 3, 1, 1>, nn::batch_norm<32>, nn::relu,  //
                      nn::max_pool2d<2>, nn::flatten<>, nn::dropout<0.1f>, nn::linear<512, 10>>;

}  // namespace

int main(int argc, char** argv) {
  std::cout << host_report{} << "\nmlp, batch 256\n" << plan_report<mlp>{} << "\ncnn, batch 64\n" << plan_report<cnn>{} << "\n";

  // A short run unless the command line says otherwise.
  std::vector<char*> args(argv, argv + argc);
  std::string min_time = "--benchmark_min_time=0.05";
  if (std::none_of(args.begin() + 1, args.end(), [](const char* a) { return std::string_view(a).starts_with("--benchmark_min_time"); }))
    args.push_back(min_time.data());
  int count = int(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;

  for (auto* b : bench::register_chain<mlp>("mlp", {.batch = 256})) b->Unit(benchmark::kMicrosecond);
  for (auto* b : bench::register_chain<cnn>("cnn", {.batch = 64})) b->Unit(benchmark::kMicrosecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::cout << "\n" << bench::roofline_report{};
  return 0;
}
