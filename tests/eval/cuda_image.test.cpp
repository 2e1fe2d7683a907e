// tests/eval/cuda_image.test.cpp: the CUDA backend's batch normalization (a warp per channel,
// eval/cuda/batch_norm.hpp) and pooling bodies (eval/cuda/pool.hpp) run on the host as the
// kernels of eval/cuda/image_kernels.hpp run them (an emulated warp per channel; every flat
// index), against the CPU layers: batch norm's outputs, running statistics and gradients
// within the rounding of sums taken in another order; pooling bit for bit (the same
// per-element bodies, here reached through the device's index decomposition).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "solder/eval/cuda/batch_norm.hpp"
#include "solder/eval/cuda/pool.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/pool.hpp"
#include "support/data.hpp"
#include "support/warp_emulation.hpp"

namespace {

using namespace solder;
namespace cu = solder::eval::cuda;
using solder::test::bit_differences;

/// Elements of a farther from b than tol relative to scale + |b|.
std::size_t far_apart(const float* a, const float* b, std::size_t n, double tol, double scale) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !(std::abs(double(a[i]) - double(b[i])) <= tol * (scale + std::abs(double(b[i]))));
  return bad;
}

}  // namespace

TEST_CASE("cuda batch_norm: training forward and backward, a warp per channel, against the CPU layer", "[cuda][batch_norm]") {
  constexpr std::size_t C = 5, H = 7, W = 9, HW = H * W;
  const std::size_t batch = 3;
  using S = shape<dyn, C, H, W>;
  tensor<float, S> x(batch), y_cpu(batch), y(batch), dy(batch), dx_cpu(batch), dx(batch);
  test::fill_uniform(x, -2, 3, 101);  // mean away from zero: the shifted sums matter
  test::fill_uniform(dy, -1, 1, 102);
  nn::batch_norm<C> cpu;
  test::fill_uniform(cpu.weight, 0.5, 1.5, 103);
  test::fill_uniform(cpu.bias, -0.5, 0.5, 104);
  test::fill_uniform(cpu.running_mean, -0.1, 0.1, 105);
  test::fill_uniform(cpu.running_var, 0.9, 1.1, 106);
  std::vector<float> running_mean(cpu.running_mean.data(), cpu.running_mean.data() + C),
      running_var(cpu.running_var.data(), cpu.running_var.data() + C), mean(C), rstd(C), dw(C), db(C);
  cpu.train();
  cpu.forward(x, y_cpu);
  cpu.backward(x, y_cpu, dy, dx_cpu);

  const cu::batch_norm_train_forward_body<HW> fwd{x.data(), y.data(), cpu.weight.data(), cpu.bias.data(), running_mean.data(),
                                                  running_var.data(), mean.data(), rstd.data(), batch, C, cpu.eps, cpu.momentum};
  test::run_warp(C, fwd);
  const cu::batch_norm_train_backward_body<HW> bwd{x.data(), dy.data(), dx.data(), cpu.weight.data(), mean.data(), rstd.data(),
                                                   dw.data(), db.data(), batch, C};
  test::run_warp(C, bwd);

  // The plane sums meet in another order than the CPU walker's: a few roundings of the values.
  CHECK(far_apart(y.data(), y_cpu.data(), y.size(), 1e-5, 1.0) == 0);
  CHECK(far_apart(running_mean.data(), cpu.running_mean.data(), C, 1e-5, 1.0) == 0);
  CHECK(far_apart(running_var.data(), cpu.running_var.data(), C, 1e-5, 1.0) == 0);
  CHECK(far_apart(dx.data(), dx_cpu.data(), dx.size(), 1e-4, 1.0) == 0);
  CHECK(far_apart(dw.data(), cpu.weight_grad.data(), C, 1e-5, double(batch * HW)) == 0);
  CHECK(far_apart(db.data(), cpu.bias_grad.data(), C, 1e-5, double(batch * HW)) == 0);
  // Normalized per channel: each output channel has mean bias[c] (the affine's shift).
  for (std::size_t c = 0; c < C; ++c) {
    double s = 0;
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t p = 0; p < HW; ++p) s += y.data()[(n * C + c) * HW + p];
    CHECK(std::abs(s / double(batch * HW) - double(cpu.bias[c])) < 1e-4);
  }
}

namespace {

/// A pooling layer's forward and backward on the CPU against the device bodies over every index.
template <class Layer, cu::pool_kind Kind, std::size_t C, std::size_t H, std::size_t W, std::size_t Ho, std::size_t Wo>
void check_pool(Layer& layer, std::size_t K, std::size_t S, std::size_t P, bool count_include_pad = true) {
  const std::size_t batch = 2;
  tensor<float, shape<dyn, C, H, W>> x(batch), dx_cpu(batch), dx(batch);
  tensor<float, shape<dyn, C, Ho, Wo>> y_cpu(batch), y(batch), dy(batch);
  test::fill_uniform(x, -1, 1, 111);
  test::fill_uniform(dy, -1, 1, 112);
  x.data()[5] = NAN;  // a NaN wins its max window, as torch
  layer.forward(x, y_cpu);
  layer.backward(x, y_cpu, dy, dx_cpu);
  using I = ops::pool2d::index;
  const ops::pool2d::geometry g{I(C), I(H), I(W), I(Ho), I(Wo), I(K), I(S), I(P)};
  std::vector<std::int32_t> argmax(y.size());
  const cu::pool_forward_body<Kind> fwd{x.data(), y.data(), argmax.data(), g, count_include_pad};
  for (std::size_t k = 0; k < y.size(); ++k) fwd(k);
  const cu::pool_backward_body<Kind> bwd{dy.data(), argmax.data(), dx.data(), g, count_include_pad};
  for (std::size_t k = 0; k < dx.size(); ++k) bwd(k);
  CHECK(test::bit_differences_any_nan(y.data(), y_cpu.data(), y.size()) == 0);
  CHECK(bit_differences(dx.data(), dx_cpu.data(), dx.size()) == 0);
}

}  // namespace

TEST_CASE("cuda pooling: max, average and adaptive average, forward and backward, equal to the CPU layers", "[cuda][pool]") {
  nn::max_pool2d<3, 2, 1> max_pool;
  check_pool<decltype(max_pool), cu::pool_kind::max, 3, 9, 8, 5, 4>(max_pool, 3, 2, 1);
  nn::avg_pool2d<3, 2, 1, false> avg_pool;
  check_pool<decltype(avg_pool), cu::pool_kind::avg, 3, 9, 8, 5, 4>(avg_pool, 3, 2, 1, false);
  nn::adaptive_avg_pool2d<4, 3> adaptive;
  check_pool<decltype(adaptive), cu::pool_kind::adaptive_avg, 2, 9, 7, 4, 3>(adaptive, 1, 1, 0);
}
