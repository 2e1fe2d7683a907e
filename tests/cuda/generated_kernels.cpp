// tests/cuda/generated_kernels.cpp: every launcher of kernels/ (solder-gen's output, built by
// nvcc into solder_kernels) called from code the C++ compiler builds alone, against the CPU
// layers the chains are made of: dropout masks bit for bit (the dropped elements are the same
// +0s), values within a few ulp (libm and CUDA's erf differ), parameter gradients within a
// stated tolerance, and the same bits on a second call. Exits 77 (skipped) without a device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bias_gelu_dropout.h"
#include "bias_relu_dropout.h"
#include "chains.hpp"
#include "layer_norm_gelu_dropout.h"
#include "solder/device.hpp"
#include "solder/solder.hpp"
#include "support/data.hpp"
#include "support/gpu_program.hpp"

namespace {

using namespace solder;

using test::gpu::expect;

void expect_ok(int status, const char* what, const char* message) {
  if (status != 0) {
    ++test::gpu::failures;
    std::fprintf(stderr, "FAILED: %s returned %d: %s\n", what, status, message);
  }
}

/// Elements dropped on one side and not on the other: the masks' only visible difference.
std::size_t mask_differences(const float* cpu, const float* gpu, std::size_t n) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < n; ++i) d += (cpu[i] == 0.0f) != (gpu[i] == 0.0f);
  return d;
}

/// Parameter gradients: sums over the batch in another order on each side; 1e-5 of the sum of
/// the terms' magnitudes, which the caller passes, covers a few hundred float roundings.
std::size_t sum_differences(const float* cpu, const float* gpu, const std::vector<double>& magnitude) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < magnitude.size(); ++i)
    d += !(std::fabs(double(cpu[i]) - double(gpu[i])) <= 1e-5 * magnitude[i] + 1e-6);
  return d;
}

template <class S>
tensor<float, S> from_device(const tensor<float, S, device>& d) {
  return to_host(d);
}

constexpr std::uint64_t seed = 0x5eedULL, offset = 11;
constexpr std::size_t batch = 157;  // not a multiple of the column walk's chunk of 128 rows

/// bias + gelu + dropout at 1024: forward, and backward from x with the mask regenerated.
void bias_gelu_dropout_chain() {
  using S = shape<dyn, 1024>;
  using block_type = std::tuple_element_t<0, ::bias_gelu_dropout::blocks_type>;
  block_type block;
  std::get<2>(block.layers).rng = {seed, offset};
  tensor<float, S> x(batch), dy(batch), y(batch), dx(batch);
  auto& b = std::get<0>(block.layers).value;
  test::fill_uniform(x, -3, 3, 1);
  test::fill_uniform(dy, -1, 1, 2);
  test::fill_uniform(b, -1, 1, 3);
  assign(y, block.expression<nn::mode::train>(x.ref(), b.ref()));
  block.backward(x, dy, dx);
  const auto& db = std::get<0>(block.layers).grad;

  auto xd = to_device(x), dyd = to_device(dy);
  auto bd = to_device(b);
  tensor<float, S, device> yd(batch), dxd(batch), dxd2(batch);
  tensor<float, shape<1024>, device> dbd, dbd2;
  expect_ok(solder_bias_gelu_dropout_f32_1024_fwd(xd.data(), bd.data(), yd.data(), batch, seed, offset, nullptr),
            "bias_gelu_dropout fwd", solder_bias_gelu_dropout_last_error());
  expect_ok(solder_bias_gelu_dropout_f32_1024_bwd(xd.data(), bd.data(), dyd.data(), dxd.data(), dbd.data(), batch, seed,
                                                  offset, nullptr),
            "bias_gelu_dropout bwd", solder_bias_gelu_dropout_last_error());
  expect_ok(solder_bias_gelu_dropout_f32_1024_bwd(xd.data(), bd.data(), dyd.data(), dxd2.data(), dbd2.data(), batch,
                                                  seed, offset, nullptr),
            "bias_gelu_dropout bwd (again)", solder_bias_gelu_dropout_last_error());
  const auto yg = from_device(yd), dxg = from_device(dxd), dxg2 = from_device(dxd2);
  const auto dbg = from_device(dbd), dbg2 = from_device(dbd2);
  expect(mask_differences(y.data(), yg.data(), y.size()) == 0, "bias_gelu_dropout: forward mask equals the CPU's");
  expect(test::ulp_differences(y.data(), yg.data(), y.size()) == 0, "bias_gelu_dropout: forward within a few ulp");
  expect(mask_differences(dx.data(), dxg.data(), dx.size()) == 0, "bias_gelu_dropout: backward mask equals the CPU's");
  expect(test::ulp_differences(dx.data(), dxg.data(), dx.size()) == 0, "bias_gelu_dropout: dx within a few ulp");
  std::vector<double> mag(1024, 0.0);
  for (std::size_t i = 0; i < dx.size(); ++i) mag[i % 1024] += std::fabs(double(dx[i]));
  expect(sum_differences(db.data(), dbg.data(), mag) == 0, "bias_gelu_dropout: db within 1e-5 of the CPU's");
  expect(test::bit_differences(dxg.data(), dxg2.data(), dx.size()) == 0 &&
             test::bit_differences(dbg.data(), dbg2.data(), 1024) == 0,
         "bias_gelu_dropout: the same bits on a second call");
}

/// layer_norm at 1024, then gelu + dropout: the row kernels and an elementwise group.
void layer_norm_gelu_dropout_chain() {
  using S = shape<dyn, 1024>;
  nn::layer_norm<1024> ln;
  test::fill_uniform(ln.weight, 0.5, 1.5, 4);
  test::fill_uniform(ln.bias, -0.5, 0.5, 5);
  tensor<float, S> x(batch), y(batch), dy(batch), dx(batch);
  test::fill_uniform(x, -2, 2, 6);
  test::fill_uniform(dy, -1, 1, 7);
  ln.forward(x, y);
  ln.backward(x, y, dy, dx);

  auto xd = to_device(x), dyd = to_device(dy);
  auto wd = to_device(ln.weight), bd = to_device(ln.bias);
  tensor<float, S, device> yd(batch), dxd(batch);
  tensor<float, shape<dyn>, device> mean(batch), rstd(batch);
  tensor<float, shape<1024>, device> dwd, dbd;
  expect_ok(solder_layer_norm_f32_1024_fwd(xd.data(), wd.data(), bd.data(), yd.data(), mean.data(), rstd.data(), batch,
                                           ln.eps, nullptr),
            "layer_norm fwd", solder_layer_norm_gelu_dropout_last_error());
  expect_ok(solder_layer_norm_f32_1024_bwd(xd.data(), dyd.data(), wd.data(), mean.data(), rstd.data(), dxd.data(),
                                           dwd.data(), dbd.data(), batch, nullptr),
            "layer_norm bwd", solder_layer_norm_gelu_dropout_last_error());
  const auto yg = from_device(yd), dxg = from_device(dxd);
  const auto dwg = from_device(dwd), dbg = from_device(dbd);
  // Row statistics in another order on each side: 1e-5 of the row's scale.
  std::size_t off = 0;
  for (std::size_t i = 0; i < y.size(); ++i) off += !(std::fabs(y[i] - yg[i]) <= 1e-5f * (1.0f + std::fabs(y[i])));
  expect(off == 0, "layer_norm: y within 1e-5 of the CPU's");
  off = 0;
  for (std::size_t i = 0; i < dx.size(); ++i) off += !(std::fabs(dx[i] - dxg[i]) <= 1e-4f * (1.0f + std::fabs(dx[i])));
  expect(off == 0, "layer_norm: dx within 1e-4 of the CPU's (sums over the row of products)");
  std::vector<double> mw(1024, 0.0), mb(1024, 0.0);
  for (std::size_t i = 0; i < dy.size(); ++i) {
    mw[i % 1024] += std::fabs(double(dy[i])) * 4.0;  // |x_hat| stays below ~4 for these rows
    mb[i % 1024] += std::fabs(double(dy[i]));
  }
  expect(sum_differences(ln.weight_grad.data(), dwg.data(), mw) == 0, "layer_norm: dweight within 1e-5 of the CPU's");
  expect(sum_differences(ln.bias_grad.data(), dbg.data(), mb) == 0, "layer_norm: dbias within 1e-5 of the CPU's");

  // The gelu + dropout group on the layer norm's output.
  using block_type = std::tuple_element_t<1, ::layer_norm_gelu_dropout::blocks_type>;
  block_type block;
  std::get<1>(block.layers).rng = {seed, offset};
  tensor<float, S> z(batch), dz(batch);
  assign(z, block.expression<nn::mode::train>(y.ref()));
  block.backward(y, dy, dz);
  auto yd_cpu = to_device(y);
  tensor<float, S, device> zd(batch), dzd(batch);
  expect_ok(solder_gelu_dropout_f32_1024_fwd(yd_cpu.data(), zd.data(), batch, seed, offset, nullptr), "gelu_dropout fwd",
            solder_layer_norm_gelu_dropout_last_error());
  expect_ok(solder_gelu_dropout_f32_1024_bwd(yd_cpu.data(), dyd.data(), dzd.data(), batch, seed, offset, nullptr),
            "gelu_dropout bwd", solder_layer_norm_gelu_dropout_last_error());
  const auto zg = from_device(zd), dzg = from_device(dzd);
  expect(mask_differences(z.data(), zg.data(), z.size()) == 0, "gelu_dropout: forward mask equals the CPU's");
  expect(test::ulp_differences(z.data(), zg.data(), z.size()) == 0, "gelu_dropout: forward within a few ulp");
  expect(test::ulp_differences(dz.data(), dzg.data(), dz.size()) == 0, "gelu_dropout: dx within a few ulp");
}

/// bias + relu + dropout at 4096: forward, and backward from the saved output.
void bias_relu_dropout_chain() {
  using S = shape<dyn, 4096>;
  using block_type = std::tuple_element_t<0, ::bias_relu_dropout::blocks_type>;
  block_type block;
  std::get<2>(block.layers).rng = {seed, offset};
  tensor<float, S> x(batch), dy(batch), y(batch), dx(batch);
  auto& b = std::get<0>(block.layers).value;
  test::fill_uniform(x, -2, 2, 8);
  test::fill_uniform(dy, -1, 1, 9);
  test::fill_uniform(b, -1, 1, 10);
  assign(y, block.expression<nn::mode::train>(x.ref(), b.ref()));
  block.backward_from_output(y, dy, dx);
  const auto& db = std::get<0>(block.layers).grad;

  auto xd = to_device(x), dyd = to_device(dy);
  auto bd = to_device(b);
  tensor<float, S, device> yd(batch), dxd(batch);
  tensor<float, shape<4096>, device> dbd;
  expect_ok(solder_bias_relu_dropout_f32_4096_fwd(xd.data(), bd.data(), yd.data(), batch, seed, offset, nullptr),
            "bias_relu_dropout fwd", solder_bias_relu_dropout_last_error());
  expect_ok(solder_bias_relu_dropout_f32_4096_bwd(yd.data(), dyd.data(), dxd.data(), dbd.data(), batch, nullptr),
            "bias_relu_dropout bwd", solder_bias_relu_dropout_last_error());
  const auto yg = from_device(yd), dxg = from_device(dxd);
  const auto dbg = from_device(dbd);
  expect(test::bit_differences(y.data(), yg.data(), y.size()) == 0, "bias_relu_dropout: forward equals the CPU bit for bit");
  expect(test::bit_differences(dx.data(), dxg.data(), dx.size()) == 0, "bias_relu_dropout: dx equals the CPU bit for bit");
  std::vector<double> mag(4096, 0.0);
  for (std::size_t i = 0; i < dx.size(); ++i) mag[i % 4096] += std::fabs(double(dx[i]));
  expect(sum_differences(db.data(), dbg.data(), mag) == 0, "bias_relu_dropout: db within 1e-5 of the CPU's");
}

}  // namespace

int main() {
  return test::gpu::run("tests/cuda/generated_kernels.cpp", "solder: the generated kernels match the CPU layers", [] {
    bias_relu_dropout_chain();
    bias_gelu_dropout_chain();
    layer_norm_gelu_dropout_chain();
    cudaDeviceSynchronize();
  });
}
