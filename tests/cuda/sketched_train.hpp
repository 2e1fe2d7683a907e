// tests/cuda/sketched_train.hpp: the CPU side of sketched_train.cu, computed in
// sketched_train.host.cpp by the C++ compiler (nvcc does not instantiate the CPU loops):
// kernels/chains.hpp's sketched_mlp as the CPU chain trains and runs it, the digits data as
// examples/sketched_mlp.cpp prepares it, and the references the device model behind
// kernels/sketched_mlp.h is compared with. Plain std types only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace solder::test::sketched_train {

inline constexpr std::size_t features = 64, classes = 10, batch = 32;
/// The flat parameter array's size.
inline constexpr std::size_t param_floats = 12938;
/// The example's seeds: the split and the shuffles, and the model's initialization (which also
/// fixes the sketched layers' sign seeds).
inline constexpr std::uint64_t data_seed = 2026, model_seed = 1;

/// examples/data/digits.csv as the example prepares it: pixels / 16, an 80/20 split by data_seed,
/// batches of 32 from a loader that drops the last partial batch, shuffled per epoch.
class digits {
 public:
  digits();
  ~digits();
  /// Batches per epoch.
  std::size_t batches() const;
  /// The training samples of epoch `epoch` in the example's order, every batch of it one after the
  /// other: x [batches() * batch, 64], y [batches() * batch].
  void epoch(int epoch, std::vector<float>& x, std::vector<std::int32_t>& y) const;
  const std::vector<float>& test_x() const;
  const std::vector<std::int32_t>& test_y() const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The optimizers compared: torch.optim.SGD (with momentum, optionally Nesterov's), Adam and
/// AdamW, with the settings the device model is given too.
struct optimizer_settings {
  enum kind_type { sgd, adam, adamw };
  kind_type kind = adamw;
  float lr = 2e-3f, weight_decay = 1e-2f;
  float momentum = 0.0f;  // SGD
  bool nesterov = false;  // SGD
};

/// One parameter tensor as the CPU chain's params() names it.
struct param_info {
  std::string name;
  std::size_t floats;
};

/// sketched_mlp on the CPU: the chain seeded with `seed` and its optimizer.
class cpu_chain {
 public:
  cpu_chain(std::uint64_t seed, const optimizer_settings& opt);
  ~cpu_chain();
  /// The parameters and their last gradients, flat in params() order (the C interface's layout).
  std::vector<float> params() const;
  std::vector<float> grads() const;
  std::vector<param_info> layout() const;
  /// train_step with torch's CrossEntropyLoss (label_smoothing) at learning rate lr; the loss.
  float train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr, float label_smoothing = 0.0f);
  /// The chain's forward of x [rows, 64] in training mode (drawing its dropouts' next masks),
  /// then its backward for dy [rows, 10]: the logits, and grads() holds the gradients.
  std::vector<float> forward_backward(const float* x, const float* dy, std::size_t rows);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The logits [rows, 10] in evaluation mode of the chain seeded with `seed` (its sign sketches)
/// holding parameters `params`.
std::vector<float> eval_forward(std::uint64_t seed, const std::vector<float>& params, const float* x, std::size_t rows);

/// The example's learning rate at each of `steps` steps (warmup + cosine from 2e-3).
std::vector<float> schedule(std::int64_t steps);

/// Held-out accuracy of the chain (model_seed's sketches) with parameters `params`, in evaluation mode.
double accuracy(const std::vector<float>& params, const std::vector<float>& x, const std::vector<std::int32_t>& y);

}  // namespace solder::test::sketched_train
