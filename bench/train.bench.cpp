// train.bench.cpp: the flagship model (examples/digits_mlp.cpp), 64 -> 256 -> 128 -> 10 with
// ReLU and dropout 0.1, as solder::nn::chain (3 fused kernels forward) and as
// solder::nn::unfused_chain (one kernel per layer, as an eager framework runs it).
//
// Cases: BM_train_step/<impl>/digits_mlp/<batch> (batch 32 and 256): forward, softmax
// cross-entropy with its gradient, backward, one AdamW step (lr 1e-3, weight decay 1e-2), on
// a fixed random batch; BM_inference/<impl>/digits_mlp/<batch> (batch 1 and 256): one
// eval-mode forward with the weights packed once. Counter: samples_per_second.
// bench/torch_bench.py runs the same model and step in PyTorch.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "solder/nn/chain.hpp"
#include "solder/optim/adam.hpp"

namespace {

using namespace solder_bench;
using namespace solder;

template <template <class...> class Chain>
using digits_mlp = Chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 128>, nn::relu, nn::dropout<0.1f>,
                         nn::linear<128, 10>>;

struct batch_data {
  tensor<float, shape<dyn, 64>> x;
  std::vector<std::int32_t> y;
  explicit batch_data(std::size_t n) : x(n), y(n) {
    fill_uniform({x.data(), x.size()}, 31, 0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((i * 7 + 3) % 10);
  }
};

template <class Model>
void train_step_case(benchmark::State& state, std::size_t batch) {
  solder::set_num_threads(1);
  batch_data d(batch);
  Model model(1);
  optim::adamw opt(model.params(), {.lr = 1e-3f, .weight_decay = 1e-2f});
  for (int i = 0; i < 10; ++i) model.train_step(d.x, d.y, opt);  // buffers sized, caches warm
  for (auto _ : state) {
    const float loss = model.train_step(d.x, d.y, opt);
    benchmark::DoNotOptimize(loss);
  }
  state.counters["samples_per_second"] = benchmark::Counter(double(batch) * double(state.iterations()), benchmark::Counter::kIsRate);
}

template <class Model>
void inference_case(benchmark::State& state, std::size_t batch) {
  solder::set_num_threads(1);
  batch_data d(batch);
  Model model(1);
  model.eval();  // dropout off, weights packed once
  for (int i = 0; i < 10; ++i) model.forward(d.x);
  for (auto _ : state) {
    auto out = model.forward(d.x);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["samples_per_second"] = benchmark::Counter(double(batch) * double(state.iterations()), benchmark::Counter::kIsRate);
}

const bool registered = [] {
  for (std::size_t batch : {32, 256}) {
    benchmark::RegisterBenchmark(("BM_train_step/solder/digits_mlp/" + std::to_string(batch)).c_str(),
                                 train_step_case<digits_mlp<nn::chain>>, batch)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_train_step/unfused/digits_mlp/" + std::to_string(batch)).c_str(),
                                 train_step_case<digits_mlp<nn::unfused_chain>>, batch)->Unit(benchmark::kMicrosecond);
  }
  for (std::size_t batch : {1, 256}) {
    benchmark::RegisterBenchmark(("BM_inference/solder/digits_mlp/" + std::to_string(batch)).c_str(),
                                 inference_case<digits_mlp<nn::chain>>, batch)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_inference/unfused/digits_mlp/" + std::to_string(batch)).c_str(),
                                 inference_case<digits_mlp<nn::unfused_chain>>, batch)->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
