// tests/nn/conv2d.test.cpp: nn::conv2d against torch's definition evaluated in double here:
// y, then dx, dW and db against the double layer's analytic gradients and against central
// finite differences of its loss sum(r * y); pointwise, 3x3, strided odd sizes, 5x5, dilated,
// non-square, grouped and depthwise kernels, with and without bias, batch 1 and 3, static and
// dynamic batches; fixed values worked by hand, NaN inputs, the default initialization, the
// planner's traits, results independent of the thread count, and the run-time errors.
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

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "solder/nn/conv2d.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using Catch::Matchers::Contains;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;
using solder::test::make;

/// Float's unit roundoff.
constexpr double u = 0x1p-24;
/// Floor for values whose exact size is 0 in double and that float rounds to a tiny residue.
constexpr double floor_abs = 1e-30;
/// The finite differences' own error: the loss is linear in each input, so the central
/// difference is exact but for double rounding of the two losses (|loss| <= 1e3, step 0.25:
/// about 1e-12); 1e-9 leaves a wide margin.
constexpr double fd_abs = 1e-9;

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// The layer's hyper-parameters and its input's spatial size, as plain numbers.
struct conv_config {
  std::size_t cin, cout, kh, kw, stride, pad, dilation, groups, h, w;
  bool bias;
  std::size_t ho() const { return (h + 2 * pad - dilation * (kh - 1) - 1) / stride + 1; }
  std::size_t wo() const { return (w + 2 * pad - dilation * (kw - 1) - 1) / stride + 1; }
};

template <class L, std::size_t H, std::size_t W>
conv_config config_of() {
  return {L::in_channels, L::out_channels, L::kernel_height, L::kernel_width, L::stride, L::padding,
          L::dilation,    L::groups,       H,                W,                L::has_bias};
}

/// torch.nn.functional.conv2d in double, written from its definition: for output channel co of
/// group g = co / (cout / groups),
///   y[n][co][i][j] = b[co] + sum_{c, p, q} W[co][c][p][q] x[n][g cin/groups + c][i s - pad + p d][j s - pad + q d],
/// x zero outside [0, h) x [0, w). Gradients by the chain rule as a scatter (the layer gathers).
struct reference {
  conv_config c;
  std::vector<double> weight, bias;  // [cout, cin/groups, kh, kw], [cout] (zeros without bias)

  std::size_t cin_g() const { return c.cin / c.groups; }
  std::size_t cout_g() const { return c.cout / c.groups; }
  std::size_t w_index(std::size_t co, std::size_t ci, std::size_t p, std::size_t q) const {
    return ((co * cin_g() + ci) * c.kh + p) * c.kw + q;
  }
  std::size_t x_index(std::size_t n, std::size_t ch, std::size_t i, std::size_t j) const {
    return ((n * c.cin + ch) * c.h + i) * c.w + j;
  }
  std::size_t y_index(std::size_t n, std::size_t co, std::size_t i, std::size_t j) const {
    return ((n * c.cout + co) * c.ho() + i) * c.wo() + j;
  }
  /// f(input channel, input row, input column, ci within the group, p, q) for each in-range tap
  /// of output (co, i, j).
  template <class F>
  void for_taps(std::size_t co, std::size_t i, std::size_t j, F&& f) const {
    const std::size_t g = co / cout_g();
    for (std::size_t ci = 0; ci < cin_g(); ++ci)
      for (std::size_t p = 0; p < c.kh; ++p)
        for (std::size_t q = 0; q < c.kw; ++q) {
          const long r = long(i * c.stride + p * c.dilation) - long(c.pad);
          const long s = long(j * c.stride + q * c.dilation) - long(c.pad);
          if (r < 0 || s < 0 || r >= long(c.h) || s >= long(c.w)) continue;
          f(g * cin_g() + ci, std::size_t(r), std::size_t(s), ci, p, q);
        }
  }

  /// y, and (mag) sum |W x| + |b| per output for the error bound.
  void forward(const std::vector<double>& x, std::size_t batch, std::vector<double>& y, std::vector<double>& mag) const {
    y.assign(batch * c.cout * c.ho() * c.wo(), 0.0);
    mag.assign(y.size(), 0.0);
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t co = 0; co < c.cout; ++co)
        for (std::size_t i = 0; i < c.ho(); ++i)
          for (std::size_t j = 0; j < c.wo(); ++j) {
            double s = bias[co], m = std::fabs(bias[co]);
            for_taps(co, i, j, [&](std::size_t ch, std::size_t r, std::size_t t, std::size_t ci, std::size_t p, std::size_t q) {
              const double term = weight[w_index(co, ci, p, q)] * x[x_index(n, ch, r, t)];
              s += term;
              m += std::fabs(term);
            });
            y[y_index(n, co, i, j)] = s;
            mag[y_index(n, co, i, j)] = m;
          }
  }
  double loss(const std::vector<double>& x, const std::vector<double>& r, std::size_t batch) const {
    std::vector<double> y, mag;
    forward(x, batch, y, mag);
    double l = 0;
    for (std::size_t k = 0; k < y.size(); ++k) l += r[k] * y[k];
    return l;
  }

  /// dL/dx, dL/dW, dL/db of sum(r * y), and the sums of the terms' magnitudes for the bounds.
  struct grads {
    std::vector<double> dx, dw, db, dx_mag, dw_mag, db_mag;
  };
  grads gradients(const std::vector<double>& x, const std::vector<double>& r, std::size_t batch) const {
    grads G{std::vector<double>(x.size()), std::vector<double>(weight.size()), std::vector<double>(c.cout),
            std::vector<double>(x.size()), std::vector<double>(weight.size()), std::vector<double>(c.cout)};
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t co = 0; co < c.cout; ++co)
        for (std::size_t i = 0; i < c.ho(); ++i)
          for (std::size_t j = 0; j < c.wo(); ++j) {
            const double g = r[y_index(n, co, i, j)];
            G.db[co] += g;
            G.db_mag[co] += std::fabs(g);
            for_taps(co, i, j, [&](std::size_t ch, std::size_t s, std::size_t t, std::size_t ci, std::size_t p, std::size_t q) {
              const std::size_t xi = x_index(n, ch, s, t), wi = w_index(co, ci, p, q);
              G.dx[xi] += g * weight[wi];
              G.dx_mag[xi] += std::fabs(g * weight[wi]);
              G.dw[wi] += g * x[xi];
              G.dw_mag[wi] += std::fabs(g * x[xi]);
            });
          }
    return G;
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

/// Forward and backward of layer L on x [batch, Cin, H, W] (shape SX) with its default
/// initialization from `seed`, against `reference`'s values and analytic gradients and against
/// finite differences of its loss.
template <class L, std::size_t H, std::size_t W, class SX = shape<dyn, L::in_channels, H, W>>
void check_layer(std::size_t batch, std::uint32_t seed) {
  constexpr std::size_t Ho = L::output_size(H, L::kernel_height), Wo = L::output_size(W, L::kernel_width);
  using SY = shape<SX::extents[0], L::out_channels, Ho, Wo>;
  const conv_config cfg = config_of<L, H, W>();
  REQUIRE(cfg.ho() == Ho);
  REQUIRE(cfg.wo() == Wo);

  L layer(seed);
  auto x = make<SX>(batch), dx = make<SX>(batch);
  auto y = make<SY>(batch), dy = make<SY>(batch);
  solder::test::fill_uniform(x, -1, 1, seed + 1);
  solder::test::fill_uniform(dy, -1, 1, seed + 2);
  reference R{cfg, std::vector<double>(layer.weight.begin(), layer.weight.end()), std::vector<double>(cfg.cout, 0.0)};
  if constexpr (L::has_bias) R.bias.assign(layer.bias.begin(), layer.bias.end());
  const std::vector<double> xd(x.begin(), x.end()), rd(dy.begin(), dy.end());

  // y: a float sum of fan_in products (the GEMM, or the direct loop), then the bias: Higham's
  // gamma_(fan_in + 2) of the terms' magnitudes.
  layer.forward(x, y);
  std::vector<double> want, mag;
  R.forward(xd, batch, want, mag);
  std::vector<double> bound(mag.size());
  for (std::size_t i = 0; i < mag.size(); ++i) bound[i] = double(L::fan_in + 2) * u * mag[i] + floor_abs;
  CHECK(worst(y.data(), want, bound) <= 1);

  layer.weight_grad.fill(1e9f);  // backward overwrites, never accumulates
  if constexpr (L::has_bias) layer.bias_grad.fill(1e9f);
  dx.fill(1e9f);
  layer.backward(x, y, dy, dx);
  const reference::grads G = R.gradients(xd, rd, batch);

  // dx: Cout/Groups products summed by the GEMM, then up to Kh Kw columns gathered per element
  // (depthwise: Cout/Cin planes of Kh Kw taps): gamma_(Cout/Groups + Kh Kw + 1).
  const double dx_u = double(L::group_out + L::kernel_height * L::kernel_width + 1);
  std::vector<double> dx_bound(xd.size());
  for (std::size_t i = 0; i < xd.size(); ++i) dx_bound[i] = dx_u * u * G.dx_mag[i] + floor_abs;
  // dW: Ho Wo products per sample in float, then the samples of a chunk added in float, the
  // chunks in double: gamma_(Ho Wo + batch + 1).
  const double dw_u = double(Ho * Wo + batch + 1);
  std::vector<double> dw_bound(R.weight.size());
  for (std::size_t i = 0; i < dw_bound.size(); ++i) dw_bound[i] = dw_u * u * G.dw_mag[i] + floor_abs;
  // db: summed in double, rounded once to float.
  std::vector<double> db_bound(cfg.cout);
  for (std::size_t i = 0; i < cfg.cout; ++i) db_bound[i] = 2 * u * G.db_mag[i] + floor_abs;

  CHECK(worst(dx.data(), G.dx, dx_bound) <= 1);
  CHECK(worst(layer.weight_grad.data(), G.dw, dw_bound) <= 1);
  if constexpr (L::has_bias) CHECK(worst(layer.bias_grad.data(), G.db, db_bound) <= 1);

  // The same against central differences of the double loss, one input at a time.
  const double h = 0.25;
  std::vector<double> fd_dx(xd.size()), fd_dw(R.weight.size()), fd_db(cfg.cout);
  for (std::size_t i = 0; i < xd.size(); ++i) {
    std::vector<double> xp = xd;
    fd_dx[i] = solder::test::central_diff(
        [&](double v) {
          xp[i] = v;
          return R.loss(xp, rd, batch);
        },
        xd[i], h);
    dx_bound[i] += fd_abs;
  }
  for (std::size_t i = 0; i < R.weight.size(); ++i) {
    reference Rp = R;
    fd_dw[i] = solder::test::central_diff(
        [&](double v) {
          Rp.weight[i] = v;
          return Rp.loss(xd, rd, batch);
        },
        R.weight[i], h);
    dw_bound[i] += fd_abs;
  }
  for (std::size_t i = 0; i < cfg.cout; ++i) {
    reference Rp = R;
    fd_db[i] = solder::test::central_diff(
        [&](double v) {
          Rp.bias[i] = v;
          return Rp.loss(xd, rd, batch);
        },
        R.bias[i], h);
    db_bound[i] += fd_abs;
  }
  CHECK(worst(dx.data(), fd_dx, dx_bound) <= 1);
  CHECK(worst(layer.weight_grad.data(), fd_dw, dw_bound) <= 1);
  if constexpr (L::has_bias) CHECK(worst(layer.bias_grad.data(), fd_db, db_bound) <= 1);

  // backward_params: the same parameter gradients, bit for bit, and dx left alone.
  const auto dw_full = layer.weight_grad;
  layer.weight_grad.fill(1e9f);
  layer.backward_params(std::as_const(x).ref(), std::as_const(y).ref(), std::as_const(dy).ref());
  CHECK(same_bits(layer.weight_grad.data(), dw_full.data(), dw_full.size()));
}

}  // namespace

TEST_CASE("nn::conv2d: constants, parameters and their names", "[nn][conv2d]") {
  using L = solder::nn::conv2d<6, 4, 3, 5, 2, 1, 1, 2>;
  STATIC_REQUIRE(L::fan_in == 3 * 3 * 5);
  STATIC_REQUIRE(L::group_in == 3);
  STATIC_REQUIRE(L::group_out == 2);
  STATIC_REQUIRE(!L::depthwise);
  STATIC_REQUIRE(solder::nn::conv2d<4, 8, 3, 3, 1, 1, 1, 4>::depthwise);
  STATIC_REQUIRE(!solder::nn::conv2d<1, 8, 3, 3>::depthwise);  // one channel, one group: the GEMM
  CHECK(std::string(L::name) == "conv2d");

  L layer(3);
  const auto p = layer.params("features.0.");
  REQUIRE(p.size() == 2);
  CHECK(p[0].name == "features.0.weight");
  CHECK(p[0].value.data() == layer.weight.data());
  CHECK(p[0].grad.data() == layer.weight_grad.data());
  CHECK(p[0].dims == std::vector<std::size_t>{4, 3, 3, 5});
  CHECK(p[1].name == "features.0.bias");
  CHECK(p[1].value.data() == layer.bias.data());
  CHECK(p[1].grad.data() == layer.bias_grad.data());
  CHECK(p[1].dims == std::vector<std::size_t>{4});

  solder::nn::conv2d<6, 4, 3, 5, 2, 1, 1, 2, false> no_bias;
  const auto q = no_bias.params();
  REQUIRE(q.size() == 1);
  CHECK(q[0].name == "weight");
}

TEST_CASE("nn::conv2d: what the planner knows", "[nn][conv2d]") {
  using solder::nn::sample_shape;
  using T = solder::nn::conv2d<64, 32, 3, 3, 2, 1>::planner_traits;
  STATIC_REQUIRE(T::kind == solder::nn::layer_kind::product);  // its block takes the layers after it
  STATIC_REQUIRE(T::folds_normalization);
  STATIC_REQUIRE(T::in == 0);
  STATIC_REQUIRE(T::out == 0);
  STATIC_REQUIRE(T::parameters == 32 * 64 * 9 + 32);
  STATIC_REQUIRE(T::forward_flops(10) == 10.0 * (2 * 64 * 9 + 1));
  STATIC_REQUIRE(T::backward_flops(10) == 10.0 * (4 * 64 * 9 + 1));
  STATIC_REQUIRE(T::saved_floats(10) == 0);
  STATIC_REQUIRE(T::takes(sample_shape(64, 7, 5)));
  STATIC_REQUIRE(T::takes(sample_shape(64, 1, 1)));  // padding 1: a 3x3 window fits a 1x1 image
  STATIC_REQUIRE(!T::takes(sample_shape(32, 7, 5)));
  STATIC_REQUIRE(!T::takes(sample_shape(64 * 7 * 5)));
  STATIC_REQUIRE(T::gives(sample_shape(64, 7, 5)) == sample_shape(32, 4, 3));
  STATIC_REQUIRE(T::gives(sample_shape(64, 56, 56)) == sample_shape(32, 28, 28));

  using U = solder::nn::conv2d<3, 8, 5, 3, 1, 0, 2, 1, false>::planner_traits;  // spans 9 x 5
  STATIC_REQUIRE(U::parameters == 8 * 3 * 15);
  STATIC_REQUIRE(U::forward_flops(1) == 2.0 * 3 * 15);
  STATIC_REQUIRE(U::takes(sample_shape(3, 9, 5)));
  STATIC_REQUIRE(!U::takes(sample_shape(3, 8, 5)));
  STATIC_REQUIRE(!U::takes(sample_shape(3, 9, 4)));
  STATIC_REQUIRE(U::gives(sample_shape(3, 9, 5)) == sample_shape(8, 1, 1));

  auto text = [](auto traits) {
    solder::fixed_string m;
    decltype(traits)::append_takes(m);
    return std::string(m.text, m.length);
  };
  CHECK(text(T{}) == "[64, H, W] with H, W >= 1");
  CHECK(text(U{}) == "[3, H, W] with H >= 9, W >= 5");
}

TEST_CASE("nn::conv2d: fixed known values", "[nn][conv2d]") {
  // x = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], W = [[1, 2], [3, 4]], b = 0.5: each output is the
  // window's dot product with W, worked by hand (all values exact in float).
  solder::nn::conv2d<1, 1, 2, 2> layer;
  tensor<float, shape<1, 1, 3, 3>> x, dx;
  tensor<float, shape<1, 1, 2, 2>> y, dy;
  for (std::size_t i = 0; i < 9; ++i) x[i] = float(i + 1);
  for (std::size_t i = 0; i < 4; ++i) layer.weight[i] = float(i + 1);
  layer.bias[0] = 0.5f;
  layer.forward(x, y);
  CHECK(std::vector<float>(y.begin(), y.end()) == std::vector<float>{37.5f, 47.5f, 67.5f, 77.5f});

  // dy = 1: dx counts the weights whose taps cover each input, dW sums the inputs each tap
  // sees, db counts the outputs.
  dy.fill(1.0f);
  layer.backward(x, y, dy, dx);
  CHECK(std::vector<float>(dx.begin(), dx.end()) == std::vector<float>{1, 3, 2, 4, 10, 6, 3, 7, 4});
  CHECK(std::vector<float>(layer.weight_grad.begin(), layer.weight_grad.end()) == std::vector<float>{12, 16, 24, 28});
  CHECK(layer.bias_grad[0] == 4.0f);

  // Stride 2 and padding 1: windows at rows/columns {-1, 0} and {1, 2}; the padding reads 0.
  solder::nn::conv2d<1, 1, 2, 2, 2, 1, 1, 1, false> padded;
  for (std::size_t i = 0; i < 4; ++i) padded.weight[i] = float(i + 1);
  padded.forward(x, y);
  CHECK(std::vector<float>(y.begin(), y.end()) == std::vector<float>{4, 18, 36, 77});
  padded.backward(x, y, dy, dx);
  // Each input is read by exactly one tap here: dx is that tap's weight.
  CHECK(std::vector<float>(dx.begin(), dx.end()) == std::vector<float>{4, 3, 4, 2, 1, 2, 4, 3, 4});
  CHECK(std::vector<float>(padded.weight_grad.begin(), padded.weight_grad.end()) == std::vector<float>{5, 10, 10, 20});

  // Depthwise, multiplier 2: channel c of x feeds y channels 2c and 2c + 1.
  solder::nn::conv2d<2, 4, 1, 1, 1, 0, 1, 2> depthwise;
  tensor<float, shape<1, 2, 1, 2>> xd;
  tensor<float, shape<1, 4, 1, 2>> yd;
  xd[0] = 1, xd[1] = 2, xd[2] = 3, xd[3] = 4;
  for (std::size_t i = 0; i < 4; ++i) depthwise.weight[i] = float(i + 1), depthwise.bias[i] = 10.0f * float(i);
  depthwise.forward(xd, yd);
  CHECK(std::vector<float>(yd.begin(), yd.end()) == std::vector<float>{1, 2, 12, 14, 29, 32, 42, 46});
}

TEST_CASE("nn::conv2d: pointwise 1x1 against the double reference and finite differences", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<4, 6, 1, 1>, 5, 7>(batch, 11);
  check_layer<solder::nn::conv2d<4, 6, 1, 1, 2>, 5, 7>(batch, 12);  // strided: through im2col
}

TEST_CASE("nn::conv2d: 3x3, padding 1 against the double reference and finite differences", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  // 17 output channels (more than one register tile of rows), 99 positions (a column tail).
  check_layer<solder::nn::conv2d<5, 17, 3, 3, 1, 1>, 9, 11>(batch, 21);
}

TEST_CASE("nn::conv2d: 3x3, stride 2, padding 1 on odd sizes", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<3, 4, 3, 3, 2, 1>, 7, 5>(batch, 31);
  check_layer<solder::nn::conv2d<3, 4, 3, 3, 2, 1>, 6, 5>(batch, 32);  // even height: the last row unread
}

TEST_CASE("nn::conv2d: 5x5 without padding, non-square kernels, wide strides and padding", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<2, 3, 5, 5>, 9, 8>(batch, 41);
  check_layer<solder::nn::conv2d<2, 3, 3, 1, 1, 1>, 6, 4>(batch, 42);
  check_layer<solder::nn::conv2d<2, 3, 2, 3, 3, 2>, 7, 8>(batch, 43);  // stride above the kernel: gaps
  check_layer<solder::nn::conv2d<2, 3, 3, 3, 1, 3>, 2, 2>(batch, 44);  // padding wider than the kernel
}

TEST_CASE("nn::conv2d: dilation 2", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<3, 4, 3, 3, 1, 1, 2>, 8, 7>(batch, 51);
  check_layer<solder::nn::conv2d<3, 4, 3, 3, 2, 2, 2>, 9, 6>(batch, 52);
}

TEST_CASE("nn::conv2d: groups 2", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<4, 6, 3, 3, 1, 1, 1, 2>, 6, 5>(batch, 61);
  check_layer<solder::nn::conv2d<4, 2, 1, 1, 1, 0, 1, 2>, 3, 5>(batch, 62);  // one output channel per group
}

TEST_CASE("nn::conv2d: depthwise, multiplier 1 and 2", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<4, 4, 3, 3, 1, 1, 1, 4>, 6, 7>(batch, 71);
  check_layer<solder::nn::conv2d<3, 6, 3, 3, 2, 1, 1, 3>, 7, 5>(batch, 72);
  check_layer<solder::nn::conv2d<3, 6, 3, 3, 1, 2, 2, 3>, 5, 6>(batch, 73);
  // Rows of several vectors and a part one; no padding, a 5 x 3 kernel.
  check_layer<solder::nn::conv2d<2, 2, 5, 3, 1, 0, 1, 2>, 9, 37>(batch, 74);
  check_layer<solder::nn::conv2d<2, 4, 3, 3, 1, 1, 1, 2>, 4, 40>(batch, 75);
}

TEST_CASE("nn::conv2d: without bias", "[nn][conv2d]") {
  const std::size_t batch = GENERATE(1, 3);
  check_layer<solder::nn::conv2d<3, 5, 3, 3, 1, 1, 1, 1, false>, 6, 5>(batch, 81);
  check_layer<solder::nn::conv2d<3, 3, 3, 3, 1, 1, 1, 3, false>, 6, 5>(batch, 82);
}

TEST_CASE("nn::conv2d: a static batch", "[nn][conv2d]") {
  check_layer<solder::nn::conv2d<3, 4, 3, 3, 2, 1>, 7, 5, shape<2, 3, 7, 5>>(2, 91);
  check_layer<solder::nn::conv2d<3, 6, 3, 3, 1, 1, 1, 3>, 5, 4, shape<2, 3, 5, 4>>(2, 92);
}

TEST_CASE("nn::conv2d: a NaN reaches exactly the outputs whose windows read it", "[nn][conv2d]") {
  auto check = [](auto layer) {
    using L = decltype(layer);
    tensor<float, shape<dyn, L::in_channels, 6, 5>> x(2);
    tensor<float, shape<dyn, L::out_channels, 6, 5>> y(2);
    solder::test::fill_uniform(x, -1, 1, 5);
    x[(1 * L::in_channels + 1) * 30 + 2 * 5 + 4] = std::numeric_limits<float>::quiet_NaN();  // sample 1, channel 1, (2, 4)
    layer.forward(x, y);
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t co = 0; co < L::out_channels; ++co)
        for (std::size_t i = 0; i < 6; ++i)
          for (std::size_t j = 0; j < 5; ++j) {
            // 3x3, padding 1: output (i, j) reads rows i - 1 .. i + 1 and columns j - 1 .. j + 1.
            const bool channel_reads = co / L::group_out == 1 / L::group_in;  // co's group holds channel 1
            const bool reads = n == 1 && channel_reads && i + 1 >= 2 && i <= 3 && j + 1 >= 4;
            CHECK(std::isnan(y[((n * L::out_channels + co) * 6 + i) * 5 + j]) == reads);
          }
  };
  check(solder::nn::conv2d<4, 6, 3, 3, 1, 1>(1));
  check(solder::nn::conv2d<4, 6, 3, 3, 1, 1, 1, 2>(2));
  check(solder::nn::conv2d<4, 8, 3, 3, 1, 1, 1, 4>(3));
}

TEST_CASE("nn::conv2d: default initialization as torch's, from Philox", "[nn][conv2d]") {
  auto check = [](auto layer, std::size_t fan_in) {
    using L = decltype(layer);
    REQUIRE(L::fan_in == fan_in);
    const double bound = 1.0 / std::sqrt(double(fan_in));
    auto within = [&](const auto& t) {
      return std::all_of(t.begin(), t.end(), [&](float v) { return std::fabs(double(v)) <= bound; });
    };
    CHECK(within(layer.weight));
    CHECK(within(layer.bias));
    // Uniform in +-bound: mean 0, standard deviation bound / sqrt(3); 5 standard errors.
    double mean = 0;
    for (float v : layer.weight) mean += double(v);
    mean /= double(layer.weight.size());
    CHECK(std::fabs(mean) <= 5 * bound / std::sqrt(3.0 * double(layer.weight.size())));
    // The same streams as nn::linear: weight (seed, 0), bias (seed, 1).
    std::vector<float> w(layer.weight.size()), b(L::out_channels);
    solder::nn::detail::fill_uniform_philox(w.data(), w.size(), float(bound), 7, 0);
    solder::nn::detail::fill_uniform_philox(b.data(), b.size(), float(bound), 7, 1);
    CHECK(same_bits(layer.weight.data(), w.data(), w.size()));
    CHECK(same_bits(layer.bias.data(), b.data(), b.size()));
    // Deterministic per seed, and another seed draws other values.
    L again(7), other(8);
    CHECK(same_bits(layer.weight.data(), again.weight.data(), w.size()));
    CHECK(same_bits(layer.bias.data(), again.bias.data(), b.size()));
    CHECK(!same_bits(layer.weight.data(), other.weight.data(), w.size()));
    other.reset_parameters(7);
    CHECK(same_bits(layer.weight.data(), other.weight.data(), w.size()));
  };
  check(solder::nn::conv2d<16, 32, 3, 3>(7), 144);
  check(solder::nn::conv2d<16, 32, 3, 3, 1, 1, 1, 4>(7), 36);
  check(solder::nn::conv2d<16, 16, 5, 3, 1, 1, 1, 16>(7), 15);
}

namespace {

/// y, dx, dW and db of one forward and backward on `threads` threads (solder's setting, and
/// OpenMP's, though solder's loops name their thread count themselves).
template <class L, class SX, class SY>
std::vector<std::vector<float>> run_on(int threads, L& layer, const tensor<float, SX>& x, const tensor<float, SY>& dy) {
  solder::set_num_threads(threads);
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  tensor<float, SY> y(x.batch());
  tensor<float, SX> dx(x.batch());
  layer.forward(x, y);
  layer.backward(x, y, dy, dx);
  return {std::vector<float>(y.begin(), y.end()), std::vector<float>(dx.begin(), dx.end()),
          std::vector<float>(layer.weight_grad.begin(), layer.weight_grad.end()),
          std::vector<float>(layer.bias_grad.begin(), layer.bias_grad.end())};
}

template <class L, std::size_t H, std::size_t W>
void check_threads(std::size_t batch) {
  using SX = shape<dyn, L::in_channels, H, W>;
  using SY = shape<dyn, L::out_channels, L::output_size(H, L::kernel_height), L::output_size(W, L::kernel_width)>;
  L layer(5);
  tensor<float, SX> x(batch);
  tensor<float, SY> dy(batch);
  solder::test::fill_uniform(x, -1, 1, 6);
  solder::test::fill_uniform(dy, -1, 1, 7);
  const int before = solder::num_threads();
  const auto one = run_on(1, layer, x, dy);
  const auto two = run_on(2, layer, x, dy);
  solder::set_num_threads(before);
  for (std::size_t k = 0; k < one.size(); ++k) {
    INFO("result " << k << " (y, dx, dW, db)");
    CHECK(same_bits(one[k].data(), two[k].data(), one[k].size()));
  }
}

}  // namespace

TEST_CASE("nn::conv2d: results do not depend on the thread count", "[nn][conv2d]") {
  // Sizes above the parallel thresholds: samples spread over threads (batch 3 and 4), one
  // sample with the GEMM and im2col threaded (batch 1), and the depthwise planes.
  check_threads<solder::nn::conv2d<16, 16, 3, 3, 1, 1>, 20, 20>(4);
  check_threads<solder::nn::conv2d<16, 16, 3, 3, 2, 1>, 21, 19>(3);
  check_threads<solder::nn::conv2d<32, 32, 3, 3, 1, 1>, 24, 24>(1);
  check_threads<solder::nn::conv2d<16, 32, 3, 3, 1, 1, 1, 16>, 20, 20>(3);
}

TEST_CASE("nn::conv2d: batch mismatches and overlapping tensors are errors", "[nn][conv2d]") {
  solder::nn::conv2d<3, 3, 3, 3, 1, 1> layer;
  using S = shape<dyn, 3, 6, 5>;
  tensor<float, S> x(3), y(4), y3(3), dy(3), dx(3), dx5(5);
  CHECK_THROWS_WITH(layer.forward(x, y), Contains("solder::nn::conv2d::forward") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(layer.backward(x, y, dy, dx),
                    Contains("solder::nn::conv2d::backward") && Contains("x (3), y (4), dy (3) and dx (3) differ"));
  CHECK_THROWS_WITH(layer.backward(x, y3, dy, dx5), Contains("x (3), y (3), dy (3) and dx (5) differ"));
  CHECK_THROWS_WITH(layer.backward_params(std::as_const(x).ref(), std::as_const(y).ref(), std::as_const(dy).ref()),
                    Contains("solder::nn::conv2d::backward_params") && Contains("y (4)"));
  CHECK_THROWS_WITH(layer.forward(tensor_ref<const float, S>(x.data(), 3), x.ref()),
                    Contains("solder::nn::conv2d::forward: y overlaps x"));
  CHECK_THROWS_WITH(layer.backward(std::as_const(x).ref(), std::as_const(y3).ref(), std::as_const(dy).ref(), dy.ref()),
                    Contains("solder::nn::conv2d::backward: dx overlaps x or dy"));
  CHECK_NOTHROW(layer.forward(x, y3));
  CHECK_NOTHROW(layer.backward(x, y3, dy, dx));
}
