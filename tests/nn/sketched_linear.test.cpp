// tests/nn/sketched_linear.test.cpp: the sketched linear layer. Forward against the formula in
// double with the sign matrices written out from their definition; the two-products and folded
// forms against each other; every gradient against central differences of the double formula;
// the signs the same across calls and thread counts; the initialization's construction and its
// expectation; the strategy chosen from costs; a chain mixing sketched, linear and elementwise
// layers trained on the digits.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/cost.hpp"
#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/sketched_linear.hpp"
#include "solder/optim/adam.hpp"
#include "solder/random/sketch.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;
using solder::test::bit_differences;

/// A sketched layer's parameters and signs in double, and its formula evaluated term by term:
/// y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b.
template <class L>
struct reference {
  static constexpr std::size_t In = L::in_features, Out = L::out_features, T = L::terms, K = L::rank;
  std::vector<double> s1, s2, b, u1, u2;  // s1 [In, T K], s2 [T K, Out], u1 [T K, Out], u2 [In, T K]

  explicit reference(const L& layer) : s1(layer.s1.begin(), layer.s1.end()), s2(layer.s2.begin(), layer.s2.end()) {
    if constexpr (L::has_bias) b.assign(layer.bias.begin(), layer.bias.end());
    else b.assign(Out, 0.0);
    // Term t's U1_t [K, Out] and U2_t [In, K], element (r, c) signed by sketch_sign(seed, t, r * C + c)
    // with the layer's rounds.
    const double scale = 1.0 / std::sqrt(double(K));
    u1.resize(T * K * Out);
    u2.resize(In * T * K);
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t r = 0; r < K; ++r)
        for (std::size_t c = 0; c < Out; ++c)
          u1[(t * K + r) * Out + c] = scale * random::sketch_sign(layer.u1().seed, t, r * Out + c, layer.sketch_rounds);
      for (std::size_t r = 0; r < In; ++r)
        for (std::size_t c = 0; c < K; ++c)
          u2[r * T * K + t * K + c] = scale * random::sketch_sign(layer.u2().seed, t, r * K + c, layer.sketch_rounds);
    }
  }

  /// z [batch, Out] for x [batch, In].
  std::vector<double> forward(const std::vector<double>& x, std::size_t batch) const {
    std::vector<double> z(batch * Out, 0.0);
    for (std::size_t m = 0; m < batch; ++m)
      for (std::size_t t = 0; t < T; ++t) {
        std::vector<double> a(K, 0.0), c(K, 0.0);  // a = x S1_t, c = x U2_t
        for (std::size_t j = 0; j < K; ++j)
          for (std::size_t i = 0; i < In; ++i) {
            a[j] += x[m * In + i] * s1[i * T * K + t * K + j];
            c[j] += x[m * In + i] * u2[i * T * K + t * K + j];
          }
        for (std::size_t o = 0; o < Out; ++o)
          for (std::size_t j = 0; j < K; ++j)
            z[m * Out + o] += (a[j] * u1[(t * K + j) * Out + o] + c[j] * s2[(t * K + j) * Out + o]) / (2.0 * T);
      }
    for (std::size_t m = 0; m < batch; ++m)
      for (std::size_t o = 0; o < Out; ++o) z[m * Out + o] += b[o];
    return z;
  }
};

template <class T>
std::vector<double> as_double(const T& t) {
  return std::vector<double>(t.begin(), t.end());
}

/// |a - b| <= tol (|b| + 1) everywhere, counting failures.
std::size_t mismatches(const float* a, const std::vector<double>& b, double tol) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < b.size(); ++i) bad += !(std::fabs(double(a[i]) - b[i]) <= tol * (std::fabs(b[i]) + 1.0));
  return bad;
}

// Float products of length In and 2 L k against double sums: a few hundred ulp of their terms.
constexpr double forward_tolerance = 2e-5;

}  // namespace

TEST_CASE("sketched_linear: forward against the formula in double, both forms", "[sketched]") {
  // 2 L k (In + Out) > In Out: allowed explicitly, and folded for inference (fewer FLOPs).
  using layer_t = nn::sketched_linear<40, 33, 3, 4, true, nn::sketch_strategy::automatic, true>;
  nn::sketched_block<layer_t> block(7);
  const reference<layer_t> ref(block.sketched);
  for (std::size_t batch : {std::size_t(1), std::size_t(5), std::size_t(37)}) {
    tensor<float, shape<dyn, 40>> x(batch);
    solder::test::fill_uniform(x, -1, 1, 11 + std::uint32_t(batch));
    const auto want = ref.forward(as_double(x), batch);
    tensor<float, shape<dyn, 33>> y(batch), y_eval(batch), y_folded(batch);
    INFO("batch " << batch);
    block.train();
    block.forward(x, y);  // two products
    CHECK(mismatches(y.data(), want, forward_tolerance) == 0);
    block.eval();
    block.forward(x, y_eval);  // no pack_weights yet: two products
    CHECK(bit_differences(y.data(), y_eval.data(), y.size()) == 0);
    block.pack_weights();  // this configuration folds for inference
    REQUIRE(block.runs_folded());
    block.forward(x, y_folded);
    CHECK(mismatches(y_folded.data(), want, forward_tolerance) == 0);
    block.weights_changed();
  }
}

TEST_CASE("sketched_linear: sketches of 10 Philox rounds, against the formula in double", "[sketched]") {
  using layer_t = nn::sketched_linear<40, 33, 3, 4, true, nn::sketch_strategy::automatic, true>;
  nn::sketched_block<layer_t> seven(7), ten(7);
  ten.sketched.sketch_rounds = 10;
  ten.sketched.reset_parameters(7);
  CHECK(ten.sketched.u1().rounds == 10);
  CHECK(transpose(ten.sketched.u2()).rounds == 10);
  const reference<layer_t> ref(ten.sketched);
  const std::size_t batch = 37;
  tensor<float, shape<dyn, 40>> x(batch);
  solder::test::fill_uniform(x, -1, 1, 3);
  tensor<float, shape<dyn, 33>> y(batch);
  ten.train();
  ten.forward(x, y);
  CHECK(mismatches(y.data(), ref.forward(as_double(x), batch), forward_tolerance) == 0);
  // Other signs: the 7-round layer's S1 and S2 differ from the 10-round one's.
  CHECK(bit_differences(seven.sketched.s1.data(), ten.sketched.s1.data(), ten.sketched.s1.size()) > 0);

  ten.sketched.sketch_rounds = 9;
  CHECK_THROWS_WITH(ten.sketched.reset_parameters(7), Catch::Matchers::Contains("sketch_rounds is 9"));
}

TEST_CASE("sketched_linear: a forced strategy, and the automatic one chosen from FLOPs", "[sketched]") {
  // 2 L k (In + Out) < In Out: the two products cost fewer FLOPs; the forced fold still folds.
  using small = nn::sketched_linear<512, 256, 1, 16>;
  STATIC_REQUIRE(small::inference_strategy == nn::sketch_strategy::two_products);
  STATIC_REQUIRE(small::two_products_flops < small::folded_flops);
  using forced = nn::sketched_linear<512, 256, 1, 16, true, nn::sketch_strategy::folded>;
  STATIC_REQUIRE(forced::inference_strategy == nn::sketch_strategy::folded);
  using large = nn::sketched_linear<2048, 1024, 8, 128, true, nn::sketch_strategy::automatic, true>;
  STATIC_REQUIRE(large::inference_strategy == nn::sketch_strategy::folded);
  // Parameters: S1, S2 and b; Panther stores U1 and U2 as large as S1 and S2 besides.
  STATIC_REQUIRE(small::stored_floats == 16 * (512 + 256) + 256);
  STATIC_REQUIRE(small::panther_floats - 256 == 2 * (small::stored_floats - 256));

  nn::sketched_block<forced> a(3);
  nn::sketched_block<small> b(3);
  tensor<float, shape<dyn, 512>> x(9);
  solder::test::fill_uniform(x, -1, 1, 5);
  tensor<float, shape<dyn, 256>> ya(9), yb(9);
  a.eval();
  b.eval();
  a.pack_weights();
  b.pack_weights();
  CHECK(a.runs_folded());
  CHECK(!b.runs_folded());
  a.forward(x, ya);
  b.forward(x, yb);
  const reference<small> ref(b.sketched);
  CHECK(mismatches(ya.data(), ref.forward(as_double(x), 9), forward_tolerance) == 0);
  CHECK(mismatches(yb.data(), ref.forward(as_double(x), 9), forward_tolerance) == 0);
}

TEST_CASE("sketched_linear: gradients against central differences of the formula", "[sketched]") {
  // With a relu after it: the gate, the 1/(2L) scale and every product rule.
  using layer_t = nn::sketched_linear<40, 32, 2, 3>;
  nn::sketched_block<layer_t, nn::relu> block(21);
  constexpr std::size_t B = 6, In = 40, Out = 32;
  tensor<float, shape<dyn, In>> x(B), dx(B);
  tensor<float, shape<dyn, Out>> y(B), r(B);
  solder::test::fill_uniform(x, -1, 1, 31);
  solder::test::fill_uniform(r, -1, 1, 32);
  block.forward(x, y);
  block.backward(x, y, r, dx);

  // L(params, x) = sum r relu(z) in double, differentiated numerically.
  reference<layer_t> ref(block.sketched);
  std::vector<double> xd = as_double(x);
  auto loss = [&] {
    const auto z = ref.forward(xd, B);
    double sum = 0;
    for (std::size_t i = 0; i < z.size(); ++i) sum += double(r[i]) * (z[i] > 0 ? z[i] : 0.0);
    return sum;
  };
  auto check = [&](std::vector<double>& v, const float* grad, const char* what) {
    std::size_t bad = 0, kinks = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double v0 = v[i], h = 1e-6;
      v[i] = v0 + h;
      const double lp = loss();
      v[i] = v0 - h;
      const double lm = loss();
      v[i] = v0;
      const double fd = (lp - lm) / (2 * h);
      // A difference straddling a relu kink is not a derivative: skip it (it shows as a
      // one-sided change far larger than h times the gradient).
      v[i] = v0 + h;
      const double l1 = loss();
      v[i] = v0;
      const double l0 = loss();
      if (std::fabs((l1 - l0) - (l0 - lm)) > 1e-3 * h + 1e-12 * std::fabs(l0)) {
        ++kinks;
        continue;
      }
      bad += !(std::fabs(double(grad[i]) - fd) <= 1e-4 * (std::fabs(fd) + 1.0));
    }
    INFO(what << ": " << kinks << " differences at a kink skipped");
    CHECK(bad == 0);
    CHECK(kinks < v.size() / 10 + 1);
  };
  check(ref.s1, block.sketched.s1_grad.data(), "dS1");
  check(ref.s2, block.sketched.s2_grad.data(), "dS2");
  check(ref.b, block.sketched.bias_grad.data(), "db");
  check(xd, dx.data(), "dx");
}

TEST_CASE("sketched_linear: initialization is S1_i = W U1_i^T, S2_i = U2_i^T W, each term W in expectation", "[sketched]") {
  // Many terms: (1/L) sum_i U1_i^T U1_i = I + E1 [Out, Out] and (1/L) sum_i U2_i U2_i^T = I + E2
  // [In, In], off-diagonal entries of standard deviation 1/sqrt(L k), so the means of the terms
  // miss W by about sqrt((Out - 1) / (L k)) and sqrt((In - 1) / (L k)) of |W|.
  constexpr std::size_t In = 24, Out = 8, T = 64, K = 16;
  using layer_t = nn::sketched_linear<In, Out, T, K, true, nn::sketch_strategy::automatic, true>;
  const layer_t layer(5);
  const reference<layer_t> ref(layer);
  std::vector<float> w(In * Out);
  nn::detail::fill_uniform_philox(w.data(), w.size(), float(1.0 / std::sqrt(double(In))), 5, 0);
  double err1 = 0, err2 = 0, norm = 0, construct = 0;
  for (std::size_t i = 0; i < In; ++i)
    for (std::size_t o = 0; o < Out; ++o) {
      double a = 0, c = 0;
      for (std::size_t j = 0; j < T * K; ++j) {
        a += ref.s1[i * T * K + j] * ref.u1[j * Out + o];  // sum_t S1_t U1_t
        c += ref.u2[i * T * K + j] * ref.s2[j * Out + o];  // sum_t U2_t S2_t
      }
      err1 += std::pow(a / T - w[i * Out + o], 2);
      err2 += std::pow(c / T - w[i * Out + o], 2);
      norm += std::pow(w[i * Out + o], 2);
    }
  for (std::size_t i = 0; i < In; ++i)
    for (std::size_t j = 0; j < T * K; ++j) {
      double s = 0;  // (W U1^T)[i, j]
      for (std::size_t o = 0; o < Out; ++o) s += double(w[i * Out + o]) * ref.u1[j * Out + o];
      construct = std::max(construct, std::fabs(s - ref.s1[i * T * K + j]));
    }
  const double expected1 = std::sqrt(double(Out - 1) / double(T * K));  // 0.083
  const double expected2 = std::sqrt(double(In - 1) / double(T * K));   // 0.150
  INFO("relative errors " << std::sqrt(err1 / norm) << ", " << std::sqrt(err2 / norm) << ", expected about "
                          << expected1 << ", " << expected2);
  CHECK(construct < 1e-5);
  CHECK(std::sqrt(err1 / norm) < 2 * expected1);
  CHECK(std::sqrt(err2 / norm) < 2 * expected2);
  // The folded weight is the mean of the two: W_eff -> W as well.
  tensor<float, shape<In, Out>> folded;
  folded = layer.folded();
  double err = 0;
  for (std::size_t i = 0; i < folded.size(); ++i) err += std::pow(double(folded[i]) - w[i], 2);
  CHECK(std::sqrt(err / norm) < expected1 + expected2);
}

TEST_CASE("sketched_linear: the same bits on every call and thread count", "[sketched]") {
  using layer_t = nn::sketched_linear<256, 192, 2, 16>;
  tensor<float, shape<dyn, 256>> x(100);
  solder::test::fill_uniform(x, -1, 1, 41);
  auto run = [&](int threads) {
    const int before = solder::num_threads();
    solder::set_num_threads(threads);
    nn::sketched_block<layer_t, nn::relu> block(9);
    tensor<float, shape<dyn, 192>> y(100), y2(100), dy(100);
    tensor<float, shape<dyn, 256>> dx(100);
    solder::test::fill_uniform(dy, -1, 1, 42);
    block.forward(x, y);
    block.forward(x, y2);
    CHECK(bit_differences(y.data(), y2.data(), y.size()) == 0);
    block.backward(x, y, dy, dx);
    solder::set_num_threads(before);
    std::vector<float> all(y.begin(), y.end());
    all.insert(all.end(), dx.begin(), dx.end());
    all.insert(all.end(), block.sketched.s1_grad.begin(), block.sketched.s1_grad.end());
    all.insert(all.end(), block.sketched.s2_grad.begin(), block.sketched.s2_grad.end());
    return all;
  };
  const auto one = run(1), two = run(2);
  CHECK(bit_differences(one.data(), two.data(), one.size()) == 0);
}

TEST_CASE("sketched_linear: a chain of sketched, linear and elementwise layers trains on the digits", "[sketched][chain]") {
  using model_t = nn::chain<nn::sketched_linear<64, 256, 2, 8>, nn::relu, nn::dropout<0.1f>,
                            nn::sketched_linear<256, 128, 2, 8>, nn::relu, nn::linear<128, 10>>;
  STATIC_REQUIRE(model_t::kernels == 3);
  STATIC_REQUIRE(cost<model_t>::params == (16 * (64 + 256) + 256) + (16 * (256 + 128) + 128) + (128 * 10 + 10));
  std::ostringstream plan;
  plan << plan_report<model_t>{};
  CHECK(plan.str().find("sketched_linear+relu+dropout") != std::string::npos);
  CHECK(plan.str().find("2 GEMMs + epilogue") != std::string::npos);
  CHECK(plan.str().find("inference two products (two products 20.7 KFLOP/sample") != std::string::npos);

  data::labeled_dataset all = data::load_labeled_csv(SOLDER_DIGITS_CSV, 64, 64);
  data::divide_features(all, 16.0f);
  const auto [train, test] = data::train_test_split(all, 0.2, 2026);
  model_t model(1);
  const auto params = model.params();
  REQUIRE(params.size() == 8);
  CHECK(params[0].name == "0.S1");
  CHECK(params[1].name == "0.S2");
  CHECK(params[2].name == "0.bias");
  optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, 32, data::last_batch::drop);
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 15; ++epoch) {
    loader.shuffle(2026, std::uint64_t(epoch));
    double sum = 0;
    for (const data::batch_view b : loader) sum += model.train_step(b.features_as<64>(), b.y, opt);
    (epoch == 0 ? first : last) = sum / double(loader.size());
  }
  model.eval();
  const double acc = nn::accuracy(model.forward(tensor_ref<const float, shape<dyn, 64>>(test.x.data(), test.size())), test.y);
  INFO("loss " << first << " -> " << last << ", held-out accuracy " << acc);
  CHECK(last < 0.2 * first);
  CHECK(acc >= 0.95);
}
