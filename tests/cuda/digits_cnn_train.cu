// tests/cuda/digits_cnn_train.cu: kernels/chains.hpp's digits_cnn as a device model behind its
// generated C interface (kernels/digits_cnn.h) against the CPU chain (digits_cnn_train.host.cpp):
// create draws the CPU chain's parameters and running statistics bit for bit, params() names them
// and lays them out as the header's macros and points at them, write_params, write_buffers and
// their reads round-trip, reseed draws what a fresh chain draws; a training forward (batch
// statistics, the running statistics moved, the dropout's mask the CPU's) and its backward for a
// given dy, also as a data-parallel shard (set_first_sample on both sides), and the evaluation
// forward (batch_norm folded, also after write_buffers) within rounding of the CPU chain's;
// train_step from the same weights on the same batches (losses, running statistics, first-step
// gradients, weights after 6 steps) with AdamW and SGD with momentum; refused labels and
// arguments (cudaErrorInvalidValue, a message naming them, the model as it was, its running
// statistics included); and the example's 20 epochs on the GPU and on the CPU from the same start,
// the held-out accuracies (the GPU's from the model's own evaluation forward) compared. Exits 77
// (ctest's skip code) where no CUDA device is present.
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

#include "digits_cnn.h"
#include "digits_cnn_train.hpp"
// After the generated header, whose common types it uses.
#include "../support/generated_model.hpp"

SOLDER_TEST_GENERATED_API_WITH_LOSS(digits_cnn, DIGITS_CNN);

namespace {

namespace ref = solder::test::digits_cnn_train;
using ref::batch;
using ref::buffer_floats;
using ref::classes;
using ref::features;
using ref::param_floats;
using namespace solder::test::gpu;

static_assert(SOLDER_DIGITS_CNN_PARAM_FLOATS == param_floats && SOLDER_DIGITS_CNN_BUFFER_FLOATS == buffer_floats &&
              SOLDER_DIGITS_CNN_IN_FLOATS == features && SOLDER_DIGITS_CNN_OUT_FLOATS == classes &&
              SOLDER_DIGITS_CNN_PARAMS == 10 && SOLDER_DIGITS_CNN_DROPOUTS == 1);
// The buffers: each batch_norm's running mean, then its running variance, in layer order.
static_assert(SOLDER_DIGITS_CNN_1_RUNNING_MEAN == 0 && SOLDER_DIGITS_CNN_1_RUNNING_VAR == 16 &&
              SOLDER_DIGITS_CNN_4_RUNNING_MEAN == 32 && SOLDER_DIGITS_CNN_4_RUNNING_VAR == 64 && buffer_floats == 96);

/// The header's flat layout, in params() order: each tensor's name and start, then the end.
constexpr std::size_t tensors = SOLDER_DIGITS_CNN_PARAMS;
constexpr const char* layout_names[tensors] = {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight",
                                               "3.bias",   "4.weight", "4.bias", "9.weight", "9.bias"};
constexpr std::size_t layout_starts[tensors + 1] = {
    SOLDER_DIGITS_CNN_0_WEIGHT, SOLDER_DIGITS_CNN_0_BIAS, SOLDER_DIGITS_CNN_1_WEIGHT, SOLDER_DIGITS_CNN_1_BIAS,
    SOLDER_DIGITS_CNN_3_WEIGHT, SOLDER_DIGITS_CNN_3_BIAS, SOLDER_DIGITS_CNN_4_WEIGHT, SOLDER_DIGITS_CNN_4_BIAS,
    SOLDER_DIGITS_CNN_9_WEIGHT, SOLDER_DIGITS_CNN_9_BIAS, param_floats};
/// The convolutions' biases (tensors 1 and 5) and the bias of the batch_norm after each (3, 7).
constexpr std::size_t conv_biases[2] = {1, 5}, norm_biases[2] = {3, 7};

/// Both sides sum the products in another order (the CPU's convolution and GEMM block them, the
/// GPU runs one fma chain per element), so a convolution's output differs by float roundings of
/// sums of 9 to 144 terms. A batch norm divides by the batch's deviation and the layers after it
/// compound the differences: 5e-5 of the tensor's largest element for the logits and gradients,
/// and for the running statistics relative to each value. The loss, a mean of 32 log-sum-exps:
/// 1e-5 relative.
constexpr double deep_tolerance = 5e-5, loss_tolerance = 1e-5;
/// A convolution's bias gradient before a batch_norm is 0 up to rounding (the normalization
/// removes any per-channel shift): both sides hold rounding noise, required below 1e-4 of the
/// batch_norm bias gradient's largest element instead of compared.
constexpr double noise_bound = 1e-4;
/// Weights after the updates, as cuda:digits_train (weight_comparison), none by more than twice the
/// most a weight moved on the CPU. The convolutions' biases are left out: their gradients are that
/// noise, which Adam's m / sqrt(v) turns into full steps of either sign on each side.
/// Held-out accuracy after the example's 20 epochs: the example's 98% bar on the GPU, and within 2
/// points (7 of 359 samples) of the CPU run from the same start; the runs' weights drift apart over
/// ~900 steps (rounding amplified where relu inputs cross 0), so the accuracies are two draws of the
/// same training. The CPU reaches 99.44%.
constexpr double example_accuracy = 0.98, accuracy_gap = 0.02;

using model = generated_model<digits_cnn_api>;
constexpr auto refused = model::refused;

/// Elements off by more than tol relative to each one.
std::size_t off_relative(const std::vector<float>& want, const std::vector<float>& got, double tol) {
  std::size_t n = want.size() == got.size() ? 0 : want.size();
  for (std::size_t i = 0; i < std::min(want.size(), got.size()); ++i)
    n += !(std::fabs(double(want[i]) - double(got[i])) <= tol * std::fabs(double(want[i])) + 1e-12);
  return n;
}
bool conv_bias(std::size_t k) { return k == conv_biases[0] || k == conv_biases[1]; }

/// The gradients against the CPU chain's: every tensor within deep_tolerance of its largest but
/// the convolutions' biases, which must be rounding noise on both sides.
void check_gradients(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t k = 0; k < tensors; ++k)
    if (!conv_bias(k)) n += off(want, got, layout_starts[k], layout_starts[k + 1], deep_tolerance);
  expect(n == 0, (what + ": every gradient within 5e-5 of its tensor's largest").c_str());
  bool noise = true;
  for (int i = 0; i < 2; ++i) {
    const std::size_t c = conv_biases[i], b = norm_biases[i];
    const double scale = noise_bound * largest(want, layout_starts[b], layout_starts[b + 1]);
    noise = noise && largest(got, layout_starts[c], layout_starts[c + 1]) <= scale &&
            largest(want, layout_starts[c], layout_starts[c + 1]) <= scale;
  }
  expect(noise, (what + ": the convolutions' bias gradients are rounding noise on both sides").c_str());
}

bool weights_close(const std::vector<float>& want, const std::vector<float>& got, double bound, const char* what) {
  if (want.size() != got.size()) return false;
  weight_comparison c;
  for (std::size_t k = 0; k < tensors; ++k)
    if (!conv_bias(k)) c.add(want, got, layout_starts[k], layout_starts[k + 1]);
  return c.close(bound, what);
}

/// A batch of `rows` held-out samples from `first` on, and a dy for it.
struct probe {
  std::vector<float> x, dy;
  probe(const ref::digits& data, std::size_t first, std::size_t rows)
      : x(data.test_x().begin() + first * features, data.test_x().begin() + (first + rows) * features),
        dy(rows * classes) {
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(std::cos(0.11 * double(i))) / float(rows);
  }
};

/// create, params(), the parameters' and buffers' writes and reads, reseed.
void parameters() {
  const ref::cpu_chain cpu(ref::model_seed, {});
  const std::vector<float> initial = cpu.params(), running = cpu.buffers();
  const model m(ref::model_seed);
  expect(same_bits(m.params(), initial), "create: the parameters nn::chain(seed) draws, bit for bit");
  expect(same_bits(m.buffers(), running), "create: the running statistics nn::chain(seed) starts with, bit for bit");

  check_param_tensors(m, cpu.layout(), layout_names, layout_starts, initial);

  std::vector<float> written(initial), stats(running);
  for (std::size_t i = 0; i < written.size(); ++i) written[i] = 0.5f * written[i] + 1e-3f * float(i % 97);
  for (std::size_t i = 0; i < stats.size(); ++i) stats[i] += 0.25f + 0.01f * float(i);
  m.write_params(written);
  m.write_buffers(stats);
  expect(same_bits(m.params(), written), "write_params, then read_params: the same bits");
  expect(same_bits(m.buffers(), stats), "write_buffers, then read_buffers: the same bits");
  const ref::cpu_chain five(5, {});
  m.reseed(5);
  expect(same_bits(m.params(), five.params()) && same_bits(m.buffers(), five.buffers()),
         "reseed(5): the parameters and running statistics nn::chain(5) starts with");
  m.reseed(ref::model_seed);
  expect(same_bits(m.params(), initial), "reseed(seed): the parameters create(seed) drew");
  expect(std::string(digits_cnn_api::last_error()).empty(), "last_error: empty after a call that succeeded");
}

/// A fresh model's training forward of a batch with a tail (37 rows) and its backward for a given
/// dy against the CPU chain's; then in evaluation mode, from the running statistics that forward
/// left, the held-out logits, also after write_buffers.
void forward_and_backward(const ref::digits& data) {
  constexpr std::size_t rows = 37;
  const probe p(data, 0, rows);
  const device_vector<float> xd(p.x), dyd(p.dy);
  ref::cpu_chain cpu(ref::model_seed, {});
  const model m(ref::model_seed);
  const std::vector<float> want = cpu.forward_backward(p.x.data(), p.dy.data(), rows);
  expect(off(want, m.forward(xd.get(), rows), deep_tolerance) == 0,
         "training forward: the logits within 5e-5 of the largest of the CPU chain's (the same dropout mask)");
  expect(off_relative(cpu.buffers(), m.buffers(), deep_tolerance) == 0,
         "training forward: the running statistics moved as the CPU chain's");
  m.backward(dyd.get(), rows);
  check_gradients(cpu.grads(), m.grads(), "backward");

  m.eval();
  const std::vector<float>& tx = data.test_x();
  const std::size_t n = data.test_y().size();
  const device_vector<float> txd(tx);
  const std::vector<float> params = m.params(), got = m.forward(txd.get(), n);
  expect(off(ref::eval_forward(params, m.buffers(), tx.data(), n), got, deep_tolerance) == 0,
         "eval forward (batch_norm folded): the logits within 5e-5 of the largest of the CPU chain's");
  expect(same_bits(got, m.forward(txd.get(), n)), "eval forward: the same bits on a second call");
  std::vector<float> stats = m.buffers();
  for (std::size_t i = 0; i < stats.size(); ++i) stats[i] = 0.5f * stats[i] + 0.3f;
  m.write_buffers(stats);
  expect(off(ref::eval_forward(params, stats, tx.data(), n), m.forward(txd.get(), n), deep_tolerance) == 0,
         "eval forward after write_buffers: folded with the written running statistics");
}

/// A data-parallel shard: samples [16, 32) of a batch as the second of two ranks
/// (set_first_sample(16)), on the GPU and on the CPU chain: the dropout draws that half's mask
/// on both sides (the batch_norms normalize over the shard, as each rank's does).
void shard(const ref::digits& data) {
  constexpr std::size_t first = batch / 2, rows = batch / 2;
  const probe p(data, first, rows);
  const device_vector<float> xd(p.x), dyd(p.dy);
  ref::cpu_chain cpu(ref::model_seed, {});
  const model m(ref::model_seed);
  cpu.set_first_sample(first);
  m.set_first_sample(first);
  const std::vector<float> want = cpu.forward_backward(p.x.data(), p.dy.data(), rows);
  expect(off(want, m.forward(xd.get(), rows), deep_tolerance) == 0,
         "shard: the logits within 5e-5 of the largest of the CPU chain's (the mask of samples 16 to 31)");
  m.backward(dyd.get(), rows);
  check_gradients(cpu.grads(), m.grads(), "shard backward");
}

void compare_training(const ref::digits& data, const ref::optimizer_settings& s, int steps, const char* what) {
  std::printf("%s, %d steps:\n", what, steps);
  ref::cpu_chain cpu(ref::model_seed, s);
  const std::vector<float> initial = cpu.params();
  const model m(ref::model_seed);
  solder_optimizer o = optimizer_of(s);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  const device_vector<float> xd(x);
  const device_vector<std::int32_t> yd(y);
  for (int t = 0; t < steps; ++t) {
    const std::size_t row = std::size_t(t) * batch;
    const float gpu_loss = m.train_step(xd.get() + row * features, yd.get() + row, batch, o);
    const float cpu_loss = cpu.train_step(x.data() + row * features, y.data() + row, batch, s.lr);
    std::printf("  step %d: loss %.7f (GPU) %.7f (CPU)\n", t + 1, double(gpu_loss), double(cpu_loss));
    expect(close_to(gpu_loss, cpu_loss, loss_tolerance),
           "train_step: the loss within 1e-5 of the CPU's");
    expect(o.steps == t + 1, "train_step: the optimizer's steps advanced by 1");
    expect(off_relative(cpu.buffers(), m.buffers(), deep_tolerance) == 0,
           "train_step: the running statistics moved as the CPU's");
    if (t == 0) check_gradients(cpu.grads(), m.grads(), "train_step, first step");
  }
  const std::vector<float> trained = cpu.params();
  expect(weights_close(trained, m.params(), 2 * moved(initial, trained), what),
         "train_step: the weights after the steps close to the CPU's");
}

/// Refused labels and arguments give cudaErrorInvalidValue and a message naming what was refused,
/// and leave the model as it was: its parameters, gradients and running statistics, its optimizer
/// state and its dropout stream (the next step is the CPU chain's, which never saw the refused
/// calls).
void refused_calls(const ref::digits& data) {
  const ref::optimizer_settings s{};
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
  const std::vector<float> params = m.params(), grads = m.grads(), running = m.buffers();

  const float* x1 = xd.get() + batch * features;
  std::vector<std::int32_t> labels(y.begin() + batch, y.begin() + 2 * batch);
  labels[9] = 12;
  const device_vector<std::int32_t> bad(labels);
  expect(refused(digits_cnn_api::train_step(m.get(), x1, bad.get(), batch, &o, 0.0f, &loss, nullptr),
                 "label 12 of row 9"),
         "train_step: a label outside [0, 10) is refused, its row named");
  expect(refused(digits_cnn_api::loss_and_backward(m.get(), x1, bad.get(), batch, 0.0f, &loss, nullptr),
                 "label 12 of row 9"),
         "loss_and_backward: a label outside [0, 10) is refused, its row named");
  solder_optimizer b = o;
  b.lr = -1.0f;
  expect(refused(digits_cnn_api::train_step(m.get(), x1, yd.get() + batch, batch, &b, 0.0f, &loss, nullptr),
                 "lr must be >= 0"),
         "train_step: a negative lr is refused");
  expect(o.steps == 1, "refused calls: the optimizer's step count not written");
  expect(refused(digits_cnn_api::forward(m.get(), nullptr, out.get(), batch, nullptr), "x is a null pointer"),
         "forward: a null x is refused, named");
  expect(refused(digits_cnn_api::forward(m.get(), x1, out.get(), 0, nullptr), "batch must be at least 1"),
         "forward: an empty batch is refused");
  expect(refused(digits_cnn_api::read_buffers(m.get(), nullptr, nullptr), "buffers is a null pointer"),
         "read_buffers: a null array is refused, named");
  expect(refused(digits_cnn_api::write_buffers(m.get(), nullptr, nullptr), "buffers is a null pointer"),
         "write_buffers: a null array is refused, named");
  expect(refused(digits_cnn_api::eval(nullptr), "model is a null pointer"), "eval: a null model is refused, named");

  expect(same_bits(m.params(), params), "refused calls: the parameters as they were, bit for bit");
  expect(same_bits(m.grads(), grads), "refused calls: the gradients as they were, bit for bit");
  expect(same_bits(m.buffers(), running), "refused calls: the running statistics as they were, bit for bit");
  loss = m.train_step(x1, yd.get() + batch, batch, o);
  const float cpu_loss = cpu.train_step(x.data() + batch * features, y.data() + batch, batch, s.lr);
  expect(close_to(loss, cpu_loss, loss_tolerance),
         "train_step after refused calls: the loss of the CPU chain that never saw them (the dropout stream as it "
         "was)");
  expect(o.steps == 2, "train_step after refused calls: the optimizer state's second step");
}

/// The example's run: 20 epochs of AdamW (lr 3e-3, weight decay 1e-2) with warmup + cosine, on
/// the GPU and on the CPU from the same start; the held-out accuracies, the GPU's from the
/// model's own evaluation forward (batch_norm folded), its logits the CPU chain's for the
/// GPU-trained parameters and running statistics.
void example_accuracy_reached(const ref::digits& data) {
  constexpr int epochs = 20;
  const std::size_t per_epoch = data.batches();
  const std::vector<float> lr = ref::schedule(std::int64_t(epochs * per_epoch));
  const ref::optimizer_settings s{.kind = ref::optimizer_settings::adamw, .lr = 3e-3f, .weight_decay = 1e-2f};
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
  const double cpu_acc = ref::accuracy(cpu.params(), cpu.buffers(), tx, data.test_y());
  std::printf("example on the GPU: loss %.4f (epoch 1) -> %.4f (epoch %d); held-out accuracy %.4f (GPU), %.4f (CPU)\n",
              first, last, epochs, gpu_acc, cpu_acc);
  expect(last < 0.1 * first, "example: the loss falls tenfold");
  expect(gpu_acc >= example_accuracy, "example: the GPU-trained model reaches the example's 98% held-out accuracy");
  expect(std::fabs(gpu_acc - cpu_acc) <= accuracy_gap, "example: the held-out accuracies within 2 points of each other");
  expect(off(ref::eval_forward(m.params(), m.buffers(), tx.data(), n), logits, deep_tolerance) == 0,
         "example: the trained model's held-out logits within 5e-5 of the largest of the CPU chain's");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_digits_cnn_train",
      "cuda:digits_cnn_train: the device digits_cnn behind its C interface matches the CPU chain and trains to the "
      "example's accuracy",
      [] {
        const ref::digits data;
        parameters();
        forward_and_backward(data);
        shard(data);
        compare_training(data, {.kind = ref::optimizer_settings::adamw, .lr = 3e-3f, .weight_decay = 1e-2f}, 6,
                         "AdamW (lr 3e-3, weight decay 1e-2), as the example");
        compare_training(data,
                         {.kind = ref::optimizer_settings::sgd, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f},
                         6, "SGD (lr 0.05, momentum 0.9, weight decay 1e-4)");
        refused_calls(data);
        example_accuracy_reached(data);
        cudaDeviceSynchronize();
      });
}
