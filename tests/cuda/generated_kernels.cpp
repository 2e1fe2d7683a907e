// tests/cuda/generated_kernels.cpp: every chain of kernels/chains.hpp through its generated C
// interface (kernels/<chain>.h, built by nvcc into solder_kernels), called from code the C++
// compiler builds alone, against the same chain on the CPU (nn::chain, seeded alike): the
// parameters drawn bit for bit; a training forward (the dropout masks drawn from the same
// streams), the parameter gradients of a backward, the running statistics and an evaluation
// forward within stated tolerances; training steps of the classifiers with SGD and AdamW against
// the CPU's optim::sgd and optim::adamw; and the statuses and messages of refused calls. Exits 77
// (skipped) without a device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "bias_gelu_dropout.h"
#include "bias_relu_dropout.h"
#include "chains.hpp"
#include "conv_bn_relu.h"
#include "digits_cnn.h"
#include "digits_mlp.h"
#include "layer_norm_gelu_dropout.h"
#include "linear_relu_dropout.h"
#include "pool_flatten.h"
#include "sketched_mlp.h"
#include "solder/nn/criterion.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"
// After the generated headers, whose common types it uses.
#include "support/generated_model.hpp"

SOLDER_TEST_GENERATED_API_WITH_LOSS(bias_relu_dropout, BIAS_RELU_DROPOUT);
SOLDER_TEST_GENERATED_API_WITH_LOSS(bias_gelu_dropout, BIAS_GELU_DROPOUT);
SOLDER_TEST_GENERATED_API_WITH_LOSS(layer_norm_gelu_dropout, LAYER_NORM_GELU_DROPOUT);
SOLDER_TEST_GENERATED_API_WITH_LOSS(linear_relu_dropout, LINEAR_RELU_DROPOUT);
SOLDER_TEST_GENERATED_API_WITH_LOSS(digits_mlp, DIGITS_MLP);
SOLDER_TEST_GENERATED_API_WITH_LOSS(sketched_mlp, SKETCHED_MLP);
SOLDER_TEST_GENERATED_API_WITH_LOSS(pool_flatten, POOL_FLATTEN);
SOLDER_TEST_GENERATED_API(conv_bn_relu, CONV_BN_RELU);
SOLDER_TEST_GENERATED_API_WITH_LOSS(digits_cnn, DIGITS_CNN);

namespace {

using namespace solder;
using test::gpu::expect;
using test::gpu::generated_model;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// An array in device memory, copied to and from host vectors on the test's stream.
template <class T>
class device_array {
 public:
  device_array(std::size_t n, cudaStream_t s) : n_(n), stream_(s) {
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  device_array(const std::vector<T>& host, cudaStream_t s) : device_array(host.size(), s) { upload(host); }
  ~device_array() { cudaFree(p_); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  T* get() const { return p_; }
  void upload(const std::vector<T>& host) {
    cuda_check(cudaMemcpyAsync(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  std::vector<T> read() const {
    std::vector<T> out(n_);
    cuda_check(cudaMemcpyAsync(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
  cudaStream_t stream_;
};

/// A host array for n floats of a model's: never empty, so a chain without parameters or buffers
/// is still given a pointer.
std::vector<float> host_floats(std::size_t n) { return std::vector<float>(std::max<std::size_t>(n, 1)); }

/// Counts and reports a call that did not succeed, with the interface's message; true when it did.
template <class Api>
bool ok(const Api&, int status, const char* call) {
  return generated_model<Api>::expect_ok(status, call);
}

/// Elements of got[begin, end) off want by more than tol * (the largest |want| there); prints
/// the count and the largest difference.
std::size_t off(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin, std::size_t end,
                double tol, const std::string& what) {
  double scale = 0, worst = 0;
  for (std::size_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(double(want[i])));
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const double d = std::fabs(double(want[i]) - double(got[i]));
    n += !(d <= tol * scale);
    worst = std::max(worst, d == d ? d : 1e30);
  }
  if (n) std::printf("  %s: %zu of %zu beyond %.0e of the largest (%.3g), largest difference %.3g\n", what.c_str(), n,
                     end - begin, tol, scale, worst);
  return n;
}

/// How a chain is driven: its batch, the range of its inputs, and the tolerance (of each
/// tensor's largest element) of its outputs and gradients: float sums in another order on each
/// side (products, batch and layer statistics), and erf and exp within a few ulp of libm's.
struct spec {
  std::size_t batch;
  double lo, hi;
  double tol;
};

template <class Chain>
std::vector<float> cpu_flat(Chain& c, bool grads) {
  std::vector<float> out;
  for (const auto& p : c.params()) {
    const auto& v = grads ? p.grad : p.value;
    out.insert(out.end(), v.data(), v.data() + v.size());
  }
  return out;
}

template <class Chain>
std::vector<float> cpu_buffers(Chain& c) {
  std::vector<float> out;
  for (const auto& b : c.buffers()) out.insert(out.end(), b.value.data(), b.value.data() + b.value.size());
  return out;
}

template <class Chain>
std::vector<float> cpu_forward(Chain& c, const std::vector<float>& x, std::size_t batch) {
  std::vector<float> y(batch * Chain::out_features);
  c.forward_into(typename Chain::input_ref(x.data(), batch),
                 tensor_ref<float, typename Chain::widths::output_batch, host>(y.data(), batch));
  return y;
}

/// Zeroes dy where the CPU's input to the chain's last relu lies within 1e-4 of its largest of 0:
/// there, rounding may put it on the other side of the kink on the GPU, and the gradient that
/// passes would differ by a whole term. Before is the chain without that relu (and what follows
/// it, elementwise), drawn from the same seed: the same parameters and the same statistics.
template <class Before, class Chain>
void clear_near_kinks(std::uint64_t seed, Chain& cpu, const std::vector<float>& x, std::size_t batch,
                      std::vector<float>& dy) {
  Before before(seed);
  const std::vector<float> mine = cpu_flat(before, false), chain = cpu_flat(cpu, false);
  expect(mine.size() <= chain.size() && test::bit_differences(mine.data(), chain.data(), mine.size()) == 0,
         "the chain before the last relu draws the chain's parameters");
  const std::vector<float> z = cpu_forward(before, x, batch);
  double scale = 0;
  for (float v : z) scale = std::max(scale, std::fabs(double(v)));
  for (std::size_t i = 0; i < z.size(); ++i)
    if (std::fabs(double(z[i])) < 1e-4 * scale) dy[i] = 0.0f;
}

/// Compares the model's gradients (read_grads) with the CPU's, tensor by tensor.
template <class Chain, class Api>
void compare_grads(const Api& a, typename Api::handle* m, Chain& cpu, double tol, cudaStream_t s, const std::string& what) {
  std::vector<float> got = host_floats(a.param_floats);
  if (!ok(a, a.read_grads(m, got.data(), s), "read_grads")) return;
  const std::vector<float> want = cpu_flat(cpu, true);
  std::size_t at = 0, n = 0;
  for (const auto& p : cpu.params()) {
    n += off(want, got, at, at + p.value.size(), tol, what + " " + p.name);
    at += p.value.size();
  }
  expect(n == 0, (std::string(a.name) + ": " + what + ": every gradient within the tolerance of its tensor's largest").c_str());
}

/// The classifiers' training steps: two of SGD with momentum, then AdamW (a fresh state, as a
/// new torch optimizer) by train_step and by loss_and_backward + optimizer_step, then one more
/// after reset_optimizer; losses and parameters against the CPU chain's steps with optim::sgd
/// and optim::adamw from the same state.
template <class Chain, class Api>
void compare_training(const Api& a, typename Api::handle* m, Chain& cpu, cudaStream_t s) {
  constexpr std::size_t batch = 64;
  const std::string name = a.name;
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<std::int32_t>> labels;
  for (std::uint32_t k = 0; k < 3; ++k) {
    xs.emplace_back(batch * Chain::in_features);
    labels.emplace_back(batch);
    test::fill_uniform(xs.back(), 0, 1, 300 + k);
    test::fill_integers(labels.back(), 0, int(Chain::out_features) - 1, 400 + k);
  }
  device_array<float> x(batch * Chain::in_features, s);
  device_array<std::int32_t> y(batch, s);
  std::size_t step = 0;

  // One step on both sides; how: 0 train_step, 1 loss_and_backward then optimizer_step.
  auto both = [&](auto& cpu_opt, solder_optimizer& opt, float smoothing, int how) {
    const std::size_t k = step++ % xs.size();
    x.upload(xs[k]);
    y.upload(labels[k]);
    const typename Chain::input_ref xr(xs[k].data(), batch);
    const std::span<const std::int32_t> yr(labels[k]);
    const nn::cross_entropy_loss loss{smoothing};
    float want = 0, got = 0;
    if (how == 0) {
      want = cpu.train_step(xr, yr, cpu_opt, loss);
      ok(a, a.train_step(m, x.get(), y.get(), batch, &opt, smoothing, &got, s), "train_step");
    } else {
      want = cpu.loss_and_backward(xr, yr, loss);
      cpu_opt.step();
      ok(a, a.loss_and_backward(m, x.get(), y.get(), batch, smoothing, &got, s), "loss_and_backward");
      ok(a, a.optimizer_step(m, &opt, s), "optimizer_step");
    }
    std::printf("  %s step %zu: loss %.6f (CPU %.6f), optimizer steps %lld\n", a.name, step, double(got), double(want),
                (long long)opt.steps);
    expect(std::fabs(double(got) - double(want)) <= 1e-5 * std::fabs(double(want)),
           (name + ": a training step's loss within 1e-5 of the CPU's").c_str());
  };
  // The parameters against the CPU's; a weight may differ by at most 3 times the most any
  // moved on the CPU since `before` (one step the other way, with margin).
  auto compare_params = [&](const std::vector<float>& before, const std::string& what) {
    std::vector<float> got = host_floats(a.param_floats);
    ok(a, a.read_params(m, got.data(), s), "read_params");
    const std::vector<float> want = cpu_flat(cpu, false);
    double moved = 0;
    for (std::size_t i = 0; i < want.size(); ++i) moved = std::max(moved, std::fabs(double(want[i]) - double(before[i])));
    expect(moved > 0, (name + ": " + what + ": the CPU's steps moved the parameters").c_str());
    expect(test::gpu::weights_close(want, got, 3 * moved, name + " " + what),
           (name + ": " + what + ": the parameters close to the CPU's").c_str());
  };

  solder_optimizer sgd{};
  sgd.kind = solder_sgd;
  sgd.lr = 0.01f;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 1e-4f;
  optim::sgd cpu_sgd(cpu.params(), {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 1e-4f});
  std::vector<float> before = cpu_flat(cpu, false);
  both(cpu_sgd, sgd, 0.0f, 0);
  both(cpu_sgd, sgd, 0.0f, 0);
  expect(sgd.steps == 2, (name + ": SGD: steps counts the steps of its state").c_str());
  compare_params(before, "after 2 steps of SGD with momentum");

  solder_optimizer adamw{};
  adamw.kind = solder_adamw;
  adamw.lr = 2e-3f;
  adamw.weight_decay = 1e-2f;
  adamw.beta1 = 0.9f;
  adamw.beta2 = 0.999f;
  adamw.eps = 1e-8f;
  before = cpu_flat(cpu, false);
  {
    optim::adamw cpu_adamw(cpu.params(), {.lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f});
    both(cpu_adamw, adamw, 0.1f, 0);
    both(cpu_adamw, adamw, 0.1f, 1);
    expect(adamw.steps == 2, (name + ": AdamW after SGD: a fresh state, two steps").c_str());
  }
  ok(a, a.reset_optimizer(m), "reset_optimizer");
  {
    optim::adamw cpu_adamw(cpu.params(), {.lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f});
    both(cpu_adamw, adamw, 0.1f, 0);
    expect(adamw.steps == 1, (name + ": AdamW after reset_optimizer: a fresh state").c_str());
  }
  compare_params(before, "after 3 steps of AdamW");
}

/// Refused calls: cudaErrorInvalidValue (1) and a message naming what was wrong; a call that
/// succeeds clears the message.
template <class Chain, class Api>
void check_refusals(const Api& a, typename Api::handle* m, cudaStream_t s) {
  const std::string name = a.name;
  auto refused = [&](int status, const char* needle, const char* what) {
    const std::string message = a.last_error();
    if (status != 1 || message.find(needle) == std::string::npos)
      std::fprintf(stderr, "  %s: %s returned %d: \"%s\"\n", a.name, what, status, message.c_str());
    expect(status == 1 && message.find(needle) != std::string::npos,
           (name + ": " + what + ": cudaErrorInvalidValue and a message naming " + needle).c_str());
  };
  const std::size_t batch = 3;
  device_array<float> x(batch * a.in_floats, s), y(batch * a.out_floats, s);
  typename Api::handle* none = nullptr;
  refused(a.create(1, nullptr), "model is a null pointer", "create with a null handle pointer");
  refused(a.forward(nullptr, x.get(), y.get(), batch, s), "model is a null pointer", "forward of a null model");
  refused(a.forward(m, nullptr, y.get(), batch, s), "x is a null pointer", "forward of a null x");
  refused(a.forward(m, x.get(), y.get(), 0, s), "batch", "forward of an empty batch");
  refused(a.backward(m, nullptr, batch, s), "dy is a null pointer", "backward of a null dy");
  refused(a.read_params(m, nullptr, s), "params is a null pointer", "read_params into a null array");
  refused(a.params(none, nullptr), "model is a null pointer", "params of a null model");
  std::vector<float> p = host_floats(a.param_floats);
  expect(a.read_params(m, p.data(), s) == 0 && std::string(a.last_error()).empty(),
         (name + ": a call that succeeds leaves an empty message").c_str());

  if constexpr (Chain::out_features == 10 && Api::with_loss) {
    // A label out of range, and an optimizer kind that is none: refused before any update.
    std::vector<float> xs(batch * a.in_floats);
    test::fill_uniform(xs, 0, 1, 77);
    x.upload(xs);
    device_array<std::int32_t> labels(std::vector<std::int32_t>{1, 10, 2}, s);
    solder_optimizer opt{};
    opt.kind = solder_sgd;
    opt.lr = 0.1f;
    float loss = 0;
    refused(a.train_step(m, x.get(), labels.get(), batch, &opt, 0.0f, &loss, s), "label 10", "train_step with a label of 10");
    std::vector<float> after = host_floats(a.param_floats);
    ok(a, a.read_params(m, after.data(), s), "read_params");
    expect(test::bit_differences(p.data(), after.data(), p.size()) == 0,
           (name + ": a refused train_step leaves the parameters as they were").c_str());
    labels.upload({1, 0, 2});
    opt.kind = 7;
    refused(a.train_step(m, x.get(), labels.get(), batch, &opt, 0.0f, &loss, s), "kind 7", "train_step with kind 7");
    refused(a.train_step(m, x.get(), labels.get(), batch, nullptr, 0.0f, &loss, s), "optimizer is a null pointer",
            "train_step without an optimizer");
  }
}

/// The whole comparison for one chain; Before, where not void, is the chain up to its last
/// relu's input (clear_near_kinks).
template <class Chain, class Api, class Before = void>
void check_chain(const spec& sp) {
  const Api a{};
  std::printf("%s: batch %zu, tolerance %.0e\n", a.name, sp.batch, sp.tol);
  const std::string name = a.name;
  constexpr std::uint64_t seed = 0x5eedULL, seed2 = 977;
  const std::size_t batch = sp.batch, in = Chain::in_features, out = Chain::out_features;

  Chain cpu(seed);
  const auto cpu_params = cpu.params();
  const auto cpu_bufs = cpu.buffers();
  std::size_t param_floats = 0, buffer_floats = 0;
  for (const auto& p : cpu_params) param_floats += p.value.size();
  for (const auto& b : cpu_bufs) buffer_floats += b.value.size();
  expect(a.in_floats == in && a.out_floats == out && a.param_tensors == cpu_params.size() &&
             a.param_floats == param_floats && a.buffer_floats == buffer_floats &&
             a.dropouts == cpu.dropout_streams().size(),
         (name + ": the header's sizes are the CPU chain's").c_str());

  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
  {
    // Destroyed before the stream that its work was queued on.
    const generated_model<Api> model(seed, s);
    typename Api::handle* const m = model.get();

    // The parameters: drawn as the CPU draws them, and where params() says they are.
    std::vector<float> params = host_floats(a.param_floats);
    ok(a, a.read_params(m, params.data(), s), "read_params");
    const std::vector<float> want_params = cpu_flat(cpu, false);
    expect(test::bit_differences(want_params.data(), params.data(), a.param_floats) == 0,
           (name + ": the parameters equal the CPU chain's bit for bit").c_str());
    std::vector<solder_param_tensor> tensors(std::max<std::size_t>(a.param_tensors, 1));
    if (ok(a, a.params(m, tensors.data()), "params")) {
      std::size_t at = 0, wrong = 0;
      for (std::size_t i = 0; i < a.param_tensors; ++i) {
        const solder_param_tensor& t = tensors[i];
        if (t.name == nullptr || cpu_params[i].name != t.name || t.floats != cpu_params[i].value.size() ||
            t.value == nullptr || t.grad == nullptr) {
          ++wrong;
          continue;
        }
        std::vector<float> v(t.floats);
        cuda_check(cudaMemcpy(v.data(), t.value, t.floats * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
        wrong += test::bit_differences(v.data(), params.data() + at, t.floats) != 0;
        at += t.floats;
      }
      expect(wrong == 0, (name + ": params() names each tensor as the CPU chain does and points at its values").c_str());
    }
    if (a.buffer_floats) {
      std::vector<float> buffers(a.buffer_floats);
      ok(a, a.read_buffers(m, buffers.data(), s), "read_buffers");
      const std::vector<float> want = cpu_buffers(cpu);
      expect(test::bit_differences(want.data(), buffers.data(), buffers.size()) == 0,
             (name + ": the running statistics start as the CPU chain's").c_str());
    }

    // A training forward and a backward.
    std::vector<float> xh(batch * in), dyh(batch * out);
    test::fill_uniform(xh, sp.lo, sp.hi, 1);
    test::fill_uniform(dyh, -1, 1, 2);
    if constexpr (!std::is_void_v<Before>) clear_near_kinks<Before>(seed, cpu, xh, batch, dyh);
    device_array<float> x(xh, s), dy(dyh, s), y(batch * out, s);
    auto compare_forward = [&](const std::string& what) {
      const std::vector<float> want = cpu_forward(cpu, xh, batch);
      if (!ok(a, a.forward(m, x.get(), y.get(), batch, s), "forward")) return;
      const std::vector<float> got = y.read();
      expect(off(want, got, 0, want.size(), sp.tol, name + " " + what) == 0,
             (name + ": " + what + ": the output within the tolerance of its largest").c_str());
      if (a.dropouts) {
        // The masks: an element the CPU dropped (+0) the GPU dropped too, unless its value is
        // within the tolerance of 0 anyway (relu's input within rounding of 0).
        double scale = 0;
        for (float v : want) scale = std::max(scale, std::fabs(double(v)));
        std::size_t differ = 0;
        for (std::size_t i = 0; i < want.size(); ++i)
          differ += (want[i] == 0.0f) != (got[i] == 0.0f) && std::max(std::fabs(want[i]), std::fabs(got[i])) > sp.tol * scale;
        expect(differ == 0, (name + ": " + what + ": the zeros (dropped elements) where the CPU's are").c_str());
      }
    };
    compare_forward("training forward");
    cpu.backward(typename Chain::output_ref(dyh.data(), batch));
    if (ok(a, a.backward(m, dy.get(), batch, s), "backward") && a.param_tensors)
      compare_grads(a, m, cpu, sp.tol, s, "backward");
    if (a.buffer_floats) {
      std::vector<float> got(a.buffer_floats);
      ok(a, a.read_buffers(m, got.data(), s), "read_buffers");
      const std::vector<float> want = cpu_buffers(cpu);
      std::size_t at = 0, n = 0;
      for (const auto& b : cpu.buffers()) {
        n += off(want, got, at, at + b.value.size(), sp.tol, name + " " + b.name);
        at += b.value.size();
      }
      expect(n == 0, (name + ": the running statistics after a training forward within the tolerance").c_str());
    }

    // The masks of another seed, as a shard starting at sample 5 draws them.
    if (a.dropouts) {
      cpu.reseed(seed2);
      cpu.set_first_sample(5);
      ok(a, a.reseed(m, seed2), "reseed");
      ok(a, a.set_first_sample(m, 5), "set_first_sample");
      // reseed draws the parameters again, as the CPU chain's does.
      std::vector<float> p = host_floats(a.param_floats);
      ok(a, a.read_params(m, p.data(), s), "read_params");
      const std::vector<float> want = cpu_flat(cpu, false);
      expect(test::bit_differences(want.data(), p.data(), a.param_floats) == 0,
             (name + ": after reseed, the parameters equal the CPU chain's bit for bit").c_str());
      compare_forward("training forward after reseed and set_first_sample(5)");
      cpu.set_first_sample(0);
      ok(a, a.set_first_sample(m, 0), "set_first_sample");
    }

    // Evaluation: no dropout, batch_norm's running statistics folded into the layer before it.
    cpu.eval();
    if (ok(a, a.eval(m), "eval")) compare_forward("evaluation forward");
    cpu.train();
    ok(a, a.train(m), "train");

    // write_params and write_buffers take what read_params and read_buffers give.
    {
      std::vector<float> p = host_floats(a.param_floats), back = host_floats(a.param_floats);
      ok(a, a.read_params(m, p.data(), s), "read_params");
      ok(a, a.write_params(m, p.data(), s), "write_params");
      ok(a, a.read_params(m, back.data(), s), "read_params");
      expect(test::bit_differences(p.data(), back.data(), p.size()) == 0,
             (name + ": write_params then read_params gives the same bits").c_str());
      if (a.buffer_floats) {
        std::vector<float> b(a.buffer_floats), bback(a.buffer_floats);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.5f + float(i % 7) * 0.125f;
        ok(a, a.write_buffers(m, b.data(), s), "write_buffers");
        ok(a, a.read_buffers(m, bback.data(), s), "read_buffers");
        expect(test::bit_differences(b.data(), bback.data(), b.size()) == 0,
               (name + ": write_buffers then read_buffers gives the same bits").c_str());
        // Back to the CPU chain's, so that the chains go on from the same state.
        const std::vector<float> want = cpu_buffers(cpu);
        ok(a, a.write_buffers(m, want.data(), s), "write_buffers");
      }
    }

    // The loss of a chain with a flat output, and the gradients of its mean.
    if constexpr (Chain::widths::output_batch::rank == 2) {
      expect(Api::with_loss, (name + ": a flat output has loss_and_backward").c_str());
      if constexpr (Api::with_loss) {
        std::vector<std::int32_t> lh(batch);
        test::fill_integers(lh, 0, int(out) - 1, 3);
        device_array<std::int32_t> labels(lh, s);
        const float want = cpu.loss_and_backward(typename Chain::input_ref(xh.data(), batch), std::span<const std::int32_t>(lh),
                                                 nn::cross_entropy_loss{0.1f});
        float got = 0;
        if (ok(a, a.loss_and_backward(m, x.get(), labels.get(), batch, 0.1f, &got, s), "loss_and_backward")) {
          expect(test::gpu::close_to(got, want, 1e-5), (name + ": loss_and_backward: the loss within 1e-5 of the CPU's").c_str());
          if (a.param_tensors) compare_grads(a, m, cpu, sp.tol, s, "loss_and_backward");
        }
      }
    }

    if constexpr (Chain::out_features == 10 && Api::with_loss) compare_training(a, m, cpu, s);
    check_refusals<Chain>(a, m, s);
  }
  a.destroy(nullptr);
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  cudaStreamDestroy(s);
}

/// The chains' own parts before their last relu, for clear_near_kinks.
using linear_relu_dropout_before = nn::chain<nn::linear<256, 512>>;
using conv_bn_relu_before = nn::chain<nn::input<64, 16, 16>, nn::conv2d<64, 64, 3, 3, 1, 1>, nn::batch_norm<64>>;

}  // namespace

int main() {
  return test::gpu::run("tests/cuda/generated_kernels.cpp", "solder: the generated C interfaces match the CPU chains", [] {
    // 157 rows: not a multiple of the column walk's chunk of 128 rows.
    check_chain<::bias_relu_dropout, bias_relu_dropout_api>({157, -2, 2, 1e-5});
    check_chain<::bias_gelu_dropout, bias_gelu_dropout_api>({157, -3, 3, 1e-5});
    check_chain<::layer_norm_gelu_dropout, layer_norm_gelu_dropout_api>({157, -2, 2, 1e-5});
    check_chain<::linear_relu_dropout, linear_relu_dropout_api, linear_relu_dropout_before>({157, -1, 1, 1e-5});
    check_chain<::digits_mlp, digits_mlp_api>({157, 0, 1, 1e-5});
    check_chain<::sketched_mlp, sketched_mlp_api>({157, 0, 1, 1e-5});
    check_chain<::pool_flatten, pool_flatten_api>({37, -1, 1, 1e-6});
    // The batch_norm chains: statistics over the batch, and the gradient through them.
    check_chain<::conv_bn_relu, conv_bn_relu_api, conv_bn_relu_before>({6, -1, 1, 5e-5});
    check_chain<::digits_cnn, digits_cnn_api>({37, 0, 1, 5e-5});
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
}
