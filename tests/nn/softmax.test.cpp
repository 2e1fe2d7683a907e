// tests/nn/softmax.test.cpp: nn::softmax and nn::log_softmax against torch's formulas evaluated
// in double here: y, and dx against central finite differences of the double function's loss
// sum(r * y); row lengths with vector tails (1, 3, 16, 37, 257), batch 1 and many, static and
// dynamic batches, large logits (+-1000), fixed known values, NaN and infinities, in-place use,
// results independent of the thread count, and the run-time errors.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/nn/softmax.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::Contains;
using Catch::Matchers::WithinULP;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

/// Float's unit roundoff.
constexpr double u = 0x1p-24;
/// Roundoff allowed, in units u: x - max rounds by u |x - max|, which exp turns into a relative
/// error of u |x - max| (counted separately); beyond it, exp (xsimd: 1-2 ulp), the row sum
/// (about 20 u: 16 terms per lane in float, then across lanes, then double), the reciprocal or
/// log of the sum, and the final product or difference.
constexpr double forward_u = 24;
/// dx: the same sums (of dy y or dy) and a few products, relative to the magnitudes involved.
constexpr double backward_u = 24;
/// Central-difference step: softmax is shift-invariant, so a fixed step suits any offset.
constexpr double fd_h = 1e-5;

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// torch's softmax / log_softmax of one row in double: m = max x, s = sum exp(x - m).
void reference_row(bool log, const double* x, double* y, std::size_t n) {
  double m = -INFINITY;
  for (std::size_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  double s = 0;
  for (std::size_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  for (std::size_t j = 0; j < n; ++j) y[j] = log ? x[j] - m - std::log(s) : std::exp(x[j] - m) / s;
}

/// max_i |got_i - want_i| / bound_i: at most 1 passes; NaN (a NaN result) fails.
double worst(const float* got, const std::vector<double>& want, const std::vector<double>& bound) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]) / bound[i];
    if (!(e <= w)) w = e;  // keeps a NaN
  }
  return w;
}

/// Forward and backward of Layer (softmax<N> or log_softmax<N>) on x [batch, N] of shape S,
/// values offset +- spread, against reference_row and its finite differences.
template <class Layer, class S>
void check_layer(std::size_t batch, double offset, double spread, std::uint32_t seed) {
  constexpr std::size_t N = Layer::in_features;
  constexpr bool log = std::string_view(Layer::name) == "log_softmax";
  Layer layer;
  auto x = make<S>(batch), y = make<S>(batch), dy = make<S>(batch), dx = make<S>(batch);
  solder::test::fill_uniform(x, offset - spread, offset + spread, seed);
  solder::test::fill_uniform(dy, -1, 1, seed + 1);
  const std::size_t rows = x.size() / N;
  const std::vector<double> xd(x.begin(), x.end()), rd(dy.begin(), dy.end());

  layer.forward(x, y);
  std::vector<double> want(x.size()), bound(x.size()), p(x.size());
  for (std::size_t i = 0; i < rows; ++i) {
    reference_row(log, &xd[i * N], &want[i * N], N);
    reference_row(false, &xd[i * N], &p[i * N], N);
    const double m = *std::max_element(xd.begin() + i * N, xd.begin() + (i + 1) * N);
    for (std::size_t j = 0; j < N; ++j) {
      const double gap = m - xd[i * N + j];  // >= 0
      bound[i * N + j] = log ? u * (forward_u * (1 + std::fabs(want[i * N + j])) + 2 * gap)
                             : u * want[i * N + j] * (forward_u + 2 * gap) + 1e-40;
    }
  }
  CHECK(worst(y.data(), want, bound) <= 1);

  layer.backward(x, y, dy, dx);
  for (std::size_t i = 0; i < rows; ++i) {
    // The double layer's loss, as a function of element j of row i.
    std::vector<double> row(xd.begin() + i * N, xd.begin() + (i + 1) * N), out(N);
    double sdy = 0, sdyp = 0, lsum = 0;
    for (std::size_t k = 0; k < N; ++k) {
      sdy += std::fabs(rd[i * N + k]);
      sdyp += std::fabs(rd[i * N + k] * p[i * N + k]);
      lsum += std::fabs(rd[i * N + k] * want[i * N + k]);
    }
    // The finite difference's own error: each loss evaluation rounds by about
    // eps sum |r_k y_k| (a few eps for exp and log), divided by the step.
    const double fd_err = 8 * 0x1p-52 * (lsum + 1) / fd_h;
    const double m = *std::max_element(row.begin(), row.end());
    for (std::size_t j = 0; j < N; ++j) {
      want[i * N + j] = solder::test::central_diff(
          [&](double v) {
            row[j] = v;
            reference_row(log, row.data(), out.data(), N);
            double l = 0;
            for (std::size_t k = 0; k < N; ++k) l += rd[i * N + k] * out[k];
            return l;
          },
          xd[i * N + j], fd_h);
      row[j] = xd[i * N + j];
      // y_j carries the forward's relative error (its gap term) into both formulas.
      const double pj = p[i * N + j], gap = m - xd[i * N + j];
      bound[i * N + j] = fd_err + (log ? u * (backward_u * (std::fabs(rd[i * N + j]) + pj * sdy) + 2 * gap * pj * sdy)
                                       : u * pj * (backward_u + 2 * gap) * (std::fabs(rd[i * N + j]) + sdyp));
    }
  }
  CHECK(worst(dx.data(), want, bound) <= 1);
}

}  // namespace

TEST_CASE("nn::softmax, nn::log_softmax: constants", "[nn][softmax]") {
  using S = solder::nn::softmax<37>;
  using L = solder::nn::log_softmax<37>;
  STATIC_REQUIRE(S::in_features == 37);
  STATIC_REQUIRE(S::out_features == 37);
  STATIC_REQUIRE(L::in_features == 37);
  STATIC_REQUIRE(L::out_features == 37);
  STATIC_REQUIRE(S::parameter_count == 0);
  STATIC_REQUIRE(L::parameter_count == 0);
  STATIC_REQUIRE(S::saved_floats == 0);
  STATIC_REQUIRE(L::saved_floats == 0);
  STATIC_REQUIRE(S::forward_flops > 0);
  STATIC_REQUIRE(L::backward_flops > 0);
  CHECK(std::string(S::name) == "softmax");
  CHECK(std::string(L::name) == "log_softmax");
  CHECK(S().params("1.").empty());
  CHECK(L().params("1.").empty());
}

TEST_CASE("nn::softmax, nn::log_softmax: fixed known values", "[nn][softmax]") {
  // torch.softmax(torch.tensor([1., 2., 3.]), -1) and log_softmax, in double.
  tensor<float, shape<1, 3>> x, y;
  x[0] = 1;
  x[1] = 2;
  x[2] = 3;
  solder::nn::softmax<3>().forward(x, y);
  CHECK_THAT(y[0], WithinULP(0.09003057317038046f, 4));
  CHECK_THAT(y[1], WithinULP(0.24472847105479764f, 4));
  CHECK_THAT(y[2], WithinULP(0.6652409557748218f, 4));
  solder::nn::log_softmax<3>().forward(x, y);
  CHECK_THAT(y[0], WithinULP(-2.4076059644443806f, 4));
  CHECK_THAT(y[1], WithinULP(-1.4076059644443804f, 4));
  CHECK_THAT(y[2], WithinULP(-0.4076059644443804f, 4));

  // One feature: softmax 1 and log_softmax 0 exactly, whatever x is; a gradient of 0.
  tensor<float, shape<dyn, 1>> x1(3), y1(3), dy1(3), dx1(3);
  x1[0] = -5;
  x1[1] = 0;
  x1[2] = 1e30f;
  dy1.fill(2);
  solder::nn::softmax<1> s1;
  s1.forward(x1, y1);
  s1.backward(x1, y1, dy1, dx1);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(y1[i] == 1.0f);
    CHECK(dx1[i] == 0.0f);
  }
  solder::nn::log_softmax<1> l1;
  l1.forward(x1, y1);
  l1.backward(x1, y1, dy1, dx1);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(y1[i] == 0.0f);
    CHECK(dx1[i] == 0.0f);
  }

  // Equal logits: 1 / N each.
  tensor<float, shape<2, 37>> xe, ye;
  xe.fill(0.3f);
  solder::nn::softmax<37>().forward(xe, ye);
  for (float v : ye) CHECK_THAT(v, WithinULP(float(1.0 / 37), 4));
}

TEMPLATE_TEST_CASE_SIG("nn::softmax: static batch against the double reference and finite differences",
                       "[nn][softmax]", ((std::size_t N, std::size_t B), N, B), (1, 2), (3, 1), (3, 7), (16, 3), (37, 1),
                       (37, 4), (257, 3)) {
  check_layer<solder::nn::softmax<N>, shape<B, N>>(B, 0.0, 4.0, 11);
  check_layer<solder::nn::log_softmax<N>, shape<B, N>>(B, 0.0, 4.0, 12);
}

TEMPLATE_TEST_CASE_SIG("nn::softmax: dynamic batch against the double reference and finite differences",
                       "[nn][softmax]", ((std::size_t N), N), (3), (37), (257)) {
  const std::size_t batch = GENERATE(1, 2, 9);
  check_layer<solder::nn::softmax<N>, shape<dyn, N>>(batch, -1.0, 8.0, 21);
  check_layer<solder::nn::log_softmax<N>, shape<dyn, N>>(batch, -1.0, 8.0, 22);
}

TEMPLATE_TEST_CASE_SIG("nn::softmax: large logits (+-1000) are stable", "[nn][softmax]", ((std::size_t N), N), (3), (37),
                       (257)) {
  // exp(1000) overflows and exp(-1000) underflows: only x - max keeps these finite.
  check_layer<solder::nn::softmax<N>, shape<dyn, N>>(3, 1000.0, 10.0, 31);
  check_layer<solder::nn::log_softmax<N>, shape<dyn, N>>(3, 1000.0, 10.0, 32);
  check_layer<solder::nn::softmax<N>, shape<dyn, N>>(3, -1000.0, 10.0, 33);
  check_layer<solder::nn::log_softmax<N>, shape<dyn, N>>(3, -1000.0, 10.0, 34);

  // A row of [-1000, 0) and one 1000: the 1000 takes everything; the rest underflow to 0 (and
  // to finite logs, down to -2000).
  tensor<float, shape<1, N>> x, y;
  for (std::size_t j = 0; j < N; ++j) x[j] = -1000.0f + 1000.0f * float(j) / float(N);
  x[N / 2] = 1000.0f;
  solder::nn::softmax<N>().forward(x, y);
  for (std::size_t j = 0; j < N; ++j) CHECK(y[j] == (j == N / 2 ? 1.0f : 0.0f));
  solder::nn::log_softmax<N>().forward(x, y);
  for (std::size_t j = 0; j < N; ++j) CHECK(y[j] == x[j] - 1000.0f);
}

TEST_CASE("nn::softmax: the many-row path", "[nn][softmax]") {
  check_layer<solder::nn::softmax<257>, shape<dyn, 257>>(300, 0.0, 4.0, 41);
  check_layer<solder::nn::log_softmax<257>, shape<dyn, 257>>(300, 0.0, 4.0, 42);
  check_layer<solder::nn::softmax<1000>, shape<dyn, 1000>>(5, 0.0, 30.0, 43);  // several sum blocks
  check_layer<solder::nn::log_softmax<1000>, shape<dyn, 1000>>(5, 0.0, 30.0, 44);
}

TEST_CASE("nn::softmax: NaN, +inf and all -inf make their row NaN; -inf elsewhere gives 0", "[nn][softmax]") {
  // As torch: a NaN reaches the row's sum, so every output of the row is NaN; +inf is the max
  // and inf - inf is NaN; a row of only -inf has max -inf and -inf - -inf = NaN. A -inf among
  // finite logits has probability 0 (log-probability -inf).
  tensor<float, shape<dyn, 37>> x(5), y(5), ly(5);
  solder::test::fill_uniform(x, -2, 2, 7);
  x(1, 5) = qnan;
  x(2, 36) = infty;  // in the vector tail
  std::fill(x.begin() + 3 * 37, x.begin() + 4 * 37, -infty);
  x(4, 0) = -infty;
  x(4, 33) = -infty;
  solder::nn::softmax<37> s;
  solder::nn::log_softmax<37> l;
  s.forward(x, y);
  l.forward(x, ly);
  for (std::size_t j = 0; j < 37; ++j) {
    CHECK(std::isfinite(y(0, j)));
    CHECK(std::isfinite(ly(0, j)));
    for (std::size_t i = 1; i < 4; ++i) {
      CHECK(std::isnan(y(i, j)));
      CHECK(std::isnan(ly(i, j)));
    }
    if (j == 0 || j == 33) {
      CHECK(y(4, j) == 0.0f);
      CHECK(ly(4, j) == -infty);
    } else {
      CHECK(y(4, j) > 0.0f);
      CHECK(std::isfinite(ly(4, j)));
    }
  }

  // Backward: a NaN dy reaches its row's sum, so the whole dx row is NaN.
  solder::test::fill_uniform(x, -2, 2, 7);
  tensor<float, shape<dyn, 37>> dy(5), dx(5);
  solder::test::fill_uniform(dy, -1, 1, 8);
  dy(2, 36) = qnan;
  s.forward(x, y);
  s.backward(x, y, dy, dx);
  for (std::size_t j = 0; j < 37; ++j) {
    CHECK(std::isfinite(dx(1, j)));
    CHECK(std::isnan(dx(2, j)));
  }
  l.forward(x, y);
  l.backward(x, y, dy, dx);
  for (std::size_t j = 0; j < 37; ++j) {
    CHECK(std::isfinite(dx(1, j)));
    CHECK(std::isnan(dx(2, j)));
  }
}

TEST_CASE("nn::softmax: in place (y = x, dx = dy) matches separate buffers bit for bit", "[nn][softmax]") {
  auto check = [](auto layer) {
    tensor<float, shape<dyn, 37>> x(5), y(5), dy(5), dx(5);
    solder::test::fill_uniform(x, -4, 4, 13);
    solder::test::fill_uniform(dy, -1, 1, 14);
    layer.forward(x, y);
    layer.backward(x, y, dy, dx);
    tensor<float, shape<dyn, 37>> xy = x, g = dy;
    layer.forward(tensor_ref<const float, shape<dyn, 37>>(xy.data(), 5), xy.ref());
    CHECK(same_bits(xy.data(), y.data(), y.size()));
    layer.backward(std::as_const(x).ref(), std::as_const(y).ref(), tensor_ref<const float, shape<dyn, 37>>(g.data(), 5),
                   g.ref());
    CHECK(same_bits(g.data(), dx.data(), dx.size()));
  };
  check(solder::nn::softmax<37>{});
  check(solder::nn::log_softmax<37>{});
}

TEST_CASE("nn::softmax: results do not depend on the thread count", "[nn][softmax]") {
  const int before = solder::num_threads();
  constexpr std::size_t rows = 300, n = 257;  // 77100 elements: above the parallel threshold
  tensor<float, shape<dyn, n>> x(rows), dy(rows);
  solder::test::fill_uniform(x, -8, 8, 15);
  solder::test::fill_uniform(dy, -1, 1, 16);
  auto check = [&](auto layer) {
    tensor<float, shape<dyn, n>> y1(rows), dx1(rows), y2(rows), dx2(rows);
    solder::set_num_threads(1);
    layer.forward(x, y1);
    layer.backward(x, y1, dy, dx1);
    solder::set_num_threads(2);
    layer.forward(x, y2);
    layer.backward(x, y2, dy, dx2);
    solder::set_num_threads(before);
    CHECK(same_bits(y1.data(), y2.data(), y1.size()));
    CHECK(same_bits(dx1.data(), dx2.data(), dx1.size()));
  };
  check(solder::nn::softmax<n>{});
  check(solder::nn::log_softmax<n>{});
}

TEST_CASE("nn::softmax: batch mismatches are errors naming both batches", "[nn][softmax]") {
  tensor<float, shape<dyn, 37>> x(3), y(4), y3(3), dy(3), dx(3), dx5(5);
  solder::nn::softmax<37> s;
  solder::nn::log_softmax<37> l;
  CHECK_THROWS_WITH(s.forward(x, y), Contains("solder::nn::softmax::forward") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(l.forward(x, y), Contains("solder::nn::log_softmax::forward") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(s.backward(x, y3, dy, dx5),
                    Contains("solder::nn::softmax::backward") && Contains("x (3), y (3), dy (3) and dx (5) differ"));
  CHECK_THROWS_WITH(l.backward(x, y, dy, dx),
                    Contains("solder::nn::log_softmax::backward") && Contains("x (3), y (4), dy (3) and dx (3) differ"));
}
