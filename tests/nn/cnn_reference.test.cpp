// tests/nn/cnn_reference.test.cpp: a small CNN (conv2d, batch_norm in training mode, ReLU, average
// pooling, flatten, linear) against the same network written here in double from torch's
// definitions: the forward, every parameter's gradient (central differences of the double
// network, which is exact enough to difference at h = 1e-6) and one SGD step.
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/pool.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"

namespace {

namespace nn = solder::nn;
using solder::dyn;
using solder::shape;
using solder::tensor;

constexpr std::size_t N = 3, Cin = 2, H = 6, W = 4, C = 3, K = 3, Ho = H / 2, Wo = W / 2, F = C * Ho * Wo, Out = 4;
using model_t = nn::chain<nn::input<Cin, H, W>, nn::conv2d<Cin, C, K, K, 1, 1>, nn::batch_norm<C>, nn::relu,
                          nn::avg_pool2d<2>, nn::flatten<>, nn::linear<F, Out>>;

/// The network in double: parameters by torch's names, forward of a batch x [N, Cin, H, W].
struct reference {
  std::map<std::string, std::vector<double>> p;

  std::vector<double> forward(const std::vector<double>& x) const {
    const auto& w = p.at("0.weight");
    const auto& b = p.at("0.bias");
    // conv2d, 3x3, padding 1
    std::vector<double> z(N * C * H * W);
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t co = 0; co < C; ++co)
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t v = 0; v < W; ++v) {
            double acc = b[co];
            for (std::size_t ci = 0; ci < Cin; ++ci)
              for (std::size_t kh = 0; kh < K; ++kh)
                for (std::size_t kw = 0; kw < K; ++kw) {
                  const long hi = long(h + kh) - 1, wi = long(v + kw) - 1;
                  if (hi < 0 || wi < 0 || hi >= long(H) || wi >= long(W)) continue;
                  acc += x[((n * Cin + ci) * H + std::size_t(hi)) * W + std::size_t(wi)] *
                         w[((co * Cin + ci) * K + kh) * K + kw];
                }
            z[((n * C + co) * H + h) * W + v] = acc;
          }
    // batch_norm in training mode (the batch's mean and biased variance), then ReLU
    const auto& gamma = p.at("1.weight");
    const auto& beta = p.at("1.bias");
    for (std::size_t c = 0; c < C; ++c) {
      double mean = 0, var = 0;
      for (std::size_t n = 0; n < N; ++n)
        for (std::size_t i = 0; i < H * W; ++i) mean += z[(n * C + c) * H * W + i];
      mean /= double(N * H * W);
      for (std::size_t n = 0; n < N; ++n)
        for (std::size_t i = 0; i < H * W; ++i) var += std::pow(z[(n * C + c) * H * W + i] - mean, 2);
      var /= double(N * H * W);
      for (std::size_t n = 0; n < N; ++n)
        for (std::size_t i = 0; i < H * W; ++i) {
          double& e = z[(n * C + c) * H * W + i];
          e = std::max(0.0, (e - mean) / std::sqrt(var + 1e-5) * gamma[c] + beta[c]);
        }
    }
    // 2x2 average pooling, flatten, linear
    const auto& lw = p.at("5.weight");
    const auto& lb = p.at("5.bias");
    std::vector<double> y(N * Out);
    for (std::size_t n = 0; n < N; ++n) {
      std::vector<double> f(F);
      for (std::size_t c = 0; c < C; ++c)
        for (std::size_t h = 0; h < Ho; ++h)
          for (std::size_t v = 0; v < Wo; ++v) {
            double s = 0;
            for (std::size_t i = 0; i < 2; ++i)
              for (std::size_t j = 0; j < 2; ++j) s += z[((n * C + c) * H + 2 * h + i) * W + 2 * v + j];
            f[(c * Ho + h) * Wo + v] = s / 4;
          }
      for (std::size_t o = 0; o < Out; ++o) {
        double acc = lb[o];
        for (std::size_t i = 0; i < F; ++i) acc += lw[o * F + i] * f[i];
        y[n * Out + o] = acc;
      }
    }
    return y;
  }
};

}  // namespace

TEST_CASE("cnn reference: forward, gradients and an SGD step against the network in double", "[chain][cnn]") {
  model_t model(17);
  tensor<float, shape<dyn, Cin, H, W>> x(N);
  tensor<float, shape<dyn, Out>> r(N);
  solder::test::fill_uniform(x, -1, 1, 18);
  solder::test::fill_uniform(r, -1, 1, 19);
  // batch_norm's affine parameters away from torch's starting ones, so a wrong use shows
  solder::test::fill_uniform(model.layer<1>().weight, 0.5, 1.5, 20);
  solder::test::fill_uniform(model.layer<1>().bias, -0.5, 0.5, 21);
  model.parameters_changed();

  reference ref;
  for (auto& prm : model.params()) ref.p[prm.name].assign(prm.value.begin(), prm.value.end());
  REQUIRE(ref.p.size() == 6);
  const std::vector<double> xd(x.begin(), x.end());
  auto loss = [&](const reference& net) {
    const auto y = net.forward(xd);
    double L = 0;
    for (std::size_t i = 0; i < y.size(); ++i) L += double(r.data()[i]) * y[i];
    return L;
  };

  // Forward: within a few float roundings of the outputs' scale.
  const auto y = model.forward(x);
  const auto y_ref = ref.forward(xd);
  double scale = 0;
  for (double v : y_ref) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < y_ref.size(); ++i) {
    INFO("y[" << i << "]");
    CHECK(std::fabs(double(y.data()[i]) - y_ref[i]) <= 1e-5 * scale);
  }

  // Gradients of L = sum(r * y): backward against central differences of the double network.
  model.backward(std::as_const(r).ref());
  std::map<std::string, std::vector<double>> g_ref;
  for (auto& [name, values] : ref.p) {
    auto& g = g_ref[name];
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double v0 = values[i], h = 1e-6;
      values[i] = v0 + h;
      const double lp = loss(ref);
      values[i] = v0 - h;
      const double lm = loss(ref);
      values[i] = v0;
      g.push_back((lp - lm) / (2 * h));
    }
  }
  for (auto& prm : model.params())
    for (std::size_t i = 0; i < prm.grad.size(); ++i) {
      INFO(prm.name << "[" << i << "]");
      CHECK(double(prm.grad[i]) == Approx(g_ref[prm.name][i]).margin(2e-5).epsilon(1e-3));
    }

  // One SGD step: p - lr g, from the double gradients.
  constexpr double lr = 0.1;
  solder::optim::sgd opt(model.params(), {.lr = float(lr)});
  opt.step();
  for (auto& prm : model.params())
    for (std::size_t i = 0; i < prm.value.size(); ++i) {
      INFO(prm.name << "[" << i << "]");
      const double want = ref.p[prm.name][i] - lr * g_ref[prm.name][i];
      CHECK(double(prm.value[i]) == Approx(want).margin(1e-6).epsilon(1e-5));
    }
}
