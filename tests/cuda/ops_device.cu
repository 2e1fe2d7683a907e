// tests/cuda/ops_device.cu: every op of solder/ops.hpp, forward and each differentiable
// gradient (from the output too, where an op gives one), and the optimizer updates of
// solder/ops/optimizer.hpp, instantiated on float in a __global__ kernel and compared with the
// same templates run on the host. Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>

#include "solder/ops.hpp"
#include "solder/ops/optimizer.hpp"

namespace {

/// The upstream gradient fed to every backward (copied into a local before use: binding the
/// constant itself to backward's const reference would odr-use it, which device code cannot).
constexpr float upstream = 1.5f;

/// Where evaluate writes its results, and (on the host) each result's absolute tolerance floor:
/// 0, except for results that are a difference of terms as large as the upstream gradient,
/// which keep those terms' absolute error (GELU's derivative crosses 0 near x = -0.75).
struct results {
  float* out;
  float* floors;  // nullptr on the device
  float floor = 0.0f;
  SOLDER_HD void put(float v) {
    *out++ = v;
    if (floors != nullptr) *floors++ = floor;
  }
};

template <class Op>
SOLDER_HD void unary(const Op& op, float x, results& out) {
  const float y = op.forward(x), g = upstream;
  out.put(y);
  out.put(op.template backward<0>(x, y, g));
}

template <class Op>
SOLDER_HD void binary(const Op& op, float a, float b, results& out) {
  const float y = op.forward(a, b), g = upstream;
  out.put(y);
  out.put(op.template backward<0>(a, b, y, g));
  out.put(op.template backward<1>(a, b, y, g));
}

/// The gradient from the output y = op(x): the op's own function and the map node's op.
template <class Op>
SOLDER_HD void from_output(const Op& op, float x, results& out) {
  const float y = op.forward(x), g = upstream;
  out.put(op.backward_from_output(y, g));
  out.put(solder::ops::gradient_from_output<Op>{op}.forward(y, g));
}

/// The same after a dropout that kept the element: y = scale op(x).
template <class Op>
SOLDER_HD void from_output_dropout(const Op& op, float x, results& out) {
  const float scale = 1.25f, y = scale * op.forward(x), g = upstream;
  out.put(op.backward_from_output(y, g, scale));
  out.put(solder::ops::gradient_from_output<Op, true>{op, scale}.forward(y, g));
}

/// One step of every optimizer update at weight w and gradient g, the state derived from them.
/// The learning rates are not round numbers, so no update cancels to a tiny difference whose
/// relative error the tolerance below could not cover.
SOLDER_HD void optimizer_steps(float w, float g, results& out) {
  namespace ops = solder::ops;
  float ws = w, b = 0.25f * w;
  ops::sgd_update(3.1e-3f, 0.9f, 0.1f, 1.7e-2f, false, false)(ws, g, b);
  out.put(ws);
  out.put(b);
  ws = w;
  b = 0.0f;
  ops::sgd_update(3.1e-3f, 0.9f, 0.0f, 0.0f, true, true)(ws, g, b);
  out.put(ws);
  out.put(b);
  float wa = w, m = 0.5f * g, v = 0.75f * g * g;
  ops::adam_update<true>(1.3e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 3)(wa, g, m, v);
  out.put(wa);
  out.put(m);
  out.put(v);
  wa = w;
  m = 0.5f * g;
  v = 0.75f * g * g;
  ops::adam_update<false>(1.3e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 3)(wa, g, m, v);
  out.put(wa);
  out.put(m);
  out.put(v);
  float gc = g;
  ops::clip_scale(1.0f, 7.0)(gc);
  out.put(gc);
  float acc = w;
  ops::grad_fold{3.0f, false, false}(acc, g);
  out.put(acc);
  acc = w;
  ops::grad_fold{3.0f, false, true}(acc, g);
  out.put(acc);
}

template <class Op>
SOLDER_HD void comparison(const Op& op, float a, float b, results& out) {
  out.put(op.forward(a, b) ? 1.0f : 0.0f);
}

/// Every op at (a, b), written to out; returns the number of results. The one function both
/// the kernel and the host reference run, so both instantiate exactly the same templates.
SOLDER_HD int evaluate(float a, float b, results& out) {
  namespace ops = solder::ops;
  float* const first = out.out;
  // arithmetic
  binary(ops::add{}, a, b, out);
  binary(ops::sub{}, a, b, out);
  binary(ops::mul{}, a, b, out);
  binary(ops::div{}, a, b, out);
  unary(ops::neg{}, a, out);
  unary(ops::abs{}, a, out);
  unary(ops::exp{}, a, out);
  unary(ops::log{}, a, out);
  unary(ops::sqrt{}, a, out);
  unary(ops::rsqrt{}, a, out);
  // activations, with default and non-default members
  unary(ops::tanh{}, a, out);
  unary(ops::sigmoid{}, a, out);
  unary(ops::relu{}, a, out);
  unary(ops::leaky_relu{}, a, out);
  unary(ops::leaky_relu{0.2f}, a, out);
  unary(ops::elu{}, a, out);
  unary(ops::elu{0.5f}, a, out);
  out.floor = 2e-7f * upstream;  // a few ulp of the terms of the derivative, which cancel
  unary(ops::gelu{}, a, out);
  unary(ops::gelu_tanh{}, a, out);
  out.floor = 0.0f;
  unary(ops::silu{}, a, out);
  unary(ops::softplus{}, a, out);
  unary(ops::softplus{2.0f, 10.0f}, a, out);
  // gradients from the output
  from_output(ops::relu{}, a, out);
  from_output(ops::sigmoid{}, a, out);
  from_output(ops::tanh{}, a, out);
  from_output_dropout(ops::relu{}, a, out);
  from_output_dropout(ops::sigmoid{}, a, out);
  // comparisons, where, min, max, clamp
  comparison(ops::less{}, a, b, out);
  comparison(ops::less_equal{}, a, b, out);
  comparison(ops::greater{}, a, b, out);
  comparison(ops::greater_equal{}, a, b, out);
  comparison(ops::equal{}, a, b, out);
  comparison(ops::not_equal{}, a, b, out);
  const ops::where where;
  const bool c = ops::greater{}.forward(a, b);
  const float y = where.forward(c, a, b), g = upstream;
  out.put(y);
  out.put(where.backward<1>(c, a, b, y, g));
  out.put(where.backward<2>(c, a, b, y, g));
  binary(ops::max{}, a, b, out);
  binary(ops::min{}, a, b, out);
  unary(ops::clamp{-1.0f, 2.0f}, a, out);
  unary(ops::clamp{}, a, out);
  // optimizer updates, weight a and gradient b
  optimizer_steps(a, b, out);
  return static_cast<int>(out.out - first);
}

/// Results per input pair (checked against evaluate's count on the host).
constexpr int per_input = 90;

__global__ void evaluate_all(const float* a, const float* b, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  results r{out + i * per_input, nullptr};
  evaluate(a[i], b[i], r);
}

/// Device and host libm differ by a few ulp per function (CUDA: expf 2, erfcf 4, tanhf 2;
/// glibc up to 3), compounded at most a few times per op, and nvcc contracts a * b + c into
/// one fma where the host rounds twice: 1e-5 relative is a dozen such ulps. Subnormal results
/// carry few significant bits, hence the absolute floor; results that evaluate marks as a
/// difference of large terms add the floor it gives them.
constexpr double rel_tol = 1e-5;
constexpr double abs_tol = 1e-30;

bool agree(float device, float host, float floor) {
  if (isnan(host)) return isnan(device);
  if (isinf(host)) return device == host;
  return fabs(double(device) - double(host)) <= rel_tol * fabs(double(host)) + abs_tol + floor;
}

#define SOLDER_CUDA_CHECK(call)                                                            \
  do {                                                                                     \
    const cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                             \
      fprintf(stderr, "solder: %s failed: %s\n", #call, cudaGetErrorString(err_));         \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    puts("solder: no CUDA device; GPU tests not run");
    return 77;
  }

  const float inf = INFINITY;
  const float a[] = {NAN,   inf,    -inf,  0.0f,   -0.0f,  1e-40f, 0.5f,  -0.5f, 1.0f,  -1.0f,
                     2.0f,  -2.0f,  -0.75f, 3.0f,  -3.0f,  7.5f,   -7.5f, 15.0f, -15.0f, 25.0f,
                     -25.0f, 88.0f, -88.0f, 100.0f, -100.0f, 1e20f, -1e20f, 2.0f,  0.1f,  -1.0f};
  constexpr int n = sizeof(a) / sizeof(a[0]);
  float b[n];
  for (int i = 0; i < n; ++i) b[i] = a[(7 * i + 3) % n];  // every pairing of kinds, ties included
  b[27] = a[27];                                            // a tie: max and min split the gradient

  static float host[n * per_input];
  static float device[n * per_input];
  static float floors[n * per_input];
  for (int i = 0; i < n; ++i) {
    results r{host + i * per_input, floors + i * per_input};
    if (evaluate(a[i], b[i], r) != per_input) {
      fprintf(stderr, "solder: per_input (%d) is stale; update it to evaluate's count\n", per_input);
      return 1;
    }
  }

  float *da = nullptr, *db = nullptr, *dout = nullptr;
  SOLDER_CUDA_CHECK(cudaMalloc(&da, sizeof a));
  SOLDER_CUDA_CHECK(cudaMalloc(&db, sizeof b));
  SOLDER_CUDA_CHECK(cudaMalloc(&dout, sizeof device));
  SOLDER_CUDA_CHECK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
  SOLDER_CUDA_CHECK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
  evaluate_all<<<1, 32>>>(da, db, dout, n);
  SOLDER_CUDA_CHECK(cudaGetLastError());
  SOLDER_CUDA_CHECK(cudaMemcpy(device, dout, sizeof device, cudaMemcpyDeviceToHost));
  SOLDER_CUDA_CHECK(cudaFree(da));
  SOLDER_CUDA_CHECK(cudaFree(db));
  SOLDER_CUDA_CHECK(cudaFree(dout));

  int mismatches = 0;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < per_input; ++k) {
      const float h = host[i * per_input + k], d = device[i * per_input + k];
      if (!agree(d, h, floors[i * per_input + k])) {
        if (++mismatches <= 20)
          fprintf(stderr, "solder: result %d at a = %g, b = %g: device %.9g, host %.9g\n", k, a[i], b[i], d, h);
      }
    }
  if (mismatches) {
    fprintf(stderr, "solder: %d of %d device results differ from the host\n", mismatches, n * per_input);
    return 1;
  }
  printf("solder: %d device results match the host\n", n * per_input);
  return 0;
}
