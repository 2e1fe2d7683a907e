// digits_train_step.cu: the digits MLP's training step on a CUDA device: solder_digits_mlp_train_step of its generated C interface (forward, softmax cross-entropy, backward, AdamW) timed over bursts of consecutive steps.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "digits_mlp.h"
#include "solder/cuda.hpp"

namespace {

using namespace solder_bench::gpu;
namespace cu = solder::eval::cuda;

/// The chain of kernels/chains.hpp: 64 -> 256 -> 128 -> 10, ReLU and dropout 0.1 after the first two.
constexpr std::size_t features = SOLDER_DIGITS_MLP_IN_FLOATS, classes = SOLDER_DIGITS_MLP_OUT_FLOATS;

/// The demo's AdamW (examples/digits_mlp.cpp): lr 2e-3, weight decay 1e-2, torch's betas and eps.
constexpr float adamw_lr = 2e-3f, adamw_weight_decay = 1e-2f;

/// Steps timed between one pair of events: train_step waits for its loss once per step, so the
/// GPU idles while the host queues the rest; a burst amortizes the events' own cost and the first
/// launch's latency over its steps, as a training loop runs them back to back.
constexpr std::size_t steps_per_burst = 20;
/// Seconds of per-step time a repetition gathers (Google Benchmark's min_time for these cases,
/// which wins over --benchmark_min_time): each iteration runs steps_per_burst steps and reports
/// one step's time, so this is 0.5 s of steps, the flag's default.
constexpr double min_step_seconds = 0.5 / steps_per_burst;
/// Steps on one batch before timing: the check that the steps train (and the warm-up).
constexpr int check_steps = 30;
/// The loss on that batch must fall below this fraction of its first value: the labels are a
/// function of x (below), and 30 steps of AdamW at lr 2e-3 take PyTorch's same model from 2.30
/// to 0.53 (batch 256) and 0.61 (batch 1024) of it.
constexpr double check_loss_fraction = 0.8;

/// Seeds of the data and of the model (its parameters drawn as nn::chain(model_seed) draws them,
/// nn.Linear's init), fixed so every run sees the same numbers.
enum seed : std::uint64_t { seed_x = 1, model_seed = 1 };

/// labels[r] = the index of the largest of x[r, 0..9]: a rule the MLP can learn, so the check
/// sees the loss fall, and every class about equally often.
__global__ void argmax_labels_kernel(const float* x, std::int32_t* labels, std::size_t rows) {
  for (std::size_t r = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += std::size_t(gridDim.x) * blockDim.x) {
    std::int32_t best = 0;
    for (std::int32_t c = 1; c < std::int32_t(classes); ++c)
      if (x[r * features + c] > x[r * features + best]) best = c;
    labels[r] = best;
  }
}

/// `sets` batches of x [batch, 64] in [0, 1) (the demo's pixels / 16 lie there) and their labels,
/// one allocation each; the steps cycle through them, so 2 x L2 of other batches passes between
/// two reads of one (the parameters, gradients, optimizer state and activations stay in place,
/// as in a training loop).
struct batches {
  std::size_t batch, sets;
  cu::device_array<float> x;
  cu::device_array<std::int32_t> labels;
  batches(std::size_t batch_, std::size_t sets_)
      : batch(batch_), sets(sets_), x(cu::device_array<float>::allocate(sets_ * batch_ * features, solder::current_stream())),
        labels(cu::device_array<std::int32_t>::allocate(sets_ * batch_, solder::current_stream())) {
    fill_uniform(x.data(), x.size(), seed_x, 0.0f, 1.0f);
    argmax_labels_kernel<<<unsigned(device().multiprocessors * 8), 256, 0, solder::current_stream()>>>(x.data(), labels.data(),
                                                                                                      labels.size());
    check(cudaGetLastError(), "argmax_labels_kernel");
  }
  const float* x_of(std::size_t k) const { return x.data() + k * batch * features; }
  const std::int32_t* labels_of(std::size_t k) const { return labels.data() + k * batch; }
};

/// The model on the device (parameters, gradients, AdamW's state, the activations the backward
/// reads), behind the C interface's handle, and the optimizer's settings.
struct training {
  std::size_t batch;
  solder_digits_mlp* model = nullptr;
  solder_optimizer opt{};

  explicit training(std::size_t batch_) : batch(batch_) {
    launched(solder_digits_mlp_create(model_seed, &model));
    opt.kind = solder_adamw;
    opt.lr = adamw_lr;
    opt.weight_decay = adamw_weight_decay;
    opt.beta1 = 0.9f;
    opt.beta2 = 0.999f;
    opt.eps = 1e-8f;
  }
  ~training() { solder_digits_mlp_destroy(model); }
  training(const training&) = delete;
  training& operator=(const training&) = delete;

  /// One training step on batch (x, labels); returns its loss.
  float step(const float* x, const std::int32_t* labels) {
    float loss = 0;
    launched(solder_digits_mlp_train_step(model, x, labels, batch, &opt, 0.0f, &loss, solder::current_stream()));
    return loss;
  }

 private:
  static void launched(int status) {
    if (status != 0) throw std::runtime_error(std::string("digits_mlp: ") + solder_digits_mlp_last_error());
  }
};

/// Times bursts of steps_per_burst steps between CUDA events on the current stream, each burst
/// one iteration (its time divided by its steps: Time is per step); the steps cycle through the
/// batches. Returns the mean seconds per step.
template <class Step>
double seconds_per_step(benchmark::State& state, std::size_t sets, Step&& step) {
  const cudaStream_t stream = solder::current_stream();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  double total = 0;
  std::size_t k = 0, bursts = 0;
  try {
    for (auto _ : state) {
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      for (std::size_t i = 0; i < steps_per_burst; ++i, k = (k + 1) % sets) step(k);
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      const double per_step = ms * 1e-3 / double(steps_per_burst);
      state.SetIterationTime(per_step);
      total += per_step;
      ++bursts;
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return total / double(bursts ? bursts : 1);
}

/// solder_digits_mlp_train_step at `batch` rows: forward (three products, bias, ReLU and the
/// dropout masks in their epilogues), softmax cross-entropy and its gradient (the loss read back
/// to the host), backward, and AdamW's update of every parameter.
void train_step_case(benchmark::State& state, std::size_t batch) {
  const std::size_t sets = rotation_sets(batch * (features * sizeof(float) + sizeof(std::int32_t)));
  const batches data(batch, sets);
  training t(batch);
  // Check: the steps train. On one batch, the loss must fall well below its first value.
  const float first = t.step(data.x_of(0), data.labels_of(0));
  float last = first;
  for (int i = 1; i < check_steps; ++i) last = t.step(data.x_of(0), data.labels_of(0));
  if (!(std::isfinite(first) && last < check_loss_fraction * first))
    return state.SkipWithError(("loss " + std::to_string(first) + " -> " + std::to_string(last) + " after " +
                                std::to_string(check_steps) + " steps on one batch: not training")
                                   .c_str());
  for (std::size_t k = 0; k < sets; ++k) t.step(data.x_of(k), data.labels_of(k));  // warm-up: every batch once
  const double seconds = seconds_per_step(state, sets, [&](std::size_t k) { t.step(data.x_of(k), data.labels_of(k)); });
  state.counters["us_per_step"] = seconds * 1e6;
  state.counters["samples_per_second"] = double(batch) / seconds;
  state.SetLabel(std::to_string(sets) + " batches; AdamW; events around bursts of " + std::to_string(steps_per_burst) +
                 " steps, each waiting for its loss");
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, [] {
    for (std::size_t batch : {256, 1024})
      benchmark::RegisterBenchmark(("BM_cuda_train_step/solder/digits_mlp/" + std::to_string(batch)).c_str(),
                                   [batch](benchmark::State& state) { guarded(state, [&] { train_step_case(state, batch); }); })
          ->UseManualTime()
          ->MinTime(min_step_seconds)
          ->Unit(benchmark::kMicrosecond);
  });
}
