// tests/cuda/product.cu: the CUDA backend's matrix product with its epilogue
// (eval/cuda/product_kernel.hpp) on the device, against the same pass run on the host over its
// whole grid (support/grid.hpp): the same bits for the fp32 tilings, since every element is
// the same fma chain in the same order and the epilogue the same op definitions and mask, and
// within a rounding per mma step for the tensor-core tilings (TF32, BF16); tails in every
// extent, a transposed left operand, generated signs, and the bias + ReLU + dropout epilogue. Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../support/data.hpp"
#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "../support/grid.hpp"
#include "solder/cuda.hpp"
#include "solder/eval/cuda/col2im.hpp"
#include "solder/eval/cuda/image_kernels.hpp"
#include "solder/eval/cuda/product_kernel.hpp"
#include "solder/expr/operators.hpp"
#include "solder/nn/conv2d.hpp"

namespace {

namespace cu = solder::eval::cuda;
using solder::device;
using solder::dyn;
using solder::shape;
using solder::tensor_ref;
using solder::test::fill_uniform;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

using small_tiles = cu::product_tiling<64, 64, 16, 4, 4>;
using large_tiles = cu::product_tiling<128, 128, 8, 8, 8>;
using tf32_tiles = cu::mma_tiling<128, 128, 32, 64, 32, cu::product_math::tf32>;
using bf16_tiles = cu::mma_tiling<64, 64, 32, 32, 32, cu::product_math::bf16>;

constexpr solder::philox_state rng{0x5eed5eedULL, 3};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Tensor cores add a fragment's products in their own order: the device's sums may differ
/// from the host emulation's by a rounding per mma step, K / 8 of them at most, each relative
/// to the magnitude (a dropped element, zero on one side only, is off by far more).
bool close_to(const std::vector<float>& got, const std::vector<float>& want, std::size_t K, float magnitude) {
  if (got.size() != want.size()) return false;
  const double tol = double(K / 8 + 2) * 0x1p-23 * magnitude;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - double(want[i])) <= tol)) return false;
  return true;
}

/// y = dropout(relu(x W^T + b)) for x [M, K], W [N, K], b [N] on the device and on the host.
template <class Tiling, std::size_t N, std::size_t K>
void linear_epilogue(std::size_t M) {
  std::vector<float> x(M * K), w(N * K), b(N);
  fill_uniform(x, -1, 1, 1);
  fill_uniform(w, -1, 1, 2);
  fill_uniform(b, -0.5, 0.5, 3);
  using S = shape<dyn, N>;
  const auto write_to = [&](float* y, const float* bias) {
    return solder::write(tensor_ref<float, S, device>(y, M),
                         solder::dropout(solder::relu(cu::product_value<S>(M) + tensor_ref<const float, shape<N>, device>(bias)),
                                         0.2f, rng));
  };
  std::vector<float> host(M * N);
  solder::test::run_product(cu::product<Tiling>(cu::matrix_operand<false>{x.data(), K},
                                                cu::matrix_operand<true>{w.data(), K}, M, K, write_to(host.data(), b.data())));

  device_vector<float> dx(x), dw(w), db(b), dy(M * N);
  cu::run_product(nullptr, cu::product<Tiling>(cu::matrix_operand<false>{dx.get(), K}, cu::matrix_operand<true>{dw.get(), K},
                                               M, K, write_to(dy.get(), db.get())));
  if constexpr (Tiling::math == cu::product_math::fp32)
    expect(same_bits(dy.read(), host), "dropout(relu(x W^T + b)): device and host differ");
  else  // |x w| <= 1 per term; the dropout scale 1.25
    expect(close_to(dy.read(), host, K, 1.25f * float(K)), "dropout(relu(x W^T + b)) on tensor cores: device and host differ");
}

/// dW = g^T x: the left operand transposed, the batch as the inner extent.
void weight_gradient() {
  constexpr std::size_t Out = 70, In = 90;
  const std::size_t batch = 300;
  std::vector<float> g(batch * Out), x(batch * In);
  fill_uniform(g, -1, 1, 4);
  fill_uniform(x, -1, 1, 5);
  using S = shape<Out, In>;
  std::vector<float> host(Out * In);
  solder::test::run_product(cu::product<small_tiles>(cu::matrix_operand<true>{g.data(), Out}, cu::matrix_operand<false>{x.data(), In},
                                                     Out, batch,
                                                     solder::write(tensor_ref<float, S, device>(host.data()), cu::product_value<S>())));
  device_vector<float> dg(g), dx(x), ddw(Out * In);
  cu::run_product(nullptr, cu::product<small_tiles>(cu::matrix_operand<true>{dg.get(), Out}, cu::matrix_operand<false>{dx.get(), In},
                                                    Out, batch,
                                                    solder::write(tensor_ref<float, S, device>(ddw.get()), cu::product_value<S>())));
  expect(same_bits(ddw.read(), host), "g^T x: device and host differ");
}

/// x S for a generated sign term S [K, N].
void signs() {
  constexpr std::size_t K = 256, N = 64;
  const std::size_t M = 100;
  std::vector<float> x(M * K);
  fill_uniform(x, -1, 1, 6);
  using S = shape<dyn, N>;
  const cu::sign_operand<K, N, false> sign{77, 1, 0.125f};
  std::vector<float> host(M * N);
  solder::test::run_product(cu::product<small_tiles>(cu::matrix_operand<false>{x.data(), K}, sign, M, K,
                                                     solder::write(tensor_ref<float, S, device>(host.data(), M), cu::product_value<S>(M))));
  device_vector<float> dx(x), dy(M * N);
  cu::run_product(nullptr, cu::product<small_tiles>(cu::matrix_operand<false>{dx.get(), K}, sign, M, K,
                                                    solder::write(tensor_ref<float, S, device>(dy.get(), M), cu::product_value<S>(M))));
  expect(same_bits(dy.read(), host), "x S with generated signs: device and host differ");
}

/// y = dropout(relu(x W^T + b)) assigned into a device tensor from the expression alone: the
/// executor runs one product with the rest as its epilogue.
void device_tensor_assignment() {
  constexpr std::size_t In = 96, Out = 200;
  const std::size_t batch = 130;
  std::vector<float> x(batch * In), w(Out * In), b(Out);
  fill_uniform(x, -1, 1, 7);
  fill_uniform(w, -1, 1, 8);
  fill_uniform(b, -0.5, 0.5, 9);
  using S = shape<dyn, Out>;
  std::vector<float> host(batch * Out);
  solder::test::run_product(cu::product_of(solder::write(
      tensor_ref<float, S, device>(host.data(), batch),
      solder::dropout(solder::relu(solder::matmul(tensor_ref<const float, shape<dyn, In>, device>(x.data(), batch),
                                                  solder::transpose(tensor_ref<const float, shape<Out, In>, device>(w.data()))) +
                                   tensor_ref<const float, shape<Out>, device>(b.data())),
                      0.2f, rng))));
  device_vector<float> dx(x), dw(w), db(b);
  solder::tensor<float, S, device> y(batch);
  y = solder::dropout(solder::relu(solder::matmul(tensor_ref<const float, shape<dyn, In>, device>(dx.get(), batch),
                                                  solder::transpose(tensor_ref<const float, shape<Out, In>, device>(dw.get()))) +
                                   tensor_ref<const float, shape<Out>, device>(db.get())),
                      0.2f, rng);
  std::vector<float> got(batch * Out);
  cu::check(cudaDeviceSynchronize(), "the product");
  cu::check(cudaMemcpy(got.data(), y.data(), got.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  expect(same_bits(got, host), "a device tensor assigned dropout(relu(matmul(x, transpose(w)) + b)): device and host differ");
}

/// relu(conv2d(x) + b) of NCHW images as a product over implicit im2col, NHWC output.
void convolution() {
  constexpr std::size_t Cin = 16, Cout = 32, Kh = 3, Kw = 3, H = 14, W = 14, Batch = 4;
  using G = solder::ops::conv2d_geometry<H, W, Kh, Kw, 1, 1, 1>;
  constexpr std::size_t K = Cin * Kh * Kw;
  const std::size_t M = Batch * G::out_plane;
  std::vector<float> x(Batch * Cin * H * W), w(Cout * K), b(Cout);
  fill_uniform(x, -1, 1, 10);
  fill_uniform(w, -0.2, 0.2, 11);
  fill_uniform(b, -0.5, 0.5, 12);
  using S = shape<dyn, Cout>;
  const auto pass = [&](const float* xp, const float* wp, const float* bp, float* yp) {
    return cu::product<small_tiles>(cu::im2col_operand<G, Cin, Kh, Kw, false>{xp}, cu::matrix_operand<true>{wp, K}, M, K,
                                    solder::write(tensor_ref<float, S, device>(yp, M),
                                                  solder::relu(cu::product_value<S>(M) + tensor_ref<const float, shape<Cout>, device>(bp))));
  };
  std::vector<float> host(M * Cout);
  solder::test::run_product(pass(x.data(), w.data(), b.data(), host.data()));
  device_vector<float> dx(x), dw(w), db(b), dy(M * Cout);
  cu::run_product(nullptr, pass(dx.get(), dw.get(), db.get(), dy.get()));
  expect(same_bits(dy.read(), host), "relu(conv2d(x) + b) over implicit im2col: device and host differ");
}

/// A convolution's backward: dW = g^T im2col(x) and dx gathered from dcol = g W.
void convolution_backward() {
  constexpr std::size_t Cin = 8, Cout = 16, Kh = 3, Kw = 3, H = 12, W = 10, Batch = 3;
  using G = solder::ops::conv2d_geometry<H, W, Kh, Kw, 2, 1, 1>;
  constexpr std::size_t K = Cin * Kh * Kw;
  const std::size_t M = Batch * G::out_plane;
  std::vector<float> x(Batch * Cin * H * W), w(Cout * K), g(M * Cout);
  fill_uniform(x, -1, 1, 13);
  fill_uniform(w, -0.2, 0.2, 14);
  fill_uniform(g, -1, 1, 15);
  using WS = shape<Cout, K>;
  using CS = shape<dyn, K>;
  const auto dw_pass = [&](const float* gp, const float* xp, float* out) {
    return cu::product<small_tiles>(cu::matrix_operand<true>{gp, Cout}, cu::im2col_operand<G, Cin, Kh, Kw, false>{xp}, Cout, M,
                                    solder::write(tensor_ref<float, WS, device>(out), cu::product_value<WS>()));
  };
  const auto dcol_pass = [&](const float* gp, const float* wp, float* out) {
    return cu::product<small_tiles>(cu::matrix_operand<false>{gp, Cout}, cu::matrix_operand<false>{wp, K}, M, Cout,
                                    solder::write(tensor_ref<float, CS, device>(out, M), cu::product_value<CS>(M)));
  };
  std::vector<float> dw(Cout * K), dcol(M * K), dx(x.size());
  solder::test::run_product(dw_pass(g.data(), x.data(), dw.data()));
  solder::test::run_product(dcol_pass(g.data(), w.data(), dcol.data()));
  const cu::col2im_pass<G, Cin, Kh, Kw> gather{dcol.data(), dx.data(), Batch};
  for (std::size_t i = 0; i < gather.elements(); ++i) gather.element(i);

  device_vector<float> dg(g), dxs(x), dws(w), ddw(Cout * K), ddcol(M * K), ddx(x.size());
  cu::run_product(nullptr, dw_pass(dg.get(), dxs.get(), ddw.get()));
  cu::run_product(nullptr, dcol_pass(dg.get(), dws.get(), ddcol.get()));
  cu::run_col2im(nullptr, cu::col2im_pass<G, Cin, Kh, Kw>{ddcol.get(), ddx.get(), Batch});
  expect(same_bits(ddw.read(), dw), "conv dW = g^T im2col(x): device and host differ");
  expect(same_bits(ddx.read(), dx), "conv dx gathered from g W: device and host differ");
}

}  // namespace

int main() {
  return solder::test::gpu::run("solder_cuda_product", "cuda:product: device products equal the host's bit for bit", [] {
    linear_epilogue<small_tiles, 150, 37>(131);
    linear_epilogue<large_tiles, 150, 37>(131);
    linear_epilogue<large_tiles, 512, 300>(257);
    linear_epilogue<tf32_tiles, 150, 70>(131);
    linear_epilogue<bf16_tiles, 520, 96>(200);
    weight_gradient();
    signs();
    device_tensor_assignment();
    convolution();
    convolution_backward();
  });
}
