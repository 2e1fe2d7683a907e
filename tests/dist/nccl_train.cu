// tests/dist/nccl_train.cu: data-parallel training of the digits MLP (kernels/digits_mlp.h) on
// the GPUs present, one process, one rank per GPU (nccl_communicator::for_local_devices): one
// model per rank, all made by solder_digits_mlp_create from one seed; each global batch cut by
// dist::shard_of, every rank's solder_digits_mlp_loss_and_backward on its shard (after
// set_first_sample(the shard's first row), so its dropout masks are the global batch's), each
// parameter's gradient (solder_digits_mlp_params) reduced by NCCL, each rank weighted by its rows
// over the global batch's, then solder_digits_mlp_optimizer_step on every rank. Checks that every
// rank holds the same parameter bits and draws the next masks of the global batch, and compares
// the parameters with solder_digits_mlp_train_step on the whole batch on one GPU: bit for bit with
// one rank (the reduction is then an identity), within kTolerance with several. Exits 77 (ctest's
// skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
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

constexpr std::size_t features = SOLDER_DIGITS_MLP_IN_FLOATS, classes = SOLDER_DIGITS_MLP_OUT_FLOATS;
constexpr std::size_t params_n = SOLDER_DIGITS_MLP_PARAM_FLOATS, tensors_n = SOLDER_DIGITS_MLP_PARAMS;
/// The global batch: 101 rows, so shards differ in size on 2, 3, 4 ... GPUs; a shard of P GPUs
/// starting at row s draws dropout counters s * 256 and s * 128, off the 128-element groups for
/// odd s in the second dropout.
constexpr std::size_t global_rows = 101;
constexpr int steps = 3;
/// The models' seed: every rank's and the one-GPU run's parameters and dropout streams.
constexpr std::uint64_t seed = 20240611;
/// Several ranks against one: the ranks' gradients of the mean are each shard's mean, weighted by
/// its rows and summed in double (dist/reduction.hpp), where one GPU sums every row's term in one
/// product; the sums agree to float rounding of their terms (about 1e-7 of the largest), and three
/// SGD steps at lr 0.1 carry that into the parameters far below 1e-5 of the largest parameter. A
/// mask that is not the global batch's moves a parameter by lr times a gradient, about 1e-3.
constexpr double kTolerance = 1e-5;

/// SGD with momentum 0.9, lr 0.1.
solder_optimizer sgd() {
  solder_optimizer o{};
  o.kind = solder_sgd;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  return o;
}

bool ok(int status, const char* what) {
  if (status != 0) std::fprintf(stderr, "%s returned %d: %s\n", what, status, solder_digits_mlp_last_error());
  expect(status == 0, what);
  return status == 0;
}

template <class T>
void copy_to(T* d, const T* h, std::size_t n) {
  cu::check(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
template <class T>
std::vector<T> read(const T* d, std::size_t n) {
  std::vector<T> v(n);
  cu::check(cudaDeviceSynchronize(), "the kernels");
  cu::check(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  return v;
}

/// The global batches of every step, on the host: x [rows, 64] uniform in [0, 1), labels in
/// [0, 10); and the batch of the training forward after them.
struct batches {
  std::vector<std::vector<float>> x;
  std::vector<std::vector<std::int32_t>> y;
  std::vector<float> after;
  batches() : after(global_rows * features) {
    for (int t = 0; t < steps; ++t) {
      x.emplace_back(global_rows * features);
      y.emplace_back(global_rows);
      fill_uniform(x.back(), 0, 1, std::uint32_t(100 + t));
      fill_integers(y.back(), 0, int(classes) - 1, std::uint32_t(200 + t));
    }
    fill_uniform(after, 0, 1, 300);
  }
};

/// A model made on the current device, destroyed with its handle.
struct model_deleter {
  void operator()(solder_digits_mlp* m) const { solder_digits_mlp_destroy(m); }
};
using model_ptr = std::unique_ptr<solder_digits_mlp, model_deleter>;

model_ptr make_model() {
  solder_digits_mlp* m = nullptr;
  if (!ok(solder_digits_mlp_create(seed, &m), "solder_digits_mlp_create"))
    throw solder::error(std::string("solder_digits_mlp_create: ") + solder_digits_mlp_last_error());
  return model_ptr(m);
}

/// The model's output for rows [first, first + n) of the batch after training, in training
/// mode (the masks the next step would draw for those rows).
std::vector<float> forward_after(solder_digits_mlp* m, const batches& data, std::size_t first, std::size_t n,
                                 cudaStream_t s) {
  auto x = cu::device_array<float>::allocate(n * features, s);
  auto y = cu::device_array<float>::allocate(n * classes, s);
  cu::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  copy_to(x.data(), data.after.data() + first * features, n * features);
  ok(solder_digits_mlp_forward(m, x.data(), y.data(), n, s), "forward after the steps");
  cu::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return read(y.data(), n * classes);
}

/// What a run leaves: the parameters, the mean loss of each step, the optimizer's step count,
/// and the logits of the training forward after the steps (every rank's rows, in order).
struct outcome {
  std::vector<float> params;
  std::vector<float> losses;
  std::int64_t steps = 0;
  std::vector<float> logits_after;
};

/// solder_digits_mlp_train_step on the whole batch, on `device`.
outcome one_gpu(int device, const batches& data) {
  cu::check(cudaSetDevice(device), "cudaSetDevice");
  solder::stream s;
  const model_ptr m = make_model();
  auto x = cu::device_array<float>::allocate(global_rows * features, s);
  auto labels = cu::device_array<std::int32_t>::allocate(global_rows, s);
  s.synchronize();
  solder_optimizer opt = sgd();
  outcome out;
  for (int t = 0; t < steps; ++t) {
    copy_to(x.data(), data.x[t].data(), global_rows * features);
    copy_to(labels.data(), data.y[t].data(), global_rows);
    float loss = 0;
    ok(solder_digits_mlp_train_step(m.get(), x.data(), labels.data(), global_rows, &opt, 0.0f, &loss, s),
       "one GPU: train_step");
    out.losses.push_back(loss);
  }
  out.params.resize(params_n);
  ok(solder_digits_mlp_read_params(m.get(), out.params.data(), s), "one GPU: read_params");
  out.steps = opt.steps;
  out.logits_after = forward_after(m.get(), data, 0, global_rows, s);
  return out;
}

/// One rank's side: its device, stream, shard, model and the batch's arrays.
struct rank_side {
  int device = 0;
  dist::shard mine;
  solder::stream stream;
  model_ptr model;
  solder_param_tensor tensors[tensors_n] = {};
  cu::device_array<float> x;
  cu::device_array<std::int32_t> labels;
  solder_optimizer opt = sgd();
};

/// The data-parallel run: every rank's loss_and_backward on its shard, each parameter's gradient
/// reduced by NCCL, every rank's optimizer_step. Returns each rank's outcome (the losses: the
/// global mean, the shards' means weighted by their rows).
std::vector<outcome> data_parallel(std::vector<dist::nccl_communicator>& comms, const batches& data) {
  const int P = int(comms.size());
  std::vector<rank_side> sides(comms.size());
  std::vector<double> weights(comms.size());
  std::vector<cudaStream_t> streams;
  for (int r = 0; r < P; ++r) {
    rank_side& side = sides[std::size_t(r)];
    side.device = comms[std::size_t(r)].device();
    side.mine = dist::shard_of(global_rows, r, P);
    weights[std::size_t(r)] = double(side.mine.count) / double(global_rows);
    const std::size_t n = side.mine.count;
    cu::check(cudaSetDevice(side.device), "cudaSetDevice");
    side.stream = solder::stream();
    side.model = make_model();
    ok(solder_digits_mlp_set_first_sample(side.model.get(), side.mine.first), "data parallel: set_first_sample");
    ok(solder_digits_mlp_params(side.model.get(), side.tensors), "data parallel: params");
    side.x = cu::device_array<float>::allocate(n * features, side.stream);
    side.labels = cu::device_array<std::int32_t>::allocate(n, side.stream);
    side.stream.synchronize();
    streams.push_back(side.stream);
  }
  std::vector<outcome> out(comms.size());
  for (int t = 0; t < steps; ++t) {
    std::vector<float> statuses;
    double global_loss = 0;
    for (std::size_t r = 0; r < sides.size(); ++r) {
      rank_side& side = sides[r];
      const std::size_t first = side.mine.first, n = side.mine.count;
      cu::check(cudaSetDevice(side.device), "cudaSetDevice");
      copy_to(side.x.data(), data.x[t].data() + first * features, n * features);
      copy_to(side.labels.data(), data.y[t].data() + first, n);
      float loss = 0;
      const bool done = ok(solder_digits_mlp_loss_and_backward(side.model.get(), side.x.data(), side.labels.data(), n,
                                                               0.0f, &loss, side.stream),
                           "data parallel: loss_and_backward");
      statuses.push_back(done ? dist::status_ok : dist::status_failed);
      global_loss += weights[r] * double(loss);
    }
    // Each gradient = sum over ranks r of (rows_r / rows) grad_r: the global batch's mean
    // gradient. All started before any is waited for, one reduction per parameter tensor.
    std::vector<std::vector<dist::nccl_reduction>> reductions;
    for (std::size_t i = 0; i < tensors_n; ++i) {
      std::vector<float*> buckets;
      for (const auto& side : sides) buckets.push_back(side.tensors[i].grad);
      reductions.push_back(dist::nccl_communicator::start_all(comms, buckets, sides[0].tensors[i].floats, weights,
                                                             statuses, streams));
    }
    for (auto& tensor : reductions)
      for (std::size_t r = 0; r < comms.size(); ++r)
        expect(comms[r].finish(tensor[r]) == -1, "data parallel: no rank reported a failed step");
    for (auto& side : sides) {
      cu::check(cudaSetDevice(side.device), "cudaSetDevice");
      ok(solder_digits_mlp_optimizer_step(side.model.get(), &side.opt, side.stream), "data parallel: optimizer_step");
    }
    for (auto& o : out) o.losses.push_back(float(global_loss));
  }
  for (std::size_t r = 0; r < sides.size(); ++r) {
    rank_side& side = sides[r];
    cu::check(cudaSetDevice(side.device), "cudaSetDevice");
    out[r].params.resize(params_n);
    ok(solder_digits_mlp_read_params(side.model.get(), out[r].params.data(), side.stream), "data parallel: read_params");
    out[r].steps = side.opt.steps;
    // Every rank's rows of the batch after the steps, gathered in rank order into rank 0's outcome.
    const std::vector<float> logits = forward_after(side.model.get(), data, side.mine.first, side.mine.count, side.stream);
    out[0].logits_after.insert(out[0].logits_after.end(), logits.begin(), logits.end());
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
        expect(whole.steps == steps, "one GPU: the optimizer took every step");
        for (const auto& o : ranks) expect(o.steps == steps, "data parallel: every rank's optimizer took every step");
        if (gpus == 1) {
          expect(bit_differences(ranks[0].params.data(), whole.params.data(), params_n) == 0,
                 "one rank: the parameters after loss_and_backward, the reduction and optimizer_step equal "
                 "train_step's bit for bit");
          expect(bit_differences(ranks[0].losses.data(), whole.losses.data(), std::size_t(steps)) == 0,
                 "one rank: the losses equal train_step's bit for bit");
          expect(bit_differences(ranks[0].logits_after.data(), whole.logits_after.data(), global_rows * classes) == 0,
                 "one rank: a training forward after the steps draws train_step's next masks (the same bits)");
        } else {
          const double d = relative_difference(ranks[0].params, whole.params);
          std::printf("dist:nccl_train: the parameters differ from one GPU's by %.3g of the largest (tolerance %.0e)\n", d,
                      kTolerance);
          expect(d <= kTolerance, "several ranks: the parameters within kTolerance of one GPU's train_step");
          for (int t = 0; t < steps; ++t)
            expect(std::fabs(double(ranks[0].losses[std::size_t(t)]) - double(whole.losses[std::size_t(t)])) <=
                       1e-5 * std::fabs(double(whole.losses[std::size_t(t)])),
                   "several ranks: the global loss (the shards' weighted means) within 1e-5 of one GPU's");
          // Parameters within kTolerance move the logits by about as much of their largest; a
          // mask that is not the global batch's moves some by a whole hidden unit's term.
          const double l = relative_difference(ranks[0].logits_after, whole.logits_after);
          std::printf("dist:nccl_train: a training forward after the steps differs from one GPU's by %.3g of the "
                      "largest logit\n",
                      l);
          expect(l <= 10 * kTolerance,
                 "several ranks: a training forward after the steps draws the global batch's next masks");
        }
        // A label outside [0, 10): refused (cudaErrorInvalidValue), the message naming the lowest
        // bad row, and the parameters left as they were.
        {
          cu::check(cudaSetDevice(comms.front().device()), "cudaSetDevice");
          const std::size_t n = 7;
          std::vector<float> x(n * features);
          fill_uniform(x, 0, 1, 5);
          const std::vector<std::int32_t> labels{1, 2, 3, 10, 4, -1, 5};
          solder::stream s;
          const model_ptr m = make_model();
          auto xd = cu::device_array<float>::allocate(n * features, s);
          auto ld = cu::device_array<std::int32_t>::allocate(n, s);
          s.synchronize();
          copy_to(xd.data(), x.data(), x.size());
          copy_to(ld.data(), labels.data(), n);
          std::vector<float> before(params_n), after(params_n);
          ok(solder_digits_mlp_read_params(m.get(), before.data(), s), "bad labels: read_params");
          float loss = 0;
          const int status = solder_digits_mlp_loss_and_backward(m.get(), xd.data(), ld.data(), n, 0.0f, &loss, s);
          const std::string message = solder_digits_mlp_last_error();
          std::printf("dist:nccl_train: loss_and_backward with labels 10 and -1 returned %d: %s\n", status,
                      message.c_str());
          expect(status == int(cudaErrorInvalidValue), "bad labels: loss_and_backward returns cudaErrorInvalidValue");
          expect(message.find("label 10 of row 3") != std::string::npos,
                 "bad labels: the message names the lowest bad row, 3, and its label");
          ok(solder_digits_mlp_read_params(m.get(), after.data(), s), "bad labels: read_params");
          expect(bit_differences(before.data(), after.data(), params_n) == 0,
                 "bad labels: the parameters are left as they were");
        }
      });
}
