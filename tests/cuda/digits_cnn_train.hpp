// tests/cuda/digits_cnn_train.hpp: the CPU side of digits_cnn_train.cu, computed in
// digits_cnn_train.host.cpp by the C++ compiler (nvcc does not instantiate the CPU loops):
// kernels/chains.hpp's digits_cnn trained by the CPU chain, the digits data as
// examples/digits_cnn.cpp prepares it, and the references the generated launchers are compared
// with. Plain std types only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace solder::test::digits_cnn_train {

inline constexpr std::size_t features = 64, classes = 10, batch = 32;
/// Per row of the launchers' `hidden` (kernels/digits_cnn.h): z0 [1024] (the first batch_norm's
/// input), y0 [1024], z1 [2048], y1 [2048], the pool's output [512] and argmax [512], the dropout's
/// output [512]; the parameter and buffer arrays' sizes.
inline constexpr std::size_t z0_at = 0, y0_at = 1024, z1_at = 2048, y1_at = 4096, pool_at = 6144, argmax_at = 6656,
                             dropout_at = 7168, hidden_floats = 7680;
inline constexpr std::size_t param_floats = 10026, buffer_floats = 192, running_floats = 96;
/// The example's seeds: the split and the shuffles, and the model's initialization.
inline constexpr std::uint64_t data_seed = 2026, model_seed = 1;

class digits {
 public:
  digits();
  ~digits();
  std::size_t batches() const;
  void epoch(int epoch, std::vector<float>& x, std::vector<std::int32_t>& y) const;
  const std::vector<float>& test_x() const;
  const std::vector<std::int32_t>& test_y() const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

struct optimizer_settings {
  bool adamw = true;
  float lr = 3e-3f, weight_decay = 1e-2f;
  float momentum = 0.0f;  // SGD
};

/// digits_cnn on the CPU, seeded with model_seed, and its optimizer.
class cpu_chain {
 public:
  explicit cpu_chain(const optimizer_settings& opt);
  ~cpu_chain();
  std::vector<float> params() const;
  std::vector<float> grads() const;
  /// The batch_norms' running statistics in buffers() order (the first running_floats of the
  /// launchers' `buffers`).
  std::vector<float> running() const;
  std::vector<std::uint64_t> seeds() const;  // the dropout's (layer 8)
  std::vector<std::uint64_t> offsets() const;
  float train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The CPU blocks' training forward of x [rows, 64] with parameters `params` and running
/// statistics `running`, the dropout drawing (seed, offset): `hidden` laid out as the launchers'
/// (z from each conv_block's convolution alone, each block's output; the argmax rows left 0), the
/// logits, and the running statistics after it.
struct forward_result {
  std::vector<float> hidden, logits, running;
};
forward_result forward(const std::vector<float>& params, const std::vector<float>& running, const float* x,
                       std::size_t rows, std::uint64_t seed, std::uint64_t offset);

/// The second convolution block alone (conv2d<16, 32, 3, 3, 1, 1>, batch_norm<32>, relu) with the
/// CPU chain's initial parameters and its batch_norm's weight and bias set from bn_weight and
/// bn_bias: the training forward of x [rows, 16, 8, 8] and its backward for dy; then, from the
/// running statistics that forward left, the evaluation forward (batch_norm folded).
struct block_result {
  std::vector<float> w, b, y, dx, dw, db, dbn_weight, dbn_bias, running_mean, running_var, y_eval;
};
block_result second_block(const std::vector<float>& x, const std::vector<float>& dy, std::size_t rows,
                          const std::vector<float>& bn_weight, const std::vector<float>& bn_bias);

std::vector<unsigned char> dropout_mask(std::uint64_t seed, std::uint64_t offset, std::size_t rows);

/// The example's learning rate at each of `steps` steps (warmup + cosine from 3e-3).
std::vector<float> schedule(std::int64_t steps);

/// Held-out accuracy of the chain with parameters `params` and running statistics `running`,
/// in evaluation mode (batch_norm folded).
double accuracy(const std::vector<float>& params, const std::vector<float>& running, const std::vector<float>& x,
                const std::vector<std::int32_t>& y);

}  // namespace solder::test::digits_cnn_train
