// tests/cuda/digits_cnn_train.cu: the generated launchers of kernels/chains.hpp's digits_cnn
// (kernels/digits_cnn.cu) against the CPU chain (digits_cnn_train.host.cpp): the second
// convolution group's own launchers (training forward, backward, the folded evaluation) against
// nn::conv_block; the chain-level launchers from the same initial weights on the same batches of
// the digits data, every step's z, block outputs, pooled and dropped features (the mask bit for
// bit) and logits, the losses, the first step's gradients, the running statistics and the weights
// after 6 steps of AdamW and of SGD with momentum, within stated tolerances; then the example's 20
// epochs on the GPU and on the CPU from the same start, the held-out accuracies compared. Exits
// 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "digits_cnn.h"
#include "digits_cnn_train.hpp"

namespace {

namespace ref = solder::test::digits_cnn_train;
using ref::batch;
using ref::features;
using ref::param_floats;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

static_assert(SOLDER_DIGITS_CNN_PARAM_FLOATS == param_floats && SOLDER_DIGITS_CNN_HIDDEN_FLOATS == ref::hidden_floats &&
              SOLDER_DIGITS_CNN_BUFFER_FLOATS == ref::buffer_floats && SOLDER_DIGITS_CNN_DROPOUTS == 1 &&
              SOLDER_DIGITS_CNN_4_SAVED_MEAN == 128 && SOLDER_DIGITS_CNN_1_SAVED_MEAN == ref::running_floats);

/// Both sides sum the products in another order (the CPU's convolution and GEMM block them, the
/// GPU runs one fma chain per element), so a convolution's output differs by float roundings of
/// sums of 9 to 144 terms: 1e-5 of the tensor's largest element. A batch norm divides by the
/// batch's deviation and the layers after it compound the differences: 5e-5 of the largest for
/// everything after the first batch_norm (outputs, pooled features, logits, gradients), and for
/// the running statistics relative to each value. The loss, a mean of 32 log-sum-exps: 1e-5
/// relative.
constexpr double conv_tolerance = 1e-5, deep_tolerance = 5e-5, loss_tolerance = 1e-5;
/// A convolution's bias gradient before a batch_norm is 0 up to rounding (the normalization
/// removes any per-channel shift): both sides hold rounding noise, required below 1e-4 of the
/// batch_norm bias gradient's largest element instead of compared.
constexpr double noise_bound = 1e-4;
/// Weights after the updates, as cuda:digits_train: within 1e-6 + 1e-5 |w|, at most 0.5% further
/// (relu inputs within rounding of 0), none by more than twice the most a weight moved on the CPU.
/// The convolutions' biases are left out: their gradients are that noise, which Adam's m / sqrt(v)
/// turns into full steps of either sign on each side.
constexpr double weight_abs = 1e-6, weight_rel = 1e-5, weight_outliers = 0.005;
/// Held-out accuracy after the example's 20 epochs: the example's 98% bar on the GPU, and within 2
/// points (7 of 359 samples) of the CPU run from the same start; the runs' weights drift apart over
/// ~900 steps (rounding amplified where relu inputs cross 0), so the accuracies are two draws of the
/// same training. The CPU reaches 99.44%.
constexpr double example_accuracy = 0.98, accuracy_gap = 0.02;

void expect_ok(int status, const char* what) {
  if (status != 0) {
    ++solder::test::gpu::failures;
    std::fprintf(stderr, "FAILED: %s returned %d: %s\n", what, status, solder_digits_cnn_last_error());
  }
}

double largest(const std::vector<float>& v, std::size_t begin, std::size_t end) {
  double m = 0;
  for (std::size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(double(v[i])));
  return m;
}
/// Elements of got[begin, end) off want by more than tol * (the largest |want| there).
std::size_t off(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin, std::size_t end,
                double tol) {
  if (want.size() < end || got.size() < end) return end - begin;
  const double bound = tol * largest(want, begin, end);
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n += !(std::fabs(double(want[i]) - double(got[i])) <= bound);
  return n;
}
std::size_t off(const std::vector<float>& want, const std::vector<float>& got, double tol) {
  return off(want, got, 0, want.size(), tol);
}
/// Elements off by more than tol relative to each one.
std::size_t off_relative(const std::vector<float>& want, const std::vector<float>& got, double tol) {
  std::size_t n = want.size() == got.size() ? 0 : want.size();
  for (std::size_t i = 0; i < std::min(want.size(), got.size()); ++i)
    n += !(std::fabs(double(want[i]) - double(got[i])) <= tol * std::fabs(double(want[i])) + 1e-12);
  return n;
}

/// The second convolution group's launchers against nn::conv_block (5 samples).
void group_launchers() {
  constexpr std::size_t rows = 5, in = 16 * 64, out = 32 * 64;
  std::vector<float> x(rows * in), dy(rows * out), bn_weight(32), bn_bias(32);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(std::cos(0.11 * double(i)));
  for (std::size_t c = 0; c < 32; ++c) bn_weight[c] = 0.5f + 0.03f * float(c), bn_bias[c] = 0.1f * float(c % 5) - 0.2f;
  const ref::block_result want = ref::second_block(x, dy, rows, bn_weight, bn_bias);
  const device_vector<float> xd(x), dyd(dy), w(want.w), b(want.b), gamma(bn_weight), beta(bn_bias), y_cpu(want.y);
  device_vector<float> running_mean(std::vector<float>(32, 0.0f)), running_var(std::vector<float>(32, 1.0f));
  device_vector<float> z(rows * out), saved_mean(32), saved_rstd(32), y(rows * out), dx(rows * in), dw(want.dw.size()),
      db(32), dgamma(32), dbeta(32), y_eval(rows * out);
  expect_ok(solder_conv2d_batch_norm_relu_f32_16x8x8_32k3x3s1p1_fwd(
                xd.get(), w.get(), b.get(), gamma.get(), beta.get(), running_mean.get(), running_var.get(), z.get(),
                saved_mean.get(), saved_rstd.get(), y.get(), rows, 1e-5, 0.1, nullptr),
            "group 1 forward");
  // The backward from the CPU's y: the relu's gate is then the CPU's bit for bit.
  expect_ok(solder_conv2d_batch_norm_relu_f32_16x8x8_32k3x3s1p1_bwd(
                xd.get(), w.get(), gamma.get(), z.get(), saved_mean.get(), saved_rstd.get(), y_cpu.get(), dyd.get(),
                dx.get(), dw.get(), db.get(), dgamma.get(), dbeta.get(), rows, nullptr),
            "group 1 backward");
  expect_ok(solder_conv2d_batch_norm_relu_f32_16x8x8_32k3x3s1p1_eval(xd.get(), w.get(), b.get(), gamma.get(),
                                                                     beta.get(), running_mean.get(),
                                                                     running_var.get(), y_eval.get(), rows, 1e-5,
                                                                     nullptr),
            "group 1 evaluation");
  expect(off(want.y, y.read(), deep_tolerance) == 0, "group 1 forward: y within 5e-5 of its largest");
  expect(off_relative(want.running_mean, running_mean.read(), deep_tolerance) == 0 &&
             off_relative(want.running_var, running_var.read(), deep_tolerance) == 0,
         "group 1 forward: the running statistics moved as the CPU's");
  expect(off(want.dx, dx.read(), deep_tolerance) == 0, "group 1 backward: dx");
  expect(off(want.dw, dw.read(), deep_tolerance) == 0, "group 1 backward: dw");
  expect(off(want.dbn_weight, dgamma.read(), deep_tolerance) == 0, "group 1 backward: the batch_norm's weight gradient");
  expect(off(want.dbn_bias, dbeta.read(), deep_tolerance) == 0, "group 1 backward: the batch_norm's bias gradient");
  const double scale = largest(want.dbn_bias, 0, 32);
  const std::vector<float> got_db = db.read();
  expect(largest(got_db, 0, 32) <= noise_bound * scale && largest(want.db, 0, 32) <= noise_bound * scale,
         "group 1 backward: the convolution's bias gradient is rounding noise on both sides");
  expect(off(want.y_eval, y_eval.read(), deep_tolerance) == 0, "group 1 evaluation (folded): y within 5e-5 of its largest");
}

/// The GPU's training state.
struct gpu_chain {
  device_vector<float> params, grads, state, buffers, hidden, y;
  solder_optimizer opt{};
  std::uint64_t seeds[1] = {}, offsets[1] = {};

  gpu_chain(const std::vector<float>& p, const std::vector<float>& running, const ref::optimizer_settings& s)
      : params(p), grads(param_floats), state(std::vector<float>(2 * param_floats, 0.0f)),
        buffers([&] {
          std::vector<float> b(ref::buffer_floats, 0.0f);
          std::copy(running.begin(), running.end(), b.begin());
          return b;
        }()),
        hidden(batch * ref::hidden_floats), y(batch * ref::classes) {
    opt.kind = s.adamw ? solder_adamw : solder_sgd;
    opt.lr = s.lr;
    opt.weight_decay = s.weight_decay;
    opt.momentum = s.momentum;
    opt.beta1 = 0.9f;
    opt.beta2 = 0.999f;
    opt.eps = 1e-8f;
    expect_ok(solder_digits_cnn_dropout_streams(ref::model_seed, seeds, offsets), "dropout_streams");
  }
  float step(const float* x, const std::int32_t* labels, float lr) {
    opt.lr = lr;
    float loss = -1;
    expect_ok(solder_digits_cnn_train_step(x, labels, params.get(), grads.get(), state.get(), &opt, buffers.get(),
                                           hidden.get(), y.get(), batch, seeds, offsets, 0, 0.0f, &loss, nullptr),
              "digits_cnn train_step");
    return loss;
  }
  std::vector<float> running() const {
    std::vector<float> b = buffers.read();
    b.resize(ref::running_floats);
    return b;
  }
};

/// The step's hidden values and logits against the CPU blocks' forward from the same parameters,
/// running statistics and stream.
void check_forward(const std::vector<float>& params, const std::vector<float>& running, const float* x, gpu_chain& g,
                   const std::string& what) {
  const ref::forward_result want = ref::forward(params, running, x, batch, g.seeds[0], g.offsets[0]);
  const std::vector<float> got = g.hidden.read(), logits = g.y.read();
  const auto rows = [](std::size_t at) { return batch * at; };
  expect(off(want.hidden, got, rows(ref::z0_at), rows(ref::y0_at), conv_tolerance) == 0, (what + ": z0 within 1e-5").c_str());
  expect(off(want.hidden, got, rows(ref::y0_at), rows(ref::z1_at), deep_tolerance) == 0, (what + ": y0 within 5e-5").c_str());
  expect(off(want.hidden, got, rows(ref::z1_at), rows(ref::y1_at), deep_tolerance) == 0, (what + ": z1 within 5e-5").c_str());
  expect(off(want.hidden, got, rows(ref::y1_at), rows(ref::pool_at), deep_tolerance) == 0, (what + ": y1 within 5e-5").c_str());
  expect(off(want.hidden, got, rows(ref::pool_at), rows(ref::argmax_at), deep_tolerance) == 0,
         (what + ": the pooled features within 5e-5").c_str());
  // The dropout: every element the CPU's mask drops is +0 on both sides, bit for bit.
  const auto keep = ref::dropout_mask(g.seeds[0], g.offsets[0], batch);
  std::size_t dropped = 0, wrong = 0;
  const float zero = 0.0f;
  for (std::size_t i = 0; i < keep.size(); ++i)
    if (!keep[i]) {
      ++dropped;
      const float v = got[rows(ref::dropout_at) + i], w = want.hidden[rows(ref::dropout_at) + i];
      wrong += std::memcmp(&v, &zero, sizeof v) != 0 || std::memcmp(&w, &zero, sizeof w) != 0;
    }
  expect(dropped > 0 && wrong == 0, (what + ": the dropped features are +0 on both sides").c_str());
  expect(off(want.hidden, got, rows(ref::dropout_at), rows(ref::hidden_floats), deep_tolerance) == 0,
         (what + ": the dropout's output within 5e-5").c_str());
  expect(off(want.logits, logits, deep_tolerance) == 0, (what + ": the logits within 5e-5").c_str());
  expect(off_relative(want.running, g.running(), deep_tolerance) == 0,
         (what + ": the running statistics moved as the CPU's").c_str());
}

bool weights_close(const std::vector<float>& want, const std::vector<float>& got, double bound, const char* what) {
  if (want.size() != got.size()) return false;
  const std::size_t skip[][2] = {{SOLDER_DIGITS_CNN_0_BIAS, SOLDER_DIGITS_CNN_1_WEIGHT},
                                 {SOLDER_DIGITS_CNN_3_BIAS, SOLDER_DIGITS_CNN_4_WEIGHT}};
  std::size_t far = 0, compared = 0;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if ((i >= skip[0][0] && i < skip[0][1]) || (i >= skip[1][0] && i < skip[1][1])) continue;
    ++compared;
    const double d = std::fabs(double(want[i]) - double(got[i]));
    far += !(d <= weight_abs + weight_rel * std::fabs(double(want[i])));
    worst = std::max(worst, d == d ? d : 1e30);
  }
  std::printf("  %s: %zu of %zu weights beyond 1e-6 + 1e-5 |w|, largest difference %.3g\n", what, far, compared, worst);
  return double(far) <= weight_outliers * double(compared) && worst <= bound;
}

void compare_training(const ref::digits& data, const ref::optimizer_settings& s, int steps, const char* what) {
  std::printf("%s, %d steps:\n", what, steps);
  ref::cpu_chain cpu(s);
  const std::vector<float> initial = cpu.params();
  gpu_chain gpu(initial, cpu.running(), s);
  expect(std::vector<std::uint64_t>(gpu.seeds, gpu.seeds + 1) == cpu.seeds() &&
             std::vector<std::uint64_t>(gpu.offsets, gpu.offsets + 1) == cpu.offsets(),
         "dropout_streams: the CPU chain's stream for the same seed");
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  const device_vector<float> xd(x);
  const device_vector<std::int32_t> yd(y);
  for (int t = 0; t < steps; ++t) {
    const std::size_t row = std::size_t(t) * batch;
    const std::vector<float> before = gpu.params.read(), running_before = gpu.running();
    const float gpu_loss = gpu.step(xd.get() + row * features, yd.get() + row, s.lr);
    const float cpu_loss = cpu.train_step(x.data() + row * features, y.data() + row, batch, s.lr);
    std::printf("  step %d: loss %.7f (GPU) %.7f (CPU)\n", t + 1, double(gpu_loss), double(cpu_loss));
    expect(std::fabs(double(gpu_loss) - double(cpu_loss)) <= loss_tolerance * std::fabs(double(cpu_loss)),
           "train_step: the loss within 1e-5 of the CPU's");
    expect(std::vector<std::uint64_t>(gpu.offsets, gpu.offsets + 1) == cpu.offsets(),
           "train_step: the dropout stream advanced as the CPU chain's");
    check_forward(before, running_before, x.data() + row * features, gpu, what);
    if (t == 0) {
      const std::vector<float> want = cpu.grads(), got = gpu.grads.read();
      const std::size_t tensors[][2] = {{SOLDER_DIGITS_CNN_0_WEIGHT, SOLDER_DIGITS_CNN_0_BIAS},
                                        {SOLDER_DIGITS_CNN_1_WEIGHT, SOLDER_DIGITS_CNN_1_BIAS},
                                        {SOLDER_DIGITS_CNN_1_BIAS, SOLDER_DIGITS_CNN_3_WEIGHT},
                                        {SOLDER_DIGITS_CNN_3_WEIGHT, SOLDER_DIGITS_CNN_3_BIAS},
                                        {SOLDER_DIGITS_CNN_4_WEIGHT, SOLDER_DIGITS_CNN_4_BIAS},
                                        {SOLDER_DIGITS_CNN_4_BIAS, SOLDER_DIGITS_CNN_9_WEIGHT},
                                        {SOLDER_DIGITS_CNN_9_WEIGHT, SOLDER_DIGITS_CNN_9_BIAS},
                                        {SOLDER_DIGITS_CNN_9_BIAS, param_floats}};
      std::size_t n = 0;
      for (const auto& r : tensors) n += off(want, got, r[0], r[1], deep_tolerance);
      expect(n == 0, "train_step: every gradient of the first step within 5e-5 of its tensor's largest");
      // The convolutions' bias gradients: noise on both sides, next to their batch_norms' bias gradients.
      const double s0 = largest(want, SOLDER_DIGITS_CNN_1_BIAS, SOLDER_DIGITS_CNN_3_WEIGHT),
                   s1 = largest(want, SOLDER_DIGITS_CNN_4_BIAS, SOLDER_DIGITS_CNN_9_WEIGHT);
      expect(largest(got, SOLDER_DIGITS_CNN_0_BIAS, SOLDER_DIGITS_CNN_1_WEIGHT) <= noise_bound * s0 &&
                 largest(got, SOLDER_DIGITS_CNN_3_BIAS, SOLDER_DIGITS_CNN_4_WEIGHT) <= noise_bound * s1,
             "train_step: the convolutions' bias gradients are rounding noise");
    }
  }
  const std::vector<float> trained = cpu.params();
  double moved = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) moved = std::max(moved, std::fabs(double(trained[i]) - initial[i]));
  expect(weights_close(trained, gpu.params.read(), 2 * moved, what), "train_step: the weights after the steps close to the CPU's");
  expect(off_relative(cpu.running(), gpu.running(), deep_tolerance) == 0,
         "train_step: the running statistics after the steps as the CPU's");
}

/// The example's run: 20 epochs of AdamW (lr 3e-3, weight decay 1e-2) with warmup + cosine, on
/// the GPU and on the CPU from the same start; the held-out accuracies (both evaluated by the CPU
/// chain, batch_norm folded).
void example_accuracy_reached(const ref::digits& data) {
  constexpr int epochs = 20;
  const std::size_t per_epoch = data.batches();
  const std::vector<float> lr = ref::schedule(std::int64_t(epochs * per_epoch));
  const ref::optimizer_settings s{.adamw = true, .lr = 3e-3f, .weight_decay = 1e-2f};
  ref::cpu_chain cpu(s);
  gpu_chain gpu(cpu.params(), cpu.running(), s);
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
      sum += gpu.step(xd.get() + b * batch * features, yd.get() + b * batch, lr[t]);
      cpu.train_step(x.data() + b * batch * features, y.data() + b * batch, batch, lr[t]);
    }
    (epoch == 0 ? first : last) = sum / double(per_epoch);
  }
  const double gpu_acc = ref::accuracy(gpu.params.read(), gpu.running(), data.test_x(), data.test_y());
  const double cpu_acc = ref::accuracy(cpu.params(), cpu.running(), data.test_x(), data.test_y());
  std::printf("example on the GPU: loss %.4f (epoch 1) -> %.4f (epoch %d); held-out accuracy %.4f (GPU), %.4f (CPU)\n",
              first, last, epochs, gpu_acc, cpu_acc);
  expect(last < 0.1 * first, "example: the loss falls tenfold");
  expect(gpu_acc >= example_accuracy, "example: the GPU-trained chain reaches the example's 98% held-out accuracy");
  expect(std::fabs(gpu_acc - cpu_acc) <= accuracy_gap, "example: the held-out accuracies within 2 points of each other");
}

/// A null buffers array is refused, named, before anything runs.
void argument_checks() {
  ref::cpu_chain cpu({});
  gpu_chain gpu(cpu.params(), cpu.running(), {});
  const device_vector<float> x(batch * features);
  const int status = solder_digits_cnn_forward(x.get(), gpu.params.get(), nullptr, gpu.hidden.get(), gpu.y.get(), batch,
                                               gpu.seeds, gpu.offsets, 0, nullptr);
  expect(status == int(cudaErrorInvalidValue) &&
             std::string(solder_digits_cnn_last_error()).find("buffers is a null pointer") != std::string::npos,
         "forward: a null buffers is refused, named");
  expect(gpu.offsets[0] == 0, "forward: a refused call leaves the stream");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_digits_cnn_train",
      "cuda:digits_cnn_train: the generated digits_cnn launchers match the CPU chain and train to the example's accuracy",
      [] {
        group_launchers();
        const ref::digits data;
        compare_training(data, {.adamw = true, .lr = 3e-3f, .weight_decay = 1e-2f}, 6,
                         "AdamW (lr 3e-3, weight decay 1e-2), as the example");
        compare_training(data, {.adamw = false, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f}, 6,
                         "SGD (lr 0.05, momentum 0.9, weight decay 1e-4)");
        argument_checks();
        example_accuracy_reached(data);
        cudaDeviceSynchronize();
      });
}
