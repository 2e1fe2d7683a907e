// tests/nn/conv_product.test.cpp: nn/conv2d_product.hpp, a convolution written over the
// executor's verbs (products over a batch's image patches, ops/conv2d.hpp's passes around them),
// run in `device` memory on the host by the emulated CUDA executor (support/emulated_device.hpp):
// forward (bias or none, an activation or none) and backward's dx, dW and db against double
// loops over several geometries and batches, and against the CPU layer nn::conv2d on the same
// weights; and ops/conv2d.hpp's bodies on the CPU's verbs (its vector row walker, its planes)
// against the same kind of loops.
#include "support/emulated_device.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "solder/nn/conv2d.hpp"
#include "solder/nn/conv2d_product.hpp"
#include "solder/ops/activations.hpp"
#include "solder/ops/conv2d.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;

/// Unit roundoff of float: 2^-24.
constexpr double float_u = std::numeric_limits<float>::epsilon() / 2;

/// A float sum of n products (each rounded, then added in any order) errs by at most n u of the
/// sum of the terms' magnitudes, to first order; the bias add and the activation add a rounding.
/// Every value is checked against that bound with n its number of terms, plus 2.
bool within_sum(double got, double want, double magnitude, std::size_t terms) {
  return std::abs(got - want) <= double(terms + 2) * float_u * magnitude;
}

/// Counts the elements of got outside the sum bound of want (terms per element: `terms`).
std::size_t far_from(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& magnitude,
                     std::size_t terms) {
  std::size_t bad = got.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    bad += !within_sum(got[i], want[i], magnitude[i], terms);
  return bad;
}

/// Two float results of the same sums, each within the bound of the exact one.
std::size_t far_apart(const std::vector<float>& a, const std::vector<float>& b, const std::vector<double>& magnitude,
                      std::size_t terms) {
  std::size_t bad = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    bad += !(std::abs(double(a[i]) - double(b[i])) <= 2.0 * double(terms + 2) * float_u * magnitude[i]);
  return bad;
}

/// A convolution's case: torch's Conv2d(Cin, Cout, (Kh, Kw), S, P, D, bias = Bias) over H x W.
template <std::size_t Cin_, std::size_t Cout_, std::size_t Kh_, std::size_t Kw_, std::size_t S_, std::size_t P_,
          std::size_t D_, bool Bias_, std::size_t H_, std::size_t W_, std::size_t Groups_ = 1>
struct conv_case {
  static constexpr std::size_t Cin = Cin_, Cout = Cout_, Kh = Kh_, Kw = Kw_, S = S_, P = P_, D = D_, H = H_, W = W_;
  static constexpr std::size_t groups = Groups_, cin_g = Cin / Groups_, cout_g = Cout / Groups_;
  static constexpr bool bias = Bias_;
  using spec = ops::conv2d_spec<Cin, Cout, Kh, Kw, S, P, D, Groups_, Bias_>;
  using geometry = typename spec::template geometry<H, W>;
  using layer = nn::conv2d<Cin, Cout, Kh, Kw, S, P, D, Groups_, Bias_>;
  static constexpr std::size_t Ho = geometry::out_height, Wo = geometry::out_width;
};

/// The convolution and its gradients by loops in double, with each value's magnitude (the sum
/// of its terms' absolute values).
template <class Case>
struct reference {
  std::vector<double> y, y_mag, dx, dx_mag, dw, dw_mag, db, db_mag;

  reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
            const std::vector<float>& dy, std::size_t batch, bool relu) {
    constexpr std::size_t Cin = Case::Cin, Cout = Case::Cout, Kh = Case::Kh, Kw = Case::Kw, H = Case::H, W = Case::W;
    constexpr std::size_t Ho = Case::Ho, Wo = Case::Wo;
    y.assign(batch * Cout * Ho * Wo, 0.0);
    y_mag = y;
    dx.assign(batch * Cin * H * W, 0.0);
    dx_mag = dx;
    dw.assign(Cout * Case::cin_g * Kh * Kw, 0.0);
    dw_mag = dw;
    db.assign(Cout, 0.0);
    db_mag = db;
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t co = 0; co < Cout; ++co)
        for (std::size_t ho = 0; ho < Ho; ++ho)
          for (std::size_t wo = 0; wo < Wo; ++wo) {
            const std::size_t yi = ((n * Cout + co) * Ho + ho) * Wo + wo;
            double acc = Case::bias ? double(b[co]) : 0.0, mag = std::abs(acc);
            const double g = dy[yi];
            db[co] += g;
            db_mag[co] += std::abs(g);
            for (std::size_t cg = 0; cg < Case::cin_g; ++cg)
              for (std::size_t kh = 0; kh < Kh; ++kh)
                for (std::size_t kw = 0; kw < Kw; ++kw) {
                  const long hi = long(ho * Case::S + kh * Case::D) - long(Case::P);
                  const long wi = long(wo * Case::S + kw * Case::D) - long(Case::P);
                  if (hi < 0 || wi < 0 || hi >= long(H) || wi >= long(W)) continue;
                  const std::size_t ci = co / Case::cout_g * Case::cin_g + cg;  // the group's input channel
                  const std::size_t xi = ((n * Cin + ci) * H + std::size_t(hi)) * W + std::size_t(wi);
                  const std::size_t wk = ((co * Case::cin_g + cg) * Kh + kh) * Kw + kw;
                  acc += double(w[wk]) * double(x[xi]);
                  mag += std::abs(double(w[wk]) * double(x[xi]));
                  dx[xi] += g * double(w[wk]);
                  dx_mag[xi] += std::abs(g * double(w[wk]));
                  dw[wk] += g * double(x[xi]);
                  dw_mag[wk] += std::abs(g * double(x[xi]));
                }
            y[yi] = relu && acc <= 0.0 ? 0.0 : acc;
            y_mag[yi] = mag;
          }
  }
};

/// Host values into emulated device memory, and back.
tensor<float, shape<dyn>, device> on_device(const std::vector<float>& v) {
  tensor<float, shape<dyn>, device> t(v.size());
  executor<cuda>::copy_from_host(t.data(), v.data(), v.size());
  return t;
}
std::vector<float> on_host(const tensor<float, shape<dyn>, device>& t) {
  std::vector<float> v(t.size());
  executor<cuda>::copy_to_host(v.data(), t.data(), t.size());
  return v;
}

/// The device convolution of Case at each batch of `batches` (in order, one object: its scratch
/// grows and is reused) against the loops and against the CPU layer.
template <class Case>
void check_conv(std::initializer_list<std::size_t> batches) {
  constexpr std::size_t Cin = Case::Cin, Cout = Case::Cout, H = Case::H, W = Case::W, Ho = Case::Ho, Wo = Case::Wo;
  constexpr std::size_t taps = Case::cin_g * Case::Kh * Case::Kw;
  using G = typename Case::geometry;
  nn::detail::conv2d_product<typename Case::spec, device> conv;
  typename Case::layer layer(3);
  std::vector<float> w(Cout * taps), b(Cout);
  test::fill_uniform(w, -1.0, 1.0, 11);
  test::fill_uniform(b, -1.0, 1.0, 12);
  std::copy(w.begin(), w.end(), layer.weight.data());
  if constexpr (Case::bias) std::copy(b.begin(), b.end(), layer.bias.data());
  const auto wd = on_device(w), bd = on_device(b);
  const float* bias = Case::bias ? bd.data() : nullptr;

  for (const std::size_t batch : batches) {
    INFO("Cin " << Cin << " Cout " << Cout << " kernel " << Case::Kh << "x" << Case::Kw << " stride " << Case::S
                << " padding " << Case::P << " dilation " << Case::D << " bias " << Case::bias << " image " << H << "x"
                << W << " batch " << batch);
    std::vector<float> x(batch * Cin * H * W), dy(batch * Cout * Ho * Wo);
    test::fill_uniform(x, -1.0, 1.0, std::uint32_t(20 + batch));
    test::fill_uniform(dy, -1.0, 1.0, std::uint32_t(40 + batch));
    const reference<Case> plain(x, w, b, dy, batch, false), relu(x, w, b, dy, batch, true);
    const auto xd = on_device(x), dyd = on_device(dy);

    // Forward, without and with an activation.
    tensor<float, shape<dyn>, device> yd(dy.size()), zd(dy.size());
    conv.template forward<G>(wd.data(), bias, xd.data(), yd.data(), batch);
    conv.template forward<G>(wd.data(), bias, xd.data(), zd.data(), batch, ops::relu{});
    const std::vector<float> y = on_host(yd), z = on_host(zd);
    CHECK(far_from(y, plain.y, plain.y_mag, taps) == 0);
    CHECK(far_from(z, relu.y, relu.y_mag, taps) == 0);

    // Backward with dx, then without: the same parameter gradients.
    tensor<float, shape<dyn>, device> dxd(x.size()), dwd(w.size()), dbd(Cout), dw2d(w.size()), db2d(Cout);
    conv.template backward<G>(wd.data(), xd.data(), dyd.data(), dxd.data(), dwd.data(), Case::bias ? dbd.data() : nullptr,
                              batch);
    conv.template backward<G>(wd.data(), xd.data(), dyd.data(), nullptr, dw2d.data(), Case::bias ? db2d.data() : nullptr,
                              batch);
    const std::vector<float> dx = on_host(dxd), dw = on_host(dwd), db = on_host(dbd);
    CHECK(far_from(dx, plain.dx, plain.dx_mag, Case::cout_g * Case::Kh * Case::Kw) == 0);
    CHECK(far_from(dw, plain.dw, plain.dw_mag, batch * Ho * Wo) == 0);
    CHECK(test::bit_differences(dw.data(), on_host(dw2d).data(), dw.size()) == 0);
    if constexpr (Case::bias) {
      CHECK(far_from(db, plain.db, plain.db_mag, batch * Ho * Wo) == 0);
      CHECK(test::bit_differences(db.data(), on_host(db2d).data(), db.size()) == 0);
    }

    // The CPU layer on the same weights and data.
    tensor<float, shape<dyn, Cin, H, W>> xh(batch), dxh(batch);
    tensor<float, shape<dyn, Cout, Ho, Wo>> yh(batch), zh(batch), dyh(batch);
    std::copy(x.begin(), x.end(), xh.data());
    std::copy(dy.begin(), dy.end(), dyh.data());
    layer.forward(xh, yh);
    layer.forward_activated(tensor_ref<const float, shape<dyn, Cin, H, W>>(xh.data(), batch), zh.ref(), ops::relu{});
    layer.backward(xh, yh, dyh, dxh);
    CHECK(far_apart(y, std::vector<float>(yh.data(), yh.data() + yh.size()), plain.y_mag, taps) == 0);
    CHECK(far_apart(z, std::vector<float>(zh.data(), zh.data() + zh.size()), relu.y_mag, taps) == 0);
    CHECK(far_apart(dx, std::vector<float>(dxh.data(), dxh.data() + dxh.size()), plain.dx_mag,
                    Case::cout_g * Case::Kh * Case::Kw) == 0);
    CHECK(far_apart(dw, std::vector<float>(layer.weight_grad.data(), layer.weight_grad.data() + w.size()), plain.dw_mag,
                    batch * Ho * Wo) == 0);
    if constexpr (Case::bias)
      CHECK(far_apart(db, std::vector<float>(layer.bias_grad.data(), layer.bias_grad.data() + Cout), plain.db_mag,
                      batch * Ho * Wo) == 0);
  }
}

}  // namespace

TEST_CASE("conv2d_product: a 3x3 convolution with padding 1, and one wider than a product tile, in device memory",
          "[conv2d][device]") {
  check_conv<conv_case<3, 5, 3, 3, 1, 1, 1, true, 7, 6>>({3, 1});
  check_conv<conv_case<16, 70, 3, 3, 1, 1, 1, true, 10, 9>>({1, 3});
}

TEST_CASE("conv2d_product: stride 2, dilation 2, 1x1 and non-square kernels, no bias, in device memory",
          "[conv2d][device]") {
  check_conv<conv_case<4, 6, 3, 3, 2, 1, 1, true, 9, 8>>({1, 3});
  check_conv<conv_case<2, 3, 3, 3, 1, 2, 2, true, 8, 8>>({3, 1});
  check_conv<conv_case<5, 4, 1, 1, 1, 0, 1, true, 5, 7>>({1, 3});
  check_conv<conv_case<3, 4, 2, 3, 2, 1, 1, true, 7, 5>>({3, 1});
  check_conv<conv_case<3, 4, 3, 1, 1, 0, 2, false, 9, 4>>({1, 3});
  check_conv<conv_case<3, 4, 3, 3, 1, 1, 1, false, 6, 6>>({3, 1});
}

TEST_CASE("conv2d_product: grouped and depthwise layers, a product per group, in device memory", "[conv2d][device]") {
  check_conv<conv_case<4, 6, 3, 3, 1, 1, 1, true, 7, 6, 2>>({3, 1});
  check_conv<conv_case<6, 6, 3, 3, 2, 1, 1, false, 9, 8, 3>>({1, 2});
  check_conv<conv_case<4, 4, 3, 3, 1, 1, 1, true, 8, 7, 4>>({2});  // depthwise
  check_conv<conv_case<3, 6, 3, 3, 1, 1, 1, true, 6, 6, 3>>({2});  // depthwise, multiplier 2
}

TEST_CASE("conv2d_product: a batch of 0 leaves y and dx alone and zeroes dW and db", "[conv2d][device]") {
  using C = conv_case<2, 3, 3, 3, 1, 1, 1, true, 4, 4>;
  nn::detail::conv2d_product<C::spec, device> conv;
  std::vector<float> w(3 * 2 * 9, 1.0f), b(3, 1.0f), dw(w.size(), 7.0f), db(3, 7.0f);
  const auto wd = on_device(w), bd = on_device(b), xd = on_device({0.0f});
  auto dwd = on_device(dw), dbd = on_device(db);
  auto out = on_device({5.0f});
  conv.forward<C::geometry>(wd.data(), bd.data(), xd.data(), out.data(), 0);
  conv.backward<C::geometry>(wd.data(), xd.data(), xd.data(), out.data(), dwd.data(), dbd.data(), 0);
  CHECK(on_host(out)[0] == 5.0f);
  for (float v : on_host(dwd)) CHECK(v == 0.0f);
  for (float v : on_host(dbd)) CHECK(v == 0.0f);
}

namespace {

/// ops/conv2d.hpp's bodies run by a backend's verbs against loops: the reorders bit for bit,
/// the gather and the channel sums within the sum bound, the sums equal in both layouts.
template <class Exec>
void check_bodies() {
  using G = ops::conv2d_geometry<7, 5, 3, 2, 2, 1, 1>;  // a 3x2 kernel, stride 2, padding 1
  constexpr std::size_t C = 3, HW = G::out_plane, batch = 3, cols = C * G::taps;
  std::vector<float> nhwc(batch * HW * C), bias(C), nchw(batch * C * HW), back(nhwc.size()), relu_y(nchw.size());
  test::fill_uniform(nhwc, -1.0, 1.0, 5);
  test::fill_uniform(bias, -1.0, 1.0, 6);
  Exec::planes(batch, C, HW, C * HW, ops::conv2d_nhwc_to_nchw<C, HW>{nhwc.data(), nchw.data()});
  Exec::planes(batch, HW, C, C * HW, ops::conv2d_nchw_to_nhwc<C, HW>{nchw.data(), back.data()});
  Exec::planes(batch, C, HW, C * HW, ops::conv2d_nhwc_to_nchw<C, HW, ops::relu>{nhwc.data(), relu_y.data(), bias.data()});
  std::size_t wrong = 0;
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t p = 0; p < HW; ++p) {
        const float v = nhwc[(n * HW + p) * C + c], vb = v + bias[c];
        wrong += nchw[(n * C + c) * HW + p] != v;
        wrong += relu_y[(n * C + c) * HW + p] != (vb <= 0.0f ? 0.0f : vb);
      }
  CHECK(wrong == 0);
  CHECK(test::bit_differences(back.data(), nhwc.data(), nhwc.size()) == 0);

  // Channel sums over n = batch HW values (not a multiple of a vector: the walker's tail).
  std::vector<float> sums_last(C, 9.0f), sums_planes(C, 9.0f);
  Exec::template rows<dyn>(C, ops::conv2d_channel_sums<C, HW, true>{nhwc.data(), sums_last.data(), batch * HW});
  Exec::template rows<dyn>(C, ops::conv2d_channel_sums<C, HW, false>{nchw.data(), sums_planes.data(), batch * HW});
  CHECK(test::bit_differences(sums_last.data(), sums_planes.data(), C) == 0);
  for (std::size_t c = 0; c < C; ++c) {
    double want = 0, mag = 0;
    for (std::size_t j = 0; j < batch * HW; ++j) {
      want += nhwc[j * C + c];
      mag += std::abs(double(nhwc[j * C + c]));
    }
    CHECK(within_sum(sums_last[c], want, mag, batch * HW));
  }

  // col2im's gather from dcol [batch Ho Wo, C Kh Kw], against a scatter of every entry.
  std::vector<float> dcol(batch * HW * cols), dx(batch * C * G::in_plane, 9.0f);
  test::fill_uniform(dcol, -1.0, 1.0, 7);
  Exec::planes(batch * C, G::height, G::width, G::in_plane, ops::conv2d_col2im<G, C>{dcol.data(), dx.data()});
  std::vector<double> want(dx.size(), 0.0), mag(dx.size(), 0.0);
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t p = 0; p < HW; ++p)
      for (std::size_t k = 0; k < cols; ++k) {
        const std::size_t ci = k / G::taps, kh = k % G::taps / G::kernel_width, kw = k % G::kernel_width;
        const long hi = long(p / G::out_width * G::stride + kh * G::dilation) - long(G::padding);
        const long wi = long(p % G::out_width * G::stride + kw * G::dilation) - long(G::padding);
        if (hi < 0 || wi < 0 || hi >= long(G::height) || wi >= long(G::width)) continue;
        const std::size_t at = ((n * C + ci) * G::height + std::size_t(hi)) * G::width + std::size_t(wi);
        const double v = dcol[(n * HW + p) * cols + k];
        want[at] += v;
        mag[at] += std::abs(v);
      }
  CHECK(far_from(dx, want, mag, G::taps) == 0);
}

}  // namespace

TEST_CASE("conv2d_product: ops/conv2d.hpp's reorders, channel sums and gather on the CPU's and the device's verbs",
          "[conv2d][device]") {
  SECTION("executor<cpu>: vectors in the channel sums") { check_bodies<executor<cpu>>(); }
  SECTION("executor<cuda>, emulated: a thread per element, a warp per channel") { check_bodies<executor<cuda>>(); }
}
