// tests/nn/conv2d_epilogue.test.cpp: a convolution's epilogue run on each part of its output
// as it is stored (conv2d::forward_with, and conv_block's tail): a residual add, ReLU and
// dropout, bit for bit what assign_all gives after the convolution and what a scalar loop with
// the dropout rule gives, on every forward path (the register tiles, the GEMM for groups and
// pointwise layers, depthwise), on 1 and 2 threads, with rows longer than a segment; the
// block's training and evaluation forwards and backwards against the unfused composition, with
// and without a batch_norm (whose forward_with runs the tail on each plane it normalizes).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "solder/nn/batch_norm.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/elementwise.hpp"
#include "support/data.hpp"

namespace {

using Catch::Matchers::Contains;
using namespace solder;
using solder::test::bit_differences;

/// Sets the thread count for one scope (OpenMP builds), then restores it.
struct threads_scope {
#if defined(_OPENMP)
  int saved = omp_get_max_threads();
  explicit threads_scope(int n) { omp_set_num_threads(n); }
  ~threads_scope() { omp_set_num_threads(saved); }
#else
  explicit threads_scope(int) {}
#endif
};

/// forward_with's two writes against forward then assign_all, and against a scalar loop:
/// y = relu(z + r) and d = dropout(relu(z + r), 0.3) with z the convolution's output.
template <class L, std::size_t H, std::size_t W>
void check_epilogue(std::size_t batch, const char* what) {
  INFO(what << ", batch " << batch);
  using SX = shape<dyn, L::in_channels, H, W>;
  constexpr std::size_t Ho = (H + 2 * L::padding - L::dilation * (L::kernel_height - 1) - 1) / L::stride + 1;
  constexpr std::size_t Wo = (W + 2 * L::padding - L::dilation * (L::kernel_width - 1) - 1) / L::stride + 1;
  using SY = shape<dyn, L::out_channels, Ho, Wo>;
  L layer(7);
  tensor<float, SX> x(batch);
  tensor<float, SY> r(batch), z(batch), y(batch), d(batch), z2(batch), y2(batch), d2(batch);
  test::fill_uniform(x, -1.0, 1.0, 11);
  test::fill_uniform(r, -0.5, 0.5, 12);
  const philox_state rng{1234, 56};
  const test::dropout_rule rule{0.3, rng.seed, rng.offset, rng.rounds};
  const std::size_t n = z.size();

  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    threads_scope scope(threads);
    const auto zc = std::as_const(z).ref();
    layer.forward_with(std::as_const(x).ref(), z.ref(), write(y, relu(zc + r)), write(d, dropout(relu(zc + r), 0.3f, rng)));
    layer.forward(x, z2);
    const auto z2c = std::as_const(z2).ref();
    assign_all(write(y2, relu(z2c + r)), write(d2, dropout(relu(z2c + r), 0.3f, rng)));
    CHECK(bit_differences(z.data(), z2.data(), n) == 0);
    CHECK(bit_differences(y.data(), y2.data(), n) == 0);
    CHECK(bit_differences(d.data(), d2.data(), n) == 0);
    // The dropout rule element by element, on the row-major index of [batch, C, Ho, Wo].
    std::size_t wrong = 0, dropped = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float v = std::max(z2.data()[i] + r.data()[i], 0.0f);
      const float want = rule.keep(i) ? v * rule.scale() : 0.0f;
      wrong += std::memcmp(&want, d.data() + i, sizeof(float)) != 0;
      dropped += !rule.keep(i);
    }
    CHECK(wrong == 0);
    CHECK(dropped > n / 5);
    CHECK(dropped < n * 2 / 5);

    // In place: the epilogue overwrites the convolution's output.
    layer.forward_with(std::as_const(x).ref(), z.ref(), write(z, relu(zc + r)));
    CHECK(bit_differences(z.data(), y2.data(), n) == 0);
  }
}

TEST_CASE("nn::conv2d: forward_with runs its writes on each part of the output, as assign_all after forward", "[nn][conv2d]") {
  check_epilogue<nn::conv2d<5, 7, 3, 3, 1, 1>, 9, 11>(3, "3x3, register tiles");
  check_epilogue<nn::conv2d<5, 40, 3, 3, 2, 1>, 13, 10>(2, "3x3 stride 2, two panels");
  check_epilogue<nn::conv2d<6, 5, 1, 1>, 7, 9>(3, "pointwise (the GEMM over x)");
  check_epilogue<nn::conv2d<4, 6, 3, 3, 1, 1, 1, 2>, 8, 7>(3, "groups 2 (the GEMM over columns)");
  check_epilogue<nn::conv2d<4, 8, 3, 3, 1, 1, 1, 4>, 9, 8>(2, "depthwise, multiplier 2");
  check_epilogue<nn::conv2d<2, 3, 3, 3, 1, 1>, 3, 300>(2, "rows of 300: two segments each");
  check_epilogue<nn::conv2d<16, 32, 3, 3, 1, 1>, 20, 20>(4, "above the parallel threshold");
  check_epilogue<nn::conv2d<16, 16, 3, 3, 1, 1, 1, 16>, 20, 20>(3, "depthwise above the parallel threshold");
}

TEST_CASE("nn::conv2d: forward_with's errors", "[nn][conv2d]") {
  nn::conv2d<3, 3, 3, 3, 1, 1> layer;
  using S = shape<dyn, 3, 6, 5>;
  tensor<float, S> x(2), z(2), z3(3), y(2);
  const auto zc = std::as_const(z).ref();
  CHECK_THROWS_WITH(layer.forward_with(std::as_const(x).ref(), z.ref(), write(x, relu(zc))),
                    Contains("solder::nn::conv2d::forward_with: a write's output overlaps x"));
  CHECK_THROWS_WITH(layer.forward_with(std::as_const(x).ref(), z3.ref(), write(z3, relu(std::as_const(z3).ref()))),
                    Contains("solder::nn::conv2d::forward_with") && Contains("x (2) and y (3) differ"));
  CHECK_NOTHROW(layer.forward_with(std::as_const(x).ref(), z.ref(), write(y, relu(zc))));
}

/// A block of a convolution and (relu, dropout) against the convolution and the elementwise
/// block run one after the other, on copies made before each call (the dropout streams advance
/// the same way): training forward and backward, then evaluation mode.
TEST_CASE("nn::conv_block: a tail with dropout runs in the convolution's epilogue, as the unfused layers", "[nn][conv2d]") {
  using conv_t = nn::conv2d<6, 12, 3, 3, 1, 1>;
  using block_t = nn::conv_block<conv_t, nn::relu, nn::dropout<0.25f>>;
  using SX = shape<dyn, 6, 10, 9>;
  using SY = shape<dyn, 12, 10, 9>;
  constexpr std::size_t batch = 3;
  block_t block(5);
  tensor<float, SX> x(batch), dx(batch), dx_ref(batch);
  tensor<float, SY> y(batch), y_ref(batch), u(batch), dy(batch), g(batch);
  test::fill_uniform(x, -1.0, 1.0, 21);
  test::fill_uniform(dy, -1.0, 1.0, 22);
  const std::size_t n = y.size();

  for (int step = 0; step < 2; ++step) {  // a second step draws a fresh mask
    INFO("training step " << step);
    conv_t conv(5);  // the block's weights: no step has changed them
    auto tail = block.tail;
    block.forward(x, y);
    conv.forward(x, u);
    tail.forward(u, y_ref);
    CHECK(bit_differences(y.data(), y_ref.data(), n) == 0);
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < n; ++i) zeros += y.data()[i] == 0.0f && u.data()[i] > 0.0f;
    CHECK(zeros > 0);  // dropout ran in training

    block.backward(x, y, dy, dx);
    tail.backward(std::as_const(u).ref(), std::as_const(y_ref).ref(), std::as_const(dy).ref(), g.ref());
    conv.backward(x, y_ref, g, dx_ref);
    CHECK(bit_differences(dx.data(), dx_ref.data(), x.size()) == 0);
    CHECK(bit_differences(block.conv.weight_grad.data(), conv.weight_grad.data(), conv.weight_grad.size()) == 0);
    CHECK(bit_differences(block.conv.bias_grad.data(), conv.bias_grad.data(), conv.bias_grad.size()) == 0);
  }

  block.eval();
  conv_t conv(5);
  auto tail = block.tail;
  tail.eval();
  block.forward(x, y);
  conv.forward(x, u);
  tail.forward(u, y_ref);
  CHECK(bit_differences(y.data(), y_ref.data(), n) == 0);
  // An evaluation-mode backward makes the tail's input again.
  block.backward(x, y, dy, dx);
  tail.backward(std::as_const(u).ref(), std::as_const(y_ref).ref(), std::as_const(dy).ref(), g.ref());
  conv.backward(x, y_ref, g, dx_ref);
  CHECK(bit_differences(dx.data(), dx_ref.data(), x.size()) == 0);
}

/// A block of a convolution, a batch_norm and Tail in training, then unfolded in evaluation
/// mode, against the three layers run one after the other (the tail on copies made before each
/// call): forward, backward, the running statistics.
template <class... Tail>
void check_norm_tail(const char* what) {
  INFO(what);
  using conv_t = nn::conv2d<5, 10, 3, 3, 1, 1, 1, 1, false>;
  using SX = shape<dyn, 5, 8, 11>;
  using SY = shape<dyn, 10, 8, 11>;
  constexpr std::size_t batch = 3;
  nn::conv_block<conv_t, nn::batch_norm<10>, Tail...> block(9);
  conv_t conv(9);
  nn::batch_norm<10> norm;
  tensor<float, SX> x(batch), dx(batch), dx_ref(batch);
  tensor<float, SY> y(batch), y_ref(batch), z(batch), u(batch), dy(batch), gu(batch), gz(batch);
  test::fill_uniform(x, -1.0, 1.0, 41);
  test::fill_uniform(dy, -1.0, 1.0, 42);
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    auto tail = block.tail;
    block.forward(x, y);
    conv.forward(x, z);
    norm.forward(z, u);
    tail.forward(u, y_ref);
    CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);
    CHECK(bit_differences(block.norm.running_var.data(), norm.running_var.data(), 10) == 0);

    block.backward(x, y, dy, dx);
    tail.backward(std::as_const(u).ref(), std::as_const(y_ref).ref(), std::as_const(dy).ref(), gu.ref());
    norm.backward(z, u, gu, gz);
    conv.backward(x, z, gz, dx_ref);
    CHECK(bit_differences(dx.data(), dx_ref.data(), x.size()) == 0);
    CHECK(bit_differences(block.conv.weight_grad.data(), conv.weight_grad.data(), conv.weight_grad.size()) == 0);
    CHECK(bit_differences(block.norm.weight_grad.data(), norm.weight_grad.data(), 10) == 0);
  }

  // Evaluation mode unfolded: the running statistics normalize, the tail runs on each plane.
  INFO("evaluation mode, unfolded");
  block.eval();
  block.fold_in_eval = false;
  norm.eval();
  auto tail = block.tail;
  tail.eval();
  block.forward(x, y);
  conv.forward(x, z);
  norm.forward(z, u);
  tail.forward(u, y_ref);
  CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);
  block.backward(x, y, dy, dx);
  tail.backward(std::as_const(u).ref(), std::as_const(y_ref).ref(), std::as_const(dy).ref(), gu.ref());
  norm.backward(z, u, gu, gz);
  conv.backward(x, z, gz, dx_ref);
  CHECK(bit_differences(dx.data(), dx_ref.data(), x.size()) == 0);
  CHECK(bit_differences(block.norm.bias_grad.data(), norm.bias_grad.data(), 10) == 0);
}

TEST_CASE("nn::conv_block: in training the tail runs as the normalization writes each plane, as the unfused layers",
          "[nn][conv2d]") {
  check_norm_tail<nn::relu>("relu (backward from y: the tail runs in place in y)");
  check_norm_tail<nn::relu, nn::dropout<0.3f>>("relu, dropout");
  check_norm_tail<nn::gelu>("gelu (backward from its input u)");
}

/// batch_norm::forward_with against forward then assign_all, in training and evaluation.
template <class S>
void check_norm_epilogue(std::size_t batch, const char* what) {
  INFO(what);
  constexpr std::size_t C = S::extents[1];
  nn::batch_norm<C> a, b;
  tensor<float, S> x(batch), r(batch), y(batch), y2(batch), d(batch), d2(batch);
  test::fill_uniform(x, -2.0, 3.0, 51);
  test::fill_uniform(r, -1.0, 1.0, 52);
  const philox_state rng{77, 3};
  for (bool training : {true, false}) {
    INFO((training ? "training" : "evaluation"));
    if (!training) {
      a.eval();
      b.eval();
    }
    const auto yc = std::as_const(y).ref();
    a.forward_with(std::as_const(x).ref(), y.ref(), write(y, relu(yc + r)), write(d, dropout(yc * 2.0f, 0.4f, rng)));
    b.forward(x, y2);
    const auto y2c = std::as_const(y2).ref();
    assign(d2, dropout(y2c * 2.0f, 0.4f, rng));
    assign(y2, relu(y2c + r));
    CHECK(bit_differences(y.data(), y2.data(), y.size()) == 0);
    CHECK(bit_differences(d.data(), d2.data(), d.size()) == 0);
  }
}

TEST_CASE("nn::batch_norm: forward_with runs its writes on each plane as it is normalized", "[nn][batch_norm]") {
  check_norm_epilogue<shape<dyn, 6, 5, 7>>(3, "[batch, C, H, W]");
  check_norm_epilogue<shape<dyn, 9>>(20, "[batch, C]");
  check_norm_epilogue<shape<dyn, 24, 30, 30>>(4, "above the parallel threshold");
}

TEST_CASE("nn::conv_block: folded, a tail of relu and dropout gives the bits of relu alone in evaluation mode", "[nn][conv2d]") {
  using conv_t = nn::conv2d<4, 20, 3, 3, 1, 1, 1, 1, false>;
  nn::conv_block<conv_t, nn::batch_norm<20>, nn::relu, nn::dropout<0.5f>> with_dropout(3);
  nn::conv_block<conv_t, nn::batch_norm<20>, nn::relu> without(3);
  using SX = shape<dyn, 4, 9, 12>;
  using SY = shape<dyn, 20, 9, 12>;
  tensor<float, SX> x(2);
  tensor<float, SY> a(2), b(2);
  test::fill_uniform(x, -1.0, 1.0, 31);
  for (auto* nb : {&with_dropout.norm, &without.norm}) {
    test::fill_uniform(nb->weight, 0.5, 1.5, 32);
    test::fill_uniform(nb->bias, -0.2, 0.2, 33);
    test::fill_uniform(nb->running_mean, -0.1, 0.1, 34);
    test::fill_uniform(nb->running_var, 0.5, 2.0, 35);
  }
  with_dropout.eval();
  without.eval();
  with_dropout.pack_weights();
  without.pack_weights();
  with_dropout.forward(x, a);
  without.forward(x, b);
  CHECK(bit_differences(a.data(), b.data(), a.size()) == 0);
}

}  // namespace
