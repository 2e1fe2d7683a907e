// tests/cuda/linear_chain.hpp: the CPU chain's results that the GPU test of the generated
// linear_relu_dropout launchers (linear_chain.cu) compares with, computed in
// linear_chain.host.cpp by the C++ compiler (nvcc does not instantiate the CPU loops).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace solder::test::linear_chain {

inline constexpr std::size_t in = 256, out = 512;

/// kernels/chains.hpp's linear_relu_dropout on the CPU, in training mode.
struct reference {
  std::vector<float> w, b;        // W [out, in], b [out]: the chain's own initialization
  std::vector<float> y;           // dropout(relu(x W^T + b)) [batch, out]
  std::vector<unsigned char> keep;  // the dropout's mask [batch, out]: 1 kept, 0 dropped
  float scale = 0;                // what kept elements are multiplied by
  std::vector<float> dx, dw, db;  // the gradients for dy: [batch, in], [out, in], [out]
};

/// The chain's forward of x [batch, in] with its dropout drawing Philox stream (seed, offset),
/// then its backward for dy [batch, out] (dx by the linear block's backward, which the chain
/// skips for its first layer).
reference run(const std::vector<float>& x, const std::vector<float>& dy, std::size_t batch, std::uint64_t seed,
              std::uint64_t offset);

}  // namespace solder::test::linear_chain
