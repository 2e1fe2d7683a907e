// tests/nn/layer_norm.test.cpp: nn::layer_norm against torch's formulas evaluated in double
// here: y, then dx, dweight and dbias against central finite differences of the double layer's
// loss sum(r * y); row lengths with vector tails (1, 3, 37, 257), batch 1 and many, static and
// dynamic batches, rows far from zero mean, constant rows, fixed known values, NaN and
// infinity, in-place use, results independent of the thread count, and the run-time errors.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/nn/layer_norm.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::Contains;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

/// Float's unit roundoff.
constexpr double u = 0x1p-24;
/// Roundoff allowed, in units u. mean_u: x - mean inherits the rounding of mean to float,
/// u |mean| (rstd u |mean| once normalized; the subtraction itself is exact near the mean);
/// it dominates for rows far from 0 and is the layer's inherent error there, as torch's.
constexpr double mean_u = 2;
/// The rest of y, relative to |w| (|xhat| + 1) + |b|: the row sums err by at most about 20 u
/// of the spread (16 terms per lane in float, then across lanes), a few more for the products.
constexpr double forward_u = 8;
/// dx, relative to rstd (|g| + mean|g| + (|xhat| + 1) mean|g xhat|), g = dy w: the same sums.
constexpr double dx_u = 16;
/// dweight and dbias, relative to the sums over rows of |dy xhat| and |dy|: each chunk adds up
/// to 64 rows in float before double (63 u), plus xhat's own few u.
constexpr double dparam_u = 72;

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// The layer in double, from torch's definition: per row mean, biased variance, rstd, and
/// y = (x - mean) rstd w + b.
struct reference {
  std::size_t n;
  double eps;
  std::vector<double> w, b;

  struct stats {
    double mean, rstd;
  };
  stats row_stats(const double* x) const {
    double m = 0;
    for (std::size_t j = 0; j < n; ++j) m += x[j];
    m /= double(n);
    double v = 0;
    for (std::size_t j = 0; j < n; ++j) v += (x[j] - m) * (x[j] - m);
    return {m, 1.0 / std::sqrt(v / double(n) + eps)};
  }
  double y(const double* x, stats s, std::size_t j) const { return (x[j] - s.mean) * s.rstd * w[j] + b[j]; }
  /// sum_j r_j y_j over one row.
  double row_loss(const double* x, const double* r) const {
    const stats s = row_stats(x);
    double l = 0;
    for (std::size_t j = 0; j < n; ++j) l += r[j] * y(x, s, j);
    return l;
  }
  double loss(const std::vector<double>& x, const std::vector<double>& r) const {
    double l = 0;
    for (std::size_t i = 0; i < x.size(); i += n) l += row_loss(x.data() + i, r.data() + i);
    return l;
  }
};

/// max_i |got_i - want_i| / bound_i: at most 1 passes; NaN (a NaN result) fails.
double worst(const float* got, const std::vector<double>& want, const std::vector<double>& bound) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]) / bound[i];
    if (!(e <= w)) w = e;  // keeps a NaN
  }
  return w;
}

/// Forward and backward of layer_norm<N> on x [batch, N] of shape S, values offset +- spread,
/// with random weight and bias, against `reference` and its finite differences.
template <std::size_t N, class S>
void check_layer(std::size_t batch, double offset, double spread, std::uint32_t seed) {
  solder::nn::layer_norm<N> layer;
  solder::test::fill_uniform(layer.weight, -1.5, 1.5, seed);
  solder::test::fill_uniform(layer.bias, -1, 1, seed + 1);
  auto x = make<S>(batch), y = make<S>(batch), dy = make<S>(batch), dx = make<S>(batch);
  solder::test::fill_uniform(x, offset - spread, offset + spread, seed + 2);
  solder::test::fill_uniform(dy, -1, 1, seed + 3);
  const std::size_t rows = x.size() / N;

  const reference R{N, double(layer.eps), std::vector<double>(layer.weight.begin(), layer.weight.end()),
                    std::vector<double>(layer.bias.begin(), layer.bias.end())};
  std::vector<double> xd(x.begin(), x.end()), rd(dy.begin(), dy.end());

  layer.forward(x, y);
  std::vector<double> want(x.size()), bound(x.size());
  std::vector<reference::stats> st(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    st[i] = R.row_stats(&xd[i * N]);
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (xd[i * N + j] - st[i].mean) * st[i].rstd;
      want[i * N + j] = R.y(&xd[i * N], st[i], j);
      bound[i * N + j] = u * (std::fabs(R.w[j]) * (mean_u * st[i].rstd * std::fabs(st[i].mean) + forward_u * (std::fabs(xhat) + 1)) +
                              forward_u * std::fabs(R.b[j]));
    }
  }
  CHECK(worst(y.data(), want, bound) <= 1);

  layer.weight_grad.fill(1e9f);  // backward overwrites, never accumulates
  layer.bias_grad.fill(1e9f);
  layer.backward(x, y, dy, dx);

  // dx: central differences of the row's loss, with a step a small fraction of the row's
  // spread (the loss's third derivative grows as rstd^3, and rows may sit far from 0).
  for (std::size_t i = 0; i < rows; ++i) {
    const double h = 1e-5 / st[i].rstd;
    double mg = 0, mgx = 0;
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (xd[i * N + j] - st[i].mean) * st[i].rstd;
      mg += std::fabs(rd[i * N + j] * R.w[j]) / double(N);
      mgx += std::fabs(rd[i * N + j] * R.w[j] * xhat) / double(N);
    }
    for (std::size_t j = 0; j < N; ++j) {
      std::vector<double> row(xd.begin() + i * N, xd.begin() + (i + 1) * N);
      want[i * N + j] = solder::test::central_diff(
          [&](double v) {
            row[j] = v;
            return R.row_loss(row.data(), &rd[i * N]);
          },
          xd[i * N + j], h);
      const double xhat = (xd[i * N + j] - st[i].mean) * st[i].rstd;
      bound[i * N + j] = u * st[i].rstd *
                             (dx_u * (std::fabs(rd[i * N + j] * R.w[j]) + mg + (std::fabs(xhat) + 1) * mgx) +
                              mean_u * st[i].rstd * std::fabs(st[i].mean) * (mgx + std::fabs(xhat) * mg)) +
                         1e-9;  // the finite difference's own error
    }
  }
  CHECK(worst(dx.data(), want, bound) <= 1);

  // dweight, dbias: the loss is linear in them, so any step gives the derivative.
  std::vector<double> want_w(N), want_b(N), bound_w(N), bound_b(N);
  for (std::size_t j = 0; j < N; ++j) {
    reference Rp = R;
    want_w[j] = solder::test::central_diff(
        [&](double v) {
          Rp.w[j] = v;
          return Rp.loss(xd, rd);
        },
        R.w[j], 1e-3);
    Rp = R;
    want_b[j] = solder::test::central_diff(
        [&](double v) {
          Rp.b[j] = v;
          return Rp.loss(xd, rd);
        },
        R.b[j], 1e-3);
    double sw = 0, sb = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      const double xhat = (xd[i * N + j] - st[i].mean) * st[i].rstd;
      sw += dparam_u * std::fabs(rd[i * N + j] * xhat) + mean_u * std::fabs(rd[i * N + j]) * st[i].rstd * std::fabs(st[i].mean);
      sb += std::fabs(rd[i * N + j]);
    }
    bound_w[j] = u * sw + 1e-9;
    bound_b[j] = dparam_u * u * sb + 1e-9;
  }
  CHECK(worst(layer.weight_grad.data(), want_w, bound_w) <= 1);
  CHECK(worst(layer.bias_grad.data(), want_b, bound_b) <= 1);
}

}  // namespace

TEST_CASE("nn::layer_norm: constants, parameters and their names", "[nn][layer_norm]") {
  using L = solder::nn::layer_norm<37>;
  STATIC_REQUIRE(L::in_features == 37);
  STATIC_REQUIRE(L::out_features == 37);
  STATIC_REQUIRE(L::parameter_count == 74);
  STATIC_REQUIRE(L::saved_floats == 2);
  STATIC_REQUIRE(L::forward_flops > 0);
  STATIC_REQUIRE(L::backward_flops > L::forward_flops);
  CHECK(std::string(L::name) == "layer_norm");

  L layer(1e-3f);
  CHECK(layer.eps == 1e-3f);
  CHECK(L().eps == 1e-5f);  // torch's default
  CHECK(std::all_of(layer.weight.begin(), layer.weight.end(), [](float v) { return v == 1.0f; }));
  CHECK(std::all_of(layer.bias.begin(), layer.bias.end(), [](float v) { return v == 0.0f; }));

  const auto p = layer.params("3.");
  REQUIRE(p.size() == 2);
  CHECK(p[0].name == "3.weight");
  CHECK(p[0].value.data() == layer.weight.data());
  CHECK(p[0].grad.data() == layer.weight_grad.data());
  CHECK(p[0].value.size() == 37);
  CHECK(p[1].name == "3.bias");
  CHECK(p[1].value.data() == layer.bias.data());
  CHECK(p[1].grad.data() == layer.bias_grad.data());
}

TEST_CASE("nn::layer_norm: fixed known values", "[nn][layer_norm]") {
  // torch.nn.LayerNorm(3)(torch.tensor([[1., 2., 3.]])): (x - 2) / sqrt(2/3 + eps), eps the
  // float 1e-5 as torch's CPU kernel adds it; 1 / sqrt(2/3 + 1e-5f) = 1.2247356859086223.
  solder::nn::layer_norm<3> layer;
  tensor<float, shape<1, 3>> x, y;
  x[0] = 1;
  x[1] = 2;
  x[2] = 3;
  layer.forward(x, y);
  CHECK_THAT(y[0], Catch::Matchers::WithinULP(-1.2247356859086223f, 1));
  CHECK(y[1] == 0.0f);
  CHECK_THAT(y[2], Catch::Matchers::WithinULP(1.2247356859086223f, 1));

  // With weight 2 and bias 1 everywhere: 2 y + 1.
  layer.weight.fill(2);
  layer.bias.fill(1);
  layer.forward(x, y);
  CHECK_THAT(y[0], Catch::Matchers::WithinULP(float(1 - 2 * 1.2247356859086223), 1));
  CHECK(y[1] == 1.0f);
  CHECK_THAT(y[2], Catch::Matchers::WithinULP(float(1 + 2 * 1.2247356859086223), 1));
}

TEMPLATE_TEST_CASE_SIG("nn::layer_norm: static batch against the double reference and finite differences",
                       "[nn][layer_norm]", ((std::size_t N, std::size_t B), N, B), (3, 1), (3, 7), (37, 1), (37, 4),
                       (16, 3), (257, 3)) {
  check_layer<N, shape<B, N>>(B, 0.0, 2.0, 11);
}

TEMPLATE_TEST_CASE_SIG("nn::layer_norm: dynamic batch against the double reference and finite differences",
                       "[nn][layer_norm]", ((std::size_t N), N), (3), (37), (257)) {
  const std::size_t batch = GENERATE(1, 2, 9);
  check_layer<N, shape<dyn, N>>(batch, 0.5, 3.0, 21);
}

TEMPLATE_TEST_CASE_SIG("nn::layer_norm: rows far from zero mean keep their precision", "[nn][layer_norm]",
                       ((std::size_t N), N), (37), (257)) {
  // |mean| / std about 1700: E[x^2] - mean^2 would cancel to nothing in float.
  check_layer<N, shape<dyn, N>>(3, 1000.0, 1.0, 31);
  check_layer<N, shape<dyn, N>>(3, -300.0, 0.01, 32);
}

TEST_CASE("nn::layer_norm: the many-row path (several chunks, flushes to double)", "[nn][layer_norm]") {
  // 300 rows of 257: 5 chunks of 64 rows, each flushing once; 300 x 16 rows of 37: 256-row
  // chunks that flush every 64 rows.
  check_layer<257, shape<dyn, 257>>(300, 0.0, 1.0, 41);
  check_layer<37, shape<dyn, 37>>(4800, 0.25, 1.0, 42);
}

TEST_CASE("nn::layer_norm: a constant row gives y = bias exactly and a finite gradient", "[nn][layer_norm]") {
  solder::nn::layer_norm<37> layer;
  solder::test::fill_uniform(layer.weight, -1.5, 1.5, 5);
  solder::test::fill_uniform(layer.bias, -1, 1, 6);
  tensor<float, shape<dyn, 37>> x(2), y(2), dy(2), dx(2);
  std::fill(x.begin(), x.begin() + 37, 0.1f);  // not a sum of exact floats: the mean is corrected
  std::fill(x.begin() + 37, x.end(), -7.25f);
  solder::test::fill_uniform(dy, -1, 1, 7);
  layer.forward(x, y);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 37; ++j) CHECK(y(i, j) == layer.bias[j]);
  layer.backward(x, y, dy, dx);
  // xhat = 0: dx = rstd (g - mean g) with rstd = 1 / sqrt(eps), dweight = 0, dbias = sum dy.
  const double rstd = 1.0 / std::sqrt(double(1e-5f));
  for (std::size_t i = 0; i < 2; ++i) {
    double mg = 0;
    for (std::size_t j = 0; j < 37; ++j) mg += double(dy(i, j)) * layer.weight[j] / 37.0;
    for (std::size_t j = 0; j < 37; ++j)
      CHECK_THAT(dx(i, j), Catch::Matchers::WithinAbs(rstd * (double(dy(i, j)) * layer.weight[j] - mg), 1e-3));
  }
  for (std::size_t j = 0; j < 37; ++j) {
    CHECK(layer.weight_grad[j] == 0.0f);
    CHECK(layer.bias_grad[j] == dy(0, j) + dy(1, j));
  }
}

TEST_CASE("nn::layer_norm: one feature normalizes to the bias", "[nn][layer_norm]") {
  solder::nn::layer_norm<1> layer;
  layer.bias[0] = 0.5f;
  tensor<float, shape<dyn, 1>> x(3), y(3), dy(3), dx(3);
  x[0] = -2;
  x[1] = 1e30f;
  x[2] = 3;
  dy.fill(1);
  layer.forward(x, y);
  layer.backward(x, y, dy, dx);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(y[i] == 0.5f);
    CHECK(dx[i] == 0.0f);
  }
  CHECK(layer.weight_grad[0] == 0.0f);
  CHECK(layer.bias_grad[0] == 3.0f);
}

TEST_CASE("nn::layer_norm: NaN and infinity make their row NaN, and no other", "[nn][layer_norm]") {
  // As torch: the row's mean (and variance) are NaN, so every y of that row is; backward's row
  // sums carry a NaN dy to the whole dx row, and to that column's dweight and dbias only.
  solder::nn::layer_norm<37> layer;
  tensor<float, shape<dyn, 37>> x(4), y(4), dy(4), dx(4);
  solder::test::fill_uniform(x, -1, 1, 8);
  solder::test::fill_uniform(dy, -1, 1, 9);
  x(1, 5) = qnan;
  x(2, 36) = infty;  // in the vector tail
  x(3, 0) = -infty;
  layer.forward(x, y);
  for (std::size_t j = 0; j < 37; ++j) {
    CHECK(std::isfinite(y(0, j)));
    CHECK(std::isnan(y(1, j)));
    CHECK(std::isnan(y(2, j)));
    CHECK(std::isnan(y(3, j)));
  }

  solder::test::fill_uniform(x, -1, 1, 8);
  layer.forward(x, y);
  dy(2, 36) = qnan;
  layer.backward(x, y, dy, dx);
  for (std::size_t j = 0; j < 37; ++j) {
    CHECK(std::isfinite(dx(0, j)));
    CHECK(std::isnan(dx(2, j)));
    CHECK(std::isnan(layer.weight_grad[j]) == (j == 36));
    CHECK(std::isnan(layer.bias_grad[j]) == (j == 36));
  }
}

TEST_CASE("nn::layer_norm: in place (y = x, dx = dy) matches separate buffers bit for bit", "[nn][layer_norm]") {
  solder::nn::layer_norm<37> layer;
  solder::test::fill_uniform(layer.weight, -1.5, 1.5, 12);
  tensor<float, shape<dyn, 37>> x(5), y(5), dy(5), dx(5);
  solder::test::fill_uniform(x, -2, 2, 13);
  solder::test::fill_uniform(dy, -1, 1, 14);
  layer.forward(x, y);
  layer.backward(x, y, dy, dx);

  tensor<float, shape<dyn, 37>> xy = x, g = dy;
  layer.forward(tensor_ref<const float, shape<dyn, 37>>(xy.data(), 5), xy.ref());
  CHECK(same_bits(xy.data(), y.data(), y.size()));
  layer.backward(std::as_const(x).ref(), std::as_const(y).ref(), tensor_ref<const float, shape<dyn, 37>>(g.data(), 5), g.ref());
  CHECK(same_bits(g.data(), dx.data(), dx.size()));
}

TEST_CASE("nn::layer_norm: results do not depend on the thread count", "[nn][layer_norm]") {
  const int before = solder::num_threads();
  // 300 x 257 elements: above the parallel threshold; 5 chunks of dweight, dbias partials.
  constexpr std::size_t rows = 300, n = 257;
  solder::nn::layer_norm<n> layer;
  solder::test::fill_uniform(layer.weight, -1.5, 1.5, 15);
  solder::test::fill_uniform(layer.bias, -1, 1, 16);
  tensor<float, shape<dyn, n>> x(rows), dy(rows);
  solder::test::fill_uniform(x, -3, 3, 17);
  solder::test::fill_uniform(dy, -1, 1, 18);
  auto run = [&](int threads, tensor<float, shape<dyn, n>>& y, tensor<float, shape<dyn, n>>& dx,
                 tensor<float, shape<n>>& dw, tensor<float, shape<n>>& db) {
    solder::set_num_threads(threads);
    layer.forward(x, y);
    layer.backward(x, y, dy, dx);
    dw = layer.weight_grad;
    db = layer.bias_grad;
  };
  tensor<float, shape<dyn, n>> y1(rows), dx1(rows), y2(rows), dx2(rows);
  tensor<float, shape<n>> dw1, db1, dw2, db2;
  run(1, y1, dx1, dw1, db1);
  run(2, y2, dx2, dw2, db2);
  solder::set_num_threads(before);
  CHECK(same_bits(y1.data(), y2.data(), y1.size()));
  CHECK(same_bits(dx1.data(), dx2.data(), dx1.size()));
  CHECK(same_bits(dw1.data(), dw2.data(), n));
  CHECK(same_bits(db1.data(), db2.data(), n));
}

TEST_CASE("nn::layer_norm: batch mismatches and a backward without its forward are errors", "[nn][layer_norm]") {
  solder::nn::layer_norm<37> layer;
  tensor<float, shape<dyn, 37>> x(3), y(4), y3(3), dy(3), dx(3), x5(5), dx5(5), y5(5), dy5(5);
  CHECK_THROWS_WITH(layer.forward(x, y),
                    Contains("solder::nn::layer_norm::forward") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(layer.backward(x, y3, dy, dx),
                    Contains("solder::nn::layer_norm::backward: no forward has run"));
  layer.forward(x, y3);
  CHECK_THROWS_WITH(layer.backward(x, y, dy, dx),
                    Contains("solder::nn::layer_norm::backward") && Contains("x (3), y (4), dy (3) and dx (3) differ"));
  CHECK_THROWS_AS(layer.backward(x, y3, dy, dx5), solder::error);
  CHECK_THROWS_WITH(layer.backward(x5, y5, dy5, dx5), Contains("the last forward saw 3 rows but backward got 5"));
  CHECK_NOTHROW(layer.backward(x, y3, dy, dx));
}
