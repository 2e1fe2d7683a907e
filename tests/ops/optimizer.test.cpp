// tests/ops/optimizer.test.cpp: the optimizer math of ops/optimizer.hpp that is not a
// per-element update: the hyperparameters (torch's defaults, names and the settings it refuses,
// checked once here for the CPU optimizers and the CUDA train steps alike) and the blocked sum of
// squares of gradient clipping (block boundaries, the accumulator order, exact sums of small
// integers, NaN and infinity).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/ops/optimizer.hpp"

namespace {

using Catch::Matchers::Contains;
using solder::ops::adam_options;
using solder::ops::sgd_options;
using solder::ops::square_sum;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float inf = std::numeric_limits<float>::infinity();

/// The names for_each_field gives, in order.
template <class O>
std::vector<std::string> field_names() {
  O o{};
  std::vector<std::string> names;
  O::for_each_field(o, [&](const char* name, auto&) { names.emplace_back(name); });
  return names;
}

}  // namespace

TEST_CASE("ops optimizer: hyperparameters with torch's names, defaults and checks", "[ops][optim]") {
  CHECK(field_names<sgd_options>() == std::vector<std::string>{"lr", "momentum", "dampening", "weight_decay", "nesterov"});
  CHECK(field_names<adam_options<false>>() == std::vector<std::string>{"lr", "beta1", "beta2", "eps", "weight_decay"});
  const sgd_options sgd{.lr = 0.1f};
  CHECK((sgd.momentum == 0.0f && sgd.dampening == 0.0f && sgd.weight_decay == 0.0f && !sgd.nesterov));
  const adam_options<false> adam{};
  CHECK((adam.lr == 1e-3f && adam.beta1 == 0.9f && adam.beta2 == 0.999f && adam.eps == 1e-8f));
  CHECK(adam.weight_decay == 0.0f);
  CHECK(adam_options<true>{}.weight_decay == 1e-2f);  // AdamW decays by default, as torch

  CHECK_NOTHROW(sgd_options::check({.lr = 0.1f, .momentum = 0.9f, .nesterov = true}));
  CHECK_THROWS_WITH(sgd_options::check({.lr = -0.1f}), Contains("solder::optim::sgd: lr must be >= 0"));
  CHECK_THROWS_WITH(sgd_options::check({.lr = qnan}), Contains("lr must be >= 0"));
  CHECK_THROWS_WITH(sgd_options::check({.lr = 0.1f, .momentum = -1.0f}), Contains("momentum must be >= 0"));
  CHECK_THROWS_WITH(sgd_options::check({.lr = 0.1f, .dampening = qnan}), Contains("dampening is NaN"));
  CHECK_THROWS_WITH(sgd_options::check({.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}),
                    "solder::optim::sgd: Nesterov momentum requires momentum > 0 and dampening = 0");
  CHECK_NOTHROW(adam_options<false>::check({}));
  CHECK_THROWS_WITH(adam_options<false>::check({.beta1 = 1.0f}), Contains("solder::optim::adam: beta1 must be in [0, 1), got 1"));
  CHECK_THROWS_WITH(adam_options<true>::check({.beta2 = -0.5f}), Contains("solder::optim::adamw: beta2 must be in [0, 1)"));
  CHECK_THROWS_WITH(adam_options<false>::check({.eps = -1.0f}), Contains("eps must be >= 0"));
  CHECK_THROWS_WITH(adam_options<true>::check({.weight_decay = qnan}), Contains("weight_decay must be >= 0"));
  CHECK_THROWS_WITH(adam_options<true>::check_lr(-1.0f), Contains("solder::optim::adamw: lr must be >= 0"));
}

TEST_CASE("ops optimizer: the sum of squares by blocks", "[ops][optim]") {
  CHECK(square_sum::blocks(0) == 0);
  CHECK(square_sum::blocks(1) == 1);
  CHECK(square_sum::blocks(square_sum::block) == 1);
  CHECK(square_sum::blocks(square_sum::block + 1) == 2);

  // Small integers: every square and every partial sum is exact in double, so each block's
  // sum is the exact one whatever the order.
  const std::size_t n = 2 * square_sum::block + 7;  // two whole blocks and a tail of 7
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(int(i % 23) - 11);
  for (std::size_t b = 0; b < square_sum::blocks(n); ++b) {
    double exact = 0;
    for (std::size_t i = b * square_sum::block; i < std::min(n, (b + 1) * square_sum::block); ++i)
      exact += double(x[i]) * double(x[i]);
    CHECK(square_sum::of_block(x.data(), n, b) == exact);
  }

  // The accumulator order, (a0 + a1) + (a2 + a3) with a_k over i = k mod 4: x_0^2 = 2^60 in a0
  // and 256 ones in a1 add up to 2^60 + 256 (exact: a double's spacing at 2^60 is 256), where a
  // running sum would round each 1 away and keep 2^60.
  std::vector<float> y(square_sum::block, 0.0f);
  y[0] = 0x1p30f;
  for (std::size_t i = 1; i < y.size(); i += 4) y[i] = 1.0f;
  CHECK(square_sum::of_block(y.data(), y.size(), 0) == 0x1p60 + 256.0);

  // NaN and infinity reach the sum.
  std::vector<float> w(10, 1.0f);
  w[9] = inf;
  CHECK(square_sum::of_block(w.data(), w.size(), 0) == std::numeric_limits<double>::infinity());
  w[3] = qnan;
  CHECK(std::isnan(square_sum::of_block(w.data(), w.size(), 0)));
  // A float whose square overflows float is finite in double.
  const std::vector<float> huge = {3e38f};
  CHECK(square_sum::of_block(huge.data(), 1, 0) == double(3e38f) * double(3e38f));
}
