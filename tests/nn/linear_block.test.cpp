// tests/nn/linear_block.test.cpp: nn::linear and nn::linear_block. The forward against a double loop and
// against the unfused composition (product stored, then its own elementwise pass) bit for bit;
// every gradient (dW, db, dx) against a double reference whose formula is itself checked by
// central finite differences of the loss; training and eval modes, dropout's mask, static and
// dynamic batches, packed weights, thread counts, and the run-time errors.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/nn/linear_block.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::bit_differences;

using namespace solder;
namespace ref = solder::test::ref;

/// The layer in double: y = keep * scale * act(x W^T + b), with the mask of the layer's last
/// forward (`keep(i)` for output element i; all kept in eval mode).
struct reference_layer {
  std::size_t M, N, K;
  std::function<double(double)> act;
  std::function<bool(std::size_t)> keep;
  double scale = 1.0;

  double pre(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b, std::size_t m,
             std::size_t n) const {
    double z = b.empty() ? 0.0 : b[n];
    for (std::size_t k = 0; k < K; ++k) z += x[m * K + k] * w[n * K + k];
    return z;
  }
  /// L = sum_i r_i y_i, whose gradient w.r.t. y is r (the dy the layer gets).
  double loss(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
              const std::vector<double>& r) const {
    double L = 0;
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t n = 0; n < N; ++n)
        if (keep(m * N + n)) L += r[m * N + n] * scale * act(pre(x, w, b, m, n));
    return L;
  }
  /// dL/dz by the chain rule, act' by a central difference of the double activation.
  std::vector<double> dz(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                         const std::vector<double>& r) const {
    std::vector<double> g(M * N, 0.0);
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t n = 0; n < N; ++n)
        if (keep(m * N + n)) {
          const double z = pre(x, w, b, m, n);
          g[m * N + n] = r[m * N + n] * scale * solder::test::central_diff(act, z, solder::test::fd_step(z));
        }
    return g;
  }
};

template <class T>
std::vector<double> to_double(const T& t) {
  return std::vector<double>(t.begin(), t.end());
}

/// |got - want| <= tol * scale + 1e-6 for every element.
std::size_t far(const float* got, const std::vector<double>& want, const std::vector<double>& scale, double tol) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) bad += !(std::fabs(double(got[i]) - want[i]) <= tol * scale[i] + 1e-6);
  return bad;
}

/// Forward and backward of Layer on a batch of M against reference_layer; in training mode
/// (with the layer's dropout mask) or eval mode. `kink`: inputs are kept this far from z = 0
/// (relu's kink) so that the finite differences do not straddle it.
template <class Layer, class SX, class SY>
void check_layer(Layer& layer, std::size_t M, bool train, std::function<double(double)> act, const std::string& what) {
  constexpr std::size_t N = Layer::out_features, K = Layer::in_features;
  auto make = [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (S::dynamic)
      return tensor<float, S>(M);
    else
      return tensor<float, S>();
  };
  auto x = make(std::type_identity<SX>{}), dx = make(std::type_identity<SX>{});
  auto y = make(std::type_identity<SY>{}), dy = make(std::type_identity<SY>{});
  solder::test::fill_uniform(x, -1, 1, 101);
  solder::test::fill_uniform(dy, -1, 1, 102);
  if (train)
    layer.train();
  else
    layer.eval();
  layer.forward(x, y);

  reference_layer R{M, N, K, act, [](std::size_t) { return true; }};
  using Tail = std::remove_cvref_t<decltype(layer.tail.layers)>;
  if constexpr (std::tuple_size_v<Tail> > 0) {
    using Last = std::tuple_element_t<std::tuple_size_v<Tail> - 1, Tail>;
    if constexpr (requires { Last::p; }) {
      if (train) {  // the mask of this forward
        const auto& d = std::get<std::tuple_size_v<Tail> - 1>(layer.tail.layers);
        const solder::test::dropout_rule rule{double(Last::p), d.rng.seed, d.rng.offset, d.rng.rounds};
        R.keep = [rule](std::size_t i) { return rule.keep(i); };
        R.scale = rule.scale();
      }
    }
  }
  const auto xd = to_double(x), wd = to_double(layer.linear.weight), rd = to_double(dy);
  std::vector<double> bd;
  if constexpr (requires { layer.linear.bias.data(); }) bd = to_double(layer.linear.bias);

  // Forward: each y against the double layer (float GEMM + activation rounding).
  std::size_t bad = 0;
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      double mag = bd.empty() ? 0 : std::fabs(bd[n]);
      for (std::size_t k = 0; k < K; ++k) mag += std::fabs(xd[m * K + k] * wd[n * K + k]);
      const double want = R.keep(m * N + n) ? R.scale * act(R.pre(xd, wd, bd, m, n)) : 0.0;
      bad += !(std::fabs(double(y[m * N + n]) - want) <= 4e-6 * (mag + std::fabs(want)) + 1e-6);
    }
  INFO(what << ", M = " << M << (train ? ", train" : ", eval"));
  CHECK(bad == 0);

  // Backward against the chain rule in double.
  layer.backward(x, y, dy, dx);
  const auto g = R.dz(xd, wd, bd, rd);
  std::vector<double> dw(N * K, 0.0), dw_mag(N * K, 0.0), db(N, 0.0), db_mag(N, 0.0), dxr(M * K, 0.0), dx_mag(M * K, 0.0);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      const double gv = g[m * N + n];
      db[n] += gv;
      db_mag[n] += std::fabs(gv);
      for (std::size_t k = 0; k < K; ++k) {
        dw[n * K + k] += gv * xd[m * K + k];
        dw_mag[n * K + k] += std::fabs(gv * xd[m * K + k]);
        dxr[m * K + k] += gv * wd[n * K + k];
        dx_mag[m * K + k] += std::fabs(gv * wd[n * K + k]);
      }
    }
  // The float gate differs from the double one by the activation derivative's rounding
  // (~1e-6 relative for gelu's erf); the sums add K or M roundings more.
  CHECK(far(layer.linear.weight_grad.data(), dw, dw_mag, 2e-5) == 0);
  CHECK(far(dx.data(), dxr, dx_mag, 2e-5) == 0);
  if constexpr (requires { layer.linear.bias_grad.data(); }) CHECK(far(layer.linear.bias_grad.data(), db, db_mag, 2e-5) == 0);

  // The reference's chain rule against central differences of its loss, on a sample.
  for (std::size_t i = 0; i < dw.size(); i += 97) {
    auto wp = wd;
    const double h = 1e-6;
    wp[i] = wd[i] + h;
    const double lp = R.loss(xd, wp, bd, rd);
    wp[i] = wd[i] - h;
    const double lm = R.loss(xd, wp, bd, rd);
    CHECK((lp - lm) / (2 * h) == Approx(dw[i]).margin(1e-5).epsilon(1e-4));
  }
  for (std::size_t i = 0; i < dxr.size(); i += 31) {
    auto xp = xd;
    const double h = 1e-6;
    xp[i] = xd[i] + h;
    const double lp = R.loss(xp, wd, bd, rd);
    xp[i] = xd[i] - h;
    const double lm = R.loss(xp, wd, bd, rd);
    CHECK((lp - lm) / (2 * h) == Approx(dxr[i]).margin(1e-5).epsilon(1e-4));
  }
}

double relu_d(double z) { return z > 0 ? z : 0.0; }

}  // namespace

TEST_CASE("linear: PyTorch's initialization, reproducible from the seed", "[nn][linear_block]") {
  nn::linear<100, 30> a(7), b(7), c(8);
  const float bound = 0.1f;  // 1 / sqrt(100)
  double sum = 0;
  for (float v : a.weight) {
    CHECK(std::fabs(v) <= bound);
    sum += v;
  }
  for (float v : a.bias) CHECK(std::fabs(v) <= bound);
  // Mean of 3000 uniforms on [-0.1, 0.1): sigma = 0.1 / sqrt(3 * 3000) ~ 1.05e-3.
  CHECK(std::fabs(sum / 3000) < 5 * 1.05e-3);
  CHECK(bit_differences(a.weight.data(), b.weight.data(), a.weight.size()) == 0);
  CHECK(bit_differences(a.weight.data(), c.weight.data(), a.weight.size()) > 2900);
}

TEST_CASE("linear_block: linear + relu + dropout, forward and backward", "[nn][linear_block]") {
  using Layer = nn::linear_block<nn::linear<29, 37>, nn::relu, nn::dropout<0.2f>>;
  static_assert(!Layer::keeps_preactivation);
  Layer layer(3);
  for (std::size_t M : {std::size_t(1), std::size_t(17), std::size_t(64)})
    for (bool train : {true, false})
      check_layer<Layer, shape<dyn, 29>, shape<dyn, 37>>(layer, M, train, relu_d, "relu + dropout(0.2)");
  Layer fixed(4);
  check_layer<Layer, shape<5, 29>, shape<5, 37>>(fixed, 5, true, relu_d, "relu + dropout(0.2), static batch");
}

TEST_CASE("linear_block: activations whose derivative needs the pre-activation", "[nn][linear_block]") {
  using Gelu = nn::linear_block<nn::linear<29, 37>, nn::gelu, nn::dropout<0.1f>>;
  static_assert(Gelu::keeps_preactivation);
  Gelu g(5);
  check_layer<Gelu, shape<dyn, 29>, shape<dyn, 37>>(g, 20, true, [](double z) { return ref::gelu(z); }, "gelu + dropout");
  using Tanh = nn::linear_block<nn::linear<29, 37>, nn::tanh, nn::dropout<0.1f>>;
  Tanh t(6);
  check_layer<Tanh, shape<dyn, 29>, shape<dyn, 37>>(t, 20, true, [](double z) { return std::tanh(z); }, "tanh + dropout");
  using Sig = nn::linear_block<nn::linear<29, 37>, nn::sigmoid, nn::dropout<0.3f>>;
  static_assert(!Sig::keeps_preactivation);
  Sig s(7);
  check_layer<Sig, shape<dyn, 29>, shape<dyn, 37>>(s, 20, true, [](double z) { return ref::sigmoid(z); }, "sigmoid + dropout");
}

TEST_CASE("linear_block: a linear layer alone, with and without bias", "[nn][linear_block]") {
  nn::linear_block<nn::linear<29, 37>> plain(8);
  check_layer<decltype(plain), shape<dyn, 29>, shape<dyn, 37>>(plain, 9, true, [](double z) { return z; }, "linear");
  nn::linear_block<nn::linear<29, 37, false>, nn::relu> nobias(9);
  check_layer<decltype(nobias), shape<dyn, 29>, shape<dyn, 37>>(nobias, 9, true, relu_d, "linear without bias + relu");
}

TEST_CASE("linear_block: the fused forward equals the product followed by its own pass", "[nn][linear_block]") {
  nn::linear_block<nn::linear<64, 300>, nn::relu, nn::dropout<0.1f>> layer(11);
  tensor<float, shape<dyn, 64>> x(50);
  tensor<float, shape<dyn, 300>> y(50), z(50), y_ref(50);
  solder::test::fill_uniform(x, -1, 1, 111);
  layer.forward(x, y);
  z = matmul(x, transpose(layer.linear.weight));
  const auto rng = layer.tail.layer<1>().rng;
  y_ref = solder::dropout(solder::relu(z + layer.linear.bias), 0.1f, rng);
  CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);
}

TEST_CASE("linear_block: packed weights give the same results; weights_changed returns to packing per call", "[nn][linear_block]") {
  nn::linear_block<nn::linear<64, 300>, nn::relu> layer(12);
  tensor<float, shape<dyn, 64>> x(33);
  tensor<float, shape<dyn, 300>> y1(33), y2(33), y3(33);
  solder::test::fill_uniform(x, -1, 1, 121);
  layer.forward(x, y1);
  layer.pack_weights();
  layer.forward(x, y2);
  CHECK(bit_differences(y1.data(), y2.data(), y1.size()) == 0);
  layer.linear.weight[0] += 1.0f;  // row 0 of W feeds column 0 of y
  layer.weights_changed();
  layer.forward(x, y3);
  std::size_t changed = 0;
  for (std::size_t m = 0; m < 33; ++m) changed += y3[m * 300] != y1[m * 300];
  CHECK(changed > 0);
}

TEST_CASE("linear_block: gradients do not depend on the thread count", "[nn][linear_block]") {
  nn::linear_block<nn::linear<64, 300>, nn::gelu, nn::dropout<0.1f>> layer(13);
  tensor<float, shape<dyn, 64>> x(300), dx1(300), dx2(300);
  tensor<float, shape<dyn, 300>> y(300), dy(300);
  solder::test::fill_uniform(x, -1, 1, 131);
  solder::test::fill_uniform(dy, -1, 1, 132);
  const int before = solder::num_threads();
  solder::set_num_threads(1);
  layer.forward(x, y);
  layer.backward(x, y, dy, dx1);
  const auto dw1 = layer.linear.weight_grad;
  const auto db1 = layer.linear.bias_grad;
  solder::set_num_threads(2);
  layer.backward(x, y, dy, dx2);
  solder::set_num_threads(before);
  CHECK(bit_differences(dx1.data(), dx2.data(), dx1.size()) == 0);
  CHECK(bit_differences(dw1.data(), layer.linear.weight_grad.data(), dw1.size()) == 0);
  CHECK(bit_differences(db1.data(), layer.linear.bias_grad.data(), db1.size()) == 0);
}

TEST_CASE("linear_block: run-time errors name the problem", "[nn][linear_block]") {
  nn::linear_block<nn::linear<8, 4>, nn::gelu> layer(14);
  tensor<float, shape<dyn, 8>> x(3), dx(3);
  tensor<float, shape<dyn, 4>> y(3), dy(3), y5(5);
  CHECK_THROWS_WITH(layer.forward(x, y5), Catch::Contains("batch size"));
  layer.eval();
  layer.forward(x, y);
  CHECK_THROWS_WITH(layer.backward(x, y, dy, dx), Catch::Contains("training-mode forward"));
  layer.train();
  layer.forward(x, y);
  tensor<float, shape<dyn, 4>> dy5(5);
  CHECK_THROWS_WITH(layer.backward(x, y, dy5, dx), Catch::Contains("batch sizes"));
}
