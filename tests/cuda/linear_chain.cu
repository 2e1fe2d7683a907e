// tests/cuda/linear_chain.cu: the generated launchers of kernels/chains.hpp's
// linear_relu_dropout (kernels/linear_relu_dropout.cu: one product with relu and dropout in its
// epilogue forward; the gate pass with db, then dx = g W and dW = g^T x backward) against the
// CPU chain (linear_chain.host.cpp): the dropout mask bit for bit (every dropped element the
// same +0), values and gradients within a stated tolerance of the sums' magnitudes, the same
// bits on a second call, and the argument checks. Exits 77 (ctest's skip code) where no CUDA
// device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "linear_chain.hpp"
#include "linear_relu_dropout.h"

namespace {

namespace ref = solder::test::linear_chain;
using ref::in;
using ref::out;
using solder::test::fill_uniform;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

constexpr std::uint64_t seed = 0x5eedULL, offset = 11;
constexpr std::size_t batch = 157;  // a tail in every tiling's rows and in the column walk's chunks

/// Both sides round each multiply-add of a sum of K terms in another order (the CPU's GEMM
/// blocks K, the GPU runs one fma chain per element): 1e-5 of the sum of the terms' magnitudes
/// covers a few hundred float roundings, K being 256, 512 or the batch here.
constexpr double sum_tolerance = 1e-5;
constexpr double floor_tolerance = 1e-6;  // for sums whose terms nearly all vanish

void expect_ok(int status, const char* what) {
  if (status != 0) {
    ++solder::test::gpu::failures;
    std::fprintf(stderr, "FAILED: %s returned %d: %s\n", what, status, solder_linear_relu_dropout_last_error());
  }
}

/// How many of `got` are off `want` by more than the tolerance of their magnitude sums.
std::size_t off_by_more(const std::vector<float>& want, const std::vector<float>& got, const std::vector<double>& mag) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    n += !(std::fabs(double(want[i]) - double(got[i])) <= sum_tolerance * mag[i] + floor_tolerance);
  return n;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void forward_and_backward() {
  std::vector<float> x(batch * in), dy(batch * out);
  fill_uniform(x, -1, 1, 1);
  fill_uniform(dy, -1, 1, 2);
  const ref::reference r = ref::run(x, dy, batch, seed, offset);

  device_vector<float> xd(x), wd(r.w), bd(r.b), dyd(dy), yd(batch * out), yd2(batch * out);
  expect_ok(solder_linear_relu_dropout_f32_256x512_fwd(xd.get(), wd.get(), bd.get(), yd.get(), batch, seed, offset,
                                                       nullptr),
            "linear_relu_dropout fwd");
  expect_ok(solder_linear_relu_dropout_f32_256x512_fwd(xd.get(), wd.get(), bd.get(), yd2.get(), batch, seed, offset,
                                                       nullptr),
            "linear_relu_dropout fwd (again)");
  const std::vector<float> y = yd.read(), y2 = yd2.read();

  // The mask: every dropped element is +0, as the CPU's.
  std::size_t mask_off = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float zero = 0.0f;
    mask_off += !r.keep[i] && std::memcmp(&y[i], &zero, sizeof zero) != 0;
  }
  expect(mask_off == 0, "linear_relu_dropout fwd: the dropped elements equal the CPU's +0 bit for bit");
  // Values: relu and the dropout's scale do not widen a difference of x W^T + b beyond the scale.
  std::vector<double> mag(batch * out);
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t j = 0; j < out; ++j) {
      double m = std::fabs(double(r.b[j]));
      for (std::size_t k = 0; k < in; ++k) m += std::fabs(double(x[i * in + k]) * double(r.w[j * in + k]));
      mag[i * out + j] = m * r.scale;
    }
  expect(off_by_more(r.y, y, mag) == 0, "linear_relu_dropout fwd: y within 1e-5 of the sums' magnitudes of the CPU's");
  expect(same_bits(y, y2), "linear_relu_dropout fwd: the same bits on a second call");

  // The backward from the CPU's y, so that both gate the same elements.
  device_vector<float> ycpu(r.y), dxd(batch * in), dwd(out * in), dbd(out), dxd2(batch * in), dwd2(out * in), dbd2(out);
  expect_ok(solder_linear_relu_dropout_f32_256x512_bwd(xd.get(), wd.get(), ycpu.get(), dyd.get(), dxd.get(), dwd.get(),
                                                       dbd.get(), batch, nullptr),
            "linear_relu_dropout bwd");
  expect_ok(solder_linear_relu_dropout_f32_256x512_bwd(xd.get(), wd.get(), ycpu.get(), dyd.get(), dxd2.get(),
                                                       dwd2.get(), dbd2.get(), batch, nullptr),
            "linear_relu_dropout bwd (again)");
  const std::vector<float> dx = dxd.read(), dw = dwd.read(), db = dbd.read();

  // |g| of the gate: dy scaled where y > 0, else 0 (relu's gate and the mask, read from y).
  std::vector<double> g(batch * out);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = r.y[i] > 0.0f ? std::fabs(double(dy[i])) * r.scale : 0.0;
  std::vector<double> mag_dx(batch * in, 0.0), mag_dw(out * in, 0.0), mag_db(out, 0.0);
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t j = 0; j < out; ++j) {
      const double gij = g[i * out + j];
      mag_db[j] += gij;
      for (std::size_t k = 0; k < in; ++k) {
        mag_dx[i * in + k] += gij * std::fabs(double(r.w[j * in + k]));
        mag_dw[j * in + k] += gij * std::fabs(double(x[i * in + k]));
      }
    }
  expect(off_by_more(r.dx, dx, mag_dx) == 0, "linear_relu_dropout bwd: dx within 1e-5 of the sums' magnitudes");
  expect(off_by_more(r.dw, dw, mag_dw) == 0, "linear_relu_dropout bwd: dw within 1e-5 of the sums' magnitudes");
  expect(off_by_more(r.db, db, mag_db) == 0, "linear_relu_dropout bwd: db within 1e-5 of the sums' magnitudes");
  expect(same_bits(dx, dxd2.read()) && same_bits(dw, dwd2.read()) && same_bits(db, dbd2.read()),
         "linear_relu_dropout bwd: the same bits on a second call");
}

/// A null pointer and an empty batch are refused with cudaErrorInvalidValue and a message.
void argument_checks() {
  device_vector<float> xd(in), wd(out * in), bd(out), yd(out);
  const int null_w = solder_linear_relu_dropout_f32_256x512_fwd(xd.get(), nullptr, bd.get(), yd.get(), 1, seed, offset,
                                                                nullptr);
  expect(null_w == int(cudaErrorInvalidValue) &&
             std::string(solder_linear_relu_dropout_last_error()).find("w is a null pointer") != std::string::npos,
         "linear_relu_dropout fwd: a null w is refused, named");
  const int empty = solder_linear_relu_dropout_f32_256x512_bwd(xd.get(), wd.get(), yd.get(), yd.get(), xd.get(), wd.get(),
                                                               bd.get(), 0, nullptr);
  expect(empty == int(cudaErrorInvalidValue), "linear_relu_dropout bwd: an empty batch is refused");
}

}  // namespace

int main() {
  return solder::test::gpu::run("solder_cuda_linear_chain",
                                "cuda:linear_chain: the generated linear + relu + dropout launchers match the CPU chain",
                                [] {
                                  forward_and_backward();
                                  argument_checks();
                                  cudaDeviceSynchronize();
                                });
}
