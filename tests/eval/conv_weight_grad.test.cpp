// tests/eval/conv_weight_grad.test.cpp: a convolution's weight gradient on the register tiles
// (eval/cpu/conv_weight_grad.hpp) against the sum written out in double, element by element,
// on geometries that reach every edge of the tiles: input channels not a multiple of the
// tile's rows, output channels not a multiple of a panel, strides, padding, dilation,
// non-square kernels, runs of rows that start and end inside a sample; the runs added in
// order; and conv2d's backward on a layer that takes this path, against the same sum, on 1
// and 2 threads with the same bits.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "solder/eval/cpu/conv_weight_grad.hpp"
#include "solder/memory.hpp"
#include "solder/nn/conv2d.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;

constexpr double u = 0x1p-24;

/// dW[co][ci][kh][kw] in double, and the sum of |terms| of each, for x [N, Cin, H, W], dy [N,
/// Cout, Ho, Wo].
struct dw_reference {
  std::vector<double> value, magnitude;
};
dw_reference reference_dw(const std::vector<float>& x, const std::vector<float>& dy, std::size_t n, std::size_t cin,
                          std::size_t cout, std::size_t h, std::size_t w, std::size_t kh, std::size_t kw, std::size_t s,
                          std::size_t p, std::size_t d) {
  const std::size_t ho = (h + 2 * p - d * (kh - 1) - 1) / s + 1, wo = (w + 2 * p - d * (kw - 1) - 1) / s + 1;
  dw_reference r{std::vector<double>(cout * cin * kh * kw, 0.0), std::vector<double>(cout * cin * kh * kw, 0.0)};
  for (std::size_t co = 0; co < cout; ++co)
    for (std::size_t ci = 0; ci < cin; ++ci)
      for (std::size_t a = 0; a < kh; ++a)
        for (std::size_t b = 0; b < kw; ++b) {
          double sum = 0, mag = 0;
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t y = 0; y < ho; ++y)
              for (std::size_t z = 0; z < wo; ++z) {
                const std::ptrdiff_t hi = std::ptrdiff_t(y * s + a * d) - std::ptrdiff_t(p);
                const std::ptrdiff_t wi = std::ptrdiff_t(z * s + b * d) - std::ptrdiff_t(p);
                if (hi < 0 || wi < 0 || hi >= std::ptrdiff_t(h) || wi >= std::ptrdiff_t(w)) continue;
                const double t = double(x[((i * cin + ci) * h + std::size_t(hi)) * w + std::size_t(wi)]) *
                                 double(dy[((i * cout + co) * ho + y) * wo + z]);
                sum += t;
                mag += std::abs(t);
              }
          const std::size_t at = ((co * cin + ci) * kh + a) * kw + b;
          r.value[at] = sum;
          r.magnitude[at] = mag;
        }
  return r;
}

/// Elements of got outside the float sum's bound: a run sums at most its rows' terms in float
/// (each rounding within u of the running sum's terms), then the runs are added in double.
std::size_t outside(const float* got, const dw_reference& r, double terms) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < r.value.size(); ++i)
    bad += !(std::abs(double(got[i]) - r.value[i]) <= (terms + 2) * u * r.magnitude[i] + 1e-30);
  return bad;
}

/// The kernel alone: runs of `per_run` output rows, each into its own partial sum, combined.
template <std::size_t Cin, std::size_t Cout, std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw,
          std::size_t S, std::size_t P, std::size_t D>
void check_kernel(std::size_t n, std::size_t per_run, const char* what) {
  INFO(what << ", batch " << n << ", runs of " << per_run << " rows");
  using K = eval::cpu::conv_weight_grad<Cin, Cout, H, W, Kh, Kw, S, P, D>;
  std::vector<float> x(n * Cin * H * W), dy(n * Cout * K::Ho * K::Wo), dw(Cout * Cin * Kh * Kw, -7.0f);
  test::fill_uniform(x, -1.0, 1.0, 61);
  test::fill_uniform(dy, -1.0, 1.0, 62);
  const std::size_t total = n * K::Ho, runs = (total + per_run - 1) / per_run;
  auto parts = allocate_aligned<float>(runs * K::partial_floats);
  for (std::size_t r = 0; r < runs; ++r)
    K::run_rows(eval::cpu::conv_detail::nchw_rows<Cin, H, W>{x.data()}, dy.data(), parts.get() + r * K::partial_floats,
                r * per_run, std::min(total, (r + 1) * per_run));
  K::combine(parts.get(), runs, dw.data(), 0, K::partial_floats / 3);  // in two blocks
  K::combine(parts.get(), runs, dw.data(), K::partial_floats / 3, K::partial_floats);
  const auto ref = reference_dw(x, dy, n, Cin, Cout, H, W, Kh, Kw, S, P, D);
  CHECK(outside(dw.data(), ref, double(per_run * K::Wo)) == 0);
}

TEST_CASE("eval::conv_weight_grad: every tile edge against the sum in double", "[eval][conv]") {
  check_kernel<13, 40, 9, 11, 3, 3, 1, 1, 1>(2, 4, "13 -> 40 (a partial panel), 3x3, pad 1");
  check_kernel<20, 33, 10, 9, 3, 3, 2, 1, 1>(3, 5, "20 -> 33, stride 2");
  check_kernel<5, 7, 8, 8, 3, 3, 1, 0, 1>(2, 3, "5 -> 7, no padding");
  check_kernel<16, 32, 9, 10, 3, 3, 1, 2, 2>(2, 7, "16 -> 32, dilation 2, pad 2");
  check_kernel<3, 64, 12, 12, 7, 5, 2, 3, 1>(2, 6, "3 -> 64, 7x5, stride 2, pad 3");
  check_kernel<1, 8, 8, 8, 3, 3, 1, 1, 1>(4, 8, "1 -> 8 (one row per tile)");
  check_kernel<64, 64, 6, 7, 1, 1, 2, 0, 1>(2, 2, "64 -> 64 pointwise, stride 2");
  check_kernel<8, 16, 4, 4, 3, 3, 1, 5, 1>(1, 1, "padding wider than the image, one row per run");
  check_kernel<24, 48, 7, 7, 3, 3, 1, 1, 1>(3, 21, "runs of three samples");
}

TEST_CASE("nn::conv2d: a layer whose dW runs on the tiles, against the sum in double, on 1 and 2 threads",
          "[nn][conv2d]") {
  using L = nn::conv2d<24, 40, 3, 3, 1, 1>;
  static_assert(eval::cpu::conv_weight_grad_fill(24, 40) >= 0.2, "the layer must take the tiles' path");
  using S = shape<dyn, 24, 12, 13>;
  using SY = shape<dyn, 40, 12, 13>;
  constexpr std::size_t n = 5;
  L layer(3);
  tensor<float, S> x(n), dx(n);
  tensor<float, SY> y(n), dy(n);
  test::fill_uniform(x, -1.0, 1.0, 71);
  test::fill_uniform(dy, -1.0, 1.0, 72);
  const auto ref = reference_dw(std::vector<float>(x.begin(), x.end()), std::vector<float>(dy.begin(), dy.end()), n, 24,
                                40, 12, 13, 3, 3, 1, 1, 1);
  std::vector<float> first;
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
#if defined(_OPENMP)
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
    layer.weight_grad.fill(-7.0f);
    layer.backward(x, y, dy, dx);
#if defined(_OPENMP)
    omp_set_num_threads(saved);
#endif
    CHECK(outside(layer.weight_grad.data(), ref, double(n * 12 * 13)) == 0);
    if (first.empty())
      first.assign(layer.weight_grad.begin(), layer.weight_grad.end());
    else
      CHECK(std::memcmp(first.data(), layer.weight_grad.data(), first.size() * sizeof(float)) == 0);
  }
}

}  // namespace
