// tests/cuda/sketched_train.hpp: the CPU side of sketched_train.cu, computed in
// sketched_train.host.cpp by the C++ compiler (nvcc does not instantiate the CPU loops):
// kernels/chains.hpp's sketched_mlp trained by the CPU chain, the digits data as
// examples/sketched_mlp.cpp prepares it, and the references the generated launchers are compared
// with. Plain std types only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace solder::test::sketched_train {

inline constexpr std::size_t features = 64, classes = 10, batch = 32;
/// Per row of the launchers' `hidden`: group 0's h [32] and output [256], group 1's h [32] and
/// output [128], in that order; the flat parameter array's size.
inline constexpr std::size_t h0 = 32, hidden0 = 256, h1 = 32, hidden1 = 128;
inline constexpr std::size_t hidden_floats = h0 + hidden0 + h1 + hidden1, param_floats = 12938;
/// The example's seeds: the split and the shuffles, and the model's initialization (which also
/// fixes the sketched layers' sign seeds).
inline constexpr std::uint64_t data_seed = 2026, model_seed = 1;

/// examples/data/digits.csv as the example prepares it: pixels / 16, an 80/20 split by data_seed,
/// batches of 32 that drop the last partial batch, shuffled per epoch.
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

struct optimizer_settings {
  bool adamw = true;
  float lr = 2e-3f, weight_decay = 1e-2f;
  float momentum = 0.0f;  // SGD
};

/// sketched_mlp on the CPU, seeded with model_seed, and its optimizer.
class cpu_chain {
 public:
  explicit cpu_chain(const optimizer_settings& opt);
  ~cpu_chain();
  /// Parameters and last gradients, flat in params() order (as the launchers lay them out).
  std::vector<float> params() const;
  std::vector<float> grads() const;
  /// The dropouts' streams (layers 2 and 5) as they stand, and the sketched layers' (0 and 3)
  /// sketch seeds.
  std::vector<std::uint64_t> seeds() const;
  std::vector<std::uint64_t> offsets() const;
  std::vector<std::uint64_t> sketch_seeds() const;
  float train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

/// The CPU chain's training forward of x [rows, 64] with parameters `params`, its dropouts drawing
/// (seeds[i], offsets[i]): `hidden` laid out as the launchers' (h = x [S1 | U2] of each sketched
/// layer from sketched_linear::first_product, each group's output from its block's forward), and
/// the logits [rows, 10].
struct forward_result {
  std::vector<float> hidden, logits;
};
forward_result forward(const std::vector<float>& params, const float* x, std::size_t rows,
                       const std::vector<std::uint64_t>& seeds, const std::vector<std::uint64_t>& offsets);

/// The first sketched block alone (sketched_linear<64, 256, 2, 8>, relu, dropout), with the CPU
/// chain's initial parameters: training forward of x [rows, 64] drawing (seed, offset), then its
/// backward for dy [rows, 256].
struct block_result {
  std::vector<float> s1, s2, b;      // the parameters used
  std::uint64_t sketch_seed = 0;
  std::vector<float> y, dx, ds1, ds2, db;
};
block_result first_block(const std::vector<float>& x, const std::vector<float>& dy, std::size_t rows, std::uint64_t seed,
                         std::uint64_t offset);

/// The mask nn::dropout<0.1f> draws from stream (seed, offset) over [rows, width]: 1 kept, 0 dropped.
std::vector<unsigned char> dropout_mask(std::uint64_t seed, std::uint64_t offset, std::size_t rows, std::size_t width);

/// The example's learning rate at each of `steps` steps (warmup + cosine from 2e-3).
std::vector<float> schedule(std::int64_t steps);

/// Held-out accuracy of the chain (model_seed's sketches) with parameters `params`, in evaluation mode.
double accuracy(const std::vector<float>& params, const std::vector<float>& x, const std::vector<std::int32_t>& y);

}  // namespace solder::test::sketched_train
