// tests/cuda/digits_train.hpp: the CPU side of digits_train.cu, computed in digits_train.host.cpp
// by the C++ compiler (nvcc does not instantiate the CPU loops): kernels/chains.hpp's digits_mlp
// trained by the CPU chain, the digits data as examples/digits_mlp.cpp prepares it, and the
// references the generated chain-level launchers are compared with. Plain std types only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace solder::test::digits_train {

inline constexpr std::size_t features = 64, classes = 10, batch = 32;
/// Features per sample of the two hidden outputs, and the flat parameter array's size.
inline constexpr std::size_t hidden0 = 256, hidden1 = 128, param_floats = 50826;
/// The demo's seeds: the split and the shuffles, and the model's initialization.
inline constexpr std::uint64_t data_seed = 2026, model_seed = 1;

/// examples/data/digits.csv as the demo prepares it: pixels / 16, an 80/20 split by data_seed,
/// batches of 32 from a loader that drops the last partial batch, shuffled per epoch.
class digits {
 public:
  digits();
  ~digits();
  /// Batches per epoch.
  std::size_t batches() const;
  /// The training samples of epoch `epoch` in the demo's order, every batch of it one after the
  /// other: x [batches() * batch, 64], y [batches() * batch].
  void epoch(int epoch, std::vector<float>& x, std::vector<std::int32_t>& y) const;
  const std::vector<float>& test_x() const;
  const std::vector<std::int32_t>& test_y() const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The optimizers compared: torch.optim.SGD with momentum, and AdamW.
struct optimizer_settings {
  bool adamw = true;
  float lr = 2e-3f, weight_decay = 1e-2f;
  float momentum = 0.0f;  // SGD
};

/// digits_mlp on the CPU: the chain seeded with `seed` and its optimizer.
class cpu_chain {
 public:
  cpu_chain(std::uint64_t seed, const optimizer_settings& opt);
  ~cpu_chain();
  /// The parameters and their last gradients, flat in params() order (as the launchers lay them out).
  std::vector<float> params() const;
  std::vector<float> grads() const;
  /// The dropouts' streams (layers 2 and 5), as they stand.
  std::vector<std::uint64_t> seeds() const;
  std::vector<std::uint64_t> offsets() const;
  /// train_step with the cross-entropy at learning rate lr; returns the loss.
  float train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The two hidden outputs of the CPU chain's training forward of x [rows, 64] with parameters
/// `params`, its dropouts drawing (seeds[i], offsets[i]): [rows, 256] then [rows, 128], as the
/// launchers' `hidden`.
std::vector<float> hidden(const std::vector<float>& params, const float* x, std::size_t rows,
                          const std::vector<std::uint64_t>& seeds, const std::vector<std::uint64_t>& offsets);

/// The mask nn::dropout<0.1f> draws from stream (seed, offset) over [rows, width]: 1 kept, 0 dropped.
std::vector<unsigned char> dropout_mask(std::uint64_t seed, std::uint64_t offset, std::size_t rows, std::size_t width);

/// The demo's learning rate at each of `steps` steps (warmup + cosine from 2e-3).
std::vector<float> demo_schedule(std::int64_t steps);

/// Held-out accuracy of the chain with parameters `params` in evaluation mode.
double accuracy(const std::vector<float>& params, const std::vector<float>& x, const std::vector<std::int32_t>& y);

}  // namespace solder::test::digits_train
