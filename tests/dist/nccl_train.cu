// tests/dist/nccl_train.cu: data-parallel training of the digits MLP (kernels/digits_mlp.h) on
// the GPUs present, one process, one rank per GPU (nccl_communicator::for_local_devices): each
// global batch cut by dist::shard_of, every rank's solder_digits_mlp_loss_and_backward on its
// shard (first_sample: the shard's first row, so its dropout masks are the global batch's), the
// gradients reduced by NCCL (each rank weighted by its rows over the global batch's), then
// solder_digits_mlp_optimizer_step on every rank. Checks that every rank holds the same
// parameter bits, and compares them with solder_digits_mlp_train_step on the whole batch on one
// GPU: bit for bit with one rank (the reduction is then an identity), within kTolerance with
// several. Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../support/data.hpp"
#include "../support/gpu_program.hpp"
#include "digits_mlp.h"
#include "solder/dist/nccl.hpp"
#include "solder/dist/reduction.hpp"
#include "solder/dist/shard.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/stream.hpp"

namespace {

namespace cu = solder::eval::cuda;
namespace dist = solder::dist;
using solder::test::bit_differences;
using solder::test::fill_integers;
using solder::test::fill_uniform;
using solder::test::gpu::expect;

constexpr std::size_t features = 64, classes = 10, params_n = SOLDER_DIGITS_MLP_PARAM_FLOATS;
constexpr std::size_t hidden_n = SOLDER_DIGITS_MLP_HIDDEN_FLOATS, dropouts = SOLDER_DIGITS_MLP_DROPOUTS;
/// The global batch: 101 rows, so shards differ in size on 2, 3, 4 ... GPUs; a shard of P GPUs
/// starting at row s draws dropout counters s * 256 and s * 128, off the 128-element groups for
/// odd s in the second dropout.
constexpr std::size_t global_rows = 101;
constexpr int steps = 3;
constexpr std::uint64_t seed = 20240611;
/// Several ranks against one: the ranks' gradients of the mean are each shard's mean, weighted by
/// its rows and summed in double (dist/reduction.hpp), where one GPU sums every row's term in one
/// product; the sums agree to float rounding of their terms (about 1e-7 of the largest), and three
/// SGD steps at lr 0.1 carry that into the parameters far below 1e-5 of the largest parameter. A
/// mask that is not the global batch's moves a parameter by lr times a gradient, about 1e-3.
constexpr double kTolerance = 1e-5;

/// SGD with momentum 0.9 (its buffer: PARAM_FLOATS of optimizer state), lr 0.1.
solder_optimizer sgd() {
  solder_optimizer o{};
  o.kind = solder_sgd;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  return o;
}

void ok(int status, const char* what) {
  if (status != 0) std::fprintf(stderr, "%s: %s\n", what, solder_digits_mlp_last_error());
  expect(status == 0, what);
}

void copy_to(float* d, const float* h, std::size_t n) {
  cu::check(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
template <class T>
std::vector<T> read(const T* d, std::size_t n) {
  std::vector<T> v(n);
  cu::check(cudaDeviceSynchronize(), "the kernels");
  cu::check(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  return v;
}

/// The global batches of every step, on the host: x [rows, 64] uniform in [0, 1), labels in [0, 10).
struct batches {
  std::vector<std::vector<float>> x;
  std::vector<std::vector<std::int32_t>> y;
  batches() {
    for (int t = 0; t < steps; ++t) {
      x.emplace_back(global_rows * features);
      y.emplace_back(global_rows);
      fill_uniform(x.back(), 0, 1, std::uint32_t(100 + t));
      fill_integers(y.back(), 0, int(classes) - 1, std::uint32_t(200 + t));
    }
  }
};

/// The parameters every run starts from: uniform in [-0.1, 0.1).
std::vector<float> initial_params() {
  std::vector<float> p(params_n);
  fill_uniform(p, -0.1, 0.1, 7);
  return p;
}

/// What a run leaves: the parameters, the mean loss of each step, the dropout offsets.
struct outcome {
  std::vector<float> params;
  std::vector<float> losses;
  std::vector<std::uint64_t> offsets;
};

/// solder_digits_mlp_train_step on the whole batch, on `device`.
outcome one_gpu(int device, const batches& data) {
  cu::check(cudaSetDevice(device), "cudaSetDevice");
  solder::stream s;
  auto params = cu::device_array<float>::allocate(params_n, s);
  auto grads = cu::device_array<float>::allocate(params_n, s);
  auto state = cu::device_array<float>::allocate(params_n, s);
  auto hidden = cu::device_array<float>::allocate(global_rows * hidden_n, s);
  auto y = cu::device_array<float>::allocate(global_rows * classes, s);
  auto x = cu::device_array<float>::allocate(global_rows * features, s);
  auto labels = cu::device_array<std::int32_t>::allocate(global_rows, s);
  s.synchronize();
  const std::vector<float> p0 = initial_params();
  copy_to(params.data(), p0.data(), params_n);
  cu::check(cudaMemset(state.data(), 0, params_n * sizeof(float)), "cudaMemset");
  std::uint64_t seeds[dropouts], offsets[dropouts];
  ok(solder_digits_mlp_dropout_streams(seed, seeds, offsets), "dropout_streams");
  solder_optimizer opt = sgd();
  outcome out;
  for (int t = 0; t < steps; ++t) {
    copy_to(x.data(), data.x[t].data(), global_rows * features);
    cu::check(cudaMemcpy(labels.data(), data.y[t].data(), global_rows * sizeof(std::int32_t), cudaMemcpyHostToDevice),
              "cudaMemcpy to the device");
    float loss = 0;
    ok(solder_digits_mlp_train_step(x.data(), labels.data(), params.data(), grads.data(), state.data(), &opt,
                                    hidden.data(), y.data(), global_rows, seeds, offsets, 0, 0.0f, &loss, s),
       "one GPU: train_step");
    out.losses.push_back(loss);
  }
  out.params = read(params.data(), params_n);
  out.offsets.assign(offsets, offsets + dropouts);
  return out;
}

/// One rank's side: its device, stream, shard and arrays.
struct rank_side {
  int device = 0;
  dist::shard mine;
  solder::stream stream;
  cu::device_array<float> params, grads, state, hidden, y, x, loss;
  cu::device_array<std::int32_t> labels;
  cu::device_array<std::uint64_t> bad_row;
  std::uint64_t offsets[dropouts] = {};
  solder_optimizer opt = sgd();
};

/// The data-parallel run: every rank's loss_and_backward on its shard, the gradients reduced by
/// NCCL, every rank's optimizer_step. Returns each rank's outcome (the losses: the global mean,
/// the shards' means weighted by their rows).
std::vector<outcome> data_parallel(std::vector<dist::nccl_communicator>& comms, const batches& data) {
  const int P = int(comms.size());
  std::vector<rank_side> sides(comms.size());
  const std::vector<float> p0 = initial_params();
  std::uint64_t seeds[dropouts], offsets0[dropouts];
  ok(solder_digits_mlp_dropout_streams(seed, seeds, offsets0), "dropout_streams");
  std::vector<double> weights(comms.size());
  for (int r = 0; r < P; ++r) {
    rank_side& side = sides[std::size_t(r)];
    side.device = comms[std::size_t(r)].device();
    side.mine = dist::shard_of(global_rows, r, P);
    weights[std::size_t(r)] = double(side.mine.count) / double(global_rows);
    const std::size_t n = side.mine.count;
    cu::check(cudaSetDevice(side.device), "cudaSetDevice");
    side.stream = solder::stream();
    const cudaStream_t s = side.stream;
    side.params = cu::device_array<float>::allocate(params_n, s);
    side.grads = cu::device_array<float>::allocate(params_n, s);
    side.state = cu::device_array<float>::allocate(params_n, s);
    side.hidden = cu::device_array<float>::allocate(n * hidden_n, s);
    side.y = cu::device_array<float>::allocate(n * classes, s);
    side.x = cu::device_array<float>::allocate(n * features, s);
    side.loss = cu::device_array<float>::allocate(1, s);
    side.labels = cu::device_array<std::int32_t>::allocate(n, s);
    side.bad_row = cu::device_array<std::uint64_t>::allocate(1, s);
    side.stream.synchronize();
    copy_to(side.params.data(), p0.data(), params_n);
    cu::check(cudaMemset(side.state.data(), 0, params_n * sizeof(float)), "cudaMemset");
    std::copy(offsets0, offsets0 + dropouts, side.offsets);
  }
  std::vector<outcome> out(comms.size());
  const std::vector<float> statuses(comms.size(), dist::status_ok);
  std::vector<float*> buckets;
  std::vector<cudaStream_t> streams;
  for (auto& side : sides) {
    buckets.push_back(side.grads.data());
    streams.push_back(side.stream);
  }
  for (int t = 0; t < steps; ++t) {
    for (auto& side : sides) {
      const std::size_t first = side.mine.first, n = side.mine.count;
      cu::check(cudaSetDevice(side.device), "cudaSetDevice");
      copy_to(side.x.data(), data.x[t].data() + first * features, n * features);
      cu::check(cudaMemcpy(side.labels.data(), data.y[t].data() + first, n * sizeof(std::int32_t),
                           cudaMemcpyHostToDevice),
                "cudaMemcpy to the device");
      ok(solder_digits_mlp_loss_and_backward(side.x.data(), side.labels.data(), side.params.data(), side.grads.data(),
                                             side.hidden.data(), side.y.data(), n, seeds, side.offsets, first, 0.0f,
                                             side.loss.data(), side.bad_row.data(), side.stream),
         "data parallel: loss_and_backward");
    }
    // grads = sum over ranks r of (rows_r / rows) grads_r: the global batch's mean gradient.
    auto reductions = dist::nccl_communicator::start_all(comms, buckets, params_n, weights, statuses, streams);
    for (std::size_t r = 0; r < comms.size(); ++r)
      expect(comms[r].finish(reductions[r]) == -1, "data parallel: no rank reported a failed step");
    double global_loss = 0;
    for (std::size_t r = 0; r < sides.size(); ++r) {
      rank_side& side = sides[r];
      cu::check(cudaSetDevice(side.device), "cudaSetDevice");
      ok(solder_digits_mlp_optimizer_step(side.params.data(), side.grads.data(), side.state.data(), &side.opt,
                                          side.stream),
         "data parallel: optimizer_step");
      const std::uint64_t bad = read(side.bad_row.data(), 1)[0];
      expect(bad == UINT64_MAX, "data parallel: every label in range (bad_label_row is UINT64_MAX)");
      global_loss += weights[r] * double(read(side.loss.data(), 1)[0]);
    }
    for (auto& o : out) o.losses.push_back(float(global_loss));
  }
  for (std::size_t r = 0; r < sides.size(); ++r) {
    cu::check(cudaSetDevice(sides[r].device), "cudaSetDevice");
    out[r].params = read(sides[r].params.data(), params_n);
    out[r].offsets.assign(sides[r].offsets, sides[r].offsets + dropouts);
    expect(sides[r].opt.steps == steps, "data parallel: every rank's optimizer took every step");
  }
  return out;
}

/// max |a - b| over max |b|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, largest = 1e-30;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    largest = std::max(largest, std::fabs(double(b[i])));
  }
  return diff / largest;
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_dist_nccl_train", "dist:nccl_train: data-parallel training on the GPUs matches one GPU's train_step", [] {
        const int gpus = cu::device_count();
        auto comms = dist::nccl_communicator::for_local_devices(gpus);
        if (gpus == 1)
          std::printf("dist:nccl_train: one GPU, one rank: the reduction is an identity (weight 1), so the split "
                      "step must equal train_step bit for bit; more GPUs test the shards' masks and the reduction\n");
        else
          std::printf("dist:nccl_train: %d GPUs, %d ranks in one process, shards of a global batch of %zu rows\n", gpus,
                      gpus, global_rows);
        const batches data;
        const outcome whole = one_gpu(comms.front().device(), data);
        const std::vector<outcome> ranks = data_parallel(comms, data);
        for (std::size_t r = 1; r < ranks.size(); ++r)
          expect(bit_differences(ranks[r].params.data(), ranks[0].params.data(), params_n) == 0,
                 "data parallel: every rank holds rank 0's parameter bits");
        for (const auto& o : ranks)
          expect(o.offsets == whole.offsets, "data parallel: every rank's dropout offsets moved as train_step's");
        if (gpus == 1) {
          expect(bit_differences(ranks[0].params.data(), whole.params.data(), params_n) == 0,
                 "one rank: the parameters after loss_and_backward, the reduction and optimizer_step equal "
                 "train_step's bit for bit");
          expect(bit_differences(ranks[0].losses.data(), whole.losses.data(), std::size_t(steps)) == 0,
                 "one rank: the device losses equal train_step's bit for bit");
        } else {
          const double d = relative_difference(ranks[0].params, whole.params);
          std::printf("dist:nccl_train: the parameters differ from one GPU's by %.3g of the largest (tolerance %.0e)\n", d,
                      kTolerance);
          expect(d <= kTolerance, "several ranks: the parameters within kTolerance of one GPU's train_step");
          for (int t = 0; t < steps; ++t)
            expect(std::fabs(double(ranks[0].losses[std::size_t(t)]) - double(whole.losses[std::size_t(t)])) <=
                       1e-5 * std::fabs(double(whole.losses[std::size_t(t)])),
                   "several ranks: the global loss (the shards' weighted means) within 1e-5 of one GPU's");
        }
        // The labels' check on the device: a label outside [0, 10) is reported by its row, no wait.
        {
          const int device = comms.front().device();
          cu::check(cudaSetDevice(device), "cudaSetDevice");
          const std::size_t n = 7;
          std::vector<float> x(n * features);
          fill_uniform(x, 0, 1, 5);
          std::vector<std::int32_t> labels{1, 2, 3, 10, 4, -1, 5};
          solder::stream s;
          auto p = cu::device_array<float>::allocate(params_n, s);
          auto g = cu::device_array<float>::allocate(params_n, s);
          auto h = cu::device_array<float>::allocate(n * hidden_n, s);
          auto yv = cu::device_array<float>::allocate(n * classes, s);
          auto xd = cu::device_array<float>::allocate(n * features, s);
          auto ld = cu::device_array<std::int32_t>::allocate(n, s);
          auto loss = cu::device_array<float>::allocate(1, s);
          auto bad = cu::device_array<std::uint64_t>::allocate(1, s);
          s.synchronize();
          const std::vector<float> p0 = initial_params();
          copy_to(p.data(), p0.data(), params_n);
          copy_to(xd.data(), x.data(), x.size());
          cu::check(cudaMemcpy(ld.data(), labels.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          std::uint64_t seeds[dropouts], offsets[dropouts];
          ok(solder_digits_mlp_dropout_streams(seed, seeds, offsets), "dropout_streams");
          ok(solder_digits_mlp_loss_and_backward(xd.data(), ld.data(), p.data(), g.data(), h.data(), yv.data(), n, seeds,
                                                 offsets, 0, 0.0f, loss.data(), bad.data(), s),
             "bad labels: loss_and_backward queues without an error");
          expect(read(bad.data(), 1)[0] == 3, "bad labels: bad_label_row names the lowest bad row, 3");
          expect(std::isnan(read(loss.data(), 1)[0]), "bad labels: the loss is NaN");
        }
      });
}
