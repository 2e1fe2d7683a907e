// tests/eval/cuda_batch_norm_bits.test.cpp: the CUDA backend's batch-norm fold and running
// statistics (eval/cuda/batch_norm.hpp) equal to the CPU layer's bits whatever the compiler
// contracts: the bodies run as compiled in cuda_batch_norm_uncontracted.test.cpp (contraction
// off), the CPU's as this suite compiles it. Each case's values are chosen so that one fused
// multiply-add and a multiply then an add round to different floats (a sum that cancels to
// below the products' rounding), so a multiply-add the bodies leave to the compiler differs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "solder/nn/batch_norm.hpp"
#include "solder/ops/batch_norm.hpp"
#include "solder/simd.hpp"
#include "support/data.hpp"

namespace solder::test::uncontracted {
float folded_bias(float conv_weight, float conv_bias, float gamma, float beta, float running_mean, float running_var,
                  double eps);
void train_running(const std::vector<float>& x, std::size_t batch, double momentum, float& running_mean,
                   float& running_var);
}  // namespace solder::test::uncontracted

namespace {

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// The CPU's folded bias: ops::batch_norm_fold, as nn::conv_block::fold and nn::linear_block
/// call it. The inputs pass through volatile copies, so that the compiler sees run-time values
/// (it folds constants without contracting).
float cpu_folded_bias(float conv_bias, float gamma, float beta, float running_mean, float running_var, double eps) {
  const volatile float vb = conv_bias, vg = gamma, vbeta = beta, vm = running_mean, vv = running_var;
  const volatile double ve = eps;
  return solder::ops::batch_norm_fold(vg, vbeta, vm, vv, ve).bias(double(vb));
}

}  // namespace

TEST_CASE("cuda batch_norm: the folded bias equals the CPU's bits under any contraction", "[cuda][batch_norm]") {
  // s = 1 / sqrt(9) = round(1/3); (b - mean) s + beta = 3 round(1/3) - 1 = -2^-54 with one
  // rounding (an fma), 0 with two.
  const float conv_weight = 0.5f, conv_bias = 3.0f, gamma = 1.0f, beta = -1.0f, running_mean = 0.0f, running_var = 9.0f;
  const double eps = 0.0;
  const float cpu = cpu_folded_bias(conv_bias, gamma, beta, running_mean, running_var, eps);
  const float cuda =
      solder::test::uncontracted::folded_bias(conv_weight, conv_bias, gamma, beta, running_mean, running_var, eps);
  INFO("CPU " << cpu << ", CUDA body " << cuda);
  CHECK(bits(cuda) == bits(cpu));
}

TEST_CASE("cuda batch_norm: the running statistics equal the CPU layer's bits under any contraction", "[cuda][batch_norm]") {
  // A channel of 3s: the batch mean is 3, its variance 0. With momentum round(1/3) and a running
  // mean of -1.5, momentum 3 + (1 - momentum) (-1.5) cancels to -2^-54 with one rounding of
  // momentum 3, to 0 with two.
  constexpr std::size_t batch = 2, C = 1, H = 2, W = 2;
  solder::tensor<float, solder::shape<solder::dyn, C, H, W>> x(batch), y(batch);
  for (float& v : x) v = 3.0f;
  solder::nn::batch_norm<C> cpu(1e-5, 1.0 / 3.0);
  cpu.running_mean[0] = -1.5f;
  cpu.running_var[0] = 0.75f;
  float running_mean = cpu.running_mean[0], running_var = cpu.running_var[0];
  cpu.train();
  cpu.forward(x, y);

  solder::test::uncontracted::train_running(std::vector<float>(x.begin(), x.end()), batch, cpu.momentum, running_mean,
                                            running_var);
  // Both run ops::batch_norm::running, whose fma is written out: the same bits in every build,
  // whatever the compiler would contract.
  INFO("running mean: CPU " << cpu.running_mean[0] << ", CUDA body " << running_mean);
  CHECK(bits(running_mean) == bits(cpu.running_mean[0]));
  CHECK(bits(running_var) == bits(cpu.running_var[0]));
}
