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
