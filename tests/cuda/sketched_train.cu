// tests/cuda/sketched_train.cu: the generated launchers of kernels/chains.hpp's sketched_mlp
// (kernels/sketched_mlp.cu) against the CPU chain (sketched_train.host.cpp): the first sketched
// group's own launchers against nn::sketched_block; the chain-level launchers from the same initial
// weights on the same batches of the digits data: h, the hidden outputs and the logits of every
// step, the dropout masks bit for bit (the sign sketches regenerated from the CPU layers' seeds),
// losses, first-step gradients and the weights after 6 steps of AdamW and of SGD with momentum,
// within stated tolerances; then the example's 40 epochs on the GPU and on the CPU from the same
// start, the held-out accuracies compared. Exits 77 (ctest's skip code) where no CUDA device is present.
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
#include "sketched_mlp.h"
#include "sketched_train.hpp"

namespace {

namespace ref = solder::test::sketched_train;
using ref::batch;
using ref::features;
using ref::param_floats;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

static_assert(SOLDER_SKETCHED_MLP_PARAM_FLOATS == param_floats && SOLDER_SKETCHED_MLP_HIDDEN_FLOATS == ref::hidden_floats &&
              SOLDER_SKETCHED_MLP_DROPOUTS == 2 && SOLDER_SKETCHED_MLP_SKETCHES == 2);

/// Both sides round the products' sums in another order (the CPU's GEMM blocks K, the GPU runs
/// one fma chain per element in ascending k), so values differ by float roundings of sums of 32
/// (the second products, inner 2 L k) to 256 terms (the first product of group 1, and dx): within
/// 1e-5 of each tensor's largest element, for values (h, hidden outputs, logits) and gradients (a
/// gradient element's sum may cancel far below its terms, never below the tensor's largest by more
/// than the batch's 32). The loss, a mean of 32 log-sum-exps: 1e-5 relative.
constexpr double value_tolerance = 1e-5;
constexpr double loss_tolerance = 1e-5;
/// Weights after the updates: within 1e-6 + 1e-5 |w| (the updates add lr-sized multiples of
/// gradients agreeing to 1e-5; Adam's m / sqrt(v) is a ratio of two such); a relu input within
/// rounding of 0 may fall on the other side on one side, moving one row of a gradient: at most
/// 0.5% of the weights may be further, none by more than twice the most any weight moved on the CPU.
constexpr double weight_abs = 1e-6, weight_rel = 1e-5, weight_outliers = 0.005;
/// Held-out accuracy after the example's 40 epochs: the GPU-trained chain at the example's bar, and
/// within 2 points of the CPU-trained one (7 of the 359 held-out samples). After ~1800 steps the
/// two runs' weights differ (rounding, amplified where relu inputs cross 0), so their accuracies
/// are two draws of the same training, not equal; the CPU reaches 96.94%.
constexpr double example_accuracy = 0.95, accuracy_gap = 0.02;

void expect_ok(int status, const char* what) {
  if (status != 0) {
    ++solder::test::gpu::failures;
    std::fprintf(stderr, "FAILED: %s returned %d: %s\n", what, status, solder_sketched_mlp_last_error());
  }
}

/// Elements of got[begin, end) off want by more than value_tolerance * (the largest |want| there).
std::size_t off(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin, std::size_t end) {
  if (want.size() < end || got.size() < end) return end - begin;
  double scale = 0;
  for (std::size_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(double(want[i])));
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n += !(std::fabs(double(want[i]) - double(got[i])) <= value_tolerance * scale);
  return n;
}
std::size_t off(const std::vector<float>& want, const std::vector<float>& got) { return off(want, got, 0, want.size()); }

/// The dropout's output rows [rows, width] against the CPU's: every element the CPU's mask drops
/// is +0 on both sides (bit for bit), the others are zero on both sides or on neither (but where
/// relu's input is within rounding of 0), and the values agree within value_tolerance.
void check_masked(const float* want, const float* got, const std::vector<unsigned char>& keep, std::size_t n,
                  const std::string& what) {
  double scale = 0;
  for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double(want[i])));
  std::size_t dropped = 0, dropped_not_zero = 0, zero_differs = 0, value_off = 0;
  const float zero = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float w = want[i], v = got[i];
    if (!keep[i]) {
      ++dropped;
      dropped_not_zero += std::memcmp(&v, &zero, sizeof v) != 0 || std::memcmp(&w, &zero, sizeof w) != 0;
    } else if ((w == 0.0f) != (v == 0.0f)) {
      zero_differs += std::max(std::fabs(w), std::fabs(v)) > value_tolerance * scale;
    }
    value_off += !(std::fabs(double(w) - double(v)) <= value_tolerance * scale);
  }
  expect(dropped > 0 && dropped_not_zero == 0, (what + ": the dropped elements are +0 on both sides").c_str());
  expect(zero_differs == 0, (what + ": the kept elements are zero on both sides or on neither").c_str());
  expect(value_off == 0, (what + ": the values within 1e-5 of the largest").c_str());
}

/// The first group's own launchers against nn::sketched_block: forward (h, y with its mask) and
/// backward (dx, ds1, ds2, db), for a batch with a tail (37 rows).
void group_launchers() {
  constexpr std::size_t rows = 37, out = ref::hidden0;
  constexpr std::uint64_t seed = 0xabcdef12ULL, offset = 5;
  std::vector<float> x(rows * features), dy(rows * out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(std::cos(0.11 * double(i)));
  const ref::block_result want = ref::first_block(x, dy, rows, seed, offset);
  const device_vector<float> xd(x), dyd(dy), s1(want.s1), s2(want.s2), b(want.b);
  device_vector<float> h(rows * ref::h0), y(rows * out), dx(rows * features), ds1(want.ds1.size()), ds2(want.ds2.size()),
      db(out);
  // The backward reads the CPU's y: its gate and mask are then the CPU's bit for bit (a relu input
  // within rounding of 0 could otherwise gate differently and move a whole row of the gradients),
  // and the GPU's own h.
  const device_vector<float> y_cpu(want.y);
  expect_ok(solder_sketched_linear_relu_dropout_f32_64x256_l2k8_fwd(xd.get(), s1.get(), s2.get(), b.get(), h.get(), y.get(),
                                                                    rows, want.sketch_seed, seed, offset, nullptr),
            "group 0 forward");
  expect_ok(solder_sketched_linear_relu_dropout_f32_64x256_l2k8_bwd(xd.get(), s1.get(), s2.get(), h.get(), y_cpu.get(),
                                                                    dyd.get(), dx.get(), ds1.get(), ds2.get(), db.get(),
                                                                    rows, want.sketch_seed, nullptr),
            "group 0 backward");
  const std::vector<float> got_y = y.read();
  check_masked(want.y.data(), got_y.data(), ref::dropout_mask(seed, offset, rows, out), rows * out, "group 0 forward");
  expect(off(want.dx, dx.read()) == 0, "group 0 backward: dx within 1e-5 of its largest");
  expect(off(want.ds1, ds1.read()) == 0, "group 0 backward: ds1 within 1e-5 of its largest");
  expect(off(want.ds2, ds2.read()) == 0, "group 0 backward: ds2 within 1e-5 of its largest");
  expect(off(want.db, db.read()) == 0, "group 0 backward: db within 1e-5 of its largest");
}

/// The GPU's training state.
struct gpu_chain {
  device_vector<float> params, grads, state, hidden, y;
  solder_optimizer opt{};
  std::uint64_t seeds[2] = {}, offsets[2] = {}, sketch_seeds[2] = {};

  gpu_chain(const std::vector<float>& p, const ref::optimizer_settings& s)
      : params(p), grads(param_floats), state(std::vector<float>(2 * param_floats, 0.0f)),
        hidden(batch * ref::hidden_floats), y(batch * ref::classes) {
    opt.kind = s.adamw ? solder_adamw : solder_sgd;
    opt.lr = s.lr;
    opt.weight_decay = s.weight_decay;
    opt.momentum = s.momentum;
    opt.beta1 = 0.9f;
    opt.beta2 = 0.999f;
    opt.eps = 1e-8f;
    expect_ok(solder_sketched_mlp_dropout_streams(ref::model_seed, seeds, offsets), "dropout_streams");
    expect_ok(solder_sketched_mlp_sketch_seeds(ref::model_seed, sketch_seeds), "sketch_seeds");
  }
  float step(const float* x, const std::int32_t* labels, float lr) {
    opt.lr = lr;
    float loss = -1;
    expect_ok(solder_sketched_mlp_train_step(x, labels, params.get(), grads.get(), state.get(), &opt, hidden.get(),
                                             y.get(), batch, sketch_seeds, seeds, offsets, 0, 0.0f, &loss, nullptr),
              "sketched_mlp train_step");
    return loss;
  }
};

bool weights_close(const std::vector<float>& want, const std::vector<float>& got, double bound, const char* what) {
  if (want.size() != got.size()) return false;
  std::size_t far = 0;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(want[i]) - double(got[i]));
    far += !(d <= weight_abs + weight_rel * std::fabs(double(want[i])));
    worst = std::max(worst, d == d ? d : 1e30);
  }
  std::printf("  %s: %zu of %zu weights beyond 1e-6 + 1e-5 |w|, largest difference %.3g\n", what, far, want.size(), worst);
  return double(far) <= weight_outliers * double(want.size()) && worst <= bound;
}

/// The step's h, hidden outputs (masks bit for bit) and logits against the CPU blocks' forward
/// from the same parameters, sketches and streams.
void check_forward(const std::vector<float>& params_before, const float* x, gpu_chain& g, const char* what) {
  const std::vector<std::uint64_t> seeds(g.seeds, g.seeds + 2), offsets(g.offsets, g.offsets + 2);
  const ref::forward_result want = ref::forward(params_before, x, batch, seeds, offsets);
  const std::vector<float> got = g.hidden.read(), logits = g.y.read();
  const std::size_t h0_at = 0, y0_at = batch * ref::h0, h1_at = y0_at + batch * ref::hidden0,
                    y1_at = h1_at + batch * ref::h1;
  const std::string name = what;
  expect(off(want.hidden, got, h0_at, y0_at) == 0, (name + ", layer 0: h = x [S1 | U2] within 1e-5").c_str());
  expect(off(want.hidden, got, h1_at, y1_at) == 0, (name + ", layer 3: h = x [S1 | U2] within 1e-5").c_str());
  check_masked(want.hidden.data() + y0_at, got.data() + y0_at, ref::dropout_mask(seeds[0], offsets[0], batch, ref::hidden0),
               batch * ref::hidden0, name + ", layer 2");
  check_masked(want.hidden.data() + y1_at, got.data() + y1_at, ref::dropout_mask(seeds[1], offsets[1], batch, ref::hidden1),
               batch * ref::hidden1, name + ", layer 5");
  expect(off(want.logits, logits) == 0, (name + ": the logits within 1e-5 of the largest").c_str());
}

void compare_training(const ref::digits& data, const ref::optimizer_settings& s, int steps, const char* what) {
  std::printf("%s, %d steps:\n", what, steps);
  ref::cpu_chain cpu(s);
  const std::vector<float> initial = cpu.params();
  gpu_chain gpu(initial, s);
  expect(std::vector<std::uint64_t>(gpu.seeds, gpu.seeds + 2) == cpu.seeds() &&
             std::vector<std::uint64_t>(gpu.offsets, gpu.offsets + 2) == cpu.offsets(),
         "dropout_streams: the CPU chain's streams for the same seed");
  expect(std::vector<std::uint64_t>(gpu.sketch_seeds, gpu.sketch_seeds + 2) == cpu.sketch_seeds(),
         "sketch_seeds: the CPU layers' sketch seeds for the same seed");
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
    check_forward(before, x.data() + row * features, gpu, what);
    if (t == 0) {
      const std::vector<float> want = cpu.grads(), got = gpu.grads.read();
      const std::size_t bounds[] = {SOLDER_SKETCHED_MLP_0_S1, SOLDER_SKETCHED_MLP_0_S2,    SOLDER_SKETCHED_MLP_0_BIAS,
                                    SOLDER_SKETCHED_MLP_3_S1, SOLDER_SKETCHED_MLP_3_S2,    SOLDER_SKETCHED_MLP_3_BIAS,
                                    SOLDER_SKETCHED_MLP_6_WEIGHT, SOLDER_SKETCHED_MLP_6_BIAS, param_floats};
      std::size_t n = 0;
      for (std::size_t k = 0; k + 1 < std::size(bounds); ++k) n += off(want, got, bounds[k], bounds[k + 1]);
      expect(n == 0, "train_step: every gradient of the first step within 1e-5 of its tensor's largest");
    }
  }
  const std::vector<float> trained = cpu.params();
  double moved = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) moved = std::max(moved, std::fabs(double(trained[i]) - initial[i]));
  expect(weights_close(trained, gpu.params.read(), 2 * moved, what), "train_step: the weights after the steps close to the CPU's");
}

/// The example's run, 40 epochs of AdamW with warmup + cosine, on the GPU and on the CPU from the
/// same start and batches; the held-out accuracies (both evaluated by the CPU chain).
void example_accuracy_reached(const ref::digits& data) {
  constexpr int epochs = 40;
  const std::size_t per_epoch = data.batches();
  const std::vector<float> lr = ref::schedule(std::int64_t(epochs * per_epoch));
  const ref::optimizer_settings s{.adamw = true, .lr = 2e-3f, .weight_decay = 1e-2f};
  ref::cpu_chain cpu(s);
  gpu_chain gpu(cpu.params(), s);
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
  const double gpu_acc = ref::accuracy(gpu.params.read(), data.test_x(), data.test_y());
  const double cpu_acc = ref::accuracy(cpu.params(), data.test_x(), data.test_y());
  std::printf("example on the GPU: loss %.4f (epoch 1) -> %.4f (epoch %d); held-out accuracy %.4f (GPU), %.4f (CPU)\n",
              first, last, epochs, gpu_acc, cpu_acc);
  expect(last < 0.1 * first, "example: the loss falls tenfold");
  expect(gpu_acc >= example_accuracy, "example: the GPU-trained chain reaches the example's 95% held-out accuracy");
  expect(std::fabs(gpu_acc - cpu_acc) <= accuracy_gap, "example: the held-out accuracies within 2 points of each other");
}

/// A null sketch_seeds is refused, named, before anything runs.
void argument_checks() {
  ref::cpu_chain cpu({});
  gpu_chain gpu(cpu.params(), {});
  const device_vector<float> x(batch * features);
  const int status = solder_sketched_mlp_forward(x.get(), gpu.params.get(), gpu.hidden.get(), gpu.y.get(), batch, nullptr,
                                                 gpu.seeds, gpu.offsets, 0, nullptr);
  expect(status == int(cudaErrorInvalidValue) &&
             std::string(solder_sketched_mlp_last_error()).find("sketch_seeds is a null pointer") != std::string::npos,
         "forward: a null sketch_seeds is refused, named");
  expect(gpu.offsets[0] == 0 && gpu.offsets[1] == 0, "forward: a refused call leaves the streams");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_cuda_sketched_train",
      "cuda:sketched_train: the generated sketched_mlp launchers match the CPU chain and train to the example's accuracy",
      [] {
        group_launchers();
        const ref::digits data;
        compare_training(data, {.adamw = true, .lr = 2e-3f, .weight_decay = 1e-2f}, 6,
                         "AdamW (lr 2e-3, weight decay 1e-2), as the example");
        compare_training(data, {.adamw = false, .lr = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f}, 6,
                         "SGD (lr 0.05, momentum 0.9, weight decay 1e-4)");
        argument_checks();
        example_accuracy_reached(data);
        cudaDeviceSynchronize();
      });
}
