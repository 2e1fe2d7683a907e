// cuda_chains: two chains of kernels/chains.hpp on the GPU through their generated C interfaces, from a program the C++ compiler builds alone.
//
// solder-gen writes, for each chain, a C header (kernels/bias_relu_dropout.h, digits_mlp.h) and
// the .cu behind it, built by nvcc into solder_kernels. A model is an opaque handle over the
// chain in device memory: create it from a seed (the parameters are drawn as the CPU chain
// draws them), then forward, backward and training steps on device arrays. Every call returns
// 0 or a cudaError_t value, and <chain>_last_error() says why. The bias+ReLU+dropout forward and
// backward are checked against the same chain on the CPU (same seed, so the same parameters and
// dropout masks); the digits MLP takes AdamW steps on a batch it can learn. Without a CUDA device
// the program says so and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <vector>

#include "bias_relu_dropout.h"  // the C interfaces: C types only
#include "chains.hpp"           // the chains' types, for the CPU reference
#include "digits_mlp.h"

namespace {

/// Prints the interface's message when a call did not succeed.
bool succeeded(int status, const char* call, const char* (*last_error)()) {
  if (status == 0) return true;
  std::fprintf(stderr, "cuda_chains: %s returned %d: %s\n", call, status, last_error());
  return false;
}
#define CALL(chain, call) succeeded(solder_##chain##_##call, "solder_" #chain "_" #call, solder_##chain##_last_error)

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "cuda_chains: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

/// A device copy of a host vector (or, given a size, an uninitialized device array).
template <class T>
struct device_vector {
  T* p = nullptr;
  explicit device_vector(std::size_t n) { cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), "cudaMalloc"); }
  explicit device_vector(const std::vector<T>& h) : device_vector(h.size()) {
    cuda_ok(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~device_vector() { cudaFree(p); }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  std::vector<T> read(std::size_t n) const {
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
};

/// A refused call is a status and a message, never an exception (no device needed).
bool show_error_reporting() {
  const int status = solder_bias_relu_dropout_create(1, nullptr);
  std::printf("cuda_chains: create without a handle to fill returns %d (cudaErrorInvalidValue): %s\n", status,
              solder_bias_relu_dropout_last_error());
  return status == 1 && std::strstr(solder_bias_relu_dropout_last_error(), "null") != nullptr;
}

/// Elements of got off want by more than tol * (the largest |want|).
std::size_t differences(const std::vector<float>& want, const std::vector<float>& got, float tol) {
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  std::size_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i) n += !(std::fabs(want[i] - got[i]) <= tol * scale);
  return n;
}

/// y = dropout(relu(x + b)) on [157, 4096] and the gradient of b, against the CPU chain.
bool bias_relu_dropout_on_device() {
  constexpr std::uint64_t seed = 7;
  constexpr std::size_t batch = 157, features = SOLDER_BIAS_RELU_DROPOUT_IN_FLOATS;
  std::mt19937 gen(20240611);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(batch * features), dy(batch * SOLDER_BIAS_RELU_DROPOUT_OUT_FLOATS);
  for (float& v : x) v = uniform(gen);
  for (float& v : dy) v = uniform(gen);

  solder_bias_relu_dropout* model = nullptr;
  if (!CALL(bias_relu_dropout, create(seed, &model))) return false;
  const device_vector<float> x_d(x), dy_d(dy), y_d(batch * SOLDER_BIAS_RELU_DROPOUT_OUT_FLOATS);
  std::vector<float> db(SOLDER_BIAS_RELU_DROPOUT_PARAM_FLOATS);
  const bool ran = CALL(bias_relu_dropout, forward(model, x_d.p, y_d.p, batch, nullptr)) &&
                   CALL(bias_relu_dropout, backward(model, dy_d.p, batch, nullptr)) &&
                   CALL(bias_relu_dropout, read_grads(model, db.data(), nullptr));
  solder_bias_relu_dropout_destroy(model);
  if (!ran) return false;
  const std::vector<float> y = y_d.read(x.size());

  // The same chain on the CPU, from the same seed: the same bias and the same dropout stream.
  ::bias_relu_dropout cpu(seed);
  const auto y_cpu = cpu.forward(bias_relu_dropout::input_ref(x.data(), batch));
  cpu.backward(bias_relu_dropout::output_ref(dy.data(), batch));
  const std::vector<float> want_y(y_cpu.data(), y_cpu.data() + y_cpu.size());
  const auto& g = cpu.params().front().grad;
  const std::vector<float> want_db(g.data(), g.data() + g.size());

  std::size_t kept = 0;
  for (float v : y) kept += v != 0.0f;
  // y is an add, a max and a multiply per element on both sides; db sums 157 rows in another order.
  const std::size_t y_off = differences(want_y, y, 1e-6f), db_off = differences(want_db, db, 1e-5f);
  std::printf("cuda_chains: bias_relu_dropout on [%zu, %zu]: %zu of %zu outputs nonzero; %zu outputs and %zu of "
              "db differ from the CPU chain's\n",
              batch, features, kept, y.size(), y_off, db_off);
  return y_off == 0 && db_off == 0;
}

/// AdamW steps of the digits MLP on one batch whose label is the largest of the first 10 features.
bool digits_mlp_on_device() {
  constexpr std::size_t batch = 256, features = SOLDER_DIGITS_MLP_IN_FLOATS, classes = SOLDER_DIGITS_MLP_OUT_FLOATS;
  std::mt19937 gen(2026);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> x(batch * features);
  std::vector<std::int32_t> labels(batch);
  for (float& v : x) v = pixel(gen);
  for (std::size_t r = 0; r < batch; ++r)
    labels[r] = std::int32_t(std::max_element(&x[r * features], &x[r * features] + classes) - &x[r * features]);
  const device_vector<float> x_d(x);
  const device_vector<std::int32_t> labels_d(labels);

  solder_optimizer adamw{};  // torch.optim.AdamW(lr=2e-3, weight_decay=1e-2)
  adamw.kind = solder_adamw;
  adamw.lr = 2e-3f;
  adamw.weight_decay = 1e-2f;
  adamw.beta1 = 0.9f;
  adamw.beta2 = 0.999f;
  adamw.eps = 1e-8f;

  solder_digits_mlp* model = nullptr;
  if (!CALL(digits_mlp, create(1, &model))) return false;
  float first = 0, loss = 0;
  bool ran = true;
  for (int step = 0; step < 30 && ran; ++step) {
    ran = CALL(digits_mlp, train_step(model, x_d.p, labels_d.p, batch, &adamw, 0.0f, &loss, nullptr));
    if (step == 0) first = loss;
  }
  solder_digits_mlp_destroy(model);
  if (!ran) return false;
  std::printf("cuda_chains: digits_mlp, %lld AdamW steps on a batch of %zu: loss %.4f -> %.4f\n",
              (long long)adamw.steps, batch, double(first), double(loss));
  return std::isfinite(first) && loss < 0.8f * first;
}

}  // namespace

int main() {
  if (!show_error_reporting()) {
    std::fputs("cuda_chains: create did not report the null handle pointer as expected\n", stderr);
    return 1;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("cuda_chains: no CUDA device is present; the generated kernels were not run (nothing to check)");
    return 0;
  }
  try {  // the CPU chain throws solder::error; the C functions never throw
    const bool ok = bias_relu_dropout_on_device() && digits_mlp_on_device();
    std::puts(ok ? "cuda_chains: the generated kernels match the CPU chain and train" : "cuda_chains: FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_chains: %s\n", e.what());
    return 1;
  }
}
