// tests/cuda/digits_cnn_train.hpp: the CPU side of digits_cnn_train.cu, computed in
// digits_cnn_train.host.cpp by the C++ compiler (nvcc does not instantiate the CPU loops):
// kernels/chains.hpp's digits_cnn as the CPU chain trains and runs it, the digits data as
// examples/digits_cnn.cpp prepares it, and the references the device model behind
// kernels/digits_cnn.h is compared with. Plain std types only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace solder::test::digits_cnn_train {

inline constexpr std::size_t features = 64, classes = 10, batch = 32;
/// The flat parameter array's size, and the buffers' (the batch_norms' running statistics).
inline constexpr std::size_t param_floats = 10026, buffer_floats = 96;
/// The example's seeds: the split and the shuffles, and the model's initialization.
inline constexpr std::uint64_t data_seed = 2026, model_seed = 1;

/// examples/data/digits.csv as the example prepares it: pixels / 16, an 80/20 split by
/// data_seed, batches of 32 that drop the last partial batch, shuffled per epoch.
class digits {
 public:
  digits();
  ~digits();
  std::size_t batches() const;
  /// The training samples of epoch `epoch` in the example's order: x [batches() * batch, 64], y.
  void epoch(int epoch, std::vector<float>& x, std::vector<std::int32_t>& y) const;
  const std::vector<float>& test_x() const;
  const std::vector<std::int32_t>& test_y() const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The optimizers compared: torch.optim.SGD with momentum and AdamW, with the settings the
/// device model is given too.
struct optimizer_settings {
  enum kind_type { sgd, adam, adamw };
  kind_type kind = adamw;
  float lr = 3e-3f, weight_decay = 1e-2f;
  float momentum = 0.0f;  // SGD
};

/// One parameter tensor as the CPU chain's params() names it.
struct param_info {
  std::string name;
  std::size_t floats;
};

/// digits_cnn on the CPU: the chain seeded with `seed` and its optimizer.
class cpu_chain {
 public:
  cpu_chain(std::uint64_t seed, const optimizer_settings& opt);
  ~cpu_chain();
  /// Parameters and last gradients, flat in params() order, and the running statistics in
  /// buffers() order (the C interface's layouts).
  std::vector<float> params() const;
  std::vector<float> grads() const;
  std::vector<float> buffers() const;
  std::vector<param_info> layout() const;
  /// train_step with the cross-entropy at learning rate lr; the loss.
  float train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr);
  /// The logits of x [rows, 64] in training mode (the dropout drawing its next mask, the
  /// running statistics moved), then with dy [rows, 10] (non-null) the backward into grads().
  std::vector<float> forward_backward(const float* x, const float* dy, std::size_t rows);
  /// The chain's set_first_sample: the next batches are samples [s, s + rows) of a larger one.
  void set_first_sample(std::uint64_t s);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The logits [rows, 10] of the chain with parameters `params` and running statistics
/// `buffers`, in evaluation mode (batch_norm folded).
std::vector<float> eval_forward(const std::vector<float>& params, const std::vector<float>& buffers, const float* x,
                                std::size_t rows);

/// The example's learning rate at each of `steps` steps (warmup + cosine from 3e-3).
std::vector<float> schedule(std::int64_t steps);

/// Held-out accuracy of the chain with parameters `params` and running statistics `buffers`,
/// in evaluation mode.
double accuracy(const std::vector<float>& params, const std::vector<float>& buffers, const std::vector<float>& x,
                const std::vector<std::int32_t>& y);

}  // namespace solder::test::digits_cnn_train
