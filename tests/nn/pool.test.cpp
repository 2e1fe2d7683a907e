// tests/nn/pool.test.cpp: nn::max_pool2d, avg_pool2d and adaptive_avg_pool2d against torch's
// definitions evaluated in double here: y, and dx against central finite differences of the
// double layer's loss sum(r * y); kernels 1 to 3, strides 1 to 3, padding, odd and non-square
// planes, count_include_pad both ways, non-divisible adaptive sizes (and more outputs than
// inputs), static and dynamic batches, fixed known values, the max tie rule, NaN and infinity,
// results independent of the thread count, the planner traits and the run-time errors.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/nn/layer_info.hpp"
#include "solder/nn/pool.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::Contains;
using solder::dyn;
using solder::fixed_string;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;
using solder::nn::sample_shape;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

/// Float's unit roundoff.
constexpr double u = 0x1p-24;
/// Roundoff allowed beyond the terms' own count, in units u: a float sum of m terms errs by
/// (m - 1) u times the sum of their magnitudes; one u more for each division by a window size
/// (two for adaptive pooling's / kh / kw) and one for rounding the result. So (m + 2) u covers
/// every pooling result, forward and backward (max forward is exact: it selects, never rounds).
constexpr double extra_u = 2;
/// The finite difference's own error: the losses are (piecewise) linear, so there is no
/// truncation error, only rounding, about 1e-16 |loss| / h with |loss| < 1e3 and h = 1e-3.
constexpr double fd_abs = 1e-9;
/// Step of the finite differences: max pooling's inputs are at least 4h apart (make_distinct),
/// so no step moves an argmax.
constexpr double fd_h = 1e-3;

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// One input element of a window and its weight in an average (1 for max).
struct term {
  std::size_t in;
  double weight;
};

/// A pooling of one H x W plane into Ho x Wo, from torch's definitions: each output's window,
/// its input elements in row-major order (padding left out) with their weights.
struct plane_ref {
  std::size_t h, w, ho, wo;
  bool is_max;
  std::vector<std::vector<term>> windows;  // per output, row-major

  /// Output o of a plane x: the weighted sum, or torch's max (a NaN makes it NaN).
  double out(const double* x, std::size_t o) const {
    if (!is_max) {
      double s = 0;
      for (const term& t : windows[o]) s += t.weight * x[t.in];
      return s;
    }
    // torch: a larger value or any NaN replaces the running max (so the last NaN stays).
    double best = -std::numeric_limits<double>::infinity();
    for (const term& t : windows[o])
      if (x[t.in] > best || std::isnan(x[t.in])) best = x[t.in];
    return best;
  }
  /// sum over planes and outputs of r * y.
  double loss(const std::vector<double>& x, const std::vector<double>& r) const {
    double l = 0;
    for (std::size_t p = 0; p < x.size() / (h * w); ++p)
      for (std::size_t o = 0; o < ho * wo; ++o) l += r[p * ho * wo + o] * out(&x[p * h * w], o);
    return l;
  }
};

/// max_pool2d / avg_pool2d of torch: window (oh, ow) covers padded rows oh S - P .. oh S - P + K - 1
/// (likewise columns); avg divides by the window's positions inside [-P, H + P) x [-P, W + P)
/// when count_include_pad, else by those inside the input.
plane_ref strided_ref(std::size_t h, std::size_t w, std::size_t k, std::size_t s, std::size_t p, bool is_max,
                      bool count_include_pad) {
  const std::size_t ho = (h + 2 * p - k) / s + 1, wo = (w + 2 * p - k) / s + 1;
  plane_ref R{h, w, ho, wo, is_max, {}};
  const long H = long(h), W = long(w), P = long(p);
  for (std::size_t oh = 0; oh < ho; ++oh)
    for (std::size_t ow = 0; ow < wo; ++ow) {
      std::vector<term> win;
      double padded = 0;
      for (std::size_t a = 0; a < k; ++a)
        for (std::size_t b = 0; b < k; ++b) {
          const long ih = long(oh * s + a) - P, iw = long(ow * s + b) - P;
          padded += ih >= -P && ih < H + P && iw >= -P && iw < W + P;
          if (ih >= 0 && ih < H && iw >= 0 && iw < W) win.push_back({std::size_t(ih * W + iw), 1.0});
        }
      const double divisor = count_include_pad ? padded : double(win.size());
      if (!is_max)
        for (term& t : win) t.weight = 1.0 / divisor;
      R.windows.push_back(win);
    }
  return R;
}

/// adaptive_avg_pool2d of torch: rows floor(o H / Oh) to ceil((o + 1) H / Oh) (exclusive), likewise
/// columns, each element weighted 1 / (rows * columns).
plane_ref adaptive_ref(std::size_t h, std::size_t w, std::size_t ho, std::size_t wo) {
  plane_ref R{h, w, ho, wo, false, {}};
  for (std::size_t oh = 0; oh < ho; ++oh)
    for (std::size_t ow = 0; ow < wo; ++ow) {
      const auto h0 = std::size_t(std::floor(double(oh * h) / double(ho)));
      const auto h1 = std::size_t(std::ceil(double((oh + 1) * h) / double(ho)));
      const auto w0 = std::size_t(std::floor(double(ow * w) / double(wo)));
      const auto w1 = std::size_t(std::ceil(double((ow + 1) * w) / double(wo)));
      std::vector<term> win;
      for (std::size_t ih = h0; ih < h1; ++ih)
        for (std::size_t iw = w0; iw < w1; ++iw) win.push_back({ih * w + iw, 1.0 / double((h1 - h0) * (w1 - w0))});
      R.windows.push_back(win);
    }
  return R;
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

/// Distinct values in [-1, 1) at least 0.004 apart (4 fd_h), shuffled: no ties, and no finite
/// difference step changes an argmax.
template <class R>
void make_distinct(R& t, std::uint32_t seed) {
  std::vector<std::size_t> order(t.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::mt19937 gen(seed);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[gen() % i]);  // Fisher-Yates, portable
  const double step = std::min(0.004 * 8, 2.0 / double(t.size()));
  REQUIRE(step >= 4 * fd_h);
  for (std::size_t i = 0; i < order.size(); ++i) t[i] = float(-1.0 + step * double(order[i]));
}

/// Forward and backward of `layer` on x [batch, C, H, W] of shape SX against the plane
/// reference R and its finite differences; dx starts as garbage (backward overwrites it).
template <class SX, class SY, class Layer>
void check_layer(Layer& layer, const plane_ref& R, std::size_t batch, std::uint32_t seed) {
  auto x = make<SX>(batch);
  auto y = make<SY>(batch), dy = make<SY>(batch);
  auto dx = make<SX>(batch);
  if (R.is_max)
    make_distinct(x, seed);
  else
    solder::test::fill_uniform(x, -2, 2, seed);
  solder::test::fill_uniform(dy, -1, 1, seed + 1);
  const std::size_t planes = x.size() / (R.h * R.w), outs = R.ho * R.wo;
  REQUIRE(y.size() == planes * outs);

  std::vector<double> xd(x.begin(), x.end()), rd(dy.begin(), dy.end());
  layer.forward(x, y);
  std::vector<double> want(y.size()), bound(y.size());
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t o = 0; o < outs; ++o) {
      want[p * outs + o] = R.out(&xd[p * R.h * R.w], o);
      double mag = 0;
      for (const term& t : R.windows[o]) mag += std::fabs(t.weight * xd[p * R.h * R.w + t.in]);
      bound[p * outs + o] = R.is_max ? 1e-300 : (double(R.windows[o].size()) + extra_u) * u * mag + 1e-300;
    }
  CHECK(worst(y.data(), want, bound) <= 1);

  dx.fill(1e9f);
  layer.backward(x, y, dy, dx);
  std::vector<double> gwant(x.size()), gbound(x.size());
  std::vector<double> mag(R.h * R.w), count(R.h * R.w);
  for (std::size_t p = 0; p < planes; ++p) {
    std::fill(mag.begin(), mag.end(), 0.0);
    std::fill(count.begin(), count.end(), 0.0);
    for (std::size_t o = 0; o < outs; ++o)
      for (const term& t : R.windows[o]) {
        mag[t.in] += std::fabs(rd[p * outs + o] * t.weight);
        count[t.in] += 1;
      }
    for (std::size_t i = 0; i < R.h * R.w; ++i) {
      const std::size_t at = p * R.h * R.w + i;
      gwant[at] = solder::test::central_diff(
          [&](double v) {
            const double keep = xd[at];
            xd[at] = v;
            const double l = R.loss(xd, rd);
            xd[at] = keep;
            return l;
          },
          xd[at], fd_h);
      gbound[at] = (count[i] + extra_u) * u * mag[i] + fd_abs;
    }
  }
  CHECK(worst(dx.data(), gwant, gbound) <= 1);
}

template <std::size_t K, std::size_t S, std::size_t P, std::size_t H, std::size_t W>
void check_strided(std::size_t batch, std::uint32_t seed) {
  constexpr std::size_t C = 3, Ho = (H + 2 * P - K) / S + 1, Wo = (W + 2 * P - K) / S + 1;
  using SX = shape<dyn, C, H, W>;
  using SY = shape<dyn, C, Ho, Wo>;
  {
    INFO("max_pool2d");
    solder::nn::max_pool2d<K, S, P> layer;
    check_layer<SX, SY>(layer, strided_ref(H, W, K, S, P, true, true), batch, seed);
    check_layer<shape<2, C, H, W>, shape<2, C, Ho, Wo>>(layer, strided_ref(H, W, K, S, P, true, true), 2, seed + 10);
  }
  {
    INFO("avg_pool2d, count_include_pad");
    solder::nn::avg_pool2d<K, S, P, true> layer;
    check_layer<SX, SY>(layer, strided_ref(H, W, K, S, P, false, true), batch, seed + 20);
    check_layer<shape<2, C, H, W>, shape<2, C, Ho, Wo>>(layer, strided_ref(H, W, K, S, P, false, true), 2, seed + 30);
  }
  {
    INFO("avg_pool2d, count_include_pad=False");
    solder::nn::avg_pool2d<K, S, P, false> layer;
    check_layer<SX, SY>(layer, strided_ref(H, W, K, S, P, false, false), batch, seed + 40);
  }
}

/// A tensor's elements, for comparisons that print them on failure.
template <class T>
std::vector<float> values(const T& t) {
  return std::vector<float>(t.begin(), t.end());
}

/// x [1, 1, 4, 4] = 1 .. 16 row by row.
tensor<float, shape<1, 1, 4, 4>> one_to_sixteen() {
  tensor<float, shape<1, 1, 4, 4>> x;
  for (std::size_t i = 0; i < 16; ++i) x[i] = float(i + 1);
  return x;
}

}  // namespace

TEST_CASE("nn pooling: names, planner traits and parameters", "[nn][pool]") {
  using M = solder::nn::max_pool2d<3, 2, 1>;
  using M3 = solder::nn::max_pool2d<3>;
  using A = solder::nn::avg_pool2d<2>;
  using D = solder::nn::adaptive_avg_pool2d<3, 2>;
  using G = solder::nn::global_avg_pool2d;
  CHECK(std::string(M::name) == "max_pool2d");
  CHECK(std::string(A::name) == "avg_pool2d");
  CHECK(std::string(D::name) == "adaptive_avg_pool2d");
  CHECK(std::string(G::name) == "adaptive_avg_pool2d");

  using TM = M::planner_traits;
  STATIC_REQUIRE(TM::kind == solder::nn::layer_kind::block);
  STATIC_REQUIRE(TM::in == 0);
  STATIC_REQUIRE(TM::out == 0);
  STATIC_REQUIRE(TM::parameters == 0);
  STATIC_REQUIRE(solder::nn::layer_info<M>::kind == solder::nn::layer_kind::block);
  STATIC_REQUIRE(solder::nn::layer_info<D>::parameters == 0);
  // (7 + 2 - 3) / 2 + 1 = 4, (5 + 2 - 3) / 2 + 1 = 3.
  STATIC_REQUIRE(TM::takes(sample_shape(3, 7, 5)));
  STATIC_REQUIRE(TM::gives(sample_shape(3, 7, 5)) == sample_shape(3, 4, 3));
  STATIC_REQUIRE(TM::takes(sample_shape(1, 1, 1)));  // 1 + 2 >= 3: one window
  STATIC_REQUIRE(!TM::takes(sample_shape(3, 7)));
  STATIC_REQUIRE(!TM::takes(sample_shape(1, 3, 7, 5)));
  STATIC_REQUIRE(M3::planner_traits::takes(sample_shape(2, 3, 3)));
  STATIC_REQUIRE(!M3::planner_traits::takes(sample_shape(2, 2, 3)));
  STATIC_REQUIRE(M3::planner_traits::gives(sample_shape(2, 8, 7)) == sample_shape(2, 2, 2));
  STATIC_REQUIRE(A::planner_traits::gives(sample_shape(16, 7, 5)) == sample_shape(16, 3, 2));
  STATIC_REQUIRE(!A::planner_traits::takes(sample_shape(16, 1, 5)));
  STATIC_REQUIRE(D::planner_traits::takes(sample_shape(4, 1, 1)));
  STATIC_REQUIRE(D::planner_traits::gives(sample_shape(4, 7, 5)) == sample_shape(4, 3, 2));
  STATIC_REQUIRE(G::planner_traits::gives(sample_shape(64, 7, 7)) == sample_shape(64, 1, 1));
  STATIC_REQUIRE(!D::planner_traits::takes(sample_shape(4, 5)));

  // FLOPs and saved floats per sample, given the features after the layer (48 = 3 * 4 * 4).
  STATIC_REQUIRE(TM::forward_flops(48) == 9 * 48.0);
  STATIC_REQUIRE(TM::saved_floats(48) == 48);  // the argmax of each output
  STATIC_REQUIRE(A::planner_traits::forward_flops(48) == 4 * 48.0);
  STATIC_REQUIRE(A::planner_traits::saved_floats(48) == 0);
  STATIC_REQUIRE(D::planner_traits::saved_floats(48) == 0);

  auto takes_text = [](auto append) {
    fixed_string s;
    append(s);
    return std::string(s.text, s.length);
  };
  CHECK(takes_text(TM::append_takes) == "[C, H, W] with H + 2*1 >= 3 and W + 2*1 >= 3");
  CHECK(takes_text(M3::planner_traits::append_takes) == "[C, H, W] with H, W >= 3");
  CHECK(takes_text(D::planner_traits::append_takes) == "[C, H, W]");
  CHECK(takes_text(solder::nn::max_pool2d<1>::planner_traits::append_takes) == "[C, H, W]");

  M m;
  A a;
  D d;
  CHECK(m.params("0.").empty());
  CHECK(a.params().empty());
  CHECK(d.params().empty());
}

TEST_CASE("nn pooling: fixed known values on a 4x4 input", "[nn][pool]") {
  const auto x = one_to_sixteen();  // rows 1-4, 5-8, 9-12, 13-16
  SECTION("max_pool2d<2>: the bottom-right of each 2x2 block; dy goes there") {
    solder::nn::max_pool2d<2> layer;
    tensor<float, shape<1, 1, 2, 2>> y, dy;
    tensor<float, shape<1, 1, 4, 4>> dx;
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>{6, 8, 14, 16});
    dy[0] = 1;
    dy[1] = 2;
    dy[2] = 3;
    dy[3] = 4;
    layer.backward(x, y, dy, dx);
    CHECK(values(dx) == std::vector<float>{0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4});
  }
  SECTION("max_pool2d<3, 2, 1>: windows rows {0, 1} and {1, 2, 3}, likewise columns") {
    solder::nn::max_pool2d<3, 2, 1> layer;
    tensor<float, shape<1, 1, 2, 2>> y;
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>{6, 8, 14, 16});
  }
  SECTION("avg_pool2d<2>: the 2x2 block means") {
    solder::nn::avg_pool2d<2> layer;
    tensor<float, shape<1, 1, 2, 2>> y, dy;
    tensor<float, shape<1, 1, 4, 4>> dx;
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>{3.5f, 5.5f, 11.5f, 13.5f});
    dy.fill(2);
    layer.backward(x, y, dy, dx);
    CHECK(values(dx) == std::vector<float>(16, 0.5f));
  }
  SECTION("avg_pool2d<3, 2, 1>: the padding counts (divisor 9) or not (4, 6, 6, 9)") {
    // Window sums: rows {0, 1} x columns {0, 1}: 1 + 2 + 5 + 6 = 14; {0, 1} x {1, 2, 3}: 30;
    // {1, 2, 3} x {0, 1}: 5 + 6 + 9 + 10 + 13 + 14 = 57; {1, 2, 3} x {1, 2, 3}: 99.
    tensor<float, shape<1, 1, 2, 2>> y, dy;
    tensor<float, shape<1, 1, 4, 4>> dx;
    solder::nn::avg_pool2d<3, 2, 1, true> with_pad;
    with_pad.forward(x, y);
    CHECK(values(y) == std::vector<float>{14.0f / 9, 30.0f / 9, 57.0f / 9, 11});
    solder::nn::avg_pool2d<3, 2, 1, false> without_pad;
    without_pad.forward(x, y);
    CHECK(values(y) == std::vector<float>{3.5f, 5, 9.5f, 11});
    // dy = 1: dx(1, 1) is in all four windows: 1/4 + 1/6 + 1/6 + 1/9 (summed in that order).
    dy.fill(1);
    without_pad.backward(x, y, dy, dx);
    CHECK(dx(0, 0, 0, 0) == 0.25f);
    CHECK(dx(0, 0, 1, 1) == 0.25f + 1.0f / 6 + 1.0f / 6 + 1.0f / 9);
    CHECK(dx(0, 0, 3, 3) == 1.0f / 9);
  }
  SECTION("adaptive_avg_pool2d<3>: overlapping windows [0, 2), [1, 3), [2, 4)") {
    solder::nn::adaptive_avg_pool2d<3> layer;
    tensor<float, shape<1, 1, 3, 3>> y;
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>{3.5f, 4.5f, 5.5f, 7.5f, 8.5f, 9.5f, 11.5f, 12.5f, 13.5f});
  }
  SECTION("global_avg_pool2d: the plane's mean; dy spread evenly") {
    solder::nn::global_avg_pool2d layer;
    tensor<float, shape<1, 1, 1, 1>> y, dy;
    tensor<float, shape<1, 1, 4, 4>> dx;
    layer.forward(x, y);
    CHECK(y[0] == 8.5f);
    dy[0] = 4;
    layer.backward(x, y, dy, dx);
    CHECK(values(dx) == std::vector<float>(16, 0.25f));
  }
}

TEMPLATE_TEST_CASE_SIG("nn pooling: max and avg against the double reference and finite differences", "[nn][pool]",
                       ((std::size_t K, std::size_t S, std::size_t P, std::size_t H, std::size_t W), K, S, P, H, W),
                       (2, 2, 0, 4, 4), (2, 2, 0, 7, 5), (3, 2, 1, 7, 5), (3, 1, 1, 7, 5), (3, 2, 1, 8, 8),
                       (3, 3, 0, 7, 5), (2, 1, 1, 5, 6), (1, 1, 0, 3, 5), (1, 2, 0, 5, 3), (3, 2, 0, 3, 3),
                       (3, 1, 1, 1, 1)) {
  const std::size_t batch = GENERATE(1, 2);
  check_strided<K, S, P, H, W>(batch, 100);
}

TEMPLATE_TEST_CASE_SIG("nn pooling: adaptive_avg_pool2d against the double reference and finite differences",
                       "[nn][pool]", ((std::size_t H, std::size_t W, std::size_t Oh, std::size_t Ow), H, W, Oh, Ow),
                       (7, 7, 3, 3), (7, 5, 3, 2), (5, 7, 2, 3), (6, 6, 1, 1), (7, 5, 1, 1), (4, 6, 4, 6),
                       (6, 4, 3, 2), (3, 2, 5, 4), (1, 1, 2, 3)) {
  constexpr std::size_t C = 3;
  const std::size_t batch = GENERATE(1, 3);
  solder::nn::adaptive_avg_pool2d<Oh, Ow> layer;
  check_layer<shape<dyn, C, H, W>, shape<dyn, C, Oh, Ow>>(layer, adaptive_ref(H, W, Oh, Ow), batch, 200);
  check_layer<shape<2, C, H, W>, shape<2, C, Oh, Ow>>(layer, adaptive_ref(H, W, Oh, Ow), 2, 210);
}

TEST_CASE("nn pooling: max_pool2d ties go to the first maximal element in row-major window order", "[nn][pool]") {
  SECTION("a constant plane: each window's first element; overlapping windows add up there") {
    // 3x3 windows at stride 1 with padding 1 over a 4x4 plane of 2s: window (oh, ow) starts at
    // (max(oh - 1, 0), max(ow - 1, 0)), so rows and columns {0, 0, 1, 2} collect the dy.
    solder::nn::max_pool2d<3, 1, 1> layer;
    tensor<float, shape<1, 1, 4, 4>> x, dx;
    tensor<float, shape<1, 1, 4, 4>> y, dy;
    x.fill(2);
    dy.fill(1);
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>(16, 2));
    layer.backward(x, y, dy, dx);
    // counts per row: row 0 twice (oh = 0, 1), rows 1 and 2 once, row 3 never; the same for columns.
    const float per_axis[4] = {2, 1, 1, 0};
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 4; ++j) CHECK(dx(0, 0, i, j) == per_axis[i] * per_axis[j]);
  }
  SECTION("two equal maxima in one window: the earlier one, also across rows") {
    solder::nn::max_pool2d<2> layer;
    tensor<float, shape<1, 1, 2, 4>> x, dx;
    tensor<float, shape<1, 1, 1, 2>> y, dy;
    // Window 0: 5 at (0, 1) and (1, 0); window 1: 7 at (1, 2) and (1, 3).
    const float v[8] = {1, 5, 0, 3, 5, 2, 7, 7};
    std::copy(v, v + 8, x.begin());
    dy[0] = 10;
    dy[1] = 20;
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>{5, 7});
    layer.backward(x, y, dy, dx);
    CHECK(values(dx) == std::vector<float>{0, 10, 0, 0, 0, 0, 20, 0});
  }
  SECTION("+0 and -0 tie: the first") {
    solder::nn::max_pool2d<2> layer;
    tensor<float, shape<1, 1, 2, 2>> x, dx;
    tensor<float, shape<1, 1, 1, 1>> y, dy;
    const float v[4] = {-1, -0.0f, 0.0f, -2};
    std::copy(v, v + 4, x.begin());
    dy[0] = 1;
    layer.forward(x, y);
    CHECK(std::signbit(y[0]));
    layer.backward(x, y, dy, dx);
    CHECK(values(dx) == std::vector<float>{0, 1, 0, 0});
  }
  SECTION("a window of -inf: y is -inf and dy goes to its first element, as torch") {
    solder::nn::max_pool2d<3, 2, 1> layer;
    tensor<float, shape<1, 1, 3, 3>> x, dx;
    tensor<float, shape<1, 1, 2, 2>> y, dy;
    x.fill(-infty);
    dy.fill(1);
    layer.forward(x, y);
    CHECK(values(y) == std::vector<float>(4, -infty));
    layer.backward(x, y, dy, dx);
    // windows start at rows and columns 0 and 1
    CHECK(values(dx) == std::vector<float>{1, 1, 0, 1, 1, 0, 0, 0, 0});
  }
}

TEST_CASE("nn pooling: NaN and infinity", "[nn][pool]") {
  SECTION("max_pool2d: a NaN makes every window holding it NaN and takes its gradient") {
    solder::nn::max_pool2d<3, 1, 1> layer;
    tensor<float, shape<dyn, 1, 4, 4>> x(1), dx(1);
    tensor<float, shape<dyn, 1, 4, 4>> y(1), dy(1);
    solder::test::fill_uniform(x, -1, 1, 3);
    x(0, 0, 1, 1) = qnan;
    x(0, 0, 3, 3) = infty;
    dy.fill(1);
    layer.forward(x, y);
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        const bool holds_nan = i <= 2 && j <= 2;
        const bool holds_inf = i >= 2 && j >= 2;
        CHECK(std::isnan(y(0, 0, i, j)) == holds_nan);
        if (holds_inf && !holds_nan) CHECK(y(0, 0, i, j) == infty);
      }
    layer.backward(x, y, dy, dx);
    CHECK(dx(0, 0, 1, 1) == 9.0f);  // the NaN is the argmax of all 9 windows holding it
    CHECK(dx(0, 0, 3, 3) == 3.0f);  // +inf wins the 3 others holding it
  }
  SECTION("max_pool2d: two NaNs in a window: the last one, as torch's CPU kernel") {
    solder::nn::max_pool2d<2> layer;
    tensor<float, shape<1, 1, 2, 2>> x, dx;
    tensor<float, shape<1, 1, 1, 1>> y, dy;
    const float v[4] = {qnan, 3, 1, qnan};
    std::copy(v, v + 4, x.begin());
    dy[0] = 1;
    layer.forward(x, y);
    CHECK(std::isnan(y[0]));
    layer.backward(x, y, dy, dx);
    CHECK(values(dx) == std::vector<float>{0, 0, 0, 1});
  }
  SECTION("avg pooling: NaN spreads to the windows holding it; inf - inf is NaN") {
    tensor<float, shape<dyn, 2, 4, 4>> x(1), dx(1);
    solder::test::fill_uniform(x, -1, 1, 4);
    x(0, 0, 0, 0) = qnan;
    x(0, 1, 0, 0) = infty;
    x(0, 1, 3, 3) = -infty;
    solder::nn::avg_pool2d<2> avg;
    tensor<float, shape<dyn, 2, 2, 2>> y(1), dy(1);
    avg.forward(x, y);
    CHECK(std::isnan(y(0, 0, 0, 0)));
    CHECK(std::isfinite(y(0, 0, 1, 1)));
    CHECK(y(0, 1, 0, 0) == infty);
    CHECK(y(0, 1, 1, 1) == -infty);
    solder::nn::global_avg_pool2d global;
    tensor<float, shape<dyn, 2, 1, 1>> g(1);
    global.forward(x, g);
    CHECK(std::isnan(g[0]));
    CHECK(std::isnan(g[1]));
    // Backward reads dy only: a NaN dy spreads over its window.
    dy.fill(1);
    dy(0, 0, 1, 0) = qnan;
    avg.backward(x, y, dy, dx);
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 4; ++j) CHECK(std::isnan(dx(0, 0, i, j)) == (i >= 2 && j < 2));
  }
}

TEST_CASE("nn pooling: results do not depend on the thread count", "[nn][pool]") {
  // solder's loops take their thread count from solder::set_num_threads (an OpenMP num_threads
  // clause), not from omp_set_num_threads. 4 x 16 planes of 33 x 33: above the parallel threshold.
  const int before = solder::num_threads();
  constexpr std::size_t batch = 4, C = 16, H = 33, W = 33;
  tensor<float, shape<dyn, C, H, W>> x(batch);
  solder::test::fill_uniform(x, -2, 2, 50);
  auto run = [&](auto& layer, auto& y, auto& dy, int threads, std::vector<float>& yout, std::vector<float>& dxout) {
    solder::set_num_threads(threads);
    tensor<float, shape<dyn, C, H, W>> dx(batch);
    layer.forward(x, y);
    layer.backward(x, y, dy, dx);
    yout = values(y);
    dxout = values(dx);
  };
  auto compare = [&](auto& layer, auto& y, auto& dy) {
    solder::test::fill_uniform(dy, -1, 1, 51);
    std::vector<float> y1, dx1, y2, dx2;
    run(layer, y, dy, 1, y1, dx1);
    run(layer, y, dy, 2, y2, dx2);
    REQUIRE(y1.size() == y2.size());
    CHECK(same_bits(y1.data(), y2.data(), y1.size()));
    CHECK(same_bits(dx1.data(), dx2.data(), dx1.size()));
  };
  {
    solder::nn::max_pool2d<3, 2, 1> layer;
    tensor<float, shape<dyn, C, 17, 17>> y(batch), dy(batch);
    compare(layer, y, dy);
  }
  {
    solder::nn::avg_pool2d<3, 1, 1, false> layer;
    tensor<float, shape<dyn, C, 33, 33>> y(batch), dy(batch);
    compare(layer, y, dy);
  }
  {
    solder::nn::adaptive_avg_pool2d<5, 7> layer;
    tensor<float, shape<dyn, C, 5, 7>> y(batch), dy(batch);
    compare(layer, y, dy);
  }
  solder::set_num_threads(before);
}

TEST_CASE("nn pooling: batch mismatches and a max_pool2d backward without its forward are errors", "[nn][pool]") {
  tensor<float, shape<dyn, 2, 6, 6>> x(3), dx(3), x5(5), dx5(5), dx4(4);
  tensor<float, shape<dyn, 2, 3, 3>> y(4), y3(3), dy(3), y5(5), dy5(5);
  solder::test::fill_uniform(x, -1, 1, 60);
  solder::test::fill_uniform(x5, -1, 1, 61);
  {
    solder::nn::max_pool2d<2> layer;
    CHECK_THROWS_WITH(layer.forward(x, y),
                      Contains("solder::nn::max_pool2d::forward") && Contains("x (3) and y (4) differ"));
    CHECK_THROWS_WITH(layer.backward(x, y3, dy, dx), Contains("solder::nn::max_pool2d::backward: no forward has run"));
    layer.forward(x, y3);
    CHECK_THROWS_WITH(layer.backward(x, y, dy, dx), Contains("solder::nn::max_pool2d::backward") &&
                                                        Contains("x (3), y (4), dy (3) and dx (3) differ"));
    CHECK_THROWS_AS(layer.backward(x, y3, dy, dx4), solder::error);
    CHECK_THROWS_WITH(layer.backward(x5, y5, dy5, dx5),
                      Contains("the last forward saw x of 216 and y of 54 elements but backward got 360 and 90"));
    CHECK_NOTHROW(layer.backward(x, y3, dy, dx));
  }
  {
    solder::nn::avg_pool2d<2> layer;
    CHECK_THROWS_WITH(layer.forward(x, y),
                      Contains("solder::nn::avg_pool2d::forward") && Contains("x (3) and y (4) differ"));
    CHECK_THROWS_WITH(layer.backward(x, y3, dy, dx5), Contains("solder::nn::avg_pool2d::backward") &&
                                                          Contains("x (3), y (3), dy (3) and dx (5) differ"));
    CHECK_NOTHROW(layer.backward(x, y3, dy, dx));  // needs no forward
  }
  {
    solder::nn::adaptive_avg_pool2d<3> layer;
    CHECK_THROWS_WITH(layer.forward(x5, y3),
                      Contains("solder::nn::adaptive_avg_pool2d::forward") && Contains("x (5) and y (3) differ"));
    CHECK_THROWS_WITH(layer.backward(x, y3, dy5, dx), Contains("solder::nn::adaptive_avg_pool2d::backward") &&
                                                          Contains("x (3), y (3), dy (5) and dx (3) differ"));
  }
}
