// tests/ops/batch_norm.test.cpp: ops::batch_norm_fold, evaluation mode's normalization folded
// into the product before it (what nn::linear_block and nn::conv_block fold with): known values,
// the formula in double rounded once, its multiply-add fused (bit for bit, on seeded values over
// wide ranges; a case where fusing changes the bits), a zero bias, and NaN or infinite statistics.
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>

#include <catch2/catch.hpp>

#include "solder/ops/batch_norm.hpp"

namespace {

using solder::ops::batch_norm_fold;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float inf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("ops batch_norm_fold: known values", "[ops][batch_norm]") {
  // gamma = 6, var = 8, eps = 1: s = 6 / 3 = 2; W' = 2 W; b' = (b - 5) 2 + 0.5.
  const batch_norm_fold f(6.0f, 0.5f, 5.0f, 8.0f, 1.0);
  CHECK(f.scale == 2.0);
  CHECK(f.weight(1.25f) == 2.5f);
  CHECK(f.weight(-3.0f) == -6.0f);
  CHECK(f.bias(7.0) == 4.5f);
  CHECK(f.bias(0.0) == -9.5f);  // a product without a bias
  // gamma = 0 folds the channel away: W' = 0 (signed as W), b' = beta.
  const batch_norm_fold zero(0.0f, -1.5f, 3.0f, 2.0f, 1e-5);
  CHECK(zero.weight(4.0f) == 0.0f);
  CHECK(zero.bias(10.0) == -1.5f);
}

TEST_CASE("ops batch_norm_fold: s, W' and b' in double, rounded once", "[ops][batch_norm]") {
  std::mt19937 gen(20260);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f), variance(0.0f, 9.0f);
  std::uniform_int_distribution<int> scale(-20, 20);
  for (int k = 0; k < 1000; ++k) {
    const float gamma = std::ldexp(value(gen), scale(gen)), beta = value(gen), mean = std::ldexp(value(gen), scale(gen));
    const float var = std::ldexp(variance(gen), scale(gen)), w = value(gen);
    const double b = double(value(gen)), eps = 1e-5;
    CAPTURE(gamma, beta, mean, var, w, b);
    const batch_norm_fold f(gamma, beta, mean, var, eps);
    const double s = double(gamma) / std::sqrt(double(var) + eps);
    CHECK(f.scale == s);
    CHECK(f.weight(w) == float(double(w) * s));
    CHECK(f.bias(b) == float(std::fma(b - double(mean), s, double(beta))));
  }
}

TEST_CASE("ops batch_norm_fold: b' is one fused multiply-add", "[ops][batch_norm]") {
  // (b - mean) s = (1 + 2^-30)^2 = 1 + 2^-29 + 2^-60, beta = -(1 + 2^-29): fused, b' = 2^-60;
  // the product rounded first loses the 2^-60 and gives 0.
  batch_norm_fold f(1.0f, 0.0f, 0.0f, 1.0f, 0.0);
  f.scale = 1 + 0x1p-30;
  f.mean = 0;
  f.beta = -(1 + 0x1p-29);
  CHECK(f.bias(1 + 0x1p-30) == 0x1p-60f);
}

TEST_CASE("ops batch_norm_fold: NaN and infinite statistics", "[ops][batch_norm]") {
  // A NaN running variance makes the channel's W' and b' NaN.
  const batch_norm_fold nan_var(1.0f, 0.0f, 0.0f, qnan, 1e-5);
  CHECK(std::isnan(nan_var.weight(1.0f)));
  CHECK(std::isnan(nan_var.bias(1.0)));
  // An infinite variance scales by 0: W' = 0 and b' = beta (a finite mean).
  const batch_norm_fold inf_var(1.0f, 0.25f, 2.0f, inf, 1e-5);
  CHECK(inf_var.weight(3.0f) == 0.0f);
  CHECK(inf_var.bias(1.0) == 0.25f);
  // An infinite mean: b' is -inf for s > 0, W' is unaffected.
  const batch_norm_fold inf_mean(1.0f, 0.0f, inf, 3.0f, 1.0);
  CHECK(inf_mean.weight(3.0f) == 1.5f);
  CHECK(inf_mean.bias(0.0) == -inf);
}
