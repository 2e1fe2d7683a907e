// tests/nn/conv2d_channels_last.test.cpp: the channels-last convolution (NHWC tensors in and out)
// against the NCHW one bit for bit, and both against a double-precision loop written here; the
// weights packed once (pack_weights) against packed per call, and weights_changed; the folded
// block's channels-last forward; results independent of the thread count; the run-time errors.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "solder/nn/conv2d.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv_block.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/linear.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"

namespace {

using Catch::Matchers::Contains;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;
namespace nn = solder::nn;

/// x [n, C, H, W] -> [n, H, W, C].
std::vector<float> to_nhwc(const float* x, std::size_t n, std::size_t c, std::size_t hw) {
  std::vector<float> out(n * c * hw);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t i = 0; i < hw; ++i) out[(s * hw + i) * c + ch] = x[(s * c + ch) * hw + i];
  return out;
}

template <class T>
tensor_ref<const float, T> cref(const std::vector<float>& v, std::size_t batch) {
  return tensor_ref<const float, T>(v.data(), batch);
}

/// relu(conv(x) + b) at one output element, in double; |terms| summed into mag.
template <class L, std::size_t H, std::size_t W>
double reference(const L& layer, const float* x, std::size_t n, std::size_t co, std::size_t ho, std::size_t wo,
                 double& mag) {
  constexpr std::size_t Cin = L::in_channels, Kh = L::kernel_height, Kw = L::kernel_width;
  double acc = 0.0;
  if constexpr (L::has_bias) acc = double(layer.bias[co]);
  mag = std::fabs(acc);
  for (std::size_t ci = 0; ci < Cin; ++ci)
    for (std::size_t kh = 0; kh < Kh; ++kh)
      for (std::size_t kw = 0; kw < Kw; ++kw) {
        const long hi = long(ho * L::stride + kh * L::dilation) - long(L::padding);
        const long wi = long(wo * L::stride + kw * L::dilation) - long(L::padding);
        if (hi < 0 || wi < 0 || hi >= long(H) || wi >= long(W)) continue;
        const double t = double(x[((n * Cin + ci) * H + std::size_t(hi)) * W + std::size_t(wi)]) *
                         double(layer.weight.data()[((co * Cin + ci) * Kh + kh) * Kw + kw]);
        acc += t;
        mag += std::fabs(t);
      }
  return acc;
}

/// forward (NCHW) and forward_channels_last (NHWC) give the same bits, and both the double
/// reference within K float roundings of the terms' magnitude; packed once or per call alike.
template <class L, std::size_t H, std::size_t W>
void check_layer(std::size_t batch) {
  constexpr std::size_t Cin = L::in_channels, Cout = L::out_channels;
  constexpr std::size_t Ho = L::output_size(H, L::kernel_height), Wo = L::output_size(W, L::kernel_width);
  using SX = shape<dyn, Cin, H, W>;
  using SY = shape<dyn, Cout, Ho, Wo>;
  using TX = shape<dyn, H, W, Cin>;
  using TY = shape<dyn, Ho, Wo, Cout>;
  INFO("conv2d<" << Cin << ", " << Cout << ", " << L::kernel_height << ", " << L::kernel_width << ", " << L::stride
                 << ", " << L::padding << ", " << L::dilation << "> on " << H << "x" << W << ", batch " << batch);
  L layer(11);
  tensor<float, SX> x(batch);
  solder::test::fill_uniform(x, -1, 1, 12);
  tensor<float, SY> y(batch);
  layer.forward(x, y);

  const std::vector<float> xt = to_nhwc(x.data(), batch, Cin, H * W);
  std::vector<float> yt(batch * Ho * Wo * Cout);
  layer.forward_channels_last(cref<TX>(xt, batch), tensor_ref<float, TY>(yt.data(), batch));
  CHECK(solder::test::bit_differences(to_nhwc(y.data(), batch, Cout, Ho * Wo).data(), yt.data(), yt.size()) == 0);

  // Packed once: the same bits.
  layer.pack_weights();
  tensor<float, SY> y_packed(batch);
  layer.forward(x, y_packed);
  CHECK(solder::test::bit_differences(y.data(), y_packed.data(), y.size()) == 0);

  std::size_t bad = 0;
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t co = 0; co < Cout; ++co)
      for (std::size_t ho = 0; ho < Ho; ++ho)
        for (std::size_t wo = 0; wo < Wo; ++wo) {
          double mag = 0;
          const double want = reference<L, H, W>(layer, x.data(), n, co, ho, wo, mag);
          const double got = y.data()[((n * Cout + co) * Ho + ho) * Wo + wo];
          bad += !(std::fabs(got - want) <= double(L::fan_in + 1) * 0x1p-24 * mag + 1e-30);
        }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("nn::conv2d: channels-last and NCHW forwards give the same bits, and the double reference",
          "[nn][conv2d][channels_last]") {
  check_layer<nn::conv2d<64, 64, 3, 3, 1, 1, 1, 1, false>, 12, 30>(2);  // two full panels, 15-pixel tiles
  check_layer<nn::conv2d<16, 40, 3, 2, 2, 1>, 9, 11>(3);               // stride 2, a part panel
  check_layer<nn::conv2d<8, 33, 3, 3, 1, 2, 2>, 10, 10>(2);            // dilation 2
  check_layer<nn::conv2d<5, 7, 1, 1>, 8, 8>(2);                        // pointwise
  check_layer<nn::conv2d<3, 17, 5, 4, 3, 0>, 12, 13>(1);               // no padding, stride 3
  check_layer<nn::conv2d<1, 16, 3, 3, 1, 1>, 8, 8>(4);                 // the digits network's first layer
  check_layer<nn::conv2d<4, 6, 3, 3, 1, 3>, 2, 3>(2);                  // padding wider than the image
}

TEST_CASE("nn::conv2d: packed weights are used until weights_changed", "[nn][conv2d][channels_last]") {
  using L = nn::conv2d<8, 16, 3, 3, 1, 1>;
  using SX = shape<dyn, 8, 7, 9>;
  using SY = shape<dyn, 16, 7, 9>;
  L layer(3);
  tensor<float, SX> x(2);
  solder::test::fill_uniform(x, -1, 1, 4);
  tensor<float, SY> before(2), frozen(2), after(2), fresh(2);
  layer.forward(x, before);
  layer.pack_weights();
  for (auto& w : layer.weight) w *= 2.0f;
  layer.forward(x, frozen);  // the packed copy: the weights as they were
  CHECK(solder::test::bit_differences(before.data(), frozen.data(), before.size()) == 0);
  layer.weights_changed();
  layer.forward(x, after);  // packed per call again: the doubled weights
  L doubled(3);
  for (auto& w : doubled.weight) w *= 2.0f;
  doubled.forward(x, fresh);
  CHECK(solder::test::bit_differences(after.data(), fresh.data(), after.size()) == 0);
  CHECK(solder::test::bit_differences(before.data(), after.data(), after.size()) > 0);
}

TEST_CASE("nn::conv_block: the folded block's channels-last forward equals its NCHW forward",
          "[nn][conv_block][channels_last]") {
  constexpr std::size_t C = 16, H = 10, W = 12, batch = 3;
  using block_t = nn::conv_block<nn::conv2d<C, 32, 3, 3, 1, 1, 1, 1, false>, nn::batch_norm<32>, nn::relu>;
  using SX = shape<dyn, C, H, W>;
  using SY = shape<dyn, 32, H, W>;
  block_t block(5);
  solder::test::fill_uniform(block.norm.weight, 0.5, 1.5, 6);
  solder::test::fill_uniform(block.norm.bias, -0.5, 0.5, 7);
  solder::test::fill_uniform(block.norm.running_mean, -0.2, 0.2, 8);
  solder::test::fill_uniform(block.norm.running_var, 0.5, 2.0, 9);
  tensor<float, SX> x(batch);
  solder::test::fill_uniform(x, -1, 1, 10);
  const std::vector<float> xt = to_nhwc(x.data(), batch, C, H * W);
  std::vector<float> yt(batch * H * W * 32);
  const auto x_last = cref<shape<dyn, H, W, C>>(xt, batch);
  const auto y_last = tensor_ref<float, shape<dyn, H, W, 32>>(yt.data(), batch);

  CHECK_THROWS_WITH(block.forward_channels_last(x_last, y_last),
                    Contains("solder::nn::conv_block::forward_channels_last") && Contains("call eval()"));
  block.eval();
  block.pack_weights();
  tensor<float, SY> y(batch);
  block.forward(x, y);
  block.forward_channels_last(x_last, y_last);
  CHECK(solder::test::bit_differences(to_nhwc(y.data(), batch, 32, H * W).data(), yt.data(), yt.size()) == 0);
  std::size_t negative = 0;
  for (float v : yt) negative += v < 0.0f;
  CHECK(negative == 0);  // the ReLU ran in the stores

  block.fold_in_eval = false;
  CHECK_THROWS_WITH(block.forward_channels_last(x_last, y_last), Contains("call eval()"));
}

TEST_CASE("nn::conv2d: the channels-last forward does not depend on the thread count", "[nn][conv2d][channels_last]") {
  using L = nn::conv2d<32, 48, 3, 3, 1, 1>;
  constexpr std::size_t H = 23, W = 17;
  using TX = shape<dyn, H, W, 32>;
  using TY = shape<dyn, H, W, 48>;
  L layer(8);
  for (const std::size_t batch : {std::size_t(1), std::size_t(3)}) {
    std::vector<float> x(batch * H * W * 32), y1(batch * H * W * 48), y2(y1.size());
    solder::test::fill_uniform(x, -1, 1, 9);
    const int before = solder::num_threads();
    solder::set_num_threads(1);
    layer.forward_channels_last(cref<TX>(x, batch), tensor_ref<float, TY>(y1.data(), batch));
    solder::set_num_threads(2);
    layer.forward_channels_last(cref<TX>(x, batch), tensor_ref<float, TY>(y2.data(), batch));
    solder::set_num_threads(before);
    CHECK(solder::test::bit_differences(y1.data(), y2.data(), y1.size()) == 0);
  }
}

TEST_CASE("nn::conv2d: channels-last batch mismatches and overlaps are errors", "[nn][conv2d][channels_last]") {
  nn::conv2d<3, 3, 3, 3, 1, 1> layer;
  using T = shape<dyn, 6, 5, 3>;
  tensor<float, T> x(3), y(4), y3(3);
  CHECK_THROWS_WITH(layer.forward_channels_last(std::as_const(x).ref(), y.ref()),
                    Contains("solder::nn::conv2d::forward_channels_last") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(layer.forward_channels_last(std::as_const(x).ref(), x.ref()), Contains("y overlaps x"));
  CHECK_NOTHROW(layer.forward_channels_last(std::as_const(x).ref(), y3.ref()));
}

TEST_CASE("nn::chain: a frozen chain keeps images channels-last between convolution blocks, with the same bits",
          "[nn][chain][channels_last]") {
  using model_t = nn::chain<nn::input<3, 12, 10>, nn::conv2d<3, 16, 3, 3, 1, 1>, nn::batch_norm<16>, nn::relu,
                            nn::conv2d<16, 16, 3, 3, 1, 1, 1, 1, false>, nn::batch_norm<16>, nn::relu,
                            nn::conv2d<16, 8, 3, 3, 2, 1>, nn::relu, nn::flatten<>, nn::linear<8 * 6 * 5, 10>>;
  constexpr std::size_t batch = 5;
  model_t kept(21), plain(21);
  plain.set_channels_last(false);
  tensor<float, shape<dyn, 3, 12, 10>> x(batch);
  solder::test::fill_uniform(x, -1, 1, 22);
  tensor<float, shape<dyn, 10>> dy(batch);
  solder::test::fill_uniform(dy, -1, 1, 23);
  // A few training steps move the running statistics away from their starting values.
  const std::vector<std::int32_t> labels{1, 2, 3, 4, 5};
  for (model_t* m : {&kept, &plain}) {
    solder::optim::sgd opt(m->params(), {.lr = 0.05f});
    for (int step = 0; step < 3; ++step) m->train_step(x, labels, opt);
    CHECK_FALSE(m->kept_channels_last());  // training never does
    m->eval();
  }
  const auto a = kept.forward(x);
  CHECK(kept.kept_channels_last());
  const auto b = plain.forward(x);
  CHECK_FALSE(plain.kept_channels_last());
  CHECK(solder::test::bit_differences(a.data(), b.data(), a.size()) == 0);

  // Backward after such a forward is the plain one's.
  kept.backward(std::as_const(dy).ref());
  plain.backward(std::as_const(dy).ref());
  const auto pa = kept.params(), pb = plain.params();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].name);
    CHECK(solder::test::bit_differences(pa[i].grad.data(), pb[i].grad.data(), pa[i].grad.size()) == 0);
  }

  // The first block unfolded cannot run channels-last; the second and third still can.
  std::get<0>(kept.blocks).fold_in_eval = std::get<0>(plain.blocks).fold_in_eval = false;
  const auto c = kept.forward(x);
  CHECK(kept.kept_channels_last());
  CHECK(solder::test::bit_differences(c.data(), plain.forward(x).data(), c.size()) == 0);
  std::get<1>(kept.blocks).fold_in_eval = std::get<1>(plain.blocks).fold_in_eval = false;
  const auto d = kept.forward(x);
  CHECK_FALSE(kept.kept_channels_last());
  CHECK(solder::test::bit_differences(d.data(), plain.forward(x).data(), d.size()) == 0);
  // The unfolded first block rounds differently, within a few ulp of the logits' scale.
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    scale = std::max(scale, std::fabs(double(b.data()[i])));
    worst = std::max(worst, std::fabs(double(b.data()[i]) - double(c.data()[i])));
  }
  CHECK(worst > 0);
  CHECK(worst <= 1e-5 * scale);
}
