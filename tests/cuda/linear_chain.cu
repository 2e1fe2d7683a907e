// tests/cuda/linear_chain.cu: kernels/chains.hpp's linear_relu_dropout (one product with relu and
// dropout in its epilogue) as a device model behind its generated C interface
// (kernels/linear_relu_dropout.h) against the CPU chain (linear_chain.host.cpp): create draws the
// CPU chain's parameters bit for bit, params() names them and lays them out as the header's
// macros, write_params and read_params round-trip, reseed draws what a fresh chain draws; a
// training forward's dropout mask bit for bit (every dropped element the same +0) and its values,
// and the backward's dW and db for a given dy, within a stated tolerance of the sums' magnitudes;
// the same bits again after reseed restores the dropout's stream; a data-parallel shard
// (set_first_sample) drawing the whole batch's mask for its rows; the evaluation forward (also
// after write_params); training steps against the CPU chain's with Nesterov SGD and with AdamW and
// label smoothing through loss_and_backward and optimizer_step; and refused labels and arguments
// (cudaErrorInvalidValue, a message naming them, the model as it was). Exits 77 (ctest's skip
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

#include "../support/data.hpp"
#include "linear_chain.hpp"
#include "linear_relu_dropout.h"
// After the generated header, whose common types it uses.
#include "../support/generated_model.hpp"

SOLDER_TEST_GENERATED_API_WITH_LOSS(linear_relu_dropout, LINEAR_RELU_DROPOUT);

namespace {

namespace ref = solder::test::linear_chain;
using ref::in;
using ref::out;
using ref::param_floats;
using solder::test::fill_uniform;
using namespace solder::test::gpu;

static_assert(SOLDER_LINEAR_RELU_DROPOUT_IN_FLOATS == in && SOLDER_LINEAR_RELU_DROPOUT_OUT_FLOATS == out &&
              SOLDER_LINEAR_RELU_DROPOUT_PARAMS == 2 && SOLDER_LINEAR_RELU_DROPOUT_PARAM_FLOATS == param_floats &&
              SOLDER_LINEAR_RELU_DROPOUT_0_WEIGHT == 0 && SOLDER_LINEAR_RELU_DROPOUT_0_BIAS == out * in &&
              SOLDER_LINEAR_RELU_DROPOUT_BUFFER_FLOATS == 0 && SOLDER_LINEAR_RELU_DROPOUT_DROPOUTS == 1);

constexpr std::size_t batch = 157;  // a tail in every tiling's rows and in the column walk's chunks
constexpr std::size_t shard_first = 61;  // a shard's first sample, off the mask's groups of samples
constexpr std::size_t bias_at = SOLDER_LINEAR_RELU_DROPOUT_0_BIAS;

/// Both sides round each multiply-add of a sum of K terms in another order (the CPU's GEMM
/// blocks K, the GPU runs one fma chain per element): 1e-5 of the sum of the terms' magnitudes
/// covers a few hundred float roundings, K being 256 or the batch here.
constexpr double sum_tolerance = 1e-5;
constexpr double floor_tolerance = 1e-6;  // for sums whose terms nearly all vanish
/// Training steps, as cuda:digits_train: the loss within 1e-5 relative, the first step's gradients
/// within 1e-5 of their tensor's largest, the weights after the steps weights_close, none off by
/// more than twice the most a weight moved on the CPU.
constexpr double loss_tolerance = 1e-5, gradient_tolerance = 1e-5;

using model = generated_model<linear_relu_dropout_api>;
constexpr auto refused = model::refused;

/// |b_j| + sum_k |x_ik w_jk|, times `scale`: the magnitude of output (i, j)'s sum, rows
/// [first, first + rows) of x.
std::vector<double> forward_magnitudes(const std::vector<float>& x, const std::vector<float>& params,
                                       std::size_t first, std::size_t rows, double scale) {
  std::vector<double> mag(rows * out);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < out; ++j) {
      double m = std::fabs(double(params[bias_at + j]));
      for (std::size_t k = 0; k < in; ++k) m += std::fabs(double(x[(first + i) * in + k]) * double(params[j * in + k]));
      mag[i * out + j] = m * scale;
    }
  return mag;
}

/// Outputs of got off want (rows [first, first + got's rows) of want) by more than the tolerance
/// of their magnitudes; and, where `keep` is given, dropped elements that are not +0 on both sides.
struct forward_check {
  std::size_t value_off = 0, dropped = 0, dropped_not_zero = 0;
};
forward_check compare_forward(const std::vector<float>& want, const std::vector<float>& got,
                              const std::vector<double>& mag, std::size_t first, const std::vector<unsigned char>* keep) {
  forward_check c;
  const float zero = 0.0f;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::size_t w = first * out + i;
    c.value_off += !(std::fabs(double(want[w]) - double(got[i])) <= sum_tolerance * mag[i] + floor_tolerance);
    if (keep != nullptr && !(*keep)[w]) {
      ++c.dropped;
      c.dropped_not_zero += std::memcmp(&got[i], &zero, sizeof zero) != 0 || std::memcmp(&want[w], &zero, sizeof zero) != 0;
    }
  }
  return c;
}

/// create, params(), write_params and read_params, reseed.
void parameters() {
  const std::vector<float> initial = ref::initial_params(ref::model_seed);
  const model m(ref::model_seed);
  expect(same_bits(m.params(), initial), "create: the parameters nn::chain(seed) draws, bit for bit");
  const std::size_t starts[3] = {SOLDER_LINEAR_RELU_DROPOUT_0_WEIGHT, SOLDER_LINEAR_RELU_DROPOUT_0_BIAS, param_floats};
  const char* const names[2] = {"0.weight", "0.bias"};
  check_param_tensors(m, ref::layout(), names, starts, initial);
  std::vector<float> written(initial);
  for (std::size_t i = 0; i < written.size(); ++i) written[i] = -0.5f * written[i] + 1e-3f * float(i % 89);
  m.write_params(written);
  expect(same_bits(m.params(), written), "write_params, then read_params: the same bits");
  m.reseed(ref::other_seed);
  expect(same_bits(m.params(), ref::initial_params(ref::other_seed)), "reseed: the parameters nn::chain(seed) draws");
  expect(std::string(linear_relu_dropout_api::last_error()).empty(), "last_error: empty after a call that succeeded");
}

/// A fresh model's training forward and its backward for dy, against the CPU chain's; the same
/// bits again after reseed; a shard; the evaluation forward.
void forward_and_backward() {
  std::vector<float> x(batch * in), dy(batch * out);
  fill_uniform(x, -1, 1, 1);
  fill_uniform(dy, -1, 1, 2);
  const ref::reference r = ref::run(x, dy, batch);
  const device_vector<float> xd(x), dyd(dy);

  const model m(ref::model_seed);
  const std::vector<float> y = m.forward(xd.get(), batch);
  const std::vector<double> mag = forward_magnitudes(x, r.params, 0, batch, r.scale);
  const forward_check c = compare_forward(r.y, y, mag, 0, &r.keep);
  expect(c.dropped > 0 && c.dropped_not_zero == 0,
         "training forward: the dropped elements equal the CPU's +0 bit for bit (the same dropout mask)");
  // Relu and the dropout's scale do not widen a difference of x W^T + b beyond the scale.
  expect(c.value_off == 0, "training forward: y within 1e-5 of the sums' magnitudes of the CPU's");

  m.backward(dyd.get(), batch);
  const std::vector<float> grads = m.grads();
  // |g| of the gate, dy scaled where y > 0: the magnitudes of dW's and db's sums. An element that
  // relu gates on one side only (its input within rounding of 0) adds its whole term as slack.
  std::vector<double> tol(param_floats, floor_tolerance), slack(param_floats, 0.0);
  std::size_t gates_differ = 0;
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t j = 0; j < out; ++j) {
      const std::size_t e = i * out + j;
      const bool cpu_open = r.y[e] > 0.0f, gpu_open = y[e] > 0.0f;
      const double g = std::fabs(double(dy[e])) * r.scale;
      const double gm = cpu_open || gpu_open ? g : 0.0, gs = cpu_open != gpu_open ? g : 0.0;
      gates_differ += cpu_open != gpu_open;
      tol[bias_at + j] += sum_tolerance * gm;
      slack[bias_at + j] += gs;
      for (std::size_t k = 0; k < in; ++k) {
        const double xk = std::fabs(double(x[i * in + k]));
        tol[j * in + k] += sum_tolerance * gm * xk;
        slack[j * in + k] += gs * xk;
      }
    }
  std::size_t dw_off = 0, db_off = 0;
  for (std::size_t p = 0; p < param_floats; ++p)
    (p < bias_at ? dw_off : db_off) += !(std::fabs(double(r.grads[p]) - double(grads[p])) <= tol[p] + slack[p]);
  std::printf("training forward: %zu of %zu elements gated by relu on one side only\n", gates_differ, y.size());
  expect(dw_off == 0, "backward: dW within 1e-5 of the sums' magnitudes of the CPU's");
  expect(db_off == 0, "backward: db within 1e-5 of the sums' magnitudes of the CPU's");

  // reseed(seed) restores the parameters and the dropout's stream: the same mask, the same bits.
  m.reseed(ref::model_seed);
  expect(same_bits(y, m.forward(xd.get(), batch)), "training forward after reseed: the same bits");
  m.backward(dyd.get(), batch);
  expect(same_bits(grads, m.grads()), "backward after reseed: the same bits");

  {
    // Samples [61, 157) of the batch as a rank of their own: the whole batch's mask for them.
    const model s(ref::model_seed);
    s.set_first_sample(shard_first);
    const std::vector<float> ys = s.forward(xd.get() + shard_first * in, batch - shard_first);
    const forward_check sc = compare_forward(
        r.y, ys, forward_magnitudes(x, r.params, shard_first, batch - shard_first, r.scale), shard_first, &r.keep);
    expect(sc.dropped > 0 && sc.dropped_not_zero == 0,
           "shard (set_first_sample): the whole batch's dropped elements for its rows, +0 bit for bit");
    expect(sc.value_off == 0, "shard (set_first_sample): y within 1e-5 of the sums' magnitudes of the CPU's");
  }

  m.eval();
  expect(compare_forward(r.y_eval, m.forward(xd.get(), batch), forward_magnitudes(x, r.params, 0, batch, 1.0), 0,
                         nullptr)
                 .value_off == 0,
         "eval forward: relu(x W^T + b) within 1e-5 of the sums' magnitudes of the CPU's");
  const std::vector<float> other = ref::initial_params(ref::other_seed);
  m.write_params(other);
  expect(compare_forward(ref::eval_forward(other, x, batch), m.forward(xd.get(), batch),
                         forward_magnitudes(x, other, 0, batch, 1.0), 0, nullptr)
                 .value_off == 0,
         "eval forward after write_params: the written parameters' output");
}

/// Training batches of 64 samples, labels over the 512 outputs.
struct batches {
  static constexpr std::size_t rows = 64, count = 3;
  std::vector<float> x = std::vector<float>(count * rows * in);
  std::vector<std::int32_t> labels = std::vector<std::int32_t>(count * rows);
  batches() {
    fill_uniform(x, -1, 1, 3);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t((i * 37 + 11) % out);
  }
};

/// batches::count steps on the GPU and on the CPU from the same weights: the loss and step count
/// every step, the first step's gradients, the weights at the end. `split`: loss_and_backward,
/// then optimizer_step.
void training(const ref::optimizer_settings& s, float label_smoothing, bool split, const char* what) {
  std::printf("%s:\n", what);
  const batches b;
  const device_vector<float> xd(b.x);
  const device_vector<std::int32_t> yd(b.labels);
  ref::cpu_chain cpu(s);
  const std::vector<float> initial = cpu.params();
  const model m(ref::model_seed);
  solder_optimizer o = optimizer_of(s);
  for (std::size_t t = 0; t < batches::count; ++t) {
    const std::size_t row = t * batches::rows;
    float loss = -1;
    if (split) {
      loss = m.loss_and_backward(xd.get() + row * in, yd.get() + row, batches::rows, label_smoothing);
      m.optimizer_step(o);
    } else {
      loss = m.train_step(xd.get() + row * in, yd.get() + row, batches::rows, o, label_smoothing);
    }
    const float cpu_loss = cpu.train_step(b.x.data() + row * in, b.labels.data() + row, batches::rows, label_smoothing);
    std::printf("  step %zu: loss %.7f (GPU) %.7f (CPU)\n", t + 1, double(loss), double(cpu_loss));
    expect(close_to(loss, cpu_loss, loss_tolerance),
           "training step: the loss within 1e-5 of the CPU's");
    expect(o.steps == std::int64_t(t + 1), "training step: the optimizer's steps advanced by 1");
    if (t == 0) {
      const std::vector<float> want = cpu.grads(), got = m.grads();
      expect(off(want, got, 0, bias_at, gradient_tolerance) == 0 &&
                 off(want, got, bias_at, param_floats, gradient_tolerance) == 0,
             "training step: the first step's gradients within 1e-5 of their tensor's largest");
    }
  }
  const std::vector<float> trained = cpu.params();
  expect(weights_close(trained, m.params(), 2 * moved(initial, trained), what),
         "training step: the weights after the steps close to the CPU's");
}

/// Refused labels and arguments give cudaErrorInvalidValue and a message naming what was refused,
/// and leave the model as it was: its parameters and its dropout stream (the next step is the
/// CPU chain's, which never saw the refused calls).
void refused_calls() {
  const ref::optimizer_settings s{.kind = ref::optimizer_settings::sgd, .lr = 0.05f};
  const batches b;
  const device_vector<float> xd(b.x), y(out);
  const device_vector<std::int32_t> yd(b.labels);
  std::vector<std::int32_t> labels(b.labels.begin(), b.labels.begin() + batches::rows);
  labels[3] = std::int32_t(out);
  const device_vector<std::int32_t> bad(labels);
  ref::cpu_chain cpu(s);
  const model m(ref::model_seed);
  solder_optimizer o = optimizer_of(s);
  const std::vector<float> before = m.params();
  float loss = -1;
  expect(refused(linear_relu_dropout_api::train_step(m.get(), xd.get(), bad.get(), batches::rows, &o, 0.0f, &loss,
                                                       nullptr),
                 "label 512 of row 3"),
         "train_step: a label outside [0, 512) is refused, its row named");
  expect(refused(linear_relu_dropout_api::forward(m.get(), xd.get(), nullptr, 1, nullptr), "y is a null pointer"),
         "forward: a null y is refused, named");
  expect(refused(linear_relu_dropout_api::backward(m.get(), y.get(), 0, nullptr), "batch must be at least 1"),
         "backward: an empty batch is refused");
  expect(refused(linear_relu_dropout_api::write_params(m.get(), nullptr, nullptr), "params is a null pointer"),
         "write_params: a null array is refused, named");
  expect(refused(linear_relu_dropout_api::set_first_sample(nullptr, 1), "model is a null pointer"),
         "set_first_sample: a null model is refused, named");
  expect(same_bits(m.params(), before), "refused calls: the parameters as they were, bit for bit");
  expect(o.steps == 0, "refused calls: no optimizer step counted");
  loss = m.train_step(xd.get(), yd.get(), batches::rows, o);
  const float cpu_loss = cpu.train_step(b.x.data(), b.labels.data(), batches::rows, 0.0f);
  expect(close_to(loss, cpu_loss, loss_tolerance) && o.steps == 1,
         "train_step after refused calls: the CPU chain's first step (the dropout stream as it was)");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_linear_chain",
      "cuda:linear_chain: the device linear + relu + dropout model behind its C interface matches the CPU chain", [] {
        parameters();
        forward_and_backward();
        training({.kind = ref::optimizer_settings::sgd, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f,
                  .nesterov = true},
                 0.0f, false, "Nesterov SGD (lr 0.05, momentum 0.9, weight decay 1e-4)");
        training({.kind = ref::optimizer_settings::adamw, .lr = 1e-3f, .weight_decay = 1e-2f}, 0.1f, true,
                 "AdamW (lr 1e-3, weight decay 1e-2), label smoothing 0.1, loss_and_backward + optimizer_step");
        refused_calls();
        cudaDeviceSynchronize();
      });
}
