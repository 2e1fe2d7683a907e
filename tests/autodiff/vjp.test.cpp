// tests/autodiff/vjp.test.cpp: vjp's gradient expressions against central finite differences:
// arithmetic, transcendental chains, where, relu/sigmoid/gelu chains, dropout chains, leaves
// broadcast over rows and channels, a variable used twice, and a dynamic batch.
//
// Method: the loss is L = sum_j dy_j y_j, accumulated in double from y = f(inputs) evaluated
// by solder in float; each input element is moved by +-h in turn and the two losses give
// dL/dx_i = (L+ - L-) / (x_i+ - x_i-), the step as actually stored in float.
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include <catch2/catch.hpp>

#include "solder/autodiff/vjp.hpp"
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "support/data.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::WithinAbs;
using solder::dyn;
using solder::shape;
using solder::tensor;

/// The finite-difference step (x +- h is rounded to float; the quotient divides by the step as
/// stored). Error of the difference quotient, per output element the input feeds, with
/// |dy| <= 1, |y| <= 4 and forward results within 2 ulps: rounding 2 * 2 u * 4 / (2h) = 6e-5,
/// truncation h^2 |L'''| / 6 <= 1e-4 for |L'''| <= 10. h = 2^-7 balances the two.
constexpr double fd_step = 0x1p-7;
/// Inputs stay this far from every kink (relu's 0, where's switch), twice the step.
constexpr double kink_margin = 2 * fd_step;
/// Allowed |analytic - finite difference|: 4e-4 per output element the input feeds (2.5x the
/// estimate above; a broadcast leaf adds up the errors of its whole row or channel; measured:
/// at most 2.5e-5) ...
constexpr double fd_abs_per_output = 4e-4;
/// ... plus 5e-4 of the gradient's magnitude (truncation grows with the function's scale).
constexpr double fd_rel = 5e-4;

/// L = sum_j dy_j y_j in double, y = f(views of the leaves) evaluated by solder in float.
template <class F, class DyT, class... Leaves>
double loss(F& f, const DyT& dy, const Leaves&... leaves) {
  using S = typename DyT::shape_type;
  const tensor<float, S> y = f(leaves.ref()...);
  double l = 0;
  for (std::size_t j = 0; j < y.size(); ++j) l += double(dy[j]) * double(y[j]);
  return l;
}

/// Checks every element of every leaf's gradient from vjp(f, dy, leaves...) (evaluated in one
/// assign_all pass) against its central difference.
template <class F, class DyT, class... Leaves>
void check_vjp(const std::string& what, F f, const DyT& dy, Leaves&... leaves) {
  // The analytic gradients, one pass.
  std::tuple<Leaves...> grads{leaves...};  // same shapes and batches as the leaves
  std::apply([](auto&... g) { (g.fill(0.0f), ...); }, grads);
  auto exprs = solder::vjp(f, dy, leaves...);
  std::apply(
      [&](auto&... g) { std::apply([&](const auto&... e) { solder::assign_all(solder::write(g, e)...); }, exprs); },
      grads);

  // The finite differences, leaf by leaf, element by element.
  const std::size_t outputs = dy.size();
  auto check_leaf = [&](auto& leaf, const auto& grad, std::size_t k) {
    const std::size_t fanout = outputs / leaf.size();  // outputs each element of this leaf feeds
    const double tol_abs = fd_abs_per_output * double(fanout);
    std::size_t bad = 0;
    std::ostringstream first;
    for (std::size_t i = 0; i < leaf.size(); ++i) {
      const float v = leaf[i];
      leaf[i] = float(v + fd_step);
      const double up = leaf[i], l_up = loss(f, dy, leaves...);
      leaf[i] = float(v - fd_step);
      const double down = leaf[i], l_down = loss(f, dy, leaves...);
      leaf[i] = v;
      const double fd = (l_up - l_down) / (up - down);
      if ((WithinAbs(fd, tol_abs + fd_rel * std::fabs(fd))).match(grad[i])) continue;
      if (bad++ == 0)
        first << std::setprecision(7) << "element " << i << " (value " << v << "): vjp " << grad[i]
              << ", finite difference " << fd;
    }
    INFO(what << ": gradient of argument " << k << " (" << leaf.size() << " elements, each feeding " << fanout
              << " outputs); " << bad << " off; first: " << first.str());
    CHECK(bad == 0);
  };
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (check_leaf(leaves, std::get<K>(grads), K), ...);
  }(std::index_sequence_for<Leaves...>{});
}

/// x = pre - b with pre at least kink_margin from 0: relu(x + b) and friends stay off the kink.
template <class X, class Bias>
void fill_preactivation(X& x, const Bias& b, std::uint32_t seed) {
  solder::test::fill_away(x, -2, 2, seed, {0.0}, kink_margin * 2);
  const std::size_t n = b.size();
  for (std::size_t i = 0; i < x.size(); ++i) x[i] -= b[i % n];
}

constexpr std::size_t B = 3, N = 37;

}  // namespace

TEST_CASE("vjp: x * x + b: a variable used twice, a broadcast bias", "[autodiff]") {
  tensor<float, shape<B, N>> x, dy;
  tensor<float, shape<N>> b;
  solder::test::fill_uniform(x, -2, 2, 701);
  solder::test::fill_uniform(b, -1, 1, 702);
  solder::test::fill_uniform(dy, -1, 1, 703);
  auto f = [](auto x, auto b) { return x * x + b; };
  check_vjp("x * x + b", f, dy, x, b);

  // The closed forms: dx = 2 x dy exactly (a product and a doubling), db = column sums of dy.
  auto [gx, gb] = solder::vjp(f, dy, x, b);
  STATIC_REQUIRE(std::is_same_v<solder::shape_of<decltype(gx)>, shape<B, N>>);
  STATIC_REQUIRE(std::is_same_v<solder::shape_of<decltype(gb)>, shape<N>>);  // summed down to b's shape
  tensor<float, shape<B, N>> dx;
  tensor<float, shape<N>> db;
  dx = gx;  // separate passes give the same values as one assign_all
  db = gb;
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(dx[i] == dy[i] * x[i] + dy[i] * x[i]);
  for (std::size_t j = 0; j < N; ++j) {
    double want = 0, scale = 0;
    for (std::size_t r = 0; r < B; ++r) {
      want += dy[r * N + j];
      scale += std::fabs(dy[r * N + j]);
    }
    CHECK_THAT(db[j], WithinAbs(want, B * 0x1p-24 * scale));  // B float additions
  }
}

TEST_CASE("vjp: exp(tanh(x)) * y, both arguments", "[autodiff]") {
  tensor<float, shape<B, N>> x, y, dy;
  solder::test::fill_uniform(x, -2, 2, 711);
  solder::test::fill_uniform(y, -2, 2, 712);
  solder::test::fill_uniform(dy, -1, 1, 713);
  check_vjp("exp(tanh(x)) * y", [](auto x, auto y) { return solder::exp(solder::tanh(x)) * y; }, dy, x, y);
}

TEST_CASE("vjp: where(x > 0, x, 0.1 x), a leaky relu by selection", "[autodiff]") {
  tensor<float, shape<B, N>> x, dy;
  solder::test::fill_away(x, -2, 2, 721, {0.0}, kink_margin);
  solder::test::fill_uniform(dy, -1, 1, 722);
  check_vjp("where(x > 0, x, 0.1 x)", [](auto x) { return solder::where(x > 0.0f, x, 0.1f * x); }, dy, x);
}

TEST_CASE("vjp: relu, sigmoid and gelu chains", "[autodiff]") {
  tensor<float, shape<B, N>> x, dy;
  tensor<float, shape<N>> b, w;
  solder::test::fill_uniform(b, -1, 1, 731);
  solder::test::fill_uniform(w, -1.5, 1.5, 732);
  solder::test::fill_uniform(dy, -1, 1, 733);
  SECTION("relu(x + b)") {
    fill_preactivation(x, b, 734);
    check_vjp("relu(x + b)", [](auto x, auto b) { return solder::relu(x + b); }, dy, x, b);
  }
  SECTION("sigmoid(x * w + b)") {
    solder::test::fill_uniform(x, -2, 2, 735);
    check_vjp("sigmoid(x * w + b)", [](auto x, auto w, auto b) { return solder::sigmoid(x * w + b); }, dy, x, w, b);
  }
  SECTION("gelu(sigmoid(x) * w + b)") {
    solder::test::fill_uniform(x, -2, 2, 736);
    check_vjp("gelu(sigmoid(x) * w + b)",
              [](auto x, auto w, auto b) { return solder::gelu(solder::sigmoid(x) * w + b); }, dy, x, w, b);
  }
  SECTION("relu(gelu(x) + b), b > 0.2: gelu(x) >= -0.17 keeps it off the kink") {
    solder::test::fill_uniform(x, -3, 3, 737);
    solder::test::fill_uniform(b, 0.2 + kink_margin, 1, 738);
    check_vjp("relu(gelu(x) + b)", [](auto x, auto b) { return solder::relu(solder::gelu(x) + b); }, dy, x, b);
  }
  SECTION("x * sigmoid(x) / (1 + w * w): a variable twice, and the quotient rule") {
    solder::test::fill_uniform(x, -2, 2, 739);
    check_vjp("x * sigmoid(x) / (1 + w * w)",
              [](auto x, auto w) { return x * solder::sigmoid(x) / (1.0f + w * w); }, dy, x, w);
  }
}

TEST_CASE("vjp: dropout chains", "[autodiff]") {
  tensor<float, shape<B, N>> x, y, dy;
  tensor<float, shape<N>> b;
  solder::test::fill_uniform(b, -1, 1, 741);
  solder::test::fill_uniform(dy, -1, 1, 742);
  SECTION("dropout(relu(x + b), 0.3)") {
    fill_preactivation(x, b, 743);
    auto f = [](auto x, auto b) { return solder::dropout(solder::relu(x + b), 0.3f, solder::philox_state{5, 6}); };
    check_vjp("dropout(relu(x + b), 0.3)", f, dy, x, b);
    // The closed form: dx = dy * keep * scale * (x + b > 0), the mask of the forward.
    auto [gx, gb] = solder::vjp(f, dy, x, b);
    tensor<float, shape<B, N>> dx;
    tensor<float, shape<N>> db;
    solder::assign_all(solder::write(dx, gx), solder::write(db, gb));
    const solder::test::dropout_rule rule{0.3, 5, 6};
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = rule.keep(i) && x[i] + b[i % N] > 0.0f ? dy[i] * rule.scale() : 0.0f;
      bad += dx[i] != want;
    }
    CHECK(bad == 0);
  }
  SECTION("dropout(tanh(x), 0.5) * y") {
    solder::test::fill_uniform(x, -2, 2, 744);
    solder::test::fill_uniform(y, -2, 2, 745);
    check_vjp("dropout(tanh(x), 0.5) * y",
              [](auto x, auto y) { return solder::dropout(solder::tanh(x), 0.5f, solder::philox_state{8, 1}) * y; }, dy,
              x, y);
  }
}

TEST_CASE("vjp: leaves broadcast over channels, rows and columns", "[autodiff]") {
  SECTION("tanh(x * s + t), s and t per channel [C, 1, 1] over [C, H, W]") {
    constexpr std::size_t C = 2, H = 3, W = 5;
    tensor<float, shape<C, H, W>> x, dy;
    tensor<float, shape<C, 1, 1>> s, t;
    solder::test::fill_uniform(x, -2, 2, 751);
    solder::test::fill_uniform(s, 0.5, 1.5, 752);
    solder::test::fill_uniform(t, -0.5, 0.5, 753);
    solder::test::fill_uniform(dy, -1, 1, 754);
    check_vjp("tanh(x * s + t)", [](auto x, auto s, auto t) { return solder::tanh(x * s + t); }, dy, x, s, t);
  }
  SECTION("(x + b) * c + b: a column [B, 1], a bias used twice") {
    tensor<float, shape<B, N>> x, dy;
    tensor<float, shape<B, 1>> c;
    tensor<float, shape<N>> b;
    solder::test::fill_uniform(x, -2, 2, 755);
    solder::test::fill_uniform(c, -1, 1, 756);
    solder::test::fill_uniform(b, -1, 1, 757);
    solder::test::fill_uniform(dy, -1, 1, 758);
    check_vjp("(x + b) * c + b", [](auto x, auto c, auto b) { return (x + b) * c + b; }, dy, x, c, b);
  }
}

TEST_CASE("vjp: a dynamic batch", "[autodiff]") {
  const std::size_t batch = GENERATE(1, 4);
  using S = shape<dyn, N>;
  auto x = make<S>(batch), dy = make<S>(batch);
  tensor<float, shape<N>> b;
  solder::test::fill_uniform(b, -1, 1, 761);
  solder::test::fill_uniform(dy, -1, 1, 762);
  fill_preactivation(x, b, 763);
  check_vjp("sigmoid(relu(x + b)) on a dynamic batch",
            [](auto x, auto b) { return solder::sigmoid(solder::relu(x + b)); }, dy, x, b);
}

TEST_CASE("vjp: the upstream gradient may be an expression", "[autodiff]") {
  tensor<float, shape<B, N>> x, dy;
  tensor<float, shape<N>> b;
  solder::test::fill_uniform(x, -2, 2, 771);
  solder::test::fill_uniform(b, -1, 1, 772);
  solder::test::fill_uniform(dy, -1, 1, 773);
  auto f = [](auto x, auto b) { return solder::tanh(x) * b; };
  auto [gx1, gb1] = solder::vjp(f, dy, x, b);
  auto [gx2, gb2] = solder::vjp(f, dy * 2.0f, x, b);
  tensor<float, shape<B, N>> dx1, dx2;
  tensor<float, shape<N>> db1, db2;
  solder::assign_all(solder::write(dx1, gx1), solder::write(db1, gb1));
  solder::assign_all(solder::write(dx2, gx2), solder::write(db2, gb2));
  // Doubling is exact, so the doubled upstream gradient doubles every result exactly.
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(dx2[i] == 2.0f * dx1[i]);
  for (std::size_t j = 0; j < N; ++j) CHECK(db2[j] == 2.0f * db1[j]);
}
