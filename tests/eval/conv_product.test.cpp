// tests/eval/conv_product.test.cpp: a convolution's gradients written as its product's rules
// (autodiff/product.hpp over expr/operand.hpp's image_patches and image_pixels) and run by the
// CPU's convolution kernels (eval/cpu/conv_product.hpp): dW = g^T patches(x) and dx =
// col2im(g W) against loops in double, for layers that take each of the CPU's paths (the dW
// tiles or per-sample GEMMs; the turned-around dx tiles, per-sample GEMMs gathered, or a 1x1
// kernel's GEMM straight into dx) and for the groups of a grouped layer; the same expressions
// on the emulated device; and the run-time checks (batches that differ, outputs overlapping an
// operand) with the output left unchanged.
#include "support/emulated_device.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <tuple>
#include <vector>

#include "solder/autodiff/product.hpp"
#include "solder/eval/cpu/executor.hpp"
#include "solder/expr/contract.hpp"
#include "solder/expr/operand.hpp"
#include "solder/expr/write.hpp"
#include "solder/ops/conv2d.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;

constexpr double float_u = std::numeric_limits<float>::epsilon() / 2;

/// Elements of got farther from want than a float sum of `terms` terms may err (terms + 2
/// roundings of the terms' magnitude).
std::size_t far_from(const float* got, const std::vector<double>& want, const std::vector<double>& mag,
                     std::size_t terms) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    bad += !(std::abs(double(got[i]) - want[i]) <= double(terms + 2) * float_u * mag[i]);
  return bad;
}

/// torch's Conv2d(Cin, Cout, (K, K), S, P, D) over H x W images, one group.
template <std::size_t Cin_, std::size_t Cout_, std::size_t K_, std::size_t S_, std::size_t P_, std::size_t D_,
          std::size_t H_, std::size_t W_>
struct conv_case {
  static constexpr std::size_t Cin = Cin_, Cout = Cout_, K = K_, S = S_, P = P_, D = D_, H = H_, W = W_;
  using G = ops::conv2d_geometry<H, W, K, K, S, P, D>;
  static constexpr std::size_t Ho = G::out_height, Wo = G::out_width, cols = Cin * K * K;
};

/// dW and dx by loops in double, with each value's magnitude.
template <class Case>
struct reference {
  std::vector<double> dx, dx_mag, dw, dw_mag;
  reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy, std::size_t batch)
      : dx(batch * Case::Cin * Case::H * Case::W), dx_mag(dx.size()), dw(Case::Cout * Case::cols), dw_mag(dw.size()) {
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t co = 0; co < Case::Cout; ++co)
        for (std::size_t ho = 0; ho < Case::Ho; ++ho)
          for (std::size_t wo = 0; wo < Case::Wo; ++wo) {
            const double g = dy[((n * Case::Cout + co) * Case::Ho + ho) * Case::Wo + wo];
            for (std::size_t ci = 0; ci < Case::Cin; ++ci)
              for (std::size_t kh = 0; kh < Case::K; ++kh)
                for (std::size_t kw = 0; kw < Case::K; ++kw) {
                  const long hi = long(ho * Case::S + kh * Case::D) - long(Case::P);
                  const long wi = long(wo * Case::S + kw * Case::D) - long(Case::P);
                  if (hi < 0 || wi < 0 || hi >= long(Case::H) || wi >= long(Case::W)) continue;
                  const std::size_t xi = ((n * Case::Cin + ci) * Case::H + std::size_t(hi)) * Case::W + std::size_t(wi);
                  const std::size_t wk = ((co * Case::Cin + ci) * Case::K + kh) * Case::K + kw;
                  dx[xi] += g * double(w[wk]);
                  dx_mag[xi] += std::abs(g * double(w[wk]));
                  dw[wk] += g * double(x[xi]);
                  dw_mag[wk] += std::abs(g * double(x[xi]));
                }
          }
  }
};

/// The forward product patches(x) W^T over x and W in Space, and g = dy as its pixel rows.
template <class Case, class Space>
auto product_of(const float* x, const float* w, std::size_t batch) {
  return matmul(image_patches<typename Case::G, Case::Cin, Space>{x, batch},
                transpose(tensor_ref<const float, shape<Case::Cout, Case::cols>, Space>(w)));
}

/// dW and dx by the product's rules in Space (the CPU, or the emulated device), into dw and dx.
template <class Case, class Space>
void gradients(const float* x, const float* w, const float* dy, float* dw, float* dx, std::size_t batch) {
  using exec = executor<backend_of_t<Space>>;
  const auto c = product_of<Case, Space>(x, w, batch);
  const image_pixels<Case::Cout, Case::G::out_plane, Space> g{dy, batch};
  exec::run(write(tensor_ref<float, shape<Case::Cout, Case::cols>, Space>(dw), std::get<0>(autodiff::right_grads(c, g))));
  exec::run(write(image_patches_grad<typename Case::G, Case::Cin, Space>{dx, batch}, autodiff::left_grad(c, g)));
}

template <class Case>
void check_case(std::initializer_list<std::size_t> batches) {
  std::vector<float> w(Case::Cout * Case::cols);
  test::fill_uniform(w, -1.0, 1.0, 3);
  for (const std::size_t batch : batches) {
    INFO("Cin " << Case::Cin << " Cout " << Case::Cout << " kernel " << Case::K << " stride " << Case::S << " padding "
                << Case::P << " dilation " << Case::D << " image " << Case::H << "x" << Case::W << " batch " << batch);
    std::vector<float> x(batch * Case::Cin * Case::H * Case::W), dy(batch * Case::Cout * Case::Ho * Case::Wo);
    test::fill_uniform(x, -1.0, 1.0, std::uint32_t(5 + batch));
    test::fill_uniform(dy, -1.0, 1.0, std::uint32_t(9 + batch));
    const reference<Case> want(x, w, dy, batch);
    std::vector<float> dw(w.size(), 7.0f), dx(x.size(), 7.0f);
    gradients<Case, host>(x.data(), w.data(), dy.data(), dw.data(), dx.data(), batch);
    CHECK(far_from(dw.data(), want.dw, want.dw_mag, batch * Case::Ho * Case::Wo) == 0);
    CHECK(far_from(dx.data(), want.dx, want.dx_mag, Case::Cout * Case::K * Case::K) == 0);

    // The same expressions in (emulated) device memory: the device's staged products.
    std::vector<float> dwd(w.size(), 7.0f), dxd(x.size(), 7.0f);
    gradients<Case, device>(x.data(), w.data(), dy.data(), dwd.data(), dxd.data(), batch);
    CHECK(far_from(dwd.data(), want.dw, want.dw_mag, batch * Case::Ho * Case::Wo) == 0);
    CHECK(far_from(dxd.data(), want.dx, want.dx_mag, Case::Cout * Case::K * Case::K) == 0);
  }
}

/// Channels [c0, c0 + C) of every sample of images [batch, Stored, plane].
std::vector<float> channels_of(const std::vector<float>& v, std::size_t batch, std::size_t stored, std::size_t c0,
                               std::size_t C, std::size_t plane) {
  std::vector<float> out(batch * C * plane);
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t p = 0; p < plane; ++p) out[(n * C + c) * plane + p] = v[(n * stored + c0 + c) * plane + p];
  return out;
}

/// A layer of Groups groups (Case: one group's channels), its gradients written per group over
/// the group's channels of the images (Stored > C), on the CPU: each group's against the loops
/// of that group alone.
template <class Case, std::size_t Groups>
void check_groups(std::size_t batch) {
  constexpr std::size_t In = Groups * Case::Cin, Out = Groups * Case::Cout, K = Case::cols;
  constexpr std::size_t in_plane = Case::H * Case::W, out_plane = Case::Ho * Case::Wo;
  using G = typename Case::G;
  INFO("groups " << Groups << " of Cin " << Case::Cin << " Cout " << Case::Cout << " kernel " << Case::K << " stride "
                 << Case::S << " batch " << batch);
  std::vector<float> x(batch * In * in_plane), dy(batch * Out * out_plane), w(Out * K);
  test::fill_uniform(x, -1.0, 1.0, 21);
  test::fill_uniform(dy, -1.0, 1.0, 22);
  test::fill_uniform(w, -1.0, 1.0, 23);
  std::vector<float> dw(w.size(), 7.0f), dx(x.size(), 7.0f);
  for (std::size_t q = 0; q < Groups; ++q) {
    const auto c = matmul(image_patches<G, Case::Cin, host, In>{x.data() + q * Case::Cin * in_plane, batch},
                          transpose(tensor_ref<const float, shape<Case::Cout, K>>(w.data() + q * Case::Cout * K)));
    const image_pixels<Case::Cout, out_plane, host, false, Out> g{dy.data() + q * Case::Cout * out_plane, batch};
    executor<cpu>::run(write(tensor_ref<float, shape<Case::Cout, K>>(dw.data() + q * Case::Cout * K),
                             std::get<0>(autodiff::right_grads(c, g))));
    executor<cpu>::run(write(image_patches_grad<G, Case::Cin, host, In>{dx.data() + q * Case::Cin * in_plane, batch},
                             autodiff::left_grad(c, g)));
  }
  for (std::size_t q = 0; q < Groups; ++q) {
    INFO("group " << q);
    const std::vector<float> wq(w.begin() + std::ptrdiff_t(q * Case::Cout * K), w.begin() + std::ptrdiff_t((q + 1) * Case::Cout * K));
    const reference<Case> want(channels_of(x, batch, In, q * Case::Cin, Case::Cin, in_plane), wq,
                               channels_of(dy, batch, Out, q * Case::Cout, Case::Cout, out_plane), batch);
    CHECK(far_from(dw.data() + q * Case::Cout * K, want.dw, want.dw_mag, batch * out_plane) == 0);
    const std::vector<float> dxq = channels_of(dx, batch, In, q * Case::Cin, Case::Cin, in_plane);
    CHECK(far_from(dxq.data(), want.dx, want.dx_mag, Case::Cout * Case::K * Case::K) == 0);
  }
}

}  // namespace

TEST_CASE("conv product: dW = g^T patches(x) and dx = col2im(g W) on the CPU's kernels, against loops",
          "[conv2d][product]") {
  SECTION("channels that fill the dW tiles, stride 1: the dW tiles and the turned-around dx tiles") {
    check_case<conv_case<16, 24, 3, 1, 1, 1, 9, 8>>({1, 3});
  }
  SECTION("three input channels: dW by per-sample GEMMs over the columns") {
    check_case<conv_case<3, 8, 3, 1, 1, 1, 7, 7>>({2, 1});
  }
  SECTION("stride 2: dx by per-sample GEMMs, gathered; dilation 2") {
    check_case<conv_case<8, 16, 3, 2, 1, 1, 9, 7>>({1, 3});
    check_case<conv_case<4, 6, 3, 1, 2, 2, 8, 8>>({3});
  }
  SECTION("a 1x1 kernel: the image is its own columns, dx written by the GEMM") {
    check_case<conv_case<5, 12, 1, 1, 0, 1, 5, 7>>({1, 3});
  }
}

TEST_CASE("conv product: batches that differ or outputs overlapping an operand are refused, the output unchanged",
          "[conv2d][product]") {
  using Case = conv_case<2, 3, 3, 1, 1, 1, 4, 4>;
  using G = Case::G;
  std::vector<float> x(2 * 2 * 16, 1.0f), w(3 * 18, 1.0f), dy(2 * 3 * 16, 1.0f), dw(w.size(), 7.0f), dx(x.size(), 7.0f);
  const auto c = product_of<Case, host>(x.data(), w.data(), 2);
  const image_pixels<3, G::out_plane> g_short{dy.data(), 1};
  const tensor_ref<float, shape<3, 18>> dw_ref(dw.data());
  CHECK_THROWS_WITH(executor<cpu>::run(write(dw_ref, std::get<0>(autodiff::right_grads(c, g_short)))),
                    Catch::Contains("1 samples of g and 2 of x"));
  CHECK_THROWS_WITH(executor<cpu>::run(write(image_patches_grad<G, 2>{dx.data(), 2}, autodiff::left_grad(c, g_short))),
                    Catch::Contains("patches of 2 samples is written from g of 1"));
  const image_pixels<3, G::out_plane> g{dy.data(), 2};
  CHECK_THROWS_WITH(executor<cpu>::run(write(image_patches_grad<G, 2>{dy.data() + 8, 2}, autodiff::left_grad(c, g))),
                    Catch::Contains("overlap g or W"));
  const tensor_ref<float, shape<3, 18>> over_x(x.data());
  CHECK_THROWS_WITH(executor<cpu>::run(write(over_x, std::get<0>(autodiff::right_grads(c, g)))),
                    Catch::Contains("overlaps one of its operands"));
  for (float v : dw) CHECK(v == 7.0f);
  for (float v : dx) CHECK(v == 7.0f);
  for (float v : x) CHECK(v == 1.0f);
}

TEST_CASE("conv product: a layer's groups, each a product over its channels of the images, against loops",
          "[conv2d][product]") {
  SECTION("2 groups, 3x3, padding 1") { check_groups<conv_case<4, 6, 3, 1, 1, 1, 7, 6>, 2>(3); }
  SECTION("4 groups, stride 2") { check_groups<conv_case<3, 2, 3, 2, 1, 1, 9, 8>, 4>(2); }
  SECTION("2 groups, 1x1") { check_groups<conv_case<5, 3, 1, 1, 0, 1, 4, 5>, 2>(3); }
}
