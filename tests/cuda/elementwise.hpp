// tests/cuda/elementwise.hpp: the CPU backend's results the GPU test of the fused passes
// compares with, computed in elementwise.host.cpp by the C++ compiler.
#pragma once

#include <cstddef>

#include "solder/expr/operators.hpp"
#include "solder/expr/random.hpp"
#include "solder/tensor.hpp"

namespace solder::test::cuda_reference {

inline constexpr philox_state rng{0xfeedULL, 3};

/// y = dropout(relu(x + b), 0.1) and dx = (y > 0 ? dy * 1.1111 : 0), on the CPU.
void bias_relu_dropout(const tensor<float, shape<dyn, 4096>>& x, const tensor<float, shape<4096>>& b,
                       const tensor<float, shape<dyn, 4096>>& dy, tensor<float, shape<dyn, 4096>>& y,
                       tensor<float, shape<dyn, 4096>>& dx);
void bias_relu_dropout(const tensor<float, shape<dyn, 100>>& x, const tensor<float, shape<100>>& b,
                       const tensor<float, shape<dyn, 100>>& dy, tensor<float, shape<dyn, 100>>& y,
                       tensor<float, shape<dyn, 100>>& dx);
/// y = dropout(tanh(x) * b + exp(x / 4), 0.5).
void odd(const tensor<float, shape<dyn, 10>>& x, const tensor<float, shape<10>>& b, tensor<float, shape<dyn, 10>>& y);
/// y = dropout(x, 0.5).
void drop(const tensor<float, shape<4096>>& x, tensor<float, shape<4096>>& y);

/// Columns of the vector and element paths' comparison: a multiple of 4, so that a pass may
/// take 16-byte accesses with a broadcast operand (eval/cuda/pass.hpp, dispatch); rows of 10 as
/// in `odd` never do, and both runs would take the element path.
inline constexpr std::size_t path_cols = 12;
/// The paths' expression: dropout(tanh(x) b + exp(x / 4), 0.5), b broadcast along the rows.
template <class X, class B>
auto paths_expr(const X& x, const B& b) {
  return dropout(tanh(x) * b + exp(x * 0.25f), 0.5f, rng);
}
/// y = paths_expr(x, b) on the CPU.
void paths(const tensor<float, shape<dyn, path_cols>>& x, const tensor<float, shape<path_cols>>& b,
           tensor<float, shape<dyn, path_cols>>& y);

}  // namespace solder::test::cuda_reference
