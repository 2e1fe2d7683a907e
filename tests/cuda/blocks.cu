// tests/cuda/blocks.cu: the blocks and the optimizer written once over the memory space, run in
// device memory: nn::linear_block over linear<..., device> (with gelu, which keeps its
// pre-activation, and with relu, whose backward reads its output), optim::clip_grad_norm and
// AdamW over basic_param<device>, against the same types in host memory (blocks.host.cpp):
// the initialization bit for bit (drawn on the host, copied), the forward, the backward and an
// evaluation forward within 1e-5 of their sums' magnitudes (the products add in another order),
// the norm and the step on the host's gradients within a few roundings; softmax, log_softmax,
// layer_norm, flatten and the softmax cross-entropy over device tensors against the host's
// (CUDA's expf and logf are within 2 ulp of glibc's); pooling; whole chains in device memory
// (nn::chain_in<device, ...>: an MLP, one with a sketched layer, one over images with pooling
// and layer_norm, a CNN with a batch_norm) trained two steps against the same chains on the host. Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/gpu_program.hpp"
#include "blocks.hpp"
#include "solder/cuda.hpp"
#include "solder/device.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/layer_norm.hpp"
#include "solder/nn/linear_block.hpp"
#include "solder/nn/loss.hpp"
#include "solder/nn/softmax.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/sgd.hpp"

namespace {

using namespace solder;
using solder::test::gpu::expect;
namespace blocks = solder::test::blocks;

constexpr double sum_tolerance = 1e-5;
constexpr double floor_tolerance = 1e-6;

/// How many of got are off want by more than the tolerance of their magnitudes.
std::size_t off(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                const std::vector<double>& mag) {
  std::size_t n = got.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const bool ok = std::fabs(double(want[i]) - double(got[i])) <= sum_tolerance * mag[i] + floor_tolerance;
    if (!ok && n++ < 5)
      std::fprintf(stderr, "solder: %s, element %zu: device %.9g, host %.9g (magnitude %.3g)\n", what, i, double(got[i]),
                   double(want[i]), mag[i]);
  }
  return n;
}

std::size_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t n = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

template <class T>
std::vector<float> host_copy(const T& t) {
  std::vector<float> out(t.size());
  executor<cuda>::copy_to_host(out.data(), t.data(), t.size());
  return out;
}

/// The device block of kind `Block` against the host one.
template <class Block>
void check_block(int kind, const char* name) {
  constexpr std::size_t in = Block::in_features, out = Block::out_features, batch = blocks::batch;
  const float p = kind == 0 ? 0.25f : 0.1f;
  std::vector<float> x(batch * in), dy(batch * out);
  solder::test::fill_uniform(x, -1.0, 1.0, 3u + unsigned(kind));
  solder::test::fill_uniform(dy, -1.0, 1.0, 5u + unsigned(kind));
  const blocks::result want = blocks::host_run(kind, x, dy);

  Block b;
  b.reset(blocks::seed, 0);
  expect(differing_bits(host_copy(b.linear.weight), want.w0) == 0, "reset: W drawn as on the host");
  expect(differing_bits(host_copy(b.linear.bias), want.b0) == 0, "reset: b drawn as on the host");

  tensor<float, shape<dyn, in>, device> xd(batch), dx(batch);
  tensor<float, shape<dyn, out>, device> y(batch), dyd(batch), y_eval(batch);
  executor<cuda>::copy_from_host(xd.data(), x.data(), x.size());
  executor<cuda>::copy_from_host(dyd.data(), dy.data(), dy.size());
  b.forward(xd, y);
  b.backward(xd, y, dyd, dx);

  // Magnitudes: |x| |W|^T + |b| through the tail (gelu' and relu' at most 1.13, the dropout's
  // scale), and the gradients' from |dy| so bounded.
  const double tail = 1.13 / (1.0 - p);
  std::vector<double> mag_y(batch * out), mag_dx(batch * in), mag_dw(out * in), mag_db(out);
  for (std::size_t r = 0; r < batch; ++r)
    for (std::size_t j = 0; j < out; ++j) {
      double s = std::fabs(want.b0[j]);
      for (std::size_t k = 0; k < in; ++k) s += std::fabs(double(x[r * in + k]) * want.w0[j * in + k]);
      mag_y[r * out + j] = s * tail;
      const double g = std::fabs(dy[r * out + j]) * tail;
      mag_db[j] += g;
      for (std::size_t k = 0; k < in; ++k) {
        mag_dx[r * in + k] += g * std::fabs(want.w0[j * in + k]);
        mag_dw[j * in + k] += g * std::fabs(x[r * in + k]);
      }
    }
  std::string what = std::string(name) + ": ";
  expect(off((what + "y").c_str(), host_copy(y), want.y, mag_y) == 0, "training forward");
  expect(off((what + "dx").c_str(), host_copy(dx), want.dx, mag_dx) == 0, "dx");
  expect(off((what + "dW").c_str(), host_copy(b.linear.weight_grad), want.dw, mag_dw) == 0, "dW");
  expect(off((what + "db").c_str(), host_copy(b.linear.bias_grad), want.db, mag_db) == 0, "db");

  // The optimizer on the host's gradients, so that both step from the same values.
  executor<cuda>::copy_from_host(b.linear.weight_grad.data(), want.dw.data(), want.dw.size());
  executor<cuda>::copy_from_host(b.linear.bias_grad.data(), want.db.data(), want.db.size());
  const std::vector<optim::basic_param<device>> params = b.params_from(0);
  const double norm = optim::clip_grad_norm(params, 1e30f);
  expect(std::fabs(norm - want.norm) <= 1e-6 * want.norm, "clip_grad_norm: the host's norm");
  optim::basic_adam<true, device> opt(params, {.lr = 1e-2f});
  opt.step();
  std::vector<double> mag_w(out * in, 1e-2 + 1.0), mag_b(out, 1e-2 + 1.0);
  expect(off((what + "W after AdamW").c_str(), host_copy(b.linear.weight), want.w1, mag_w) == 0, "AdamW step: W");
  expect(off((what + "b after AdamW").c_str(), host_copy(b.linear.bias), want.b1, mag_b) == 0, "AdamW step: b");

  // Evaluation mode with the stepped weights (nothing packed on the device).
  b.eval();
  b.pack_weights();
  b.forward(xd, y_eval);
  for (double& m : mag_y) m *= (1.0 - p) + 0.1;  // no dropout scale; the weights moved by lr
  expect(off((what + "evaluation y").c_str(), host_copy(y_eval), want.y_eval, mag_y) == 0, "evaluation forward");
}

/// The row layers, flatten and the loss in device memory against the host's.
void check_rows() {
  constexpr std::size_t batch = blocks::batch, classes = blocks::classes;
  std::vector<float> x(batch * classes), dy(batch * classes);
  std::vector<std::int32_t> labels(batch);
  solder::test::fill_uniform(x, -4.0, 4.0, 21u);
  solder::test::fill_uniform(dy, -1.0, 1.0, 22u);
  for (std::size_t r = 0; r < batch; ++r) labels[r] = std::int32_t((r * 7) % classes);
  const blocks::rows_result want = blocks::host_rows(x, labels, dy);

  // Literal extents in the types: nvcc's host code spells a type by its first spelling, and a
  // named constant there as a function-style cast, which g++ reads as a function type.
  static_assert(classes == 10);
  using T = tensor<float, shape<dyn, 10>, device>;
  T xd(batch), dyd(batch), g(batch), y(batch), dx(batch), s(batch);
  tensor<std::int32_t, shape<dyn>, device> labels_d(batch);
  executor<cuda>::copy_from_host(xd.data(), x.data(), x.size());
  executor<cuda>::copy_from_host(dyd.data(), dy.data(), dy.size());
  executor<cuda>::copy_from_host(labels_d.data(), labels.data(), labels.size());
  const std::span<const std::int32_t> dlabels(labels_d.data(), batch);
  const double loss = nn::softmax_cross_entropy(xd, dlabels, g, 0.1f);
  expect(std::fabs(loss - want.loss) <= 1e-6 * std::fabs(want.loss), "softmax_cross_entropy: the host's mean loss");
  nn::log_softmax<10, device> log_softmax;
  log_softmax.forward(xd, y);
  log_softmax.backward(xd, y, dyd, dx);
  nn::softmax<10, device>{}.forward(xd, s);
  // Each value from a handful of exps and logs of the row and a sum of its 10 terms.
  auto magnitudes = [](const std::vector<float>& v, double rel) {
    std::vector<double> m(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) m[i] = rel * (1.0 + std::fabs(v[i]));
    return m;
  };
  expect(off("dlogits", host_copy(g), want.dlogits, magnitudes(want.dlogits, 1.0)) == 0, "softmax_cross_entropy: dlogits");
  expect(off("log_softmax y", host_copy(y), want.log_y, magnitudes(want.log_y, 1.0)) == 0, "log_softmax forward");
  expect(off("log_softmax dx", host_copy(dx), want.log_dx, magnitudes(want.log_dx, 1.0)) == 0, "log_softmax backward");
  expect(off("softmax y", host_copy(s), want.soft_y, magnitudes(want.soft_y, 1.0)) == 0, "softmax forward");

  // layer_norm: each row's statistics, y and dx from them; dweight and dbias summed over the
  // rows in chunks (the device's chunks differ from the CPU's: a sum of 37 terms' roundings).
  nn::layer_norm<10, device> norm;
  std::vector<float> w(classes), b(classes);
  for (std::size_t j = 0; j < classes; ++j) {
    w[j] = 1.0f + float(j) / 10.0f;
    b[j] = float(j) / 20.0f;
  }
  executor<cuda>::copy_from_host(norm.weight.data(), w.data(), classes);
  executor<cuda>::copy_from_host(norm.bias.data(), b.data(), classes);
  T ny(batch), ndx(batch);
  norm.forward(xd, ny);
  norm.backward(xd, ny, dyd, ndx);
  expect(off("layer_norm y", host_copy(ny), want.norm_y, magnitudes(want.norm_y, 1.0)) == 0, "layer_norm forward");
  expect(off("layer_norm dx", host_copy(ndx), want.norm_dx, magnitudes(want.norm_dx, 1.0)) == 0, "layer_norm dx");
  expect(off("layer_norm dweight", host_copy(norm.weight_grad), want.norm_dw, magnitudes(want.norm_dw, 10.0)) == 0,
         "layer_norm dweight");
  expect(off("layer_norm dbias", host_copy(norm.bias_grad), want.norm_db, magnitudes(want.norm_db, 10.0)) == 0,
         "layer_norm dbias");

  // A label outside [0, classes) is refused before anything is written.
  labels[3] = std::int32_t(classes);
  executor<cuda>::copy_from_host(labels_d.data(), labels.data(), labels.size());
  bool refused = false;
  try {
    (void)nn::softmax_cross_entropy(xd, dlabels, g);
  } catch (const solder::error&) {
    refused = true;
  }
  expect(refused, "softmax_cross_entropy: a label outside [0, classes) in device memory is refused");

  // flatten: a copy in device memory, both ways.
  using F = nn::flatten<2, 5>::in_space<device>;
  tensor<float, shape<dyn, 2, 5>, device> image(batch), dimage(batch);
  tensor<float, shape<dyn, 10>, device> flat(batch);
  executor<cuda>::copy_from_host(image.data(), x.data(), x.size());
  F f;
  f.forward(image, flat);
  expect(differing_bits(host_copy(flat), x) == 0, "flatten forward: the same floats");
  f.backward(image, flat, flat, dimage);
  expect(differing_bits(host_copy(dimage), x) == 0, "flatten backward: the same floats");
}

/// A chain in device memory, trained as the host chain is (want: the host's results).
template <class Model>
void check_chain(const char* name, const blocks::chain_result& want, const std::vector<float>& x,
                 const std::vector<std::int32_t>& labels) {
  constexpr std::size_t batch = blocks::batch;
  const std::string what = std::string(name) + ": ";
  Model model(blocks::chain_seed);
  auto flat = [&] {
    std::vector<float> out;
    for (const auto& p : model.params()) {
      const std::vector<float> v = host_copy(p.value);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  expect(differing_bits(flat(), want.initial) == 0, (what + "parameters drawn as on the host").c_str());

  tensor<float, shape<dyn, blocks::chain_in>, device> xd(batch);
  tensor<std::int32_t, shape<dyn>, device> labels_d(batch);
  executor<cuda>::copy_from_host(xd.data(), x.data(), x.size());
  executor<cuda>::copy_from_host(labels_d.data(), labels.data(), labels.size());
  const std::span<const std::int32_t> dlabels(labels_d.data(), batch);
  optim::basic_sgd<device> opt(model.params(), {.lr = 0.05f, .momentum = 0.9f});
  const tensor_ref<const float, shape<dyn, blocks::chain_in>, device> xv(xd.ref());  // for any input shape
  const float loss1 = model.train_step(xv, dlabels, opt);
  const float loss2 = model.train_step(xv, dlabels, opt);
  expect(std::fabs(loss1 - want.loss1) <= 1e-5f * want.loss1, (what + "the first step's loss").c_str());
  expect(std::fabs(loss2 - want.loss2) <= 1e-5f * want.loss2, (what + "the second step's loss").c_str());
  const std::vector<float> trained = flat();
  std::vector<double> mag(trained.size(), 1.0);
  for (std::size_t i = 0; i < mag.size() && i < want.trained.size(); ++i) mag[i] += std::fabs(want.trained[i]);
  expect(off((what + "parameters after two SGD steps").c_str(), trained, want.trained, mag) == 0,
         (what + "the parameters after two steps").c_str());

  model.eval();
  const auto logits = model.forward(xd);
  std::vector<double> mag_logits(want.logits.size());
  for (std::size_t i = 0; i < mag_logits.size(); ++i) mag_logits[i] = 1.0 + std::fabs(want.logits[i]);
  expect(off((what + "logits").c_str(), host_copy(logits), want.logits, mag_logits) == 0,
         (what + "evaluation logits").c_str());
}

/// The MLP chain and the sketched chain of blocks.hpp in device memory.
void check_chains() {
  constexpr std::size_t batch = blocks::batch;
  std::vector<float> x(batch * blocks::chain_in);
  std::vector<std::int32_t> labels(batch);
  solder::test::fill_uniform(x, -1.0, 1.0, 31u);
  for (std::size_t r = 0; r < batch; ++r) labels[r] = std::int32_t((r * 3 + 1) % blocks::chain_out);
  using mlp = nn::chain_in<device, nn::linear<blocks::chain_in, 32>, nn::relu, nn::dropout<0.1f>, nn::linear<32, 16>,
                           nn::gelu, nn::linear<16, blocks::chain_out>>;
  static_assert(mlp::kernels == 3);
  check_chain<mlp>("chain_in<device> MLP", blocks::host_chain(x, labels), x, labels);
  // The sketched layer's two products stage [S1 | U2] and [U1; S2] from the factors and the
  // regenerated signs; evaluation runs the two products on the device (the host folds them).
  using sketched = nn::chain_in<device, nn::sketched_linear<blocks::chain_in, 48, 2, 4>, nn::relu, nn::dropout<0.1f>,
                                nn::linear<48, blocks::chain_out>>;
  check_chain<sketched>("chain_in<device> sketched", blocks::host_sketched_chain(x, labels), x, labels);
  // Images: pooling, flatten, layer_norm and log_softmax as blocks of their own.
  using image_chain = nn::chain_in<device, nn::input<4, 4, 4>, nn::max_pool2d<2>, nn::flatten<>, nn::linear<16, 32>,
                                   nn::relu, nn::layer_norm<32>, nn::linear<32, 10>, nn::log_softmax<10>>;
  static_assert(blocks::chain_out == 10);
  check_chain<image_chain>("chain_in<device> image", blocks::host_image_chain(x, labels), x, labels);
  // A convolution (products over image patches), its batch_norm (folded into it in
  // evaluation), pooling.
  using cnn = nn::chain_in<device, nn::input<4, 4, 4>, nn::conv2d<4, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu,
                           nn::max_pool2d<2>, nn::flatten<>, nn::linear<32, 10>>;
  check_chain<cnn>("chain_in<device> CNN", blocks::host_cnn_chain(x, labels), x, labels);
}

/// mse and bce_with_logits over device tensors against a double loop of torch's definitions:
/// the mean losses within 1e-6, mse's gradient 2 (x - t) / n within a rounding.
void check_elementwise_losses() {
  constexpr std::size_t rows = 37, n = rows * 13;
  std::vector<float> x(n), t(n);
  solder::test::fill_uniform(x, -3.0, 3.0, 71u);
  solder::test::fill_uniform(t, 0.0, 1.0, 72u);
  tensor<float, shape<dyn, 13>, device> xd(rows), td(rows), gd(rows);
  executor<cuda>::copy_from_host(xd.data(), x.data(), n);
  executor<cuda>::copy_from_host(td.data(), t.data(), n);
  double mse = 0, bce = 0;
  std::vector<float> want_g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double d = double(x[i]) - double(t[i]);
    mse += d * d;
    want_g[i] = float(2.0 * d / double(n));
    bce += std::max(double(x[i]), 0.0) - double(x[i]) * double(t[i]) + std::log1p(std::exp(-std::fabs(double(x[i]))));
  }
  mse /= double(n);
  bce /= double(n);
  const float got_mse = nn::mse(xd, td, gd);
  expect(std::fabs(got_mse - mse) <= 1e-6 * mse, "mse over device tensors: the mean");
  std::vector<double> mag(n);
  for (std::size_t i = 0; i < n; ++i) mag[i] = std::fabs(want_g[i]) + 1e-12;
  expect(off("mse gradient", host_copy(gd), want_g, mag) == 0, "mse over device tensors: the gradient");
  const float got_bce = nn::bce_with_logits(xd, td);
  expect(std::fabs(got_bce - bce) <= 1e-6 * bce, "bce_with_logits over device tensors: the mean");
}

/// Pooling in device memory: max pooling's values, argmax routing and gathers bit for bit (no
/// arithmetic but the gather's adds, in the same order), average pooling's within a rounding.
void check_pool() {
  constexpr std::size_t batch = blocks::batch;
  std::vector<float> x(batch * 4 * 8 * 8), dy_max(batch * 4 * 4 * 4), dy_avg(x.size());
  solder::test::fill_uniform(x, -1.0, 1.0, 61u);
  solder::test::fill_uniform(dy_max, -1.0, 1.0, 62u);
  solder::test::fill_uniform(dy_avg, -1.0, 1.0, 63u);
  const blocks::pool_result want = blocks::host_pool(x, dy_max, dy_avg);
  using X = tensor<float, shape<dyn, 4, 8, 8>, device>;
  X xd(batch), dx(batch), y_avg(batch), dy_a(batch);
  tensor<float, shape<dyn, 4, 4, 4>, device> y_max(batch), dy_m(batch);
  executor<cuda>::copy_from_host(xd.data(), x.data(), x.size());
  executor<cuda>::copy_from_host(dy_m.data(), dy_max.data(), dy_max.size());
  executor<cuda>::copy_from_host(dy_a.data(), dy_avg.data(), dy_avg.size());
  nn::max_pool2d<2>::in_space<device> max_pool;
  max_pool.forward(xd, y_max);
  max_pool.backward(xd, y_max, dy_m, dx);
  expect(differing_bits(host_copy(y_max), want.max_y) == 0, "max_pool2d forward: the host's bits");
  expect(differing_bits(host_copy(dx), want.max_dx) == 0, "max_pool2d backward: the host's bits");
  nn::avg_pool2d<3, 1, 1>::in_space<device> avg_pool;
  avg_pool.forward(xd, y_avg);
  avg_pool.backward(xd, y_avg, dy_a, dx);
  std::vector<double> mag(x.size(), 9.0);  // at most 9 terms of magnitude 1
  expect(off("avg_pool2d y", host_copy(y_avg), want.avg_y, mag) == 0, "avg_pool2d forward");
  expect(off("avg_pool2d dx", host_copy(dx), want.avg_dx, mag) == 0, "avg_pool2d backward");
}

}  // namespace

int main() {
  constexpr const char* passed =
      "solder: the linear blocks, AdamW, the row layers, flatten, the loss and chains in device memory match the host's";
  return solder::test::gpu::run("blocks", passed, [] {
    check_block<nn::linear_block<nn::linear<48, 40, true, device>, nn::gelu, nn::dropout<0.25f>>>(0, "linear+gelu+dropout");
    check_block<nn::linear_block<nn::linear<64, 32, true, device>, nn::relu, nn::dropout<0.1f>>>(1, "linear+relu+dropout");
    check_rows();
    check_pool();
    check_elementwise_losses();
    check_chains();
  });
}
