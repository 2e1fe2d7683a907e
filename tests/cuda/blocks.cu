// tests/cuda/blocks.cu: the blocks and the optimizer written once over the memory space, run in
// device memory: nn::linear_block over linear<..., device> (with gelu, which keeps its
// pre-activation, and with relu, whose backward reads its output), optim::clip_grad_norm and
// AdamW over basic_param<device>, against the same types in host memory (blocks.host.cpp):
// the initialization bit for bit (drawn on the host, copied), the forward, the backward and an
// evaluation forward within 1e-5 of their sums' magnitudes (the products add in another order),
// the norm and the step on the host's gradients within a few roundings. Exits 77 (ctest's skip
// code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/gpu_program.hpp"
#include "blocks.hpp"
#include "solder/cuda.hpp"
#include "solder/device.hpp"
#include "solder/nn/linear_block.hpp"
#include "solder/optim/adam.hpp"

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

}  // namespace

int main() {
  return solder::test::gpu::run("blocks", "solder: the linear blocks and AdamW in device memory match the host's", [] {
    check_block<nn::linear_block<nn::linear<48, 40, true, device>, nn::gelu, nn::dropout<0.25f>>>(0, "linear+gelu+dropout");
    check_block<nn::linear_block<nn::linear<64, 32, true, device>, nn::relu, nn::dropout<0.1f>>>(1, "linear+relu+dropout");
  });
}
