// tests/cuda/digits_train.cu: kernels/chains.hpp's digits_mlp as a device model behind its
// generated C interface (kernels/digits_mlp.h) against the CPU chain (digits_train.host.cpp):
// create draws the CPU chain's parameters bit for bit, params() names them and lays them out as
// the header's macros and points at them, write_params and read_params round-trip and reseed
// draws what a fresh chain draws; the evaluation forward (also after write_params) and a training
// forward and its backward for a given dy within rounding of the CPU chain's; train_step from the
// same weights on the same batches (losses, first-step gradients, weights after 6 steps) with
// AdamW, SGD with momentum, Nesterov SGD, and Adam with label smoothing through loss_and_backward
// and optimizer_step; two data-parallel shards (set_first_sample, gradients averaged through
// params()) against the whole batch on the CPU; refused arguments, labels and settings
// (cudaErrorInvalidValue, a message naming them, the model as it was); and the demo's 40 epochs
// on the GPU reaching its held-out accuracy in the model's own evaluation forward. Exits 77
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

#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "digits_mlp.h"
#include "digits_train.hpp"

namespace {

namespace ref = solder::test::digits_train;
using ref::batch;
using ref::classes;
using ref::features;
using ref::param_floats;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

static_assert(SOLDER_DIGITS_MLP_PARAM_FLOATS == param_floats && SOLDER_DIGITS_MLP_IN_FLOATS == features &&
              SOLDER_DIGITS_MLP_OUT_FLOATS == classes && SOLDER_DIGITS_MLP_PARAMS == 6 &&
              SOLDER_DIGITS_MLP_BUFFER_FLOATS == 0 && SOLDER_DIGITS_MLP_DROPOUTS == 2);

/// The header's flat layout, in params() order: each tensor's name and start, then the end.
constexpr std::size_t tensors = SOLDER_DIGITS_MLP_PARAMS;
constexpr const char* layout_names[tensors] = {"0.weight", "0.bias", "3.weight", "3.bias", "6.weight", "6.bias"};
constexpr std::size_t layout_starts[tensors + 1] = {SOLDER_DIGITS_MLP_0_WEIGHT, SOLDER_DIGITS_MLP_0_BIAS,
                                                    SOLDER_DIGITS_MLP_3_WEIGHT, SOLDER_DIGITS_MLP_3_BIAS,
                                                    SOLDER_DIGITS_MLP_6_WEIGHT, SOLDER_DIGITS_MLP_6_BIAS,
                                                    param_floats};

/// Both sides round the products' sums in another order (the CPU's GEMM blocks K, the GPU runs
/// one fma chain per element), so values differ by float roundings of sums of 32 to 256 terms:
/// 1e-5 relative for the loss (a mean of 32 rows' log-sum-exps), and for each logit and gradient
/// element against the largest magnitude of its tensor (an element's sum may cancel to far below
/// its terms, never below the tensor's largest element by more than the batch's 32).
constexpr double loss_tolerance = 1e-5;
constexpr double value_tolerance = 1e-5;
/// Weights after the updates: an element is close when within 1e-6 + 1e-5 |w| (the updates add
/// lr-sized multiples of gradients that agree to 1e-5, and Adam's m / sqrt(v) is a ratio of two
/// such). A pre-activation within rounding of 0 may take the other side of relu on one side, which
/// changes one row of a weight's gradient: at most weight_outliers of the elements may be off by
/// more, and none by more than twice the most any weight moved on the CPU (the two sides' updates
/// of an element, each at most that).
constexpr double weight_abs = 1e-6, weight_rel = 1e-5, weight_outliers = 0.005;
/// The demo's bar (examples/digits_mlp.cpp exits 1 below it).
constexpr double demo_accuracy = 0.97;

void expect_ok(int status, const char* what) {
  if (status != 0) {
    ++solder::test::gpu::failures;
    std::fprintf(stderr, "FAILED: %s returned %d: %s\n", what, status, solder_digits_mlp_last_error());
  }
}

/// A device model, destroyed with its scope.
class model {
 public:
  explicit model(std::uint64_t seed) {
    expect_ok(solder_digits_mlp_create(seed, &p_), "create");
    if (p_ == nullptr) throw std::runtime_error("solder_digits_mlp_create made no model");
  }
  ~model() { solder_digits_mlp_destroy(p_); }
  model(const model&) = delete;
  model& operator=(const model&) = delete;
  solder_digits_mlp* get() const { return p_; }

  std::vector<float> params() const {
    std::vector<float> v(param_floats);
    expect_ok(solder_digits_mlp_read_params(p_, v.data(), nullptr), "read_params");
    return v;
  }
  std::vector<float> grads() const {
    std::vector<float> v(param_floats);
    expect_ok(solder_digits_mlp_read_grads(p_, v.data(), nullptr), "read_grads");
    return v;
  }
  /// The logits of x [rows, 64] (device memory) in the model's mode.
  std::vector<float> forward(const float* x, std::size_t rows) const {
    const device_vector<float> y(rows * classes);
    expect_ok(solder_digits_mlp_forward(p_, x, y.get(), rows, nullptr), "forward");
    return y.read();
  }

 private:
  solder_digits_mlp* p_ = nullptr;
};

solder_optimizer optimizer_of(const ref::optimizer_settings& s) {
  solder_optimizer o{};
  o.kind = s.kind == ref::optimizer_settings::sgd    ? solder_sgd
           : s.kind == ref::optimizer_settings::adam ? solder_adam
                                                     : solder_adamw;
  o.lr = s.lr;
  o.weight_decay = s.weight_decay;
  o.momentum = s.momentum;
  o.dampening = 0.0f;
  o.nesterov = s.nesterov ? 1 : 0;
  o.beta1 = 0.9f;
  o.beta2 = 0.999f;
  o.eps = 1e-8f;
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Elements of got[begin, end) off want by more than tol * (the largest |want| there).
std::size_t off(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin, std::size_t end,
                double tol) {
  if (want.size() < end || got.size() < end) return end - begin;
  double scale = 0;
  for (std::size_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(double(want[i])));
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n += !(std::fabs(double(want[i]) - double(got[i])) <= tol * scale);
  return n;
}
std::size_t off(const std::vector<float>& want, const std::vector<float>& got, double tol) {
  return off(want, got, 0, want.size(), tol);
}
/// Gradient elements off by more than value_tolerance of their tensor's largest, over every tensor.
std::size_t off_gradients(const std::vector<float>& want, const std::vector<float>& got) {
  std::size_t n = 0;
  for (std::size_t k = 0; k < tensors; ++k) n += off(want, got, layout_starts[k], layout_starts[k + 1], value_tolerance);
  return n;
}

/// Compares weights: false where more than weight_outliers are not close, or any is off by more
/// than `bound`.
bool weights_close(const std::vector<float>& want, const std::vector<float>& got, double bound, const char* what) {
  if (want.size() != got.size()) return false;
  std::size_t far = 0;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(want[i]) - double(got[i]));
    far += !(d <= weight_abs + weight_rel * std::fabs(double(want[i])));
    worst = std::max(worst, d == d ? d : 1e30);
  }
  std::printf("  %s: %zu of %zu weights beyond 1e-6 + 1e-5 |w|, largest difference %.3g\n", what, far, want.size(),
              worst);
  return double(far) <= weight_outliers * double(want.size()) && worst <= bound;
}
/// The most any weight moved from `initial` to `trained`.
double moved(const std::vector<float>& initial, const std::vector<float>& trained) {
  double m = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) m = std::max(m, std::fabs(double(trained[i]) - initial[i]));
  return m;
}

/// Rows of logits [rows, 10] whose largest logit (the first of equal ones) is the label.
double accuracy_of(const std::vector<float>& logits, const std::vector<std::int32_t>& labels) {
  std::size_t right = 0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const float* row = logits.data() + r * classes;
    right += std::size_t(std::max_element(row, row + classes) - row) == std::size_t(labels[r]);
  }
  return double(right) / double(labels.size());
}

/// The device memory tensor k of params() points at, read back.
std::vector<float> read_device(const float* p, std::size_t floats) {
  std::vector<float> v(floats);
  solder::eval::cuda::check(cudaMemcpy(v.data(), p, floats * sizeof(float), cudaMemcpyDeviceToHost),
                            "cudaMemcpy of a parameter tensor");
  return v;
}

/// create, params(), write_params and read_params, reseed.
void parameters() {
  const ref::cpu_chain cpu(ref::model_seed, {});
  const std::vector<float> initial = cpu.params();
  const model m(ref::model_seed);
  expect(same_bits(m.params(), initial), "create: the parameters nn::chain(seed) draws, bit for bit");

  solder_param_tensor t[tensors] = {};
  expect_ok(solder_digits_mlp_params(m.get(), t), "params");
  const std::vector<ref::param_info> layout = cpu.layout();
  bool names = layout.size() == tensors, places = names, values = names, pointers = names;
  for (std::size_t k = 0; names && k < tensors; ++k) {
    const std::size_t at = layout_starts[k];
    names = names && t[k].name != nullptr && layout[k].name == t[k].name && layout[k].name == layout_names[k];
    places = places && t[k].floats == layout[k].floats && at + t[k].floats == layout_starts[k + 1];
    pointers = pointers && t[k].value != nullptr && t[k].grad != nullptr && t[k].value != t[k].grad;
    if (pointers && places)
      values = values && std::memcmp(read_device(t[k].value, t[k].floats).data(), initial.data() + at,
                                     t[k].floats * sizeof(float)) == 0;
  }
  expect(names, "params: the CPU chain's state_dict names, in the header's order");
  expect(places, "params: each tensor's floats, where the header's macros place it in the flat array");
  expect(pointers, "params: a value and a separate gradient pointer for every tensor");
  expect(pointers && places && values, "params: the device memory of each value holds read_params' floats there");

  std::vector<float> written(initial);
  for (std::size_t i = 0; i < written.size(); ++i) written[i] = 0.5f * written[i] + 1e-3f * float(i % 97);
  expect_ok(solder_digits_mlp_write_params(m.get(), written.data(), nullptr), "write_params");
  expect(same_bits(m.params(), written), "write_params, then read_params: the same bits");
  expect_ok(solder_digits_mlp_reseed(m.get(), 5), "reseed");
  expect(same_bits(m.params(), ref::cpu_chain(5, {}).params()), "reseed(5): the parameters nn::chain(5) draws");
  expect_ok(solder_digits_mlp_reseed(m.get(), ref::model_seed), "reseed");
  expect(same_bits(m.params(), initial), "reseed(seed): the parameters create(seed) drew");
  expect(std::string(solder_digits_mlp_last_error()).empty(), "last_error: empty after a call that succeeded");
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
    expect_ok(solder_digits_mlp_eval(m.get()), "eval");
    const std::vector<float> got = m.forward(txd.get(), n);
    expect(off(ref::eval_forward(m.params(), tx.data(), n), got, value_tolerance) == 0,
           "eval forward: the logits within 1e-5 of the largest of the CPU chain's");
    expect(same_bits(got, m.forward(txd.get(), n)), "eval forward: the same bits on a second call");
    const std::vector<float> other = ref::cpu_chain(5, {}).params();
    expect_ok(solder_digits_mlp_write_params(m.get(), other.data(), nullptr), "write_params");
    expect(off(ref::eval_forward(other, tx.data(), n), m.forward(txd.get(), n), value_tolerance) == 0,
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
  expect_ok(solder_digits_mlp_backward(m.get(), dyd.get(), rows, nullptr), "backward");
  const std::vector<float> grads = m.grads();
  expect(off_gradients(cpu.grads(), grads) == 0, "backward: every gradient within 1e-5 of its tensor's largest");
  solder_param_tensor t[tensors] = {};
  expect_ok(solder_digits_mlp_params(m.get(), t), "params");
  bool same = true;
  for (std::size_t k = 0; k < tensors; ++k)
    same = same && t[k].grad != nullptr &&
           std::memcmp(read_device(t[k].grad, t[k].floats).data(), grads.data() + layout_starts[k],
                       t[k].floats * sizeof(float)) == 0;
  expect(same, "params: the device memory of each gradient holds read_grads' floats there");
}

/// `steps` training steps on the GPU and the CPU from the same weights and batches: the loss and
/// the optimizer's step count at every step, the gradients of the first, the weights at the end.
/// `split`: each step as loss_and_backward, then optimizer_step.
void compare_training(const ref::digits& data, const ref::optimizer_settings& s, float label_smoothing, bool split,
                      int steps, const char* what) {
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
    float gpu_loss = -1;
    if (split) {
      expect_ok(solder_digits_mlp_loss_and_backward(m.get(), xd.get() + row * features, yd.get() + row, batch,
                                                    label_smoothing, &gpu_loss, nullptr),
                "loss_and_backward");
      expect_ok(solder_digits_mlp_optimizer_step(m.get(), &o, nullptr), "optimizer_step");
    } else {
      expect_ok(solder_digits_mlp_train_step(m.get(), xd.get() + row * features, yd.get() + row, batch, &o,
                                             label_smoothing, &gpu_loss, nullptr),
                "train_step");
    }
    const float cpu_loss = cpu.train_step(x.data() + row * features, y.data() + row, batch, s.lr, label_smoothing);
    std::printf("  step %d: loss %.7f (GPU) %.7f (CPU)\n", t + 1, double(gpu_loss), double(cpu_loss));
    expect(std::fabs(double(gpu_loss) - double(cpu_loss)) <= loss_tolerance * std::fabs(double(cpu_loss)),
           "training step: the loss within 1e-5 of the CPU's");
    expect(o.steps == t + 1, "training step: the optimizer's steps advanced by 1");
    // The first step starts from the same weights: its gradients are the CPU's within rounding.
    if (t == 0)
      expect(off_gradients(cpu.grads(), m.grads()) == 0,
             "training step: every gradient of the first step within 1e-5 of its tensor's largest");
  }
  const std::vector<float> trained = cpu.params();
  expect(weights_close(trained, m.params(), 2 * moved(initial, trained), what),
         "training step: the weights after the steps close to the CPU's");
}

/// dst[i] = src[i] = (dst[i] + src[i]) / 2: the mean of two ranks' gradients on both.
__global__ void average_into_both(float* dst, float* src, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] = 0.5f * (dst[i] + src[i]);
}

/// Two ranks, each a model holding half of every batch (the second from sample 16 on:
/// set_first_sample), their gradients averaged in place through params() as an all-reduce would,
/// then each steps: the mean of their losses and the averaged gradients as the CPU chain's on
/// the whole batch, both ranks the same weights, close to the CPU's after the steps.
void data_parallel(const ref::digits& data) {
  constexpr int steps = 4;
  constexpr std::size_t half = batch / 2;
  const ref::optimizer_settings s{};
  std::printf("two data-parallel ranks of %zu samples, AdamW, %d steps:\n", half, steps);
  ref::cpu_chain cpu(ref::model_seed, s);
  const std::vector<float> initial = cpu.params();
  const model r0(ref::model_seed), r1(ref::model_seed);
  expect_ok(solder_digits_mlp_set_first_sample(r1.get(), half), "set_first_sample");
  solder_param_tensor t0[tensors] = {}, t1[tensors] = {};
  expect_ok(solder_digits_mlp_params(r0.get(), t0), "params");
  expect_ok(solder_digits_mlp_params(r1.get(), t1), "params");
  solder_optimizer o0 = optimizer_of(s), o1 = o0;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  const device_vector<float> xd(x);
  const device_vector<std::int32_t> yd(y);
  for (int t = 0; t < steps; ++t) {
    const std::size_t row = std::size_t(t) * batch;
    float l0 = -1, l1 = -1;
    expect_ok(solder_digits_mlp_loss_and_backward(r0.get(), xd.get() + row * features, yd.get() + row, half, 0.0f, &l0,
                                                  nullptr),
              "rank 0 loss_and_backward");
    expect_ok(solder_digits_mlp_loss_and_backward(r1.get(), xd.get() + (row + half) * features, yd.get() + row + half,
                                                  half, 0.0f, &l1, nullptr),
              "rank 1 loss_and_backward");
    for (std::size_t k = 0; k < tensors; ++k)
      average_into_both<<<unsigned((t0[k].floats + 255) / 256), 256>>>(t0[k].grad, t1[k].grad, t0[k].floats);
    solder::eval::cuda::check(cudaGetLastError(), "the gradients' average");
    const float cpu_loss = cpu.train_step(x.data() + row * features, y.data() + row, batch, s.lr);
    const double mean = 0.5 * (double(l0) + double(l1));
    std::printf("  step %d: loss %.7f (ranks' mean) %.7f (CPU)\n", t + 1, mean, double(cpu_loss));
    expect(std::fabs(mean - double(cpu_loss)) <= loss_tolerance * std::fabs(double(cpu_loss)),
           "data parallel: the ranks' mean loss within 1e-5 of the CPU's on the whole batch");
    if (t == 0)
      expect(off_gradients(cpu.grads(), r0.grads()) == 0,
             "data parallel: the averaged gradients of the first step within 1e-5 of the CPU's on the whole batch");
    expect_ok(solder_digits_mlp_optimizer_step(r0.get(), &o0, nullptr), "rank 0 optimizer_step");
    expect_ok(solder_digits_mlp_optimizer_step(r1.get(), &o1, nullptr), "rank 1 optimizer_step");
  }
  const std::vector<float> w0 = r0.params(), trained = cpu.params();
  expect(same_bits(w0, r1.params()), "data parallel: both ranks hold the same weights, bit for bit");
  expect(weights_close(trained, w0, 2 * moved(initial, trained), "data parallel"),
         "data parallel: the weights after the steps close to the CPU's on the whole batches");
}

/// Refused calls give cudaErrorInvalidValue and a message naming what was refused, and leave the
/// model as it was: its parameters and gradients, its optimizer state and its dropout streams (the
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
  float loss = -1;
  expect_ok(solder_digits_mlp_train_step(m.get(), xd.get(), yd.get(), batch, &o, 0.0f, &loss, nullptr), "train_step");
  cpu.train_step(x.data(), y.data(), batch, s.lr);
  const std::vector<float> params = m.params(), grads = m.grads();

  auto refused = [](int status, const char* part) {
    return status == int(cudaErrorInvalidValue) &&
           std::string(solder_digits_mlp_last_error()).find(part) != std::string::npos;
  };
  const float* x1 = xd.get() + batch * features;
  std::vector<std::int32_t> labels(y.begin() + batch, y.begin() + 2 * batch);
  labels[5] = 10;
  const device_vector<std::int32_t> bad(labels);
  labels[5] = y[batch + 5];
  labels[0] = -1;
  const device_vector<std::int32_t> negative(labels);
  expect(refused(solder_digits_mlp_train_step(m.get(), x1, bad.get(), batch, &o, 0.0f, &loss, nullptr),
                 "label 10 of row 5"),
         "train_step: a label outside [0, 10) is refused, its row named");
  expect(refused(solder_digits_mlp_loss_and_backward(m.get(), x1, negative.get(), batch, 0.0f, &loss, nullptr),
                 "label -1 of row 0"),
         "loss_and_backward: a negative label is refused, its row named");

  solder_optimizer b = o;
  b.kind = 7;
  expect(refused(solder_digits_mlp_train_step(m.get(), x1, yd.get() + batch, batch, &b, 0.0f, &loss, nullptr),
                 "optimizer kind 7"),
         "train_step: an unknown optimizer kind is refused");
  expect(refused(solder_digits_mlp_optimizer_step(m.get(), &b, nullptr), "optimizer kind 7"),
         "optimizer_step: an unknown optimizer kind is refused");
  b = o;
  b.lr = -1.0f;
  expect(refused(solder_digits_mlp_train_step(m.get(), x1, yd.get() + batch, batch, &b, 0.0f, &loss, nullptr),
                 "lr must be >= 0"),
         "train_step: a negative lr is refused");
  b = o;
  b.momentum = 0.0f;
  b.nesterov = 1;
  expect(refused(solder_digits_mlp_optimizer_step(m.get(), &b, nullptr), "Nesterov momentum requires"),
         "optimizer_step: Nesterov without momentum is refused");
  b = o;
  b.kind = solder_adamw;
  b.beta1 = 1.0f;
  expect(refused(solder_digits_mlp_train_step(m.get(), x1, yd.get() + batch, batch, &b, 0.0f, &loss, nullptr),
                 "beta1 must be in [0, 1)"),
         "train_step: AdamW's beta1 of 1 is refused");
  expect(o.steps == 1, "refused steps: the optimizer's step count not written");

  expect(refused(solder_digits_mlp_forward(m.get(), nullptr, out.get(), batch, nullptr), "x is a null pointer"),
         "forward: a null x is refused, named");
  expect(refused(solder_digits_mlp_forward(m.get(), x1, out.get(), 0, nullptr), "batch must be at least 1"),
         "forward: an empty batch is refused");
  expect(refused(solder_digits_mlp_backward(m.get(), nullptr, batch, nullptr), "dy is a null pointer"),
         "backward: a null dy is refused, named");
  expect(refused(solder_digits_mlp_train_step(m.get(), x1, yd.get() + batch, batch, nullptr, 0.0f, &loss, nullptr),
                 "optimizer is a null pointer"),
         "train_step: a null optimizer is refused, named");
  expect(refused(solder_digits_mlp_train_step(nullptr, x1, yd.get() + batch, batch, &o, 0.0f, &loss, nullptr),
                 "model is a null pointer"),
         "train_step: a null model is refused, named");
  expect(refused(solder_digits_mlp_read_params(m.get(), nullptr, nullptr), "params is a null pointer"),
         "read_params: a null array is refused, named");
  expect(refused(solder_digits_mlp_params(m.get(), nullptr), "tensors is a null pointer"),
         "params: a null array is refused, named");
  expect(solder_digits_mlp_create(1, nullptr) == int(cudaErrorInvalidValue), "create: a null handle pointer is refused");

  expect(same_bits(m.params(), params), "refused calls: the parameters as they were, bit for bit");
  expect(same_bits(m.grads(), grads), "refused calls: the gradients as they were, bit for bit");
  expect_ok(solder_digits_mlp_train_step(m.get(), x1, yd.get() + batch, batch, &o, 0.0f, &loss, nullptr), "train_step");
  const float cpu_loss = cpu.train_step(x.data() + batch * features, y.data() + batch, batch, s.lr);
  expect(std::fabs(double(loss) - double(cpu_loss)) <= loss_tolerance * std::fabs(double(cpu_loss)),
         "train_step after refused calls: the loss of the CPU chain that never saw them (the dropout streams as they "
         "were)");
  expect(o.steps == 2, "train_step after refused calls: the optimizer state's second step");
}

/// The demo's run: 40 epochs of AdamW with warmup + cosine on the GPU, then the held-out
/// accuracy of the model's own evaluation forward, its logits the CPU chain's for the trained
/// weights.
void demo_accuracy_reached(const ref::digits& data) {
  constexpr int epochs = 40;
  const std::size_t per_epoch = data.batches();
  const std::vector<float> lr = ref::demo_schedule(std::int64_t(epochs * per_epoch));
  const model m(ref::model_seed);
  solder_optimizer o = optimizer_of({.kind = ref::optimizer_settings::adamw, .lr = 2e-3f, .weight_decay = 1e-2f});
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
      float loss = -1;
      expect_ok(solder_digits_mlp_train_step(m.get(), xd.get() + b * batch * features, yd.get() + b * batch, batch, &o,
                                             0.0f, &loss, nullptr),
                "train_step");
      sum += loss;
    }
    (epoch == 0 ? first : last) = sum / double(per_epoch);
  }
  expect_ok(solder_digits_mlp_eval(m.get()), "eval");
  const std::vector<float>& tx = data.test_x();
  const std::size_t n = data.test_y().size();
  const device_vector<float> txd(tx);
  const std::vector<float> logits = m.forward(txd.get(), n);
  const double acc = accuracy_of(logits, data.test_y());
  std::printf("demo on the GPU: loss %.4f (epoch 1) -> %.4f (epoch %d), held-out accuracy %.4f\n", first, last, epochs,
              acc);
  expect(last < 0.1 * first, "demo: the loss falls tenfold");
  expect(acc >= demo_accuracy, "demo: the GPU-trained model reaches the demo's 97% held-out accuracy");
  expect(off(ref::eval_forward(m.params(), tx.data(), n), logits, value_tolerance) == 0,
         "demo: the trained model's held-out logits within 1e-5 of the largest of the CPU chain's");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_digits_train",
      "cuda:digits_train: the device digits_mlp behind its C interface matches the CPU chain and trains to the demo's "
      "accuracy",
      [] {
        const ref::digits data;
        parameters();
        forward_and_backward(data);
        compare_training(data, {.kind = ref::optimizer_settings::adamw, .lr = 2e-3f, .weight_decay = 1e-2f}, 0.0f,
                         false, 6, "AdamW (lr 2e-3, weight decay 1e-2), as the demo");
        compare_training(data,
                         {.kind = ref::optimizer_settings::sgd, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f},
                         0.0f, false, 6, "SGD (lr 0.05, momentum 0.9, weight decay 1e-4)");
        compare_training(data,
                         {.kind = ref::optimizer_settings::sgd, .lr = 0.05f, .weight_decay = 0.0f, .momentum = 0.9f,
                          .nesterov = true},
                         0.0f, false, 6, "Nesterov SGD (lr 0.05, momentum 0.9)");
        compare_training(data, {.kind = ref::optimizer_settings::adam, .lr = 1e-3f, .weight_decay = 1e-4f}, 0.1f, true,
                         6, "Adam (lr 1e-3, weight decay 1e-4), label smoothing 0.1, loss_and_backward + optimizer_step");
        data_parallel(data);
        refused_calls(data);
        demo_accuracy_reached(data);
        cudaDeviceSynchronize();
      });
}
