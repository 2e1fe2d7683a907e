// tests/nn/device_emulated.test.cpp: what is written once over the memory space, run in `device`
// memory on the host: the CUDA backend's executor emulated (support/emulated_device.hpp) runs
// the device kernels' own bodies, so the code paths a GPU takes (chain_in<device, ...>, the
// blocks' device branches, the loss's and the optimizers' device verbs) run in the CPU suite,
// against the same chains in host memory: parameters drawn bit for bit alike, losses, trained
// parameters and evaluation logits within rounding (the device's products and sums add in
// other orders), a bad label refused.
#include "support/emulated_device.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "solder/interop/c_chain.hpp"
#include "solder/solder.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;

constexpr std::size_t batch = 37;

template <class Model>
std::vector<float> flat_params(Model& model) {
  std::vector<float> out;
  for (const auto& p : model.params()) out.insert(out.end(), p.value.data(), p.value.data() + p.value.size());
  return out;
}

/// Elements of got farther than tol (1 + |want|) from want.
std::size_t far(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  std::size_t bad = got.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    bad += !(std::abs(double(got[i]) - double(want[i])) <= tol * (1.0 + std::abs(double(want[i]))));
  return bad;
}

/// Host chain Host and its device form Device trained two steps alike by Optimizer (over each
/// one's space), then evaluated.
template <class Host, class Device, template <class> class Optimizer>
void check_chain(const typename Optimizer<host>::options& options, bool clip) {
  constexpr std::size_t in = Host::in_features, classes = Host::out_features;
  std::vector<float> x(batch * in);
  std::vector<std::int32_t> labels(batch);
  test::fill_uniform(x, -1.0, 1.0, 71);
  for (std::size_t r = 0; r < batch; ++r) labels[r] = std::int32_t((r * 3 + 1) % classes);

  Host h(7);
  Device d(7);
  CHECK(flat_params(h) == flat_params(d));  // drawn on the host, copied in: the same bits

  tensor<float, shape<dyn, in>> xh(batch);
  tensor<float, shape<dyn, in>, device> xd(batch);
  tensor<std::int32_t, shape<dyn>, device> labels_d(batch);
  std::memcpy(xh.data(), x.data(), x.size() * sizeof(float));
  executor<cuda>::copy_from_host(xd.data(), x.data(), x.size());
  executor<cuda>::copy_from_host(labels_d.data(), labels.data(), batch);
  const typename Host::input_ref xhv(xh.data(), batch);  // [batch, 64] as the chain's samples
  const typename Device::input_ref xdv(xd.data(), batch);
  const std::span<const std::int32_t> dlabels(labels_d.data(), batch);

  Optimizer<host> opt_h(h.params(), options);
  Optimizer<device> opt_d(d.params(), options);
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const float lh = h.loss_and_backward(xhv, std::span<const std::int32_t>(labels));
    const float ld = d.loss_and_backward(xdv, dlabels);
    CHECK(std::abs(lh - ld) <= 1e-5f * lh);
    if (clip) {
      const float nh = optim::clip_grad_norm(h.params(), 0.5f), nd = optim::clip_grad_norm(d.params(), 0.5f);
      CHECK(std::abs(nh - nd) <= 1e-5f * nh);
    }
    opt_h.step();
    opt_d.step();
  }
  CHECK(far(flat_params(d), flat_params(h), 1e-4) == 0);

  h.eval();
  d.eval();
  const auto yh = h.forward(xhv);
  const auto yd = d.forward(xdv);
  CHECK(far(std::vector<float>(yd.data(), yd.data() + yd.size()), std::vector<float>(yh.data(), yh.data() + yh.size()),
            1e-4) == 0);

  // A label outside [0, classes) in device memory is refused, naming it.
  labels[5] = -1;
  executor<cuda>::copy_from_host(labels_d.data(), labels.data(), batch);
  CHECK_THROWS_WITH(d.loss_and_backward(xdv, dlabels), Catch::Contains("label -1 of row 5"));
}

template <class Space>
using adamw_in = optim::basic_adam<true, Space>;
template <class Space>
using sgd_in = optim::basic_sgd<Space>;

}  // namespace

TEST_CASE("device memory, emulated: an MLP chain_in<device> trains as the host chain (AdamW, clipping)",
          "[device][chain]") {
  check_chain<nn::chain<nn::linear<64, 32>, nn::relu, nn::dropout<0.1f>, nn::linear<32, 16>, nn::gelu, nn::linear<16, 10>>,
              nn::chain_in<device, nn::linear<64, 32>, nn::relu, nn::dropout<0.1f>, nn::linear<32, 16>, nn::gelu,
                           nn::linear<16, 10>>,
              adamw_in>({.lr = 1e-3f}, true);
}

TEST_CASE("device memory, emulated: a sketched chain trains as the host chain (SGD with momentum)", "[device][chain]") {
  check_chain<nn::chain<nn::sketched_linear<64, 48, 2, 4>, nn::relu, nn::dropout<0.1f>, nn::linear<48, 10>>,
              nn::chain_in<device, nn::sketched_linear<64, 48, 2, 4>, nn::relu, nn::dropout<0.1f>, nn::linear<48, 10>>,
              sgd_in>({.lr = 0.05f, .momentum = 0.9f}, false);
}

TEST_CASE("device memory, emulated: a chain over images (pooling, flatten, layer_norm, log_softmax) trains as the "
          "host chain",
          "[device][chain]") {
  check_chain<nn::chain<nn::input<4, 4, 4>, nn::max_pool2d<2>, nn::flatten<>, nn::linear<16, 32>, nn::relu,
                        nn::layer_norm<32>, nn::linear<32, 10>, nn::log_softmax<10>>,
              nn::chain_in<device, nn::input<4, 4, 4>, nn::max_pool2d<2>, nn::flatten<>, nn::linear<16, 32>, nn::relu,
                           nn::layer_norm<32>, nn::linear<32, 10>, nn::log_softmax<10>>,
              sgd_in>({.lr = 0.05f, .momentum = 0.9f}, false);
}

namespace {

/// batch_norm<C, device> against the host layer on the same x and dy: a training forward and
/// backward (twice, so the running statistics move twice), then evaluation's. Sample shape
/// Extents... ([C] or [C, H, W]).
template <std::size_t C, std::size_t... Extents>
void check_batch_norm(std::size_t n) {
  using S = shape<dyn, C, Extents...>;
  const std::size_t count = S::elements(n);
  std::vector<float> x(count), dy(count);
  test::fill_uniform(x, -1.0, 3.0, 5);  // a mean far from 0, as the shifted sums are for
  test::fill_uniform(dy, -1.0, 1.0, 6);
  const auto to_vector = [](const float* p, std::size_t size) { return std::vector<float>(p, p + size); };
  const auto from_device = [](const float* p, std::size_t size) {
    std::vector<float> out(size);
    executor<cuda>::copy_to_host(out.data(), p, size);
    return out;
  };

  nn::batch_norm<C> h;
  nn::batch_norm<C, device> d;
  tensor<float, S> xh(n), yh(n), dyh(n), dxh(n);
  tensor<float, S, device> xd(n), yd(n), dyd(n), dxd(n);
  std::memcpy(xh.data(), x.data(), count * sizeof(float));
  std::memcpy(dyh.data(), dy.data(), count * sizeof(float));
  executor<cuda>::copy_from_host(xd.data(), x.data(), count);
  executor<cuda>::copy_from_host(dyd.data(), dy.data(), count);
  for (int mode = 0; mode < 3; ++mode) {
    INFO((mode < 2 ? "training, pass " : "evaluation, pass ") << mode);
    if (mode == 2) {
      h.eval();
      d.eval();
    }
    h.forward(xh, yh);
    d.forward(xd, yd);
    CHECK(far(from_device(yd.data(), count), to_vector(yh.data(), count), 1e-5) == 0);
    CHECK(far(from_device(d.running_mean.data(), C), to_vector(h.running_mean.data(), C), 1e-6) == 0);
    CHECK(far(from_device(d.running_var.data(), C), to_vector(h.running_var.data(), C), 1e-6) == 0);
    CHECK(d.num_batches_tracked == h.num_batches_tracked);
    h.backward(xh, yh, dyh, dxh);
    d.backward(xd, yd, dyd, dxd);
    CHECK(far(from_device(dxd.data(), count), to_vector(dxh.data(), count), 1e-4) == 0);
    CHECK(far(from_device(d.weight_grad.data(), C), to_vector(h.weight_grad.data(), C), 1e-4) == 0);
    CHECK(far(from_device(d.bias_grad.data(), C), to_vector(h.bias_grad.data(), C), 1e-4) == 0);
  }
  // Its mistakes are the host layer's: backward on another batch than the forward's.
  tensor<float, S, device> x2(n + 1), dx2(n + 1);
  CHECK_THROWS_WITH(d.backward(x2, x2, x2, dx2), Catch::Contains("run forward on this batch first"));
}

}  // namespace

TEST_CASE("device memory, emulated: batch_norm over images and features matches the host layer (training, evaluation)",
          "[device][batch_norm]") {
  check_batch_norm<6, 5, 7>(3);   // planes of 35 values: a warp's row with a tail
  check_batch_norm<3, 8, 8>(1);   // one sample
  check_batch_norm<40>(37);       // 1-d: chunks of samples flushed every 16
  check_batch_norm<5>(2);
}

TEST_CASE("device memory, emulated: a CNN (convolutions, batch_norm, pooling) trains as the host chain",
          "[device][chain]") {
  // Training runs the convolution, the batch's statistics, the normalization; evaluation the
  // convolution with the statistics folded into it, the relu applied as it writes. SGD: a bias
  // before a batch_norm has a gradient of rounding noise only, whose sign Adam's first step
  // would turn into a step of lr either way.
  check_chain<nn::chain<nn::input<2, 6, 6>, nn::conv2d<2, 4, 3, 3, 1, 1>, nn::batch_norm<4>, nn::relu,
                        nn::conv2d<4, 6, 3, 3, 2, 0, 1, 1, false>, nn::batch_norm<6>, nn::relu, nn::flatten<>,
                        nn::dropout<0.1f>, nn::linear<24, 10>>,
              nn::chain_in<device, nn::input<2, 6, 6>, nn::conv2d<2, 4, 3, 3, 1, 1>, nn::batch_norm<4>, nn::relu,
                           nn::conv2d<4, 6, 3, 3, 2, 0, 1, 1, false>, nn::batch_norm<6>, nn::relu, nn::flatten<>,
                           nn::dropout<0.1f>, nn::linear<24, 10>>,
              sgd_in>({.lr = 0.05f, .momentum = 0.9f}, true);
}

TEST_CASE("device memory, emulated: the C interface's object (interop::c_chain) trains a device chain as a host one",
          "[device][interop]") {
  using host_cnn = nn::chain<nn::input<2, 6, 6>, nn::conv2d<2, 4, 3, 3, 1, 1>, nn::batch_norm<4>, nn::relu, nn::flatten<>,
                             nn::dropout<0.1f>, nn::linear<144, 10>>;
  interop::c_chain<host_cnn> h(9);
  interop::c_chain<host_cnn::in_space<device>> d(9);
  REQUIRE(d.param_floats() == h.param_floats());
  std::vector<float> x(batch * 72), ph(h.param_floats()), pd(d.param_floats());
  std::vector<std::int32_t> labels(batch);
  test::fill_uniform(x, -1.0, 1.0, 17);
  for (std::size_t r = 0; r < batch; ++r) labels[r] = std::int32_t((r * 7) % 10);
  tensor<float, shape<dyn, 72>, device> xd(batch);
  tensor<std::int32_t, shape<dyn>, device> ld(batch);
  executor<cuda>::copy_from_host(xd.data(), x.data(), x.size());
  executor<cuda>::copy_from_host(ld.data(), labels.data(), batch);
  h.read_params(ph.data());
  d.read_params(pd.data());
  CHECK(ph == pd);
  interop::optimizer_settings s;
  s.kind = interop::optimizer_settings::sgd;
  s.lr = 0.05f;
  s.momentum = 0.9f;
  for (int step = 1; step <= 2; ++step) {
    const auto rh = h.train_step(x.data(), labels.data(), batch, s, 0.0f);
    const auto rd = d.train_step(xd.data(), ld.data(), batch, s, 0.0f);
    CHECK(std::abs(rh.loss - rd.loss) <= 1e-5f * rh.loss);
    CHECK(rd.steps == step);
  }
  h.read_params(ph.data());
  d.read_params(pd.data());
  CHECK(far(pd, ph, 1e-4) == 0);
  std::vector<float> bh(h.buffer_floats()), bd(d.buffer_floats());
  h.read_buffers(bh.data());
  d.read_buffers(bd.data());
  CHECK(far(bd, bh, 1e-5) == 0);
  // A bad label in device memory is read back and refused before the forward runs.
  labels[3] = 10;
  executor<cuda>::copy_from_host(ld.data(), labels.data(), batch);
  CHECK_THROWS_WITH(d.train_step(xd.data(), ld.data(), batch, s, 0.0f), Catch::Contains("label 10 of row 3"));
  std::vector<float> after(d.buffer_floats());
  d.read_buffers(after.data());
  CHECK(after == bd);
}

TEST_CASE("device memory, emulated: a linear layer with a batch_norm after it trains as the host chain (folded in "
          "evaluation)",
          "[device][chain]") {
  check_chain<nn::chain<nn::linear<64, 32>, nn::batch_norm<32>, nn::relu, nn::linear<32, 10>>,
              nn::chain_in<device, nn::linear<64, 32>, nn::batch_norm<32>, nn::relu, nn::linear<32, 10>>, sgd_in>(
      {.lr = 0.05f, .momentum = 0.9f}, false);
}

TEST_CASE("device memory, emulated: mse and bce_with_logits match the host's, their gradients too", "[device][loss]") {
  for (const std::size_t rows : {std::size_t(1), std::size_t(37), std::size_t(400)}) {
    INFO(rows << " rows of 13");
    const std::size_t n = rows * 13;
    std::vector<float> x(n), t(n), gh(n), gd(n);
    test::fill_uniform(x, -3.0, 3.0, 21);
    test::fill_uniform(t, 0.0, 1.0, 22);
    tensor<float, shape<dyn, 13>> xh(rows), th(rows), dh(rows);
    tensor<float, shape<dyn, 13>, device> xd(rows), td(rows), dd(rows);
    std::memcpy(xh.data(), x.data(), n * sizeof(float));
    std::memcpy(th.data(), t.data(), n * sizeof(float));
    executor<cuda>::copy_from_host(xd.data(), x.data(), n);
    executor<cuda>::copy_from_host(td.data(), t.data(), n);
    const auto host_grad = [&] { return std::vector<float>(dh.data(), dh.data() + n); };
    const auto device_grad = [&] {
      executor<cuda>::copy_to_host(gd.data(), dd.data(), n);
      return gd;
    };
    // The chunks' sums are added in another order on the device: within rounding.
    const float mh = nn::mse(xh, th, dh), md = nn::mse(xd, td, dd);
    CHECK(std::abs(mh - md) <= 1e-6f * mh);
    CHECK(device_grad() == host_grad());  // elementwise: the same bits
    CHECK(std::abs(nn::mse(xd, td) - mh) <= 1e-6f * mh);
    const float bh = nn::bce_with_logits(xh, th, dh), bd = nn::bce_with_logits(xd, td, dd);
    CHECK(std::abs(bh - bd) <= 1e-6f * bh);
    CHECK(far(device_grad(), host_grad(), 1e-6) == 0);
    CHECK(std::abs(nn::bce_with_logits(xd, td) - bh) <= 1e-6f * bh);
  }
}
