// tests/nn/elementwise_block.test.cpp: nn::elementwise_block through its named instance nn::bias_relu_dropout: the fused
// forward and backward against the unfused composition and scalar loops, eval mode, the
// dropout keep rate, the backward's mask, fresh masks per step, static and dynamic batches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "solder/expr/reduce.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "support/data.hpp"

namespace {

using solder::test::make;
using solder::test::bit_differences;

using Catch::Matchers::WithinAbs;
using solder::dyn;
using solder::shape;
using solder::tensor;

/// Float's unit roundoff: summing n floats in any order errs by at most (n - 1) u sum|x_i|
/// (Higham 4.2); the tolerance of db, a column sum, against its double reference.
constexpr double unit_roundoff = 0x1p-24;
/// Deviations of the observed keep rate allowed, in standard deviations of a binomial count:
/// a correct generator fails this once in 1.7 million runs.
constexpr double keep_rate_sigmas = 5.0;

/// The layer's inputs: x in [-2, 2), the bias in [-1, 1), dy in [-1, 1).
template <class S, std::size_t N, class Layer>
struct setup {
  std::size_t batch;
  Layer layer;
  tensor<float, S> x = make<S>(batch), y = make<S>(batch), dy = make<S>(batch), dx = make<S>(batch);
  explicit setup(std::size_t b, std::uint32_t seed) : batch(b) {
    solder::test::fill_uniform(x, -2, 2, seed);
    solder::test::fill_uniform(layer.template layer<0>().value, -1, 1, seed + 1);
    solder::test::fill_uniform(dy, -1, 1, seed + 2);
  }
  const tensor<float, shape<N>>& bias() { return layer.template layer<0>().value; }
  const tensor<float, shape<N>>& bias_grad() { return layer.template layer<0>().grad; }
  solder::philox_state rng() { return layer.template layer<2>().rng; }
};

/// Forward and backward of bias_relu_dropout<N, P> on shape S against (a) the same math as
/// three separate solder assignments with temporaries and (b) scalar loops.
template <class S, std::size_t N, float P>
void check_against_unfused(std::size_t batch, std::uint32_t rounds = solder::random::philox_default_rounds) {
  using Layer = solder::nn::bias_relu_dropout<N, P>;
  setup<S, N, Layer> s(batch, 801);
  s.layer.template layer<2>().rng.rounds = rounds;
  const std::string at = solder::to_string<S>(batch) + ", p = " + std::to_string(P) + ", " + std::to_string(rounds) + " rounds";

  s.layer.train();
  s.layer.forward(s.x, s.y);
  const solder::philox_state rng = s.rng();  // the stream this forward drew from
  const auto& b = s.bias();

  // (a) Unfused forward: three passes through temporaries.
  auto pre = make<S>(batch), act = make<S>(batch), y_unfused = make<S>(batch);
  pre = s.x + b;
  act = solder::relu(pre);
  y_unfused = solder::dropout(act, P, rng);
  {
    INFO("forward on " << at << ": fused vs unfused");
    CHECK(bit_differences(s.y.data(), y_unfused.data(), s.y.size()) == 0);
  }
  // (b) Scalar forward: keep(i) ? max(x + b, 0) * scale : 0, the mask from its counter.
  const solder::test::dropout_rule rule{P, rng.seed, rng.offset, rng.rounds};
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    const float want = rule.keep(i) ? std::max(s.x[i] + b[i % N], 0.0f) * rule.scale() : 0.0f;
    wrong += std::memcmp(&want, &s.y[i], sizeof(float)) != 0;
  }
  {
    INFO("forward on " << at << ": fused vs scalar loop");
    CHECK(wrong == 0);
  }

  // Backward: dx = dy * keep * scale * (x + b > 0), db = sum over rows of dx.
  s.layer.backward(s.x, s.dy, s.dx);
  // (a) Unfused: dropout's backward is dropout of the gradient with the same mask.
  auto g1 = make<S>(batch), dx_unfused = make<S>(batch);
  tensor<float, shape<N>> db_unfused;
  g1 = solder::dropout(s.dy, P, rng);
  dx_unfused = solder::where(pre > 0.0f, g1, 0.0f);
  db_unfused = solder::sum<0>(dx_unfused);
  {
    INFO("backward dx on " << at << ": fused vs unfused");
    CHECK(bit_differences(s.dx.data(), dx_unfused.data(), s.dx.size()) == 0);
  }
  // (b) Scalar: dx is one float product where it is not 0, so it must match exactly; db is
  // checked against a double column sum within the summation bound.
  const std::size_t rows = s.x.size() / N;
  std::vector<double> db(N, 0.0), db_abs(N, 0.0);
  wrong = 0;
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    const float want = rule.keep(i) && s.x[i] + b[i % N] > 0.0f ? s.dy[i] * rule.scale() : 0.0f;
    wrong += want != s.dx[i];
    db[i % N] += want;
    db_abs[i % N] += std::fabs(want);
  }
  {
    INFO("backward dx on " << at << ": fused vs scalar loop");
    CHECK(wrong == 0);
  }
  std::size_t bad_db = 0, bad_unfused = 0;
  for (std::size_t j = 0; j < N; ++j) {
    const double tol = double(rows) * unit_roundoff * db_abs[j];
    bad_db += !WithinAbs(db[j], tol).match(s.bias_grad()[j]);
    bad_unfused += !WithinAbs(double(db_unfused[j]), 2 * tol).match(s.bias_grad()[j]);
  }
  INFO("backward db on " << at);
  CHECK(bad_db == 0);
  CHECK(bad_unfused == 0);
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("elementwise_block: bias_relu_dropout equals the unfused composition", "[nn]", ((int B, int N), B, N),
                       (3, 37), (1, 257), (17, 255), (5, 768)) {
  // (5, 768): rows of three whole segments, the next of which a pass draws inline (7 rounds).
  check_against_unfused<shape<B, N>, N, 0.1f>(1);
}

TEST_CASE("elementwise_block: bias_relu_dropout with p = 0.5 equals the unfused composition", "[nn]") {
  check_against_unfused<shape<3, 37>, 37, 0.5f>(1);
}

TEST_CASE("elementwise_block: bias_relu_dropout on a dynamic batch equals the unfused composition", "[nn]") {
  const std::size_t batch = GENERATE(1, 3, 100);
  check_against_unfused<shape<dyn, 37>, 37, 0.1f>(batch);
}

TEST_CASE("elementwise_block: a dropout stream of 10 Philox rounds equals the unfused composition", "[nn]") {
  check_against_unfused<shape<17, 255>, 255, 0.1f>(1, 10);
  check_against_unfused<shape<dyn, 37>, 37, 0.5f>(100, 10);
  check_against_unfused<shape<5, 768>, 768, 0.1f>(1, 10);
}

TEST_CASE("elementwise_block: the stream's rounds pick the masks; other than 7 or 10 is an error", "[nn]") {
  using Layer = solder::nn::bias_relu_dropout<64, 0.5f>;
  setup<shape<dyn, 64>, 64, Layer> seven(8, 5), ten(8, 5);
  ten.layer.template layer<2>().rng.rounds = 10;
  seven.layer.train();
  ten.layer.train();
  seven.layer.forward(seven.x, seven.y);
  ten.layer.forward(ten.x, ten.y);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < seven.y.size(); ++i) differ += (seven.y[i] == 0.0f) != (ten.y[i] == 0.0f);
  CHECK(differ > seven.y.size() / 8);  // two independent masks at p = 0.5 differ in about half

  setup<shape<dyn, 64>, 64, Layer> bad(8, 5);
  bad.layer.template layer<2>().rng.rounds = 8;
  bad.layer.train();
  const std::vector<float> before(bad.y.data(), bad.y.data() + bad.y.size());
  CHECK_THROWS_WITH(bad.layer.forward(bad.x, bad.y), Catch::Matchers::Contains("a Philox stream runs 7 or 10 rounds, not 8"));
  CHECK(std::equal(before.begin(), before.end(), bad.y.data()));
}

TEST_CASE("elementwise_block: a batch mismatch between input and output throws solder::error", "[nn]") {
  solder::nn::bias_relu_dropout<37, 0.1f> layer;
  tensor<float, shape<dyn, 37>> x(3), y(4), dy(3), dx(4);
  CHECK_THROWS_AS(layer.forward(x, y), solder::error);
  CHECK_THROWS_AS(layer.backward(x, dy, dx), solder::error);
}

TEST_CASE("elementwise_block: eval mode is relu(x + b), forward and backward", "[nn]") {
  constexpr std::size_t N = 37;
  using S = shape<3, N>;
  setup<S, N, solder::nn::bias_relu_dropout<N, 0.5f>> s(1, 811);
  s.layer.eval();
  s.layer.forward(s.x, s.y);
  const auto& b = s.bias();
  tensor<float, S> want;
  want = solder::relu(s.x + b);
  CHECK(bit_differences(s.y.data(), want.data(), want.size()) == 0);
  for (std::size_t i = 0; i < s.x.size(); ++i) CHECK(s.y[i] == std::max(s.x[i] + b[i % N], 0.0f));
  const auto rng_before = s.rng();
  s.layer.forward(s.x, s.y);
  CHECK(s.rng().offset == rng_before.offset);  // no mask drawn, none consumed

  s.layer.backward(s.x, s.dy, s.dx);
  for (std::size_t i = 0; i < s.x.size(); ++i) CHECK(s.dx[i] == (s.x[i] + b[i % N] > 0.0f ? s.dy[i] : 0.0f));
  for (std::size_t j = 0; j < N; ++j) {
    double db = 0, scale = 0;
    for (std::size_t r = 0; r < 3; ++r) {
      db += s.dx[r * N + j];
      scale += std::fabs(s.dx[r * N + j]);
    }
    CHECK_THAT(s.bias_grad()[j], WithinAbs(db, 3 * unit_roundoff * scale));
  }
}

TEMPLATE_TEST_CASE_SIG("elementwise_block: the dropout keep rate is 1 - p within 5 sigma over 1M elements", "[nn]",
                       ((int Percent), Percent), (10), (50)) {
  constexpr float p = Percent / 100.0f;
  constexpr std::size_t N = 1024;
  using S = shape<1024, N>;
  solder::nn::bias_relu_dropout<N, p> layer;  // bias 0
  tensor<float, S> x, y;
  solder::test::fill_uniform(x, 0.5, 1.5, 821);  // positive: y > 0 exactly where kept
  layer.forward(x, y);
  std::size_t kept = 0;
  for (float v : y) kept += v > 0.0f;
  const double n = double(x.size());
  const double rate = double(kept) / n;
  const double sigma = std::sqrt(double(p) * (1 - double(p)) / n);
  INFO("p = " << p << ": kept " << kept << " of " << x.size() << ", rate " << rate << ", sigma " << sigma);
  CHECK(std::fabs(rate - (1.0 - double(p))) <= keep_rate_sigmas * sigma);
}

TEST_CASE("elementwise_block: backward uses the forward's mask", "[nn]") {
  // dy = 1 and every pre-activation positive: dx = scale where the forward kept, 0 elsewhere,
  // so y > 0 exactly where dx != 0.
  auto check_masks = [](auto& layer, auto& x, auto& y, auto& dy, auto& dx, const std::string& what) {
    solder::test::fill_uniform(x, 0.5, 1.5, 831);
    dy.fill(1.0f);
    layer.forward(x, y);
    layer.backward(x, dy, dx);
    std::size_t mismatched = 0, kept = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      mismatched += (y[i] > 0.0f) != (dx[i] != 0.0f);
      kept += y[i] > 0.0f;
    }
    INFO(what << ": " << kept << " of " << x.size() << " kept");
    CHECK(mismatched == 0);
    CHECK(kept > 0);
    CHECK(kept < x.size());
  };
  solder::nn::bias_relu_dropout<255, 0.5f> layer;
  tensor<float, shape<17, 255>> x, y, dy, dx;
  check_masks(layer, x, y, dy, dx, "[17, 255]");
  tensor<float, shape<dyn, 255>> xd(33), yd(33), dyd(33), dxd(33);
  check_masks(layer, xd, yd, dyd, dxd, "dynamic [33, 255]");
  // Several steps: each backward follows the latest forward.
  for (int step = 0; step < 3; ++step) check_masks(layer, x, y, dy, dx, "[17, 255], step " + std::to_string(step));
}

TEST_CASE("elementwise_block: successive training forwards draw different masks", "[nn]") {
  constexpr std::size_t N = 257;
  solder::nn::bias_relu_dropout<N, 0.5f> layer;
  tensor<float, shape<4, N>> x, y1, y2, dy, dx;
  solder::test::fill_uniform(x, 0.5, 1.5, 841);  // y > 0 exactly where kept
  layer.forward(x, y1);
  const auto rng1 = layer.layer<2>().rng;
  layer.forward(x, y2);
  const auto rng2 = layer.layer<2>().rng;
  CHECK(rng1.offset != rng2.offset);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += (y1[i] > 0.0f) != (y2[i] > 0.0f);
  // Two independent masks at p = 0.5 differ at half the elements: 514 of 1028, sigma 16.
  INFO(differ << " of " << x.size() << " elements kept by one mask and dropped by the other");
  CHECK(differ > x.size() / 4);
  CHECK(differ < 3 * x.size() / 4);
  // The backward after the second forward uses the second mask.
  dy.fill(1.0f);
  layer.backward(x, dy, dx);
  std::size_t mismatched = 0;
  for (std::size_t i = 0; i < x.size(); ++i) mismatched += (y2[i] > 0.0f) != (dx[i] != 0.0f);
  CHECK(mismatched == 0);
}

TEST_CASE("elementwise_block: backward overwrites the bias gradient", "[nn]") {
  constexpr std::size_t N = 37;
  using S = shape<3, N>;
  setup<S, N, solder::nn::bias_relu_dropout<N, 0.1f>> s(1, 851);
  s.layer.forward(s.x, s.y);
  s.layer.backward(s.x, s.dy, s.dx);
  const tensor<float, shape<N>> first = s.bias_grad();
  s.layer.backward(s.x, s.dy, s.dx);  // the same step again: the same gradient, not twice it
  CHECK(bit_differences(first.data(), s.bias_grad().data(), N) == 0);
  std::size_t nonzero = 0;
  for (float v : first) nonzero += v != 0.0f;
  CHECK(nonzero > 0);
}

namespace {

/// backward_from_output(y, dy) against backward(x, dy) after the same forward: dx bitwise
/// (the same float product where kept), db bitwise (the same gated values summed in the same
/// order by the same loop nest).
template <class S, std::size_t N, class Layer>
void check_output_backward(std::size_t batch, bool train) {
  setup<S, N, Layer> s(batch, 861);
  const std::string at = solder::to_string<S>(batch) + (train ? ", train" : ", eval");
  if (train)
    s.layer.train();
  else
    s.layer.eval();
  s.layer.forward(s.x, s.y);
  s.layer.backward(s.x, s.dy, s.dx);
  const auto dx_from_input = s.dx;
  const tensor<float, shape<N>> db_from_input = s.bias_grad();
  s.dx.fill(-7.0f);
  s.layer.backward_from_output(s.y, s.dy, s.dx);
  INFO("from the output vs from the input on " << at);
  CHECK(bit_differences(s.dx.data(), dx_from_input.data(), s.dx.size()) == 0);
  CHECK(bit_differences(s.bias_grad().data(), db_from_input.data(), N) == 0);
}

}  // namespace

TEST_CASE("elementwise_block: bias_relu_dropout's backward from the output equals the one from the input", "[nn]") {
  using solder::nn::bias_relu_dropout;
  static_assert(bias_relu_dropout<37, 0.1f>::output_backward);
  for (bool train : {true, false}) {
    check_output_backward<shape<3, 37>, 37, bias_relu_dropout<37, 0.1f>>(1, train);
    check_output_backward<shape<17, 255>, 255, bias_relu_dropout<255, 0.5f>>(1, train);
    check_output_backward<shape<dyn, 257>, 257, bias_relu_dropout<257, 0.1f>>(5, train);
  }
}

TEST_CASE("elementwise_block: relu, sigmoid and tanh backward from the output equals the one from the input, NaN and Inf included", "[nn]") {
  // Without a dropout the gradient from y is the op's own backward (ops::gradient_from_output):
  // the same float operations on the same y as the backward from x, so every bit of dx agrees,
  // at an infinite input too, and a NaN input gives a NaN either way (its sign is the operand
  // order's the compiler chose for the FMA of tanh's 1 - y^2: -O3 with AVX-512 picks one order
  // in one loop nest and the other in the other). db sums the same terms in the same order, but where a term
  // is a product (sigmoid, tanh) the compiler may fuse it into the accumulating add (an FMA) in
  // one loop nest and not the other, and every partial sum may then round differently: each
  // of the two sums is within (rows - 1) u sum|dx| of the exact one (Higham 4.2), so they are
  // within twice rows u sum|dx| of each other (relu's terms are selects: exact). The sign of a
  // NaN sum is not defined.
  using namespace solder::nn;
  constexpr std::size_t N = 37;
  auto check = [](auto layer, const char* what, bool exact_db) {
    INFO(what);
    setup<shape<5, N>, N, decltype(layer)> s(1, 881);
    s.layer = layer;
    solder::test::fill_uniform(s.layer.template layer<0>().value, -1, 1, 882);
    s.x[3] = std::numeric_limits<float>::quiet_NaN();
    s.x[40] = std::numeric_limits<float>::infinity();
    s.x[77] = -std::numeric_limits<float>::infinity();
    s.dy[100] = std::numeric_limits<float>::infinity();
    s.layer.forward(s.x, s.y);
    s.layer.backward(s.x, s.dy, s.dx);
    const auto dx_from_input = s.dx;
    const tensor<float, shape<N>> db_from_input = s.bias_grad();
    s.dx.fill(-7.0f);
    s.layer.backward_from_output(s.y, s.dy, s.dx);
    CHECK(solder::test::bit_differences_any_nan(s.dx.data(), dx_from_input.data(), s.dx.size()) == 0);
    CHECK(std::isnan(s.dx[3]));  // a NaN input gives a NaN gradient from y as from x
    CHECK(std::isnan(dx_from_input[3]));
    if (exact_db) {
      CHECK(bit_differences(s.bias_grad().data(), db_from_input.data(), N) == 0);
    } else {
      const std::size_t rows = s.dx.size() / N;
      for (std::size_t j = 0; j < N; ++j) {
        double abs_sum = 0;
        for (std::size_t i = j; i < s.dx.size(); i += N) abs_sum += std::fabs(s.dx[i]);
        const float got = s.bias_grad()[j], want = db_from_input[j];
        CAPTURE(j);
        if (std::isnan(want))
          CHECK(std::isnan(got));
        else if (std::isinf(want))
          CHECK(got == want);
        else
          CHECK_THAT(got, WithinAbs(want, 2 * double(rows) * unit_roundoff * abs_sum));
      }
    }
  };
  check(elementwise_block<bias<N>, relu>{}, "bias, relu", true);
  check(elementwise_block<bias<N>, sigmoid>{}, "bias, sigmoid", false);
  check(elementwise_block<bias<N>, solder::nn::tanh>{}, "bias, tanh", false);
}

TEST_CASE("elementwise_block: which layer runs have a backward from the output", "[nn]") {
  using namespace solder::nn;
  static_assert(elementwise_block<bias<8>>::output_backward);
  static_assert(elementwise_block<bias<8>, relu>::output_backward);
  static_assert(elementwise_block<bias<8>, sigmoid, dropout<0.1f>>::output_backward);
  static_assert(elementwise_block<bias<8>, solder::nn::tanh>::output_backward);
  static_assert(!elementwise_block<bias<8>, solder::nn::tanh, dropout<0.1f>>::output_backward);  // tanh(0) = 0 with slope 1
  static_assert(!elementwise_block<bias<8>, gelu>::output_backward);                 // gelu is not invertible
  static_assert(!elementwise_block<bias<8>, relu, relu>::output_backward);
  static_assert(!elementwise_block<relu, bias<8>>::output_backward);
  SUCCEED();
}

TEST_CASE("elementwise_block: sigmoid and tanh backward from the output agree with the mask-regenerating backward", "[nn]") {
  // Different formulas (s(1 - s) from y against the op's derivative at x): equal within a few ulps
  // of the larger of |dx| and |dy| (the derivative's rounding).
  auto check = [](auto& layer, const char* what) {
    constexpr std::size_t N = 37;
    tensor<float, shape<9, N>> x, y, dy, dx_in, dx_out;
    solder::test::fill_uniform(x, -4, 4, 871);
    solder::test::fill_uniform(layer.template layer<0>().value, -1, 1, 872);
    solder::test::fill_uniform(dy, -1, 1, 873);
    layer.forward(x, y);
    layer.backward(x, dy, dx_in);
    const tensor<float, shape<N>> db_in = layer.template layer<0>().grad;
    layer.backward_from_output(y, dy, dx_out);
    INFO(what);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) bad += std::fabs(dx_in[i] - dx_out[i]) > 4e-7 * (1 + std::fabs(dy[i]) * 2);
    CHECK(bad == 0);
    for (std::size_t j = 0; j < N; ++j) CHECK_THAT(layer.template layer<0>().grad[j], WithinAbs(db_in[j], 9 * 4e-6));
  };
  solder::nn::elementwise_block<solder::nn::bias<37>, solder::nn::sigmoid, solder::nn::dropout<0.3f>> sig;
  check(sig, "bias, sigmoid, dropout(0.3)");
  solder::nn::elementwise_block<solder::nn::bias<37>, solder::nn::tanh> th;
  check(th, "bias, tanh");
}
