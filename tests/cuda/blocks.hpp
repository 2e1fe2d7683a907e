// tests/cuda/blocks.hpp: the CPU side of blocks.cu, which runs the blocks and the optimizer
// written once over the memory space (nn/linear_block.hpp, optim/) in device memory and
// compares them with the same types in host memory, computed in blocks.host.cpp by the C++
// compiler (nvcc does not instantiate the CPU loops).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace solder::test::blocks {

inline constexpr std::size_t batch = 37;
inline constexpr std::uint64_t seed = 11;

/// Block kinds: 0 = linear<48, 40>, gelu, dropout<0.25> (keeps its pre-activation);
/// 1 = linear<64, 32>, relu, dropout<0.1> (backward from its output).
inline constexpr std::size_t in_features(int kind) { return kind == 0 ? 48 : 64; }
inline constexpr std::size_t out_features(int kind) { return kind == 0 ? 40 : 32; }

/// What the host block gives for x [batch, In] and dy [batch, Out], in this order: its
/// parameters after reset(seed, 0); a training forward y and the backward's dx, dW, db; the
/// gradient norm (optim::clip_grad_norm, no clipping); W and b after one AdamW step; and an
/// evaluation forward with the updated weights (packed, as a frozen model runs).
struct result {
  std::vector<float> w0, b0, y, dx, dw, db;
  double norm = 0;
  std::vector<float> w1, b1, y_eval;
};

result host_run(int kind, const std::vector<float>& x, const std::vector<float>& dy);

inline constexpr std::size_t classes = 10;

/// The row layers and the loss on the host, for logits x [batch, classes], labels and dy:
/// softmax_cross_entropy's mean loss (label smoothing 0.1) and dlogits; log_softmax's y and its
/// dx for dy; softmax's y; layer_norm's y, dx, dweight and dbias (weight 1 + j / 10, bias j / 20
/// at feature j).
struct rows_result {
  double loss = 0;
  std::vector<float> dlogits, log_y, log_dx, soft_y;
  std::vector<float> norm_y, norm_dx, norm_dw, norm_db;
};

rows_result host_rows(const std::vector<float>& x, const std::vector<std::int32_t>& labels, const std::vector<float>& dy);

/// The chain both sides build: nn::chain<linear<64, 32>, relu, dropout<0.1>, linear<32, 16>,
/// gelu, linear<16, 10>> (three GEMM kernels, one keeping its pre-activation), seed 7.
inline constexpr std::size_t chain_in = 64, chain_out = 10;
inline constexpr std::uint64_t chain_seed = 7;

/// What the host chain gives on x [batch, 64] and labels: its parameters as drawn (params()
/// order, flattened), the losses of two train_steps with SGD (lr 0.05, momentum 0.9), the
/// parameters after them, and the logits of an evaluation forward.
struct chain_result {
  std::vector<float> initial;
  float loss1 = 0, loss2 = 0;
  std::vector<float> trained, logits;
};

chain_result host_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels);
/// The same for nn::chain<sketched_linear<64, 48, 2, 4>, relu, dropout<0.1>, linear<48, 10>>.
chain_result host_sketched_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels);
/// The same for nn::chain<input<4, 4, 4>, max_pool2d<2>, flatten<>, linear<16, 32>, relu,
/// layer_norm<32>, linear<32, 10>, log_softmax<10>> (64 inputs).
chain_result host_image_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels);
/// The same for nn::chain<input<4, 4, 4>, conv2d<4, 8, 3, 3, 1, 1>, batch_norm<8>, relu,
/// max_pool2d<2>, flatten<>, linear<32, 10>> (64 inputs).
chain_result host_cnn_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels);

/// Pooling on the host for x [batch, 4, 8, 8] and dy of each output: max_pool2d<2> and
/// avg_pool2d<3, 1, 1> forward y and backward dx.
struct pool_result {
  std::vector<float> max_y, max_dx, avg_y, avg_dx;
};
pool_result host_pool(const std::vector<float>& x, const std::vector<float>& dy_max, const std::vector<float>& dy_avg);

}  // namespace solder::test::blocks
