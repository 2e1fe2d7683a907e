// tests/eval/cuda_batch_norm_uncontracted.test.cpp: the CUDA backend's batch-norm bodies
// (eval/cuda/batch_norm.hpp) compiled with floating-point contraction off, as a compiler that
// contracts a * b + c otherwise than the CPU build does: the results they give here are checked
// against the CPU layer's in cuda_batch_norm_bits.test.cpp, so a multiply-add the bodies leave
// to the compiler (rather than writing it as an fma) shows up as a difference in the bits.
// GCC reads the pragma below; it must precede every include so that all code in this file, the
// headers' inline functions included, is compiled under it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "solder/eval/cuda/batch_norm.hpp"
#include "support/warp_emulation.hpp"

namespace solder::test::uncontracted {

/// batch_norm_fold_body over one channel of PerChannel = 2 weights; the folded bias.
float folded_bias(float conv_weight, float conv_bias, float gamma, float beta, float running_mean, float running_var,
                  double eps) {
  const float w[2] = {conv_weight, conv_weight};
  float folded_w[2] = {}, folded_b = 0;
  const eval::cuda::batch_norm_fold_body<2> body{w,     &conv_bias,   &gamma,  &beta, &running_mean, &running_var,
                                                  folded_w, &folded_b, 1, eps};
  for (std::size_t i = 0; i < body.elements(); ++i) body(i);
  return folded_b;
}

/// batch_norm_train_forward_body over x [batch, 1, 4] on an emulated warp; the running mean
/// and variance it leaves, from `running_mean` and `running_var`.
void train_running(const std::vector<float>& x, std::size_t batch, double momentum, float& running_mean,
                   float& running_var) {
  constexpr std::size_t HW = 4;
  std::vector<float> y(x.size());
  const float weight = 1.0f, bias = 0.0f;
  float mean = 0, rstd = 0;
  const eval::cuda::batch_norm_train_forward_body<HW> body{x.data(), y.data(), &weight,   &bias, &running_mean,
                                                           &running_var, &mean, &rstd, batch, 1, 1e-5, momentum};
  test::run_warp(1, body);
}

/// a * b + c as written, in this file: contracted into one fma unless contraction is off. The
/// operands pass through volatile copies, so the compiler cannot fold the constants (it folds
/// without contracting).
double written_multiply_add(double a, double b, double c) {
  const volatile double va = a, vb = b, vc = c;
  return va * vb + vc;
}

}  // namespace solder::test::uncontracted

TEST_CASE("cuda batch_norm: this file is compiled without floating-point contraction", "[cuda][batch_norm]") {
  // 3 * round(1/3) - 1 is -2^-54 in one rounding and 0 in two: the test of the other file
  // relies on this file rounding twice where its code does not ask for an fma.
  CHECK(solder::test::uncontracted::written_multiply_add(3.0, 1.0 / 3.0, -1.0) == 0.0);
}
