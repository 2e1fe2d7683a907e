// tests/nn/batch_norm.test.cpp: nn::batch_norm against torch's definitions evaluated in double
// here: y in training and evaluation, the running statistics over several steps (unbiased
// variance), dx, dweight and dbias against central finite differences of the double layer's
// loss sum(r * y) and against the closed formula; 1-d ([batch, C]) and 2-d ([batch, C, H, W])
// inputs with vector tails, batch 1, static and dynamic batches, data far from zero mean, fixed
// known values, NaN and infinity, in-place use, results independent of the thread count, the
// planner's traits and the run-time errors.
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

#include "solder/nn/batch_norm.hpp"
#include "solder/nn/layer_info.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinULP;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

// The image shape the layer is written for compiles, forward and backward (a mistake in the
// static shape check would make this false, or an error).
using image = tensor<float, shape<dyn, 3, 5, 5>>;
static_assert(requires(solder::nn::batch_norm<3>& l, const image& x, image& y) {
  l.forward(x, y);
  l.backward(x, y, x, y);
});

/// Float's unit roundoff.
constexpr double u = 0x1p-24;
/// The float mean's own rounding, u |mean| / 2, reaches xhat as rstd u |mean| / 2; it dominates
/// for channels far from 0 and is the layer's inherent error there, as torch's.
constexpr double mean_u = 1;
/// The channel's shifted sums, relative to the sums of their terms' magnitudes: float vectors of
/// up to 16 terms per lane, then a horizontal add, then double (about 21 u). The variance
/// s2 / n - (s1 / n)^2 then cancels by up to 1 + z^2, z = (mean - shift) / std, the shift being
/// the channel's first value (sample 0): hence `cancel` below.
constexpr double stats_u = 24;
/// y = fma(x - mean, k, b) and k = float(weight rstd): a few roundings of |w xhat| and |b|.
constexpr double forward_u = 3;
/// dx's own roundings (k, the fma, the subtraction, the product), relative to its terms.
constexpr double dx_u = 4;
/// dweight and dbias, relative to the sums of |dy xhat| and |dy|: the same float-then-double
/// sums as the statistics.
constexpr double dparam_u = 24;
/// Evaluation: x - running_mean and rstd = float(1 / sqrt(running_var + eps)) round once each,
/// then forward_u's; relative to |w| (|xhat| + 1) + |b|.
constexpr double eval_u = 6;

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// Values per sample and channel of a batched shape: H * W, or 1 for [batch, C].
template <class S>
constexpr std::size_t plane_of() {
  if constexpr (S::rank == 4)
    return S::extents[2] * S::extents[3];
  else
    return 1;
}

/// The layer in double, from torch's definitions: per channel over (batch, H, W) the mean, the
/// biased variance, rstd = 1 / sqrt(Var + eps), y = (x - mean) rstd w + b in training; the
/// running statistics in evaluation; the running update with the unbiased variance.
struct reference {
  std::size_t batch, channels, hw;
  double eps, momentum;
  std::vector<double> w, b;

  std::size_t n() const { return batch * hw; }
  std::size_t at(std::size_t i, std::size_t c, std::size_t j) const { return (i * channels + c) * hw + j; }

  struct stats {
    double mean, var, rstd;
  };
  stats channel(const std::vector<double>& x, std::size_t c) const {
    double m = 0;
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t j = 0; j < hw; ++j) m += x[at(i, c, j)];
    m /= double(n());
    double v = 0;
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t j = 0; j < hw; ++j) v += (x[at(i, c, j)] - m) * (x[at(i, c, j)] - m);
    v /= double(n());
    return {m, v, 1.0 / std::sqrt(v + eps)};
  }
  /// sum over channel c of r y, training.
  double channel_loss(const std::vector<double>& x, const std::vector<double>& r, std::size_t c) const {
    const stats s = channel(x, c);
    double l = 0;
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t j = 0; j < hw; ++j) l += r[at(i, c, j)] * ((x[at(i, c, j)] - s.mean) * s.rstd * w[c] + b[c]);
    return l;
  }
  double loss(const std::vector<double>& x, const std::vector<double>& r) const {
    double l = 0;
    for (std::size_t c = 0; c < channels; ++c) l += channel_loss(x, r, c);
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

template <class T>
std::vector<double> doubles(const T& t) {
  return std::vector<double>(t.begin(), t.end());
}

/// A training forward and backward of batch_norm<C> on x of shape S ([batch, C] or [batch, C,
/// H, W]), values offset +- spread, with random weight, bias and running statistics, against
/// `reference`: y, the running statistics, dx against the closed formula and (when
/// `finite_differences`) central differences, dweight and dbias against both.
template <std::size_t C, class S>
void check_training(std::size_t batch, double offset, double spread, std::uint32_t seed, bool finite_differences = true) {
  constexpr std::size_t hw = plane_of<S>();
  solder::nn::batch_norm<C> layer;
  solder::test::fill_uniform(layer.weight, -1.5, 1.5, seed);
  solder::test::fill_uniform(layer.bias, -1, 1, seed + 1);
  solder::test::fill_uniform(layer.running_mean, -1, 1, seed + 2);
  solder::test::fill_uniform(layer.running_var, 0.5, 2, seed + 3);
  auto x = make<S>(batch), y = make<S>(batch), dy = make<S>(batch), dx = make<S>(batch);
  solder::test::fill_uniform(x, offset - spread, offset + spread, seed + 4);
  solder::test::fill_uniform(dy, -1, 1, seed + 5);
  const std::vector<double> xd = doubles(x), rd = doubles(dy), rm0 = doubles(layer.running_mean),
                            rv0 = doubles(layer.running_var);
  const reference R{batch, C, hw, layer.eps, layer.momentum, doubles(layer.weight), doubles(layer.bias)};
  const double n = double(R.n());

  layer.forward(x, y);
  CHECK(layer.num_batches_tracked == 1);

  // Per channel: the statistics, z of the shift, and the error xhat may carry (e_x, absolute)
  // and rstd (e_r, relative), from the tolerances above.
  std::vector<reference::stats> st(C);
  std::vector<double> cancel(C), e_r(C);
  auto e_x = [&](std::size_t c, double xhat) {
    return u * (mean_u * st[c].rstd * std::fabs(st[c].mean) + stats_u * cancel[c] * (1 + std::fabs(xhat)));
  };
  for (std::size_t c = 0; c < C; ++c) {
    st[c] = R.channel(xd, c);
    const double z = (st[c].mean - xd[R.at(0, c, 0)]) * st[c].rstd;
    cancel[c] = 1 + std::fabs(z) + z * z;
    e_r[c] = u * (stats_u * cancel[c] + 2);
  }

  std::vector<double> want(x.size()), bound(x.size());
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < hw; ++j) {
        const std::size_t e = R.at(i, c, j);
        const double xhat = (xd[e] - st[c].mean) * st[c].rstd;
        want[e] = xhat * R.w[c] + R.b[c];
        bound[e] = std::fabs(R.w[c]) * e_x(c, xhat) + u * forward_u * (std::fabs(R.w[c] * xhat) + std::fabs(R.b[c]));
      }
  CHECK(worst(y.data(), want, bound) <= 1);

  // The running statistics: momentum towards the batch's mean and UNBIASED variance.
  {
    const double m = R.momentum;
    std::vector<double> want_m(C), want_v(C), bound_m(C), bound_v(C);
    for (std::size_t c = 0; c < C; ++c) {
      const double var_unbiased = st[c].var * n / (n - 1);
      want_m[c] = m * st[c].mean + (1 - m) * rm0[c];
      want_v[c] = m * var_unbiased + (1 - m) * rv0[c];
      bound_m[c] = u * (std::fabs(want_m[c]) + m * stats_u * cancel[c] / st[c].rstd) + 1e-30;
      bound_v[c] = u * std::fabs(want_v[c]) + m * var_unbiased * 2 * e_r[c];
    }
    CHECK(worst(layer.running_mean.data(), want_m, bound_m) <= 1);
    CHECK(worst(layer.running_var.data(), want_v, bound_v) <= 1);
  }

  layer.weight_grad.fill(1e9f);  // backward overwrites, never accumulates
  layer.bias_grad.fill(1e9f);
  layer.backward(x, y, dy, dx);

  // Per channel sums of the closed formula, and of the magnitudes the bounds scale with.
  std::vector<double> sdy(C, 0), sdyx(C, 0), mag_dy(C, 0), mag_dyx(C, 0), mag_dyex(C, 0);
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < hw; ++j) {
        const std::size_t e = R.at(i, c, j);
        const double xhat = (xd[e] - st[c].mean) * st[c].rstd;
        sdy[c] += rd[e];
        sdyx[c] += rd[e] * xhat;
        mag_dy[c] += std::fabs(rd[e]);
        mag_dyx[c] += std::fabs(rd[e] * xhat);
        mag_dyex[c] += std::fabs(rd[e]) * e_x(c, xhat);
      }

  // dx: the closed formula w rstd / n (n dy - sum dy - xhat sum dy xhat), and the bound from
  // the errors of k, xhat, and the two means dweight / n, dbias / n.
  std::vector<double> closed(x.size());
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < hw; ++j) {
        const std::size_t e = R.at(i, c, j);
        const double xhat = (xd[e] - st[c].mean) * st[c].rstd;
        const double k = std::fabs(R.w[c]) * st[c].rstd;
        const double mg = mag_dy[c] / n, mgx = mag_dyx[c] / n;
        closed[e] = R.w[c] * st[c].rstd / n * (n * rd[e] - sdy[c] - xhat * sdyx[c]);
        bound[e] = k * ((e_r[c] + dx_u * u) * (std::fabs(rd[e]) + std::fabs(xhat) * mgx + mg) + e_x(c, xhat) * mgx +
                        std::fabs(xhat) * (mag_dyex[c] / n + dparam_u * u * mgx) + dparam_u * u * mg) +
                   1e-12;
      }
  CHECK(worst(dx.data(), closed, bound) <= 1);

  if (finite_differences) {
    // Central differences of the channel's loss, with a step a small fraction of the spread
    // (the loss's third derivative grows as rstd^3). Their own error: double roundings of
    // values of size |mean| (in units of the spread), over the step.
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t c = 0; c < C; ++c)
        for (std::size_t j = 0; j < hw; ++j) {
          const std::size_t e = R.at(i, c, j);
          const double h = 1e-5 / st[c].rstd;
          std::vector<double> xv = xd;
          want[e] = solder::test::central_diff(
              [&](double v) {
                xv[e] = v;
                return R.channel_loss(xv, rd, c);
              },
              xd[e], h);
          CHECK_THAT(want[e], WithinAbs(closed[e], 1e-8 * (1 + st[c].rstd * std::fabs(st[c].mean))));
          bound[e] += 1e-9 * (1 + st[c].rstd * std::fabs(st[c].mean));
        }
    CHECK(worst(dx.data(), want, bound) <= 1);
  }

  // dweight, dbias: sum dy xhat and sum dy; the loss is linear in them, so any step of the
  // central difference gives the derivative.
  std::vector<double> bound_w(C), bound_b(C);
  for (std::size_t c = 0; c < C; ++c) {
    bound_w[c] = mag_dyex[c] + dparam_u * u * mag_dyx[c] + 1e-12;
    bound_b[c] = dparam_u * u * mag_dy[c] + 1e-12;
  }
  CHECK(worst(layer.weight_grad.data(), sdyx, bound_w) <= 1);
  CHECK(worst(layer.bias_grad.data(), sdy, bound_b) <= 1);
  if (finite_differences) {
    std::vector<double> fd_w(C), fd_b(C);
    for (std::size_t c = 0; c < C; ++c) {
      reference Rp = R;
      fd_w[c] = solder::test::central_diff(
          [&](double v) {
            Rp.w[c] = v;
            return Rp.loss(xd, rd);
          },
          R.w[c], 1e-3);
      Rp = R;
      fd_b[c] = solder::test::central_diff(
          [&](double v) {
            Rp.b[c] = v;
            return Rp.loss(xd, rd);
          },
          R.b[c], 1e-3);
      bound_w[c] += 1e-9;
      bound_b[c] += 1e-9;
    }
    CHECK(worst(layer.weight_grad.data(), fd_w, bound_w) <= 1);
    CHECK(worst(layer.bias_grad.data(), fd_b, bound_b) <= 1);
  }
}

/// An evaluation forward and backward of batch_norm<C> on x of shape S with random running
/// statistics: y = (x - running_mean) / sqrt(running_var + eps) w + b, dx = dy w rstd, dweight
/// = sum dy xhat, dbias = sum dy, against the double formulas and central differences; the
/// running statistics and num_batches_tracked stay.
template <std::size_t C, class S>
void check_evaluation(std::size_t batch, double offset, double spread, std::uint32_t seed) {
  constexpr std::size_t hw = plane_of<S>();
  solder::nn::batch_norm<C> layer;
  layer.eval();
  solder::test::fill_uniform(layer.weight, -1.5, 1.5, seed);
  solder::test::fill_uniform(layer.bias, -1, 1, seed + 1);
  solder::test::fill_uniform(layer.running_mean, offset - spread, offset + spread, seed + 2);
  solder::test::fill_uniform(layer.running_var, 0.25 * spread * spread, spread * spread, seed + 3);
  auto x = make<S>(batch), y = make<S>(batch), dy = make<S>(batch), dx = make<S>(batch);
  solder::test::fill_uniform(x, offset - spread, offset + spread, seed + 4);
  solder::test::fill_uniform(dy, -1, 1, seed + 5);
  const std::vector<double> xd = doubles(x), rd = doubles(dy), rm = doubles(layer.running_mean),
                            rv = doubles(layer.running_var);
  const reference R{batch, C, hw, layer.eps, layer.momentum, doubles(layer.weight), doubles(layer.bias)};

  layer.forward(x, y);
  CHECK(same_bits(layer.running_mean.data(), std::vector<float>(rm.begin(), rm.end()).data(), C));
  CHECK(same_bits(layer.running_var.data(), std::vector<float>(rv.begin(), rv.end()).data(), C));
  CHECK(layer.num_batches_tracked == 0);

  auto yv = [&](const std::vector<double>& xs, std::size_t e, std::size_t c) {
    return (xs[e] - rm[c]) / std::sqrt(rv[c] + R.eps) * R.w[c] + R.b[c];
  };
  std::vector<double> want(x.size()), bound(x.size()), closed(x.size()), bound_dx(x.size());
  std::vector<double> sdy(C, 0), sdyx(C, 0), mag_dy(C, 0), mag_dyx(C, 0);
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < hw; ++j) {
        const std::size_t e = R.at(i, c, j);
        const double rstd = 1 / std::sqrt(rv[c] + R.eps), xhat = (xd[e] - rm[c]) * rstd;
        want[e] = yv(xd, e, c);
        bound[e] = u * eval_u * (std::fabs(R.w[c]) * (std::fabs(xhat) + 1) + std::fabs(R.b[c]));
        closed[e] = rd[e] * R.w[c] * rstd;
        bound_dx[e] = u * dx_u * std::fabs(closed[e]) + 1e-30;
        sdy[c] += rd[e];
        sdyx[c] += rd[e] * xhat;
        mag_dy[c] += std::fabs(rd[e]);
        mag_dyx[c] += std::fabs(rd[e] * xhat);
      }
  CHECK(worst(y.data(), want, bound) <= 1);

  layer.backward(x, y, dy, dx);
  CHECK(worst(dx.data(), closed, bound_dx) <= 1);
  // The loss sum r y is linear in each x here: central differences with any step.
  std::vector<double> fd(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) {
    const std::size_t c = e / hw % C;
    std::vector<double> xv = xd;
    fd[e] = solder::test::central_diff(
        [&](double v) {
          xv[e] = v;
          return rd[e] * yv(xv, e, c);
        },
        xd[e], 1e-3 * spread);
    bound_dx[e] += 1e-9;
  }
  CHECK(worst(dx.data(), fd, bound_dx) <= 1);
  std::vector<double> bound_w(C), bound_b(C);
  for (std::size_t c = 0; c < C; ++c) {
    bound_w[c] = (dparam_u + eval_u) * u * mag_dyx[c] + 1e-12;
    bound_b[c] = dparam_u * u * mag_dy[c] + 1e-12;
  }
  CHECK(worst(layer.weight_grad.data(), sdyx, bound_w) <= 1);
  CHECK(worst(layer.bias_grad.data(), sdy, bound_b) <= 1);
}

}  // namespace

TEST_CASE("nn::batch_norm: constants, parameters, buffers and their names", "[nn][batch_norm]") {
  using L = solder::nn::batch_norm<37>;
  using T = L::planner_traits;
  using solder::nn::sample_shape;
  STATIC_REQUIRE(T::kind == solder::nn::layer_kind::block);
  STATIC_REQUIRE(T::in == 0);
  STATIC_REQUIRE(T::out == 0);
  STATIC_REQUIRE(T::parameters == 74);
  STATIC_REQUIRE(T::saved_floats(37 * 64) == 0);
  STATIC_REQUIRE(T::forward_flops(100) > 0);
  STATIC_REQUIRE(T::forward_flops(200) == 2 * T::forward_flops(100));  // per feature
  STATIC_REQUIRE(T::backward_flops(100) > T::forward_flops(100));
  STATIC_REQUIRE(T::takes(sample_shape(37)));
  STATIC_REQUIRE(T::takes(sample_shape(37, 8, 5)));
  STATIC_REQUIRE(T::takes(sample_shape(37, 1, 1)));
  STATIC_REQUIRE(!T::takes(sample_shape(36)));
  STATIC_REQUIRE(!T::takes(sample_shape(36, 8, 8)));
  STATIC_REQUIRE(!T::takes(sample_shape(37, 8)));
  STATIC_REQUIRE(!T::takes(sample_shape(8, 37, 8)));
  STATIC_REQUIRE(!T::takes(sample_shape()));
  STATIC_REQUIRE(T::gives(sample_shape(37, 8, 5)) == sample_shape(37, 8, 5));
  STATIC_REQUIRE(T::gives(sample_shape(37)) == sample_shape(37));
  STATIC_REQUIRE(solder::nn::layer_info<L>::kind == solder::nn::layer_kind::block);
  STATIC_REQUIRE(solder::nn::layer_info<L>::parameters == 74);
  constexpr solder::fixed_string takes = [] {
    solder::fixed_string s;
    T::append_takes(s);
    return s;
  }();
  CHECK(std::string(takes.text) == "[37] or [37, H, W]");
  CHECK(std::string(L::name) == "batch_norm");

  L layer(1e-3, 0.25);
  CHECK(layer.eps == 1e-3);
  CHECK(layer.momentum == 0.25);
  CHECK(L().eps == 1e-5);  // torch's defaults
  CHECK(L().momentum == 0.1);
  CHECK(layer.training());
  CHECK(std::all_of(layer.weight.begin(), layer.weight.end(), [](float v) { return v == 1.0f; }));
  CHECK(std::all_of(layer.bias.begin(), layer.bias.end(), [](float v) { return v == 0.0f; }));
  CHECK(std::all_of(layer.running_mean.begin(), layer.running_mean.end(), [](float v) { return v == 0.0f; }));
  CHECK(std::all_of(layer.running_var.begin(), layer.running_var.end(), [](float v) { return v == 1.0f; }));
  CHECK(layer.num_batches_tracked == 0);
  layer.eval();
  CHECK(!layer.training());
  layer.train();
  CHECK(layer.training());

  const auto p = layer.params("1.");
  REQUIRE(p.size() == 2);
  CHECK(p[0].name == "1.weight");
  CHECK(p[0].value.data() == layer.weight.data());
  CHECK(p[0].grad.data() == layer.weight_grad.data());
  CHECK(p[0].dims == std::vector<std::size_t>{37});
  CHECK(p[1].name == "1.bias");
  CHECK(p[1].value.data() == layer.bias.data());
  CHECK(p[1].grad.data() == layer.bias_grad.data());

  const auto b = layer.buffers("1.");
  REQUIRE(b.size() == 2);
  CHECK(b[0].name == "1.running_mean");
  CHECK(b[0].value.data() == layer.running_mean.data());
  CHECK(b[0].value.size() == 37);
  CHECK(b[0].dims == std::vector<std::size_t>{37});
  CHECK(b[1].name == "1.running_var");
  CHECK(b[1].value.data() == layer.running_var.data());
  CHECK(b[1].dims == std::vector<std::size_t>{37});

  // reset_parameters resets the running statistics too, as torch's.
  layer.weight.fill(3);
  layer.running_var.fill(7);
  layer.num_batches_tracked = 5;
  layer.reset_parameters();
  CHECK(layer.weight[0] == 1.0f);
  CHECK(layer.running_var[36] == 1.0f);
  CHECK(layer.num_batches_tracked == 0);
  // The params train with an optimizer like any layer's.
  CHECK_NOTHROW(solder::optim::sgd(layer.params(), {0.1f}));
}

TEST_CASE("nn::batch_norm: fixed known values", "[nn][batch_norm]") {
  // torch.nn.BatchNorm1d(2) on x = [[1, 0], [1, 0], [3, 0], [3, 4]]. Channel 0 is [1, 1, 3, 3]:
  // mean 2, Var 1, so y = -+r, r = 1 / sqrt(1 + 1e-5) = 0.9999950000374997; channel 1 is [0, 0,
  // 0, 4]: mean 1, Var 3, y = [-1, -1, -1, 3] / sqrt(3 + 1e-5), 1 / sqrt(3 + 1e-5) =
  // 0.5773493069415827.
  solder::nn::batch_norm<2> layer;
  tensor<float, shape<dyn, 2>> x(4), y(4), dy(4), dx(4);
  const float xs[8] = {1, 0, 1, 0, 3, 0, 3, 4};
  std::copy(xs, xs + 8, x.begin());
  layer.forward(x, y);
  constexpr double r = 0.9999950000374997, s = 0.5773493069415827;
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK_THAT(y(i, 0), WithinULP(float(i < 2 ? -r : r), 2));
    CHECK_THAT(y(i, 1), WithinULP(float(i < 3 ? -s : 3 * s), 2));
  }
  // Running statistics: 0.1 mean + 0.9 [0, 0], and 0.1 * (unbiased Var: 4/3 and 4) + 0.9 * 1.
  CHECK_THAT(layer.running_mean[0], WithinULP(0.2f, 1));
  CHECK_THAT(layer.running_mean[1], WithinULP(0.1f, 1));
  CHECK_THAT(layer.running_var[0], WithinULP(float(0.1 * 4.0 / 3.0 + 0.9), 1));
  CHECK_THAT(layer.running_var[1], WithinULP(1.3f, 1));
  CHECK(layer.num_batches_tracked == 1);

  // Backward of dy = e_0 in channel 0 (weight 1): dbias = 1, dweight = -r, and dx = r / 4 (4 dy
  // - 1 + r xhat): r (3 - r^2) / 4 = 0.49999999998125033, -r (1 + r^2) / 4 =
  // -0.4999950000562494, and -r (1 - r^2) / 4 = -2.499962500427346e-06, which cancels to about
  // 1e-7 absolute in float. Channel 1 has dy = 0: its dx and gradients are 0.
  dy.fill(0);
  dy(0, 0) = 1;
  layer.backward(x, y, dy, dx);
  CHECK_THAT(layer.bias_grad[0], WithinULP(1.0f, 0));
  CHECK_THAT(layer.weight_grad[0], WithinULP(float(-r), 2));
  CHECK_THAT(dx(0, 0), WithinULP(0.49999999998125033f, 4));
  CHECK_THAT(dx(1, 0), WithinULP(-0.4999950000562494f, 4));
  CHECK_THAT(dx(2, 0), WithinAbs(-2.499962500427346e-06, 2e-7));
  CHECK_THAT(dx(3, 0), WithinAbs(-2.499962500427346e-06, 2e-7));
  CHECK(layer.bias_grad[1] == 0.0f);
  CHECK(layer.weight_grad[1] == 0.0f);
  for (std::size_t i = 0; i < 4; ++i) CHECK(dx(i, 1) == 0.0f);

  // Evaluation: (x - running_mean) / sqrt(running_var + 1e-5), the running statistics as the
  // floats above: x = 1 and 3 in channel 0, 0 and 4 in channel 1.
  layer.eval();
  layer.forward(x, y);
  CHECK_THAT(y(0, 0), WithinULP(0.7869872041208416f, 2));
  CHECK_THAT(y(2, 0), WithinULP(2.754455221752335f, 2));
  CHECK_THAT(y(0, 1), WithinULP(-0.08770546751805121f, 2));
  CHECK_THAT(y(3, 1), WithinULP(3.4205131809274656f, 2));
  CHECK(layer.num_batches_tracked == 1);

  // The same channel-0 values as one channel of 2-d input [2, 1, 1, 2] give the same y and dx.
  solder::nn::batch_norm<1> layer2;
  tensor<float, shape<2, 1, 1, 2>> x2, y2, dy2, dx2;
  const float x2s[4] = {1, 1, 3, 3};
  std::copy(x2s, x2s + 4, x2.begin());
  dy2[0] = 1;
  layer2.forward(x2, y2);
  layer2.backward(x2, y2, dy2, dx2);
  for (std::size_t i = 0; i < 4; ++i) CHECK_THAT(y2[i], WithinULP(float(i < 2 ? -r : r), 2));
  CHECK_THAT(dx2[0], WithinULP(0.49999999998125033f, 4));
  CHECK_THAT(dx2[1], WithinULP(-0.4999950000562494f, 4));
  CHECK_THAT(dx2[3], WithinAbs(-2.499962500427346e-06, 2e-7));
  CHECK_THAT(layer2.running_var[0], WithinULP(float(0.1 * 4.0 / 3.0 + 0.9), 1));
}

TEMPLATE_TEST_CASE_SIG("nn::batch_norm: 2-d training against the double reference and finite differences",
                       "[nn][batch_norm]", ((std::size_t C, std::size_t H, std::size_t W), C, H, W), (3, 5, 5),
                       (1, 4, 4), (4, 17, 17), (3, 1, 1), (5, 3, 7)) {
  // 17 x 17: a plane of more than one float block; 1 x 1: a plane of one value.
  const std::size_t batch = GENERATE(1, 2, 7);
  if (batch * H * W >= 2) check_training<C, shape<dyn, C, H, W>>(batch, 0.5, 2.0, 11);
}

TEMPLATE_TEST_CASE_SIG("nn::batch_norm: 1-d training against the double reference and finite differences",
                       "[nn][batch_norm]", ((std::size_t C), C), (1), (3), (16), (37)) {
  const std::size_t batch = GENERATE(2, 3, 7, 40);
  check_training<C, shape<dyn, C>>(batch, -0.5, 3.0, 21);
}

TEST_CASE("nn::batch_norm: static batches", "[nn][batch_norm]") {
  check_training<3, shape<7, 3, 5, 5>>(7, 0.0, 1.0, 25);
  check_training<3, shape<1, 3, 5, 5>>(1, 0.0, 1.0, 26);
  check_training<3, shape<7, 3>>(7, 0.0, 1.0, 27);
  check_evaluation<3, shape<7, 3, 5, 5>>(7, 0.0, 1.0, 28);
}

TEST_CASE("nn::batch_norm: data far from zero mean keeps its precision", "[nn][batch_norm]") {
  // |mean| / std about 1700: sum x^2 - n mean^2 would cancel to nothing in float (and in
  // double sums of float squares at larger n).
  check_training<3, shape<dyn, 3, 5, 5>>(7, 1000.0, 1.0, 31);
  check_training<3, shape<dyn, 3, 5, 5>>(2, -300.0, 0.01, 32);
  check_training<37, shape<dyn, 37>>(9, 1000.0, 1.0, 33);
  check_training<3, shape<dyn, 3>>(7, -300.0, 0.01, 34);
  check_evaluation<3, shape<dyn, 3, 5, 5>>(7, 1000.0, 1.0, 35);
}

TEST_CASE("nn::batch_norm: many samples (several chunks, float columns flushed to double)", "[nn][batch_norm]") {
  // 1-d: 4800 samples of 37 channels, 11 chunks of 443 samples, each flushing every 16;
  // 2-d: 64 samples of 8 x 16 x 16, 512 planes over the threads. The closed formula only:
  // central differences would re-sum a channel per element.
  check_training<37, shape<dyn, 37>>(4800, 0.25, 1.0, 41, false);
  check_training<8, shape<dyn, 8, 16, 16>>(64, 0.25, 1.0, 42, false);
}

TEMPLATE_TEST_CASE_SIG("nn::batch_norm: evaluation against the double reference", "[nn][batch_norm]",
                       ((std::size_t C, std::size_t H, std::size_t W), C, H, W), (3, 5, 5), (37, 1, 1), (4, 17, 17)) {
  const std::size_t batch = GENERATE(1, 7);
  check_evaluation<C, shape<dyn, C, H, W>>(batch, 0.5, 2.0, 51);
  check_evaluation<C, shape<dyn, C>>(batch, -1.0, 0.5, 52);
}

TEST_CASE("nn::batch_norm: running statistics over several steps", "[nn][batch_norm]") {
  // Five training steps on fresh data, each moving the running statistics by momentum towards
  // the batch's mean and unbiased variance; the error bound carries the earlier steps' errors
  // forward, shrunk by 1 - momentum, and adds this step's rounding and statistics error.
  const double momentum = GENERATE(0.1, 0.3);
  constexpr std::size_t C = 3, hw = 25, batch = 7;
  solder::nn::batch_norm<C> layer(1e-5, momentum);
  solder::nn::batch_norm<C> flat(1e-5, momentum);  // the same values as [batch * 25, 3]: the 1-d path
  std::vector<double> rm(C, 0.0), rv(C, 1.0), bm(C, 0.0), bv(C, 0.0);
  for (int step = 0; step < 5; ++step) {
    tensor<float, shape<dyn, C, 5, 5>> x(batch), y(batch);
    solder::test::fill_uniform(x, 3.0 - step, 5.0 + step, 60 + step);
    const reference R{batch, C, hw, 1e-5, momentum, std::vector<double>(C, 1), std::vector<double>(C, 0)};
    const std::vector<double> xd = doubles(x);
    // The same values per channel as a 1-d batch of batch * hw samples.
    tensor<float, shape<dyn, C>> xf(batch * hw), yf(batch * hw);
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t c = 0; c < C; ++c)
        for (std::size_t j = 0; j < hw; ++j) xf(i * hw + j, c) = x(i, c, j / 5, j % 5);
    layer.forward(x, y);
    flat.forward(xf, yf);
    for (std::size_t c = 0; c < C; ++c) {
      const reference::stats s = R.channel(xd, c);
      const double n = double(R.n());
      const double z = (s.mean - xd[R.at(0, c, 0)]) * s.rstd, cancel = 1 + std::fabs(z) + z * z;
      // flat's shift is its channel's first value too, the same x(0, c, 0, 0)
      rm[c] = momentum * s.mean + (1 - momentum) * rm[c];
      rv[c] = momentum * s.var * n / (n - 1) + (1 - momentum) * rv[c];
      bm[c] = (1 - momentum) * bm[c] + u * (std::fabs(rm[c]) + momentum * stats_u * cancel / s.rstd);
      bv[c] = (1 - momentum) * bv[c] + u * (std::fabs(rv[c]) + momentum * s.var * n / (n - 1) * 2 * (stats_u * cancel + 2));
      CHECK(std::fabs(layer.running_mean[c] - rm[c]) <= bm[c]);
      CHECK(std::fabs(layer.running_var[c] - rv[c]) <= bv[c]);
      CHECK(std::fabs(flat.running_mean[c] - rm[c]) <= bm[c]);
      CHECK(std::fabs(flat.running_var[c] - rv[c]) <= bv[c]);
    }
    CHECK(layer.num_batches_tracked == step + 1);
  }
  // Evaluation neither moves nor counts.
  layer.eval();
  const tensor<float, shape<C>> before = layer.running_var;
  tensor<float, shape<dyn, C, 5, 5>> x(2), y(2);
  solder::test::fill_uniform(x, -9, 9, 70);
  layer.forward(x, y);
  CHECK(same_bits(before.data(), layer.running_var.data(), C));
  CHECK(layer.num_batches_tracked == 5);
}

TEST_CASE("nn::batch_norm: backward follows the mode of the last forward", "[nn][batch_norm]") {
  // A training forward, then eval(): backward is still training's (batch statistics, the mean
  // corrections), as torch's graph of that forward; and the other way round.
  solder::nn::batch_norm<3> trained, evaluated;
  tensor<float, shape<dyn, 3, 5, 5>> x(4), y(4), dy(4), dx1(4), dx2(4);
  solder::test::fill_uniform(x, -2, 2, 80);
  solder::test::fill_uniform(dy, -1, 1, 81);
  trained.forward(x, y);
  trained.eval();
  trained.backward(x, y, dy, dx1);
  trained.train();
  trained.forward(x, y);
  trained.backward(x, y, dy, dx2);
  CHECK(same_bits(dx1.data(), dx2.data(), dx1.size()));

  evaluated.eval();
  evaluated.forward(x, y);
  evaluated.train();
  evaluated.backward(x, y, dy, dx1);
  for (std::size_t i = 0; i < dx1.size(); ++i)  // running statistics 0 and 1: dx = dy / sqrt(1 + eps)
    CHECK_THAT(dx1[i], WithinULP(float(dy[i] / std::sqrt(1 + 1e-5)), 2));
}

TEST_CASE("nn::batch_norm: NaN and infinity make their channel NaN in training, one element in evaluation",
          "[nn][batch_norm]") {
  // As torch: in training the channel's mean or variance is NaN, so every y of that channel is,
  // and its running statistics; backward's channel sums carry a NaN dy to the whole dx of that
  // channel and to its dweight and dbias only. In evaluation y is elementwise, and dx = dy k
  // does not read x.
  solder::nn::batch_norm<3> layer;
  tensor<float, shape<dyn, 3, 5, 5>> x(4), y(4), dy(4), dx(4);
  solder::test::fill_uniform(x, -1, 1, 90);
  solder::test::fill_uniform(dy, -1, 1, 91);
  x(2, 1, 4, 4) = qnan;
  x(3, 2, 0, 3) = infty;
  layer.forward(x, y);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 25; ++j) {
      CHECK(std::isfinite(y(i, 0, j / 5, j % 5)));
      CHECK(std::isnan(y(i, 1, j / 5, j % 5)));
      CHECK(std::isnan(y(i, 2, j / 5, j % 5)));
    }
  CHECK(std::isfinite(layer.running_mean[0]));
  CHECK(std::isnan(layer.running_mean[1]));
  CHECK(std::isnan(layer.running_var[2]));

  // The same in 1-d, the NaN in the first sample (the channel's shift).
  solder::nn::batch_norm<3> flat;
  tensor<float, shape<dyn, 3>> xf(5), yf(5);
  solder::test::fill_uniform(xf, -1, 1, 92);
  xf(0, 2) = qnan;
  flat.forward(xf, yf);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(std::isfinite(yf(i, 0)));
    CHECK(std::isfinite(yf(i, 1)));
    CHECK(std::isnan(yf(i, 2)));
  }

  solder::test::fill_uniform(x, -1, 1, 90);
  layer.reset_running_stats();
  layer.forward(x, y);
  dy(1, 2, 0, 0) = qnan;
  layer.backward(x, y, dy, dx);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 25; ++j) {
      CHECK(std::isfinite(dx(i, 0, j / 5, j % 5)));
      CHECK(std::isfinite(dx(i, 1, j / 5, j % 5)));
      CHECK(std::isnan(dx(i, 2, j / 5, j % 5)));
    }
  CHECK(std::isfinite(layer.weight_grad[1]));
  CHECK(std::isnan(layer.weight_grad[2]));
  CHECK(std::isnan(layer.bias_grad[2]));

  layer.eval();
  solder::test::fill_uniform(dy, -1, 1, 91);
  x(2, 1, 4, 4) = qnan;
  layer.forward(x, y);
  layer.backward(x, y, dy, dx);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 25; ++j) {
      CHECK(std::isnan(y(i, 1, j / 5, j % 5)) == (i == 2 && j == 24));
      CHECK(std::isfinite(dx(i, 1, j / 5, j % 5)));
    }
  CHECK(std::isnan(layer.weight_grad[1]));
  CHECK(std::isfinite(layer.bias_grad[1]));
}

TEST_CASE("nn::batch_norm: in place (y = x, dx = dy) matches separate buffers bit for bit", "[nn][batch_norm]") {
  auto run = [](auto x, auto dy, std::uint32_t seed) {
    using S = typename decltype(x)::shape_type;
    solder::nn::batch_norm<S::extents[1]> a, b;
    solder::test::fill_uniform(a.weight, -1.5, 1.5, seed);
    b.weight = a.weight;
    solder::test::fill_uniform(x, -2, 2, seed + 1);
    solder::test::fill_uniform(dy, -1, 1, seed + 2);
    auto y = x, dx = dy;
    a.forward(x, y);
    a.backward(x, y, dy, dx);
    auto xy = x, g = dy;
    const std::size_t batch = x.batch();
    b.forward(tensor_ref<const float, S>(xy.data(), batch), xy.ref());
    CHECK(same_bits(xy.data(), y.data(), y.size()));
    b.backward(std::as_const(x).ref(), std::as_const(y).ref(), tensor_ref<const float, S>(g.data(), batch), g.ref());
    CHECK(same_bits(g.data(), dx.data(), dx.size()));
  };
  run(tensor<float, shape<dyn, 3, 5, 5>>(5), tensor<float, shape<dyn, 3, 5, 5>>(5), 100);
  run(tensor<float, shape<dyn, 37>>(5), tensor<float, shape<dyn, 37>>(5), 110);
}

TEST_CASE("nn::batch_norm: results do not depend on the thread count", "[nn][batch_norm]") {
  const int before = solder::num_threads();
  // Above the parallel threshold: 2-d, 32 samples of 16 x 16 x 16 (512 planes); 1-d, 300 x 257
  // (5 chunks of float columns).
  auto compare = [](auto x, auto dy, bool training) {
    using S = typename decltype(x)::shape_type;
    constexpr std::size_t C = S::extents[1];
    solder::test::fill_uniform(x, -3, 3, 120);
    solder::test::fill_uniform(dy, -1, 1, 121);
    auto run = [&](int threads, auto& y, auto& dx, auto& layer) {
      solder::set_num_threads(threads);
      solder::test::fill_uniform(layer.weight, -1.5, 1.5, 122);
      solder::test::fill_uniform(layer.running_var, 0.5, 2, 123);
      if (!training) layer.eval();
      layer.forward(x, y);
      layer.backward(x, y, dy, dx);
    };
    auto y1 = x, dx1 = x, y2 = x, dx2 = x;
    solder::nn::batch_norm<C> one, two;
    run(1, y1, dx1, one);
    run(2, y2, dx2, two);
    CHECK(same_bits(y1.data(), y2.data(), y1.size()));
    CHECK(same_bits(dx1.data(), dx2.data(), dx1.size()));
    CHECK(same_bits(one.weight_grad.data(), two.weight_grad.data(), C));
    CHECK(same_bits(one.bias_grad.data(), two.bias_grad.data(), C));
    CHECK(same_bits(one.running_mean.data(), two.running_mean.data(), C));
    CHECK(same_bits(one.running_var.data(), two.running_var.data(), C));
  };
  for (bool training : {true, false}) {
    compare(tensor<float, shape<dyn, 16, 16, 16>>(32), tensor<float, shape<dyn, 16, 16, 16>>(32), training);
    compare(tensor<float, shape<dyn, 257>>(300), tensor<float, shape<dyn, 257>>(300), training);
  }
  solder::set_num_threads(before);
}

TEST_CASE("nn::batch_norm: batch mismatches, one value per channel, and a backward without its forward are errors",
          "[nn][batch_norm]") {
  solder::nn::batch_norm<3> layer;
  tensor<float, shape<dyn, 3, 5, 5>> x(3), y(4), y3(3), dy(3), dx(3), x5(5), dx5(5), y5(5), dy5(5);
  solder::test::fill_uniform(x, -1, 1, 130);
  solder::test::fill_uniform(x5, -1, 1, 131);
  CHECK_THROWS_WITH(layer.forward(x, y),
                    Contains("solder::nn::batch_norm::forward") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(layer.backward(x, y3, dy, dx), Contains("solder::nn::batch_norm::backward: no forward has run"));
  layer.forward(x, y3);
  CHECK_THROWS_WITH(layer.backward(x, y, dy, dx),
                    Contains("solder::nn::batch_norm::backward") && Contains("x (3), y (4), dy (3) and dx (3) differ"));
  CHECK_THROWS_AS(layer.backward(x, y3, dy, dx5), solder::error);
  CHECK_THROWS_WITH(layer.backward(x5, y5, dy5, dx5),
                    Contains("the last forward saw a batch of 3 (25 values per sample and channel) but backward got 5 (25)"));
  tensor<float, shape<dyn, 3, 1, 3>> xs(3), ys(3);  // the same batch, other planes
  CHECK_THROWS_WITH(layer.backward(xs, ys, ys, xs), Contains("but backward got 3 (3)"));
  CHECK_NOTHROW(layer.backward(x, y3, dy, dx));

  // Training needs more than one value per channel, as torch ("Expected more than 1 value per
  // channel when training"); a refused forward changes nothing. Batch 1 of 5 x 5 planes is fine.
  solder::nn::batch_norm<3> one;
  tensor<float, shape<dyn, 3>> x1(1), y1(1);
  tensor<float, shape<1, 3, 1, 1>> p1, q1;
  x1[0] = 5;
  CHECK_THROWS_WITH(one.forward(x1, y1), Contains("solder::nn::batch_norm::forward: expected more than 1 value per "
                                                   "channel when training, got input size [1, 3]"));
  CHECK_THROWS_WITH(one.forward(p1, q1), Contains("got input size [1, 3, 1, 1]"));
  CHECK(one.num_batches_tracked == 0);
  CHECK(one.running_mean[0] == 0.0f);
  tensor<float, shape<dyn, 3, 5, 5>> xb(1), yb(1);
  solder::test::fill_uniform(xb, -1, 1, 132);
  CHECK_NOTHROW(one.forward(xb, yb));
  one.eval();
  CHECK_NOTHROW(one.forward(x1, y1));  // evaluation normalizes a single value
  CHECK_THAT(y1[0], WithinULP(float((5 - one.running_mean[0]) / std::sqrt(double(one.running_var[0]) + 1e-5)), 2));
}
