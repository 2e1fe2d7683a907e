// tests/cuda/linear_chain.hpp: the CPU chain's results that the GPU test of the device
// linear_relu_dropout model behind kernels/linear_relu_dropout.h (linear_chain.cu) compares with,
// computed in linear_chain.host.cpp by the C++ compiler (nvcc does not instantiate the CPU loops).
// Plain std types only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace solder::test::linear_chain {

inline constexpr std::size_t in = 256, out = 512, param_floats = out * in + out;
/// The seed of the model compared, and of another one (reseed, write_params).
inline constexpr std::uint64_t model_seed = 7, other_seed = 8;

/// kernels/chains.hpp's linear_relu_dropout seeded with model_seed on the CPU.
struct reference {
  std::vector<float> params;        // W [out, in], then b [out]: the chain's own initialization
  std::vector<float> y;             // its first training forward, dropout(relu(x W^T + b)) [batch, out]
  std::vector<unsigned char> keep;  // that forward's dropout mask [batch, out]: 1 kept, 0 dropped
  float scale = 0;                  // what kept elements are multiplied by
  std::vector<float> grads;         // dW, then db, for dy after that forward (params() order)
  std::vector<float> y_eval;        // relu(x W^T + b): the forward in evaluation mode
};
reference run(const std::vector<float>& x, const std::vector<float>& dy, std::size_t batch);

/// The parameters chain(seed) draws, flat in params() order.
std::vector<float> initial_params(std::uint64_t seed);
/// The state_dict names and float counts of the chain's parameters, in params() order.
struct param_info {
  std::string name;
  std::size_t floats;
};
std::vector<param_info> layout();
/// The forward in evaluation mode of the chain holding parameters `params`.
std::vector<float> eval_forward(const std::vector<float>& params, const std::vector<float>& x, std::size_t batch);

/// The optimizers compared, with the settings the device model is given too.
struct optimizer_settings {
  enum kind_type { sgd, adam, adamw };
  kind_type kind = sgd;
  float lr = 0.05f, weight_decay = 0.0f;
  float momentum = 0.0f;  // SGD
  bool nesterov = false;  // SGD
};

/// The chain seeded with model_seed and its optimizer, trained with torch's CrossEntropyLoss over
/// the 512 outputs as classes.
class cpu_chain {
 public:
  explicit cpu_chain(const optimizer_settings& opt);
  ~cpu_chain();
  std::vector<float> params() const;
  std::vector<float> grads() const;
  float train_step(const float* x, const std::int32_t* labels, std::size_t rows, float label_smoothing);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace solder::test::linear_chain
