// tests/generators/conv_group.test.cpp: the passes solder-gen writes for a convolution group
// (generators/solder_gen.hpp, conv_definitions and its launchers; kernels/conv_bn_relu.cu), run
// on the host (the products over whole grids, support/grid.hpp; the warp bodies on an emulated
// warp) against the CPU block nn::conv_block: training forward (z, the batch statistics, the
// running statistics, y), evaluation with the normalization folded into the weights (W' and b'
// bit for bit the formula the CPU block folds with), and every gradient; and the generated text
// builds exactly these passes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../generators/solder_gen.hpp"
#include "solder/eval/cuda/batch_norm.hpp"
#include "solder/eval/cuda/col2im.hpp"
#include "solder/eval/cuda/layout.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/conv_block.hpp"
#include "solder/nn/elementwise.hpp"
#include "support/data.hpp"
#include "support/device_view.hpp"
#include "support/grid.hpp"
#include "support/warp_emulation.hpp"

namespace {

using namespace solder;
namespace cu = solder::eval::cuda;
namespace gen = solder::gen;
using solder::test::dev;
using solder::test::dev_out;

/// The definitions and launcher bodies solder-gen writes for a convolution group of Block on
/// H x W images, with host memory seen as device memory.
template <class Block, std::size_t H, std::size_t W>
struct generated_conv {
  using conv_t = std::remove_cvref_t<decltype(std::declval<Block&>().conv)>;
  using tail_type = typename Block::tail_type;
  static constexpr bool norm = Block::has_norm, tail = Block::tail_size > 0, bias = conv_t::has_bias;
  static constexpr std::size_t Cin = conv_t::in_channels, Cout = conv_t::out_channels, Kh = conv_t::kernel_height,
                               Kw = conv_t::kernel_width, K = Cin * Kh * Kw;
  using G = ops::conv2d_geometry<H, W, Kh, Kw, conv_t::stride, conv_t::padding, conv_t::dilation>;
  static constexpr std::size_t Ho = G::out_height, Wo = G::out_width, plane = Ho * Wo, width = Cout * plane;
  using im2col = cu::im2col_operand<G, Cin, Kh, Kw, false>;
  /// The CPU layers' NCHW batches; the generated passes see them as rows (rows_of).
  using images = tensor<float, shape<dyn, Cout, Ho, Wo>>;
  using inputs = tensor<float, shape<dyn, Cin, H, W>>;
  using pixels = tensor<float, shape<dyn, Cout>>;
  using rows = tensor_ref<const float, shape<dyn, width>, device>;
  using rows_out = tensor_ref<float, shape<dyn, width>, device>;
  static rows rows_of(const images& t) { return rows(t.data(), t.batch()); }
  static rows_out rows_of(images& t) { return rows_out(t.data(), t.batch()); }

  /// c = im2col(x) W^T, then z = c reordered to NCHW with the bias.
  static void conv(const inputs& x, const float* w, const float* b, images& z) {
    const std::size_t batch = x.batch(), m = batch * plane;
    pixels c(m);
    test::run_product(cu::product<cu::product_tiling_for<Cout>>(im2col{x.data()}, cu::matrix_operand<true>{w, K}, m, K,
                                                               write(dev_out(c), cu::product_value<shape<dyn, Cout>>(m))));
    const cu::nhwc_to_nchw_body<Cout, Ho, Wo> r{c.data(), z.data(), batch, b};
    for (std::size_t i = 0; i < r.elements(); ++i) r(i);
  }
  /// batch_norm in training mode over z (a warp per channel), into u.
  static void normalize(const images& z, images& u, nn::batch_norm<Cout>& bn, float* saved_mean, float* saved_rstd) {
    test::run_warp(Cout, cu::batch_norm_train_forward_body<plane>{z.data(), u.data(), bn.weight.data(), bn.bias.data(),
                                                                  bn.running_mean.data(), bn.running_var.data(), saved_mean,
                                                                  saved_rstd, z.batch(), Cout, bn.eps, bn.momentum});
  }
  static void tail_forward(const tail_type& t, const images& u, images& y) {
    test::host_runner r;
    cu::dispatch(r, write(rows_of(y), t.template expression<nn::mode::train>(rows_of(u))));
  }
  /// Evaluation: W', b' folded, then the product with the tail in its epilogue, reordered.
  static void folded(const tail_type& t, const inputs& x, const float* w, const float* b, const nn::batch_norm<Cout>& bn,
                     std::vector<float>& wf, std::vector<float>& bf, images& y) {
    const std::size_t batch = x.batch(), m = batch * plane;
    wf.assign(Cout * K, 0.0f);
    bf.assign(Cout, 0.0f);
    const cu::batch_norm_fold_body<K> fold{w,          b,         bn.weight.data(), bn.bias.data(), bn.running_mean.data(),
                                           bn.running_var.data(), wf.data(),        bf.data(),      Cout,
                                           bn.eps};
    for (std::size_t i = 0; i < fold.elements(); ++i) fold(i);
    pixels c(m);
    const auto z = cu::product_value<shape<dyn, Cout>>(m) + tensor_ref<const float, shape<Cout>, device>(bf.data());
    test::run_product(cu::product<cu::product_tiling_for<Cout>>(im2col{x.data()}, cu::matrix_operand<true>{wf.data(), K}, m,
                                                               K, write(dev_out(c), t.template expression<nn::mode::eval>(z))));
    const cu::nhwc_to_nchw_body<Cout, Ho, Wo> r{c.data(), y.data(), batch};
    for (std::size_t i = 0; i < r.elements(); ++i) r(i);
  }

  struct grads {
    std::vector<float> dx, dw, db, dbn_weight, dbn_bias;
    std::vector<double> g_l1;  // per channel, the sum of |g| db adds up
  };
  /// The backward launcher's passes from y, dy (and z and the saved statistics with a norm).
  static grads backward(const tail_type& t, const inputs& x, const float* w, const images& z, const images& y,
                        const images& dy, const float* bn_weight, const float* saved_mean, const float* saved_rstd) {
    const std::size_t batch = x.batch(), m = batch * plane;
    grads out;
    images gu(batch), gz(batch);
    const images* grad = &dy;
    if constexpr (tail) {
      test::host_runner r;
      cu::dispatch(r, write(rows_of(gu), t.template gate_from_output<nn::mode::train>(rows_of(y), rows_of(dy))));
      grad = &gu;
    }
    if constexpr (norm) {
      out.dbn_weight.assign(Cout, 0.0f);
      out.dbn_bias.assign(Cout, 0.0f);
      test::run_warp(Cout, cu::batch_norm_train_backward_body<plane>{z.data(), grad->data(), gz.data(), bn_weight, saved_mean,
                                                                     saved_rstd, out.dbn_weight.data(), out.dbn_bias.data(),
                                                                     batch, Cout});
      grad = &gz;
    }
    pixels g(m);
    const cu::nchw_to_nhwc_body<Cout, Ho, Wo> r{grad->data(), g.data(), batch};
    for (std::size_t i = 0; i < r.elements(); ++i) r(i);
    out.g_l1.assign(Cout, 0.0);
    for (std::size_t i = 0; i < g.size(); ++i) out.g_l1[i % Cout] += std::fabs(double(g.data()[i]));
    if constexpr (bias) {
      out.db.assign(Cout, 0.0f);
      test::run_warp(Cout, cu::channel_sums_body<Cout, Ho, Wo, true>{g.data(), out.db.data(), batch});
    }
    tensor<float, shape<Cout, K>> dw;
    test::run_product(cu::product<cu::product_tiling_for<K>>(cu::matrix_operand<true>{g.data(), Cout}, im2col{x.data()}, Cout, m,
                                                            write(dev_out(dw), cu::product_value<shape<Cout, K>>())));
    out.dw.assign(dw.begin(), dw.end());
    tensor<float, shape<dyn, K>> dcol(m);
    test::run_product(cu::product<cu::product_tiling_for<K>>(cu::matrix_operand<false>{g.data(), Cout},
                                                            cu::matrix_operand<false>{w, K}, m, Cout,
                                                            write(dev_out(dcol), cu::product_value<shape<dyn, K>>(m))));
    out.dx.assign(batch * Cin * H * W, -1.0f);
    const cu::col2im_pass<G, Cin, Kh, Kw> gather{dcol.data(), out.dx.data(), batch};
    for (std::size_t i = 0; i < gather.elements(); ++i) gather(i);
    return out;
  }
};

double largest(const float* b, std::size_t n) {
  double m = 1e-30;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(b[i])));
  return m;
}
/// Elements off by more than tol times the reference's largest magnitude: the products' sums run
/// in another order on each side, so values agree within a few ulp of the sums' magnitude.
std::size_t differing(const float* a, const float* b, std::size_t n, double tol) {
  const double bound = tol * largest(b, n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !(std::fabs(double(a[i]) - double(b[i])) <= bound);
  return bad;
}
// Sums of at most a few thousand float products (dW sums over batch Ho Wo), normalized by batch
// statistics: rounding of the two orders stays below 1e-5 of each tensor's largest element, but
// batch norm divides by the batch's standard deviation, which can magnify the products' rounding
// of z: 2e-5 after a normalization.
constexpr double value_tolerance = 1e-5, normalized_tolerance = 2e-5;

/// Training forward, evaluation and backward of Block on H x W images against the CPU block.
template <class Block, std::size_t H, std::size_t W>
void compare_with_cpu(std::size_t batch) {
  using Gc = generated_conv<Block, H, W>;
  constexpr std::size_t Cout = Gc::Cout, width = Gc::width;
  Block block(5);
  typename Gc::inputs x(batch), dx(batch);
  typename Gc::images y(batch), dy(batch), z(batch), u(batch), y_host(batch), z_ref(batch);
  test::fill_uniform(x, -1, 1, 31 + std::uint32_t(batch));
  test::fill_uniform(dy, -1, 1, 32 + std::uint32_t(batch));
  if constexpr (Gc::norm) {
    test::fill_uniform(block.norm.weight, 0.5f, 1.5f, 33);
    test::fill_uniform(block.norm.bias, -0.5f, 0.5f, 34);
  }
  const float* b = nullptr;
  if constexpr (Gc::bias) b = block.conv.bias.data();
  // The host's copy of the layers before the CPU's forward moves the running statistics.
  nn::batch_norm<Cout> bn;
  if constexpr (Gc::norm) {
    bn.weight = block.norm.weight;
    bn.bias = block.norm.bias;
  }
  block.train();
  block.forward(x, y);
  block.backward(x, y, dy, dx);

  // Training forward.
  std::vector<float> saved_mean(Cout), saved_rstd(Cout);
  typename Block::tail_type tail;
  Gc::conv(x, block.conv.weight.data(), b, z);
  block.conv.forward(x, z_ref);  // the CPU's convolution alone, with its bias
  CHECK(differing(z.data(), z_ref.data(), z.size(), value_tolerance) == 0);
  const typename Gc::images* to_tail = &z;
  if constexpr (Gc::norm) {
    Gc::normalize(z, u, bn, saved_mean.data(), saved_rstd.data());
    to_tail = &u;
    // The batch's statistics against double sums over z_ref, the running ones against the CPU's.
    for (std::size_t c = 0; c < Cout; ++c) {
      double s = 0, s2 = 0;
      const double n = double(batch * Gc::plane);
      for (std::size_t k = 0; k < batch; ++k)
        for (std::size_t p = 0; p < Gc::plane; ++p) s += z_ref.data()[(k * Cout + c) * Gc::plane + p];
      const double mean = s / n;
      for (std::size_t k = 0; k < batch; ++k)
        for (std::size_t p = 0; p < Gc::plane; ++p) {
          const double d = z_ref.data()[(k * Cout + c) * Gc::plane + p] - mean;
          s2 += d * d;
        }
      const double rstd = 1.0 / std::sqrt(s2 / n + bn.eps);
      CHECK(std::fabs(saved_mean[c] - mean) <= value_tolerance * largest(z_ref.data(), z_ref.size()));
      CHECK(std::fabs(saved_rstd[c] - rstd) <= normalized_tolerance * rstd);
      CHECK(std::fabs(bn.running_mean[c] - block.norm.running_mean[c]) <= value_tolerance * largest(z_ref.data(), z_ref.size()));
      CHECK(std::fabs(bn.running_var[c] - block.norm.running_var[c]) <= normalized_tolerance * block.norm.running_var[c]);
    }
  }
  if constexpr (Gc::tail)
    Gc::tail_forward(tail, *to_tail, y_host);
  else
    y_host = *to_tail;
  CHECK(differing(y_host.data(), y.data(), y.size(), Gc::norm ? normalized_tolerance : value_tolerance) == 0);

  // Backward from the CPU's y (the tail's gate then is the CPU's bit for bit), the host's z and
  // statistics.
  const auto grads = Gc::backward(tail, x, block.conv.weight.data(), z, y, dy, bn.weight.data(), saved_mean.data(),
                                  saved_rstd.data());
  const double tol = Gc::norm ? normalized_tolerance : value_tolerance;
  CHECK(differing(grads.dx.data(), dx.data(), dx.size(), tol) == 0);
  CHECK(differing(grads.dw.data(), block.conv.weight_grad.data(), block.conv.weight_grad.size(), tol) == 0);
  if constexpr (Gc::bias) {
    // db sums g over the batch's pixels; after a batch_norm that sum is 0 up to rounding (the
    // normalization removes a per-channel shift), so both sides hold rounding noise: compare at
    // the scale of the terms summed, not of the result.
    std::size_t off = 0;
    for (std::size_t c = 0; c < Cout; ++c)
      off += !(std::fabs(double(grads.db[c]) - double(block.conv.bias_grad[c])) <= tol * grads.g_l1[c]);
    CHECK(off == 0);
  }
  if constexpr (Gc::norm) {
    CHECK(differing(grads.dbn_weight.data(), block.norm.weight_grad.data(), Cout, tol) == 0);
    CHECK(differing(grads.dbn_bias.data(), block.norm.bias_grad.data(), Cout, tol) == 0);
  }

  // Evaluation, folded: with the CPU block's running statistics after its forward.
  if constexpr (Gc::norm) {
    typename Gc::images y_eval(batch), y_eval_host(batch);
    block.eval();
    block.pack_weights();
    block.forward(x, y_eval);
    std::vector<float> wf, bf;
    Gc::folded(tail, x, block.conv.weight.data(), b, block.norm, wf, bf, y_eval_host);
    // W' and b' are the CPU block's fold (nn::conv_block::fold) bit for bit: the same double
    // formula rounded once.
    std::size_t fold_bits = 0;
    for (std::size_t c = 0; c < Cout; ++c) {
      const double s = double(block.norm.weight[c]) / std::sqrt(double(block.norm.running_var[c]) + block.norm.eps);
      for (std::size_t i = 0; i < Gc::K; ++i)
        fold_bits += cu::float_bits(wf[c * Gc::K + i]) != cu::float_bits(float(double(block.conv.weight.data()[c * Gc::K + i]) * s));
      const double bc = b ? double(b[c]) : 0.0;
      fold_bits += cu::float_bits(bf[c]) !=
                   cu::float_bits(float((bc - double(block.norm.running_mean[c])) * s + double(block.norm.bias[c])));
    }
    CHECK(fold_bits == 0);
    CHECK(differing(y_eval_host.data(), y_eval.data(), y_eval.size(), value_tolerance) == 0);
  }
  (void)width;
}

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

using conv_bn_relu = nn::chain<nn::input<64, 16, 16>, nn::conv2d<64, 64, 3, 3, 1, 1>, nn::batch_norm<64>, nn::relu>;

}  // namespace

TEST_CASE("conv group: the generated passes against nn::conv_block", "[gen][conv]") {
  SECTION("conv2d 3 -> 8, 3x3, padding 1, batch_norm, relu, on 6 x 7 images") {
    const std::size_t batch = GENERATE(1, 3);
    INFO("batch " << batch);
    compare_with_cpu<nn::conv_block<nn::conv2d<3, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu>, 6, 7>(batch);
  }
  SECTION("conv2d 4 -> 5, 3x2, stride 2, padding 1, no bias, relu, on 7 x 5 images") {
    compare_with_cpu<nn::conv_block<nn::conv2d<4, 5, 3, 2, 2, 1, 1, 1, false>, nn::relu>, 7, 5>(2);
  }
  SECTION("conv2d 2 -> 9, 3x3, dilation 2, padding 2, batch_norm, no tail, on 9 x 8 images") {
    compare_with_cpu<nn::conv_block<nn::conv2d<2, 9, 3, 3, 1, 2, 2>, nn::batch_norm<9>>, 9, 8>(2);
  }
  SECTION("kernels/conv_bn_relu's group: 64 -> 64, 3x3, padding 1, on 16 x 16 images") {
    compare_with_cpu<nn::conv_block<nn::conv2d<64, 64, 3, 3, 1, 1>, nn::batch_norm<64>, nn::relu>, 16, 16>(2);
  }
}

TEST_CASE("solder-gen: a convolution, its batch_norm and its tail are one convolution group", "[gen][conv]") {
  const gen::chain_desc c = gen::describe<conv_bn_relu>("conv_bn_relu");
  REQUIRE(c.groups.size() == 1);
  const gen::group_desc& g = c.groups[0];
  CHECK(g.conv);
  CHECK(g.norm);
  CHECK(g.conv_bias);
  CHECK_FALSE(g.product);
  CHECK(g.channels == 64);
  CHECK(g.height == 16);
  CHECK(g.out_channels == 64);
  CHECK(g.out_height == 16);
  CHECK(g.kernel_h == 3);
  CHECK(g.pad == 1);
  CHECK(c.layers[0].type == "solder::nn::conv2d<64, 64, 3, 3, 1, 1>");
  CHECK(c.layers[1].type == "solder::nn::batch_norm<64>");
  using odd = nn::chain<nn::input<4, 7, 5>, nn::conv2d<4, 5, 3, 2, 2, 1, 1, 1, false>, nn::relu>;
  const gen::chain_desc o = gen::describe<odd>("odd");
  CHECK(o.layers[0].type == "solder::nn::conv2d<4, 5, 3, 2, 2, 1, 1, 1, false>");
  CHECK_FALSE(o.groups[0].norm);
  CHECK(o.groups[0].out_height == 4);
  CHECK(o.groups[0].out_cols == 3);
}

TEST_CASE("solder-gen: a convolution group's passes and launchers", "[gen][conv]") {
  const gen::files f = gen::generate(gen::describe<conv_bn_relu>("conv_bn_relu"), "chains.hpp");
  CHECK(holds(f.cu, "using g0_block = solder::nn::conv_block<solder::nn::conv2d<64, 64, 3, 3, 1, 1>, solder::nn::batch_norm<64>,"));
  CHECK(holds(f.cu, "using g0_geometry = solder::ops::conv2d_geometry<16, 16, 3, 3, 1, 1, 1>;"));
  CHECK(holds(f.cu, "using g0_im2col = solder::eval::cuda::im2col_operand<g0_geometry, 64, 3, 3, false>;"));
  CHECK(holds(f.cu, "return product<g0_out_tiling>(g0_im2col{x}, matrix_operand<true>{w, 576}, m, 576,"));
  CHECK(holds(f.cu, "const auto z = product_value<solder::shape<solder::dyn, 64>>(m) + bf;"));
  CHECK(holds(f.cu, "solder::write(c, tail.expression<solder::nn::mode::eval>(z))"));
  CHECK(holds(f.cu, "return product<g0_in_tiling>(matrix_operand<true>{g.data(), 64}, g0_im2col{x}, 64, g.batch(),"));
  CHECK(holds(f.cu, "matrix_operand<false>{g.data(), 64}, matrix_operand<false>{w, 576}, m, 64,"));
  CHECK(holds(f.cu, "solder::eval::cuda::nhwc_to_nchw(g0_to_nchw{c.data(), z, batch, b}, stream);"));
  CHECK(holds(f.cu, "using g0_norm_forward = solder::eval::cuda::batch_norm_train_forward_body<256>;"));
  CHECK(holds(f.cu, "solder::eval::cuda::nchw_to_nhwc(g0_to_nhwc{gz.data(), g.data(), batch}, stream);"));
  CHECK(holds(f.cu, "using g0_bias_sums = solder::eval::cuda::channel_sums_body<64, 16, 16, true>;"));
  CHECK(holds(f.cu, "solder::eval::cuda::run_col2im(stream, g0_col2im{dcol.data(), dx, batch});"));
  CHECK(holds(f.cu, "template __global__ void solder::eval::cuda::transpose_kernel<256, 64>("));
  CHECK(holds(f.h, "int solder_conv2d_batch_norm_relu_f32_64x16x16_64k3x3s1p1_fwd("));
  CHECK(holds(f.h, "float* running_mean, float* running_var, float* z, float* saved_mean, float* saved_rstd, float* y,"));
  CHECK(holds(f.h, "size_t batch, double eps, double momentum, cudaStream_t stream);"));
  CHECK(holds(f.h, "int solder_conv2d_batch_norm_relu_f32_64x16x16_64k3x3s1p1_eval("));
  CHECK(holds(f.h, "float* dbn_weight, float* dbn_bias, size_t batch, cudaStream_t stream);"));
}

namespace {
using digits_cnn = nn::chain<nn::input<1, 8, 8>, nn::conv2d<1, 16, 3, 3, 1, 1>, nn::batch_norm<16>, nn::relu,
                             nn::conv2d<16, 32, 3, 3, 1, 1>, nn::batch_norm<32>, nn::relu, nn::max_pool2d<2>, nn::flatten<>,
                             nn::dropout<0.1f>, nn::linear<512, 10>>;
}  // namespace

TEST_CASE("solder-gen: the digits CNN's chain-level launchers and their layout", "[gen][conv]") {
  const gen::chain_desc c = gen::describe<digits_cnn>("digits_cnn");
  REQUIRE(c.groups.size() == 6);
  const gen::files f = gen::generate(c, "chains.hpp");
  // The parameters in the CPU chain's params() order, the running statistics in its buffers() order.
  digits_cnn model(1);
  std::vector<std::size_t> starts;
  std::size_t at = 0;
  for (const auto& p : model.params()) {
    starts.push_back(at);
    at += p.value.size();
  }
  CHECK(at == 10026);
  CHECK(starts == std::vector<std::size_t>{0, 144, 160, 176, 192, 4800, 4832, 4864, 4896, 10016});
  std::vector<std::string> buffer_names;
  for (const auto& b : model.buffers()) buffer_names.push_back(b.name + ":" + std::to_string(b.value.size()));
  CHECK(buffer_names == std::vector<std::string>{"1.running_mean:16", "1.running_var:16", "4.running_mean:32", "4.running_var:32"});
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_PARAM_FLOATS 10026\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_3_WEIGHT 192  /* [32, 16, 3, 3] */\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_4_WEIGHT 4832  /* [32] */\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_9_WEIGHT 4896  /* [10, 512] */\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_1_RUNNING_MEAN 0  /* [16] */\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_4_RUNNING_VAR 64  /* [32] */\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_4_SAVED_MEAN 128  /* [32] */\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_BUFFER_FLOATS 192\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_CNN_HIDDEN_FLOATS 7680\n"));
  CHECK(holds(f.h, "int solder_digits_cnn_train_step(const float* x, const int32_t* labels, float* params, float* grads,"));
  CHECK(holds(f.h, "const uint64_t* seeds, const uint64_t* offsets, uint64_t first_sample,"));
  CHECK(model.layer<8>().rng.seed == random::derive_seed(1, 8));
  CHECK(holds(f.cu, "seeds[0] = solder::random::derive_seed(seed, 8);  // layer 8"));
  // The forward: z, then the normalization into the tail's input, the running and saved statistics.
  CHECK(holds(f.cu, "solder::eval::cuda::nhwc_to_nchw(g0_to_nchw{c.data(), hidden, batch, params + 144}, stream);"));
  CHECK(holds(f.cu, "const g0_norm_forward norm{hidden, u.data(), params + 160, params + 176, buffers, buffers + 16,"));
  CHECK(holds(f.cu, "buffers + 96, buffers + 112, batch, 16, bn_eps, bn_momentum};"));
  CHECK(holds(f.cu, "reinterpret_cast<std::int32_t*>(hidden + batch * 6656)"));
  CHECK(holds(f.cu, "// (the same bytes: its output is its input)"));
  CHECK(holds(f.cu, "run(stream, g4_forward(block, g4_rows(hidden + batch * 6144, batch),"));
  // The backward: the gradient between two buffers, the dropout's mask drawn again from its
  // stream, the pool's argmax, no dx for the first group.
  CHECK(holds(f.cu, "run_product(stream, g5_input_grad(g5_rows(g, batch), params + 4896, g5_in_rows_out(d0, batch)));"));
  CHECK(holds(f.cu, "run(stream, g4_backward(block, g4_rows(hidden + batch * 6144, batch), g4_rows(d0, batch),"));
  CHECK(holds(f.cu, "const g2_backward_body body{d1, reinterpret_cast<const std::int32_t*>(hidden + batch * 6656), d0,"));
  CHECK(holds(f.cu, "solder::eval::cuda::run_col2im(stream, g1_col2im{dcol.data(), d1, batch});"));
  CHECK_FALSE(holds(f.cu, "g0_col2im{dcol.data(), d0"));
  CHECK_FALSE(holds(f.cu, "g0_col2im{dcol.data(), d1"));
  CHECK(holds(f.cu, "run_product(stream, g0_weight_grad(g0_pixels(gc.data(), batch * 64), x, g0_weight_out(grads)));"));
  // Two conv groups with the same batch_norm body type: its kernel instantiated once.
  const auto first = f.cu.find("batch_norm_train_forward_body<64>>(");
  REQUIRE(first != std::string::npos);
  CHECK(f.cu.find("batch_norm_train_forward_body<64>>(", first + 1) == std::string::npos);
}
