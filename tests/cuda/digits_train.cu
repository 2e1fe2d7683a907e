// tests/cuda/digits_train.cu: the generated chain-level launchers of kernels/chains.hpp's
// digits_mlp (kernels/digits_mlp.cu) against the CPU chain (digits_train.host.cpp), from the same
// initial weights on the same batches of the digits data: losses, gradients and weights step by
// step within stated tolerances, the dropout masks bit for bit at every step, AdamW and SGD with
// momentum; the argument and settings checks; and the demo's 40 epochs trained on the GPU reaching
// its held-out accuracy. Exits 77 (ctest's skip code) where no CUDA device is present.
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
#include "digits_mlp.h"
#include "digits_train.hpp"

namespace {

namespace ref = solder::test::digits_train;
using ref::batch;
using ref::features;
using ref::hidden0;
using ref::hidden1;
using ref::param_floats;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

static_assert(SOLDER_DIGITS_MLP_PARAM_FLOATS == param_floats && SOLDER_DIGITS_MLP_HIDDEN_FLOATS == hidden0 + hidden1 &&
              SOLDER_DIGITS_MLP_DROPOUTS == 2);

/// Both sides round the products' sums in another order (the CPU's GEMM blocks K, the GPU runs
/// one fma chain per element), so values differ by float roundings of sums of 32 to 256 terms:
/// 1e-5 relative for the loss (a mean of 32 rows' log-sum-exps) and for each gradient element
/// against the largest magnitude of its tensor (an element's sum may cancel to far below its
/// terms, never below the tensor's largest element by more than the batch's 32).
constexpr double loss_tolerance = 1e-5;
constexpr double gradient_tolerance = 1e-5;
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

/// The GPU's training state: parameters, gradients, the optimizer's state, activations.
struct gpu_chain {
  device_vector<float> params, grads, state, hidden, y;
  solder_optimizer opt{};
  std::uint64_t seeds[2] = {}, offsets[2] = {};

  gpu_chain(const std::vector<float>& p, const ref::optimizer_settings& s)
      : params(p), grads(param_floats), state(std::vector<float>(2 * param_floats, 0.0f)),
        hidden(batch * (hidden0 + hidden1)), y(batch * ref::classes) {
    opt.kind = s.adamw ? solder_adamw : solder_sgd;
    opt.lr = s.lr;
    opt.weight_decay = s.weight_decay;
    opt.momentum = s.momentum;
    opt.dampening = 0.0f;
    opt.beta1 = 0.9f;
    opt.beta2 = 0.999f;
    opt.eps = 1e-8f;
    expect_ok(solder_digits_mlp_dropout_streams(ref::model_seed, seeds, offsets), "dropout_streams");
  }
  float step(const float* x, const std::int32_t* labels, float lr) {
    opt.lr = lr;
    float loss = -1;
    expect_ok(solder_digits_mlp_train_step(x, labels, params.get(), grads.get(), state.get(), &opt, hidden.get(),
                                           y.get(), batch, seeds, offsets, 0, 0.0f, &loss, nullptr),
              "digits_mlp train_step");
    return loss;
  }
};

/// Elements of got off want by more than tolerance * (the largest |want|).
std::size_t off_gradient(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin,
                         std::size_t end) {
  double scale = 0;
  for (std::size_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(double(want[i])));
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i)
    n += !(std::fabs(double(want[i]) - double(got[i])) <= gradient_tolerance * scale);
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

/// The GPU's hidden outputs against the CPU blocks' from the same parameters and streams: every
/// element the CPU's mask drops is +0 on the GPU (bit for bit, as the CPU's), every other element
/// is zero on both sides or on neither (but where relu's input is within rounding of 0), and the
/// values agree within 1e-5 of the layer's largest.
void check_hidden(const std::vector<float>& params_before, const float* x, gpu_chain& g, const char* what) {
  const std::vector<std::uint64_t> seeds(g.seeds, g.seeds + 2), offsets(g.offsets, g.offsets + 2);
  const std::vector<float> want = ref::hidden(params_before, x, batch, seeds, offsets);
  const std::vector<float> got = g.hidden.read();
  const std::size_t widths[2] = {hidden0, hidden1};
  std::size_t at = 0;
  for (int layer = 0; layer < 2; ++layer) {
    const std::size_t n = batch * widths[layer];
    const auto keep = ref::dropout_mask(seeds[layer], offsets[layer], batch, widths[layer]);
    double scale = 0;
    for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double(want[at + i])));
    std::size_t dropped_not_zero = 0, zero_differs = 0, value_off = 0, dropped = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float w = want[at + i], v = got[at + i], zero = 0.0f;
      if (!keep[i]) {
        ++dropped;
        dropped_not_zero += std::memcmp(&v, &zero, sizeof v) != 0 || std::memcmp(&w, &zero, sizeof w) != 0;
      } else if ((w == 0.0f) != (v == 0.0f)) {
        zero_differs += std::max(std::fabs(w), std::fabs(v)) > 1e-5f * float(scale);
      }
      value_off += !(std::fabs(double(w) - double(v)) <= 1e-5 * scale);
    }
    const std::string name = std::string(what) + (layer == 0 ? ", layer 2" : ", layer 5");
    expect(dropped > 0 && dropped_not_zero == 0, (name + ": the dropped elements are +0 on both sides").c_str());
    expect(zero_differs == 0, (name + ": the kept elements are zero on both sides or on neither").c_str());
    expect(value_off == 0, (name + ": the hidden values within 1e-5 of the layer's largest").c_str());
    at += n;
  }
}

/// `steps` training steps on the GPU and the CPU from the same weights and batches: the streams,
/// the masks and the loss at every step; the gradients of the first step; the weights at the end.
void compare_training(const ref::digits& data, const ref::optimizer_settings& s, int steps, const char* what) {
  std::printf("%s, %d steps:\n", what, steps);
  ref::cpu_chain cpu(ref::model_seed, s);
  const std::vector<float> initial = cpu.params();
  gpu_chain gpu(initial, s);
  expect(std::vector<std::uint64_t>(gpu.seeds, gpu.seeds + 2) == cpu.seeds() &&
             std::vector<std::uint64_t>(gpu.offsets, gpu.offsets + 2) == cpu.offsets(),
         "dropout_streams: the CPU chain's streams for the same seed");
  std::vector<float> x;
  std::vector<std::int32_t> y;
  data.epoch(0, x, y);
  const device_vector<float> xd(x);
  const device_vector<std::int32_t> yd(y);
  for (int t = 0; t < steps; ++t) {
    const std::size_t row = std::size_t(t) * batch;
    const std::vector<float> before = gpu.params.read();
    const float gpu_loss = gpu.step(xd.get() + row * features, yd.get() + row, s.lr);
    const float cpu_loss = cpu.train_step(x.data() + row * features, y.data() + row, batch, s.lr);
    std::printf("  step %d: loss %.7f (GPU) %.7f (CPU)\n", t + 1, double(gpu_loss), double(cpu_loss));
    expect(std::fabs(double(gpu_loss) - double(cpu_loss)) <= loss_tolerance * std::fabs(double(cpu_loss)),
           "train_step: the loss within 1e-5 of the CPU's");
    expect(std::vector<std::uint64_t>(gpu.offsets, gpu.offsets + 2) == cpu.offsets(),
           "train_step: the dropout streams advanced as the CPU chain's");
    expect(gpu.opt.steps == t + 1, "train_step: the optimizer's steps advanced by 1");
    check_hidden(before, x.data() + row * features, gpu, what);
    if (t == 0) {
      // The first step starts from the same weights: its gradients are the CPU's within rounding.
      const std::vector<float> want = cpu.grads(), got = gpu.grads.read();
      const std::size_t bounds[] = {0,
                                    SOLDER_DIGITS_MLP_0_BIAS,
                                    SOLDER_DIGITS_MLP_3_WEIGHT,
                                    SOLDER_DIGITS_MLP_3_BIAS,
                                    SOLDER_DIGITS_MLP_6_WEIGHT,
                                    SOLDER_DIGITS_MLP_6_BIAS,
                                    param_floats};
      std::size_t off = 0;
      for (std::size_t k = 0; k + 1 < std::size(bounds); ++k) off += off_gradient(want, got, bounds[k], bounds[k + 1]);
      expect(off == 0, "train_step: every gradient of the first step within 1e-5 of its tensor's largest");
    }
  }
  const std::vector<float> trained = cpu.params();
  double moved = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) moved = std::max(moved, std::fabs(double(trained[i]) - initial[i]));
  expect(weights_close(trained, gpu.params.read(), 2 * moved, what),
         "train_step: the weights after the steps close to the CPU's");
}

/// The demo's run: 40 epochs of AdamW with warmup + cosine on the GPU, then the held-out accuracy
/// of the trained weights (evaluated by the CPU chain).
void demo_accuracy_reached(const ref::digits& data) {
  constexpr int epochs = 40;
  const std::size_t per_epoch = data.batches();
  const std::vector<float> lr = ref::demo_schedule(std::int64_t(epochs * per_epoch));
  const ref::optimizer_settings s{.adamw = true, .lr = 2e-3f, .weight_decay = 1e-2f};
  ref::cpu_chain init(ref::model_seed, s);
  gpu_chain gpu(init.params(), s);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::size_t t = 0;
  double first = 0, last = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    data.epoch(epoch, x, y);
    const device_vector<float> xd(x);
    const device_vector<std::int32_t> yd(y);
    double sum = 0;
    for (std::size_t b = 0; b < per_epoch; ++b, ++t)
      sum += gpu.step(xd.get() + b * batch * features, yd.get() + b * batch, lr[t]);
    (epoch == 0 ? first : last) = sum / double(per_epoch);
  }
  const double acc = ref::accuracy(gpu.params.read(), data.test_x(), data.test_y());
  std::printf("demo on the GPU: loss %.4f (epoch 1) -> %.4f (epoch %d), held-out accuracy %.4f\n", first, last, epochs,
              acc);
  expect(last < 0.1 * first, "demo: the loss falls tenfold");
  expect(acc >= demo_accuracy, "demo: the GPU-trained chain reaches the demo's 97% held-out accuracy");
}

/// Refused arguments and settings give cudaErrorInvalidValue and a message, and change nothing.
void argument_checks() {
  const ref::optimizer_settings s{};
  ref::cpu_chain cpu(ref::model_seed, s);
  gpu_chain gpu(cpu.params(), s);
  device_vector<float> x(batch * features);
  std::vector<std::int32_t> labels(batch, 3);
  labels[5] = 10;
  const device_vector<std::int32_t> bad(labels);
  float loss = 0;
  auto step = [&](solder_optimizer& o, float* state, const std::int32_t* l) {
    return solder_digits_mlp_train_step(x.get(), l, gpu.params.get(), gpu.grads.get(), state, &o, gpu.hidden.get(),
                                        gpu.y.get(), batch, gpu.seeds, gpu.offsets, 0, 0.0f, &loss, nullptr);
  };
  auto refused = [](int status, const char* part) {
    return status == int(cudaErrorInvalidValue) &&
           std::string(solder_digits_mlp_last_error()).find(part) != std::string::npos;
  };
  solder_optimizer o = gpu.opt;
  expect(refused(step(o, nullptr, bad.get()), "m and v live there"), "train_step: AdamW without its state is refused");
  o.kind = 7;
  expect(refused(step(o, gpu.state.get(), bad.get()), "optimizer->kind"), "train_step: an unknown optimizer is refused");
  o = gpu.opt;
  o.lr = -1.0f;
  expect(refused(step(o, gpu.state.get(), bad.get()), "lr must be >= 0"), "train_step: a negative lr is refused");
  expect(gpu.offsets[0] == 0 && gpu.offsets[1] == 0, "train_step: a refused call leaves the streams");
  expect(refused(solder_digits_mlp_forward(x.get(), gpu.params.get(), nullptr, gpu.y.get(), batch, gpu.seeds,
                                           gpu.offsets, 0, nullptr),
                 "hidden is a null pointer"),
         "forward: a null hidden is refused, named");
  expect(refused(solder_digits_mlp_backward(x.get(), gpu.params.get(), gpu.hidden.get(), gpu.y.get(), gpu.y.get(),
                                            gpu.grads.get(), 0, nullptr),
                 "batch must be at least 1"),
         "backward: an empty batch is refused");
  // SGD without momentum keeps no state.
  o = gpu.opt;
  o.kind = solder_sgd;
  o.momentum = 0.0f;
  expect(refused(step(o, nullptr, bad.get()), "label 10 of row 5"), "train_step: a label outside [0, 10) is named");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_digits_train",
      "cuda:digits_train: the generated digits_mlp train_step matches the CPU chain and trains to the demo's accuracy",
      [] {
        const ref::digits data;
        compare_training(data, {.adamw = true, .lr = 2e-3f, .weight_decay = 1e-2f}, 6,
                         "AdamW (lr 2e-3, weight decay 1e-2), as the demo");
        compare_training(data, {.adamw = false, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f}, 6,
                         "SGD (lr 0.05, momentum 0.9, weight decay 1e-4)");
        argument_checks();
        demo_accuracy_reached(data);
        cudaDeviceSynchronize();
      });
}
