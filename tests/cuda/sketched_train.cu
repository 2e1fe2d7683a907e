// tests/cuda/sketched_train.cu: kernels/chains.hpp's sketched_mlp as a device model behind its
// generated C interface (kernels/sketched_mlp.h) against the CPU chain (sketched_train.host.cpp):
// create draws the CPU chain's parameters bit for bit, params() names them and lays them out as
// the header's macros and points at them, write_params and read_params round-trip, reseed draws
// what a fresh chain draws (its parameters, and its sign sketches: the evaluation forward of the
// reseeded model is that chain's); the evaluation forward (also after write_params) and a training
// forward and its backward for a given dy within rounding of the CPU chain's (the sketches
// regenerated from the same seeds, the dropouts drawing the same masks); train_step from the same
// weights on the same batches (losses, first-step gradients, weights after 6 steps) with AdamW, and
// SGD with momentum through loss_and_backward and optimizer_step; two data-parallel shards
// (set_first_sample, gradients averaged through params()) against the whole batch on the CPU;
// refused labels and arguments (cudaErrorInvalidValue, a message naming them, the model as it
// was); and the example's 40 epochs on the GPU and on the CPU from the same start, the held-out
// accuracies (the GPU's from the model's own evaluation forward) compared. Exits 77 (ctest's skip
// code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "sketched_mlp.h"
#include "sketched_train.hpp"
// After the generated header, whose common types it uses.
#include "../support/generated_model.hpp"

SOLDER_TEST_GENERATED_API_WITH_LOSS(sketched_mlp, SKETCHED_MLP);

namespace {

namespace ref = solder::test::sketched_train;
using ref::batch;
using ref::classes;
using ref::features;
using ref::param_floats;
using namespace solder::test::gpu;

static_assert(SOLDER_SKETCHED_MLP_PARAM_FLOATS == param_floats && SOLDER_SKETCHED_MLP_IN_FLOATS == features &&
              SOLDER_SKETCHED_MLP_OUT_FLOATS == classes && SOLDER_SKETCHED_MLP_PARAMS == 8 &&
              SOLDER_SKETCHED_MLP_BUFFER_FLOATS == 0 && SOLDER_SKETCHED_MLP_DROPOUTS == 2);

/// The header's flat layout, in params() order: each tensor's name and start, then the end.
constexpr std::size_t tensors = SOLDER_SKETCHED_MLP_PARAMS;
constexpr const char* layout_names[tensors] = {"0.S1",   "0.S2",   "0.bias",   "3.S1",
                                               "3.S2",   "3.bias", "6.weight", "6.bias"};
constexpr std::size_t layout_starts[tensors + 1] = {
    SOLDER_SKETCHED_MLP_0_S1,     SOLDER_SKETCHED_MLP_0_S2,   SOLDER_SKETCHED_MLP_0_BIAS,
    SOLDER_SKETCHED_MLP_3_S1,     SOLDER_SKETCHED_MLP_3_S2,   SOLDER_SKETCHED_MLP_3_BIAS,
    SOLDER_SKETCHED_MLP_6_WEIGHT, SOLDER_SKETCHED_MLP_6_BIAS, param_floats};

/// Both sides round the products' sums in another order (the CPU's GEMM blocks K, the GPU runs
/// one fma chain per element; a sketched layer is two products, x [S1 | U2], then by [U1; S2]),
/// so values differ by float roundings of sums of 16 to 256 terms:
/// 1e-5 relative for the loss (a mean of 32 rows' log-sum-exps), and for each logit and gradient
/// element against the largest magnitude of its tensor (an element's sum may cancel to far below
/// its terms, never below the tensor's largest element by more than the batch's 32).
constexpr double loss_tolerance = 1e-5;
constexpr double value_tolerance = 1e-5;
// Weights after the updates: weights_close, none off by more than twice the most any weight moved
// on the CPU (the two sides' updates of an element, each at most that).
/// Held-out accuracy after the example's 40 epochs: the GPU-trained model at the example's bar, and
/// within 2 points of the CPU-trained chain (7 of the 359 held-out samples). After ~1800 steps the
/// two runs' weights differ (rounding, amplified where relu inputs cross 0), so their accuracies
/// are two draws of the same training, not equal; the CPU reaches 96.94%.
constexpr double example_accuracy = 0.95, accuracy_gap = 0.02;

using model = solder::test::gpu::generated_model<sketched_mlp_api>;
constexpr auto refused = model::refused;

/// Gradient elements off by more than value_tolerance of their tensor's largest, over every tensor.
std::size_t off_gradients(const std::vector<float>& want, const std::vector<float>& got) {
  return off_each(want, got, layout_starts, tensors, value_tolerance);
}

/// create, params(), write_params and read_params, reseed.
void parameters() {
  const ref::cpu_chain cpu(ref::model_seed, {});
  const std::vector<float> initial = cpu.params();
  const model m(ref::model_seed);
  expect(same_bits(m.params(), initial), "create: the parameters nn::chain(seed) draws, bit for bit");

  check_param_tensors(m, cpu.layout(), layout_names, layout_starts, initial);

  std::vector<float> written(initial);
  for (std::size_t i = 0; i < written.size(); ++i) written[i] = 0.5f * written[i] + 1e-3f * float(i % 97);
  m.write_params(written);
  expect(same_bits(m.params(), written), "write_params, then read_params: the same bits");
  m.reseed(5);
  const std::vector<float> five = ref::cpu_chain(5, {}).params();
  expect(same_bits(m.params(), five), "reseed(5): the parameters nn::chain(5) draws");
  {
    // The sketches are drawn from the seed too: the reseeded model's logits are chain(5)'s.
    constexpr std::size_t rows = 7;
    std::vector<float> x(rows * features);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
    const device_vector<float> xd(x);
    m.eval();
    expect(off(ref::eval_forward(5, five, x.data(), rows), m.forward(xd.get(), rows), value_tolerance) == 0,
           "reseed(5): the evaluation forward of nn::chain(5), its sketches included");
    m.train();
  }
  m.reseed(ref::model_seed);
  expect(same_bits(m.params(), initial), "reseed(seed): the parameters create(seed) drew");
  expect(std::string(sketched_mlp_api::last_error()).empty(), "last_error: empty after a call that succeeded");
}

/// The evaluation forward of the held-out samples, also after write_params in evaluation mode;
/// then a fresh model's training forward of a batch with a tail (37 rows) and its backward for a
/// given dy, against the CPU chain's (its dropouts drawing the same masks).
void forward_and_backward(const ref::digits& data) {
  const std::vector<float>& tx = data.test_x();
  const std::size_t n = data.test_y().size();
  const device_vector<float> txd(tx);
  {
    const model m(ref::model_seed);
    m.eval();
    const std::vector<float> got = m.forward(txd.get(), n);
    expect(off(ref::eval_forward(ref::model_seed, m.params(), tx.data(), n), got, value_tolerance) == 0,
           "eval forward: the logits within 1e-5 of the largest of the CPU chain's");
    expect(same_bits(got, m.forward(txd.get(), n)), "eval forward: the same bits on a second call");
    const std::vector<float> other = ref::cpu_chain(5, {}).params();
    m.write_params(other);
    expect(off(ref::eval_forward(ref::model_seed, other, tx.data(), n), m.forward(txd.get(), n), value_tolerance) == 0,
           "eval forward after write_params: the logits of the written parameters");
  }
  constexpr std::size_t rows = 37;
  std::vector<float> x(tx.begin(), tx.begin() + rows * features), dy(rows * classes);
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(std::cos(0.11 * double(i))) / float(rows);
  const device_vector<float> xd(x), dyd(dy);
  ref::cpu_chain cpu(ref::model_seed, {});
  const model m(ref::model_seed);
  const std::vector<float> want = cpu.forward_backward(x.data(), dy.data(), rows);
  expect(off(want, m.forward(xd.get(), rows), value_tolerance) == 0,
         "training forward: the logits within 1e-5 of the largest of the CPU chain's (the same dropout masks)");
  m.backward(dyd.get(), rows);
  const std::vector<float> grads = m.grads();
  expect(off_gradients(cpu.grads(), grads) == 0, "backward: every gradient within 1e-5 of its tensor's largest");
  const std::vector<solder_param_tensor> t = m.tensors();
  bool same = true;
  for (std::size_t k = 0; k < tensors; ++k)
    same = same && t[k].grad != nullptr &&
           std::memcmp(read_device(t[k].grad, t[k].floats).data(), grads.data() + layout_starts[k],
                       t[k].floats * sizeof(float)) == 0;
  expect(same, "params: the device memory of each gradient holds read_grads' floats there");
}

/// `steps` training steps on the GPU and the CPU from the same weights and batches of the first
/// epoch (compare_training_steps). `split`: each step as loss_and_backward, then optimizer_step.
void compare_training(const ref::digits& data, const ref::optimizer_settings& s, float label_smoothing, bool split,
                      int steps, const char* what) {
  ref::cpu_chain cpu(ref::model_seed, s);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  compare_training_steps<sketched_mlp_api>(cpu, s, ref::model_seed, x, y, batch, label_smoothing, split, steps, what, loss_tolerance,
                                 off_gradients);
}

/// Two data-parallel ranks of 16 samples against the CPU chain on the whole batches, AdamW, 4 steps.
void data_parallel(const ref::digits& data) {
  const ref::optimizer_settings s{};
  ref::cpu_chain cpu(ref::model_seed, s);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  compare_data_parallel<sketched_mlp_api>(cpu, s, ref::model_seed, x, y, batch, 4, loss_tolerance, off_gradients);
}

/// Refused labels and arguments (cuda:digits_train refuses the settings) give cudaErrorInvalidValue
/// and a message naming what was refused, and leave the model as it was: its parameters and gradients, its optimizer state and its dropout streams (the
/// next step is the CPU chain's, which never saw the refused calls).
void refused_calls(const ref::digits& data) {
  const ref::optimizer_settings s{.kind = ref::optimizer_settings::sgd, .lr = 0.05f, .weight_decay = 1e-4f,
                                  .momentum = 0.9f};
  ref::cpu_chain cpu(ref::model_seed, s);
  const model m(ref::model_seed);
  solder_optimizer o = optimizer_of(s);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  const device_vector<float> xd(x), out(batch * classes);
  const device_vector<std::int32_t> yd(y);
  m.train_step(xd.get(), yd.get(), batch, o);
  float loss = -1;
  cpu.train_step(x.data(), y.data(), batch, s.lr);
  const std::vector<float> params = m.params(), grads = m.grads();

  const float* x1 = xd.get() + batch * features;
  std::vector<std::int32_t> labels(y.begin() + batch, y.begin() + 2 * batch);
  labels[5] = 10;
  const device_vector<std::int32_t> bad(labels);
  labels[5] = y[batch + 5];
  labels[0] = -1;
  const device_vector<std::int32_t> negative(labels);
  expect(refused(sketched_mlp_api::train_step(m.get(), x1, bad.get(), batch, &o, 0.0f, &loss, nullptr),
                 "label 10 of row 5"),
         "train_step: a label outside [0, 10) is refused, its row named");
  expect(refused(sketched_mlp_api::loss_and_backward(m.get(), x1, negative.get(), batch, 0.0f, &loss, nullptr),
                 "label -1 of row 0"),
         "loss_and_backward: a negative label is refused, its row named");

  expect(o.steps == 1, "refused calls: the optimizer's step count not written");

  expect(refused(sketched_mlp_api::forward(m.get(), nullptr, out.get(), batch, nullptr), "x is a null pointer"),
         "forward: a null x is refused, named");
  expect(refused(sketched_mlp_api::forward(m.get(), x1, out.get(), 0, nullptr), "batch must be at least 1"),
         "forward: an empty batch is refused");
  expect(refused(sketched_mlp_api::train_step(m.get(), x1, yd.get() + batch, batch, nullptr, 0.0f, &loss, nullptr),
                 "optimizer is a null pointer"),
         "train_step: a null optimizer is refused, named");

  expect(same_bits(m.params(), params), "refused calls: the parameters as they were, bit for bit");
  expect(same_bits(m.grads(), grads), "refused calls: the gradients as they were, bit for bit");
  loss = m.train_step(x1, yd.get() + batch, batch, o);
  const float cpu_loss = cpu.train_step(x.data() + batch * features, y.data() + batch, batch, s.lr);
  expect(close_to(loss, cpu_loss, loss_tolerance),
         "train_step after refused calls: the loss of the CPU chain that never saw them (the dropout streams as they "
         "were)");
  expect(o.steps == 2, "train_step after refused calls: the optimizer state's second step");
}

/// The example's run, 40 epochs of AdamW with warmup + cosine, on the GPU and on the CPU from the
/// same start and batches; the held-out accuracies, the GPU's from the model's own evaluation
/// forward, its logits the CPU chain's for the GPU-trained weights.
void example_accuracy_reached(const ref::digits& data) {
  constexpr int epochs = 40;
  const std::size_t per_epoch = data.batches();
  const std::vector<float> lr = ref::schedule(std::int64_t(epochs * per_epoch));
  const ref::optimizer_settings s{.kind = ref::optimizer_settings::adamw, .lr = 2e-3f, .weight_decay = 1e-2f};
  ref::cpu_chain cpu(ref::model_seed, s);
  const model m(ref::model_seed);
  solder_optimizer o = optimizer_of(s);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::size_t t = 0;
  double first = 0, last = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    data.epoch(epoch, x, y);
    const device_vector<float> xd(x);
    const device_vector<std::int32_t> yd(y);
    double sum = 0;
    for (std::size_t b = 0; b < per_epoch; ++b, ++t) {
      o.lr = lr[t];
      sum += m.train_step(xd.get() + b * batch * features, yd.get() + b * batch, batch, o);
      cpu.train_step(x.data() + b * batch * features, y.data() + b * batch, batch, lr[t]);
    }
    (epoch == 0 ? first : last) = sum / double(per_epoch);
  }
  m.eval();
  const std::vector<float>& tx = data.test_x();
  const std::size_t n = data.test_y().size();
  const device_vector<float> txd(tx);
  const std::vector<float> logits = m.forward(txd.get(), n);
  const double gpu_acc = accuracy_of(logits, data.test_y(), classes);
  const double cpu_acc = ref::accuracy(cpu.params(), tx, data.test_y());
  std::printf("example on the GPU: loss %.4f (epoch 1) -> %.4f (epoch %d); held-out accuracy %.4f (GPU), %.4f (CPU)\n",
              first, last, epochs, gpu_acc, cpu_acc);
  expect(last < 0.1 * first, "example: the loss falls tenfold");
  expect(gpu_acc >= example_accuracy, "example: the GPU-trained model reaches the example's 95% held-out accuracy");
  expect(std::fabs(gpu_acc - cpu_acc) <= accuracy_gap, "example: the held-out accuracies within 2 points of each other");
  expect(off(ref::eval_forward(ref::model_seed, m.params(), tx.data(), n), logits, value_tolerance) == 0,
         "example: the trained model's held-out logits within 1e-5 of the largest of the CPU chain's");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_sketched_train",
      "cuda:sketched_train: the device sketched_mlp behind its C interface matches the CPU chain and trains to the "
      "example's accuracy",
      [] {
        const ref::digits data;
        parameters();
        forward_and_backward(data);
        compare_training(data, {.kind = ref::optimizer_settings::adamw, .lr = 2e-3f, .weight_decay = 1e-2f}, 0.0f,
                         false, 6, "AdamW (lr 2e-3, weight decay 1e-2), as the example");
        compare_training(data,
                         {.kind = ref::optimizer_settings::sgd, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f},
                         0.0f, true, 6, "SGD (lr 0.05, momentum 0.9, weight decay 1e-4), loss_and_backward + optimizer_step");
        data_parallel(data);
        refused_calls(data);
        example_accuracy_reached(data);
        cudaDeviceSynchronize();
      });
}
