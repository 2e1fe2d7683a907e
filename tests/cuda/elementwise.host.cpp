// tests/cuda/elementwise.host.cpp: the CPU backend's side of tests/cuda/elementwise.cu.
#include "elementwise.hpp"

#include "solder/solder.hpp"

namespace solder::test::cuda_reference {

namespace {
template <std::size_t N>
void brd(const tensor<float, shape<dyn, N>>& x, const tensor<float, shape<N>>& b, const tensor<float, shape<dyn, N>>& dy,
         tensor<float, shape<dyn, N>>& y, tensor<float, shape<dyn, N>>& dx) {
  y = dropout(relu(x + b), 0.1f, rng);
  dx = where(y > 0.0f, dy * 1.1111f, 0.0f);
}
}  // namespace

void bias_relu_dropout(const tensor<float, shape<dyn, 4096>>& x, const tensor<float, shape<4096>>& b,
                       const tensor<float, shape<dyn, 4096>>& dy, tensor<float, shape<dyn, 4096>>& y,
                       tensor<float, shape<dyn, 4096>>& dx) {
  brd(x, b, dy, y, dx);
}
void bias_relu_dropout(const tensor<float, shape<dyn, 100>>& x, const tensor<float, shape<100>>& b,
                       const tensor<float, shape<dyn, 100>>& dy, tensor<float, shape<dyn, 100>>& y,
                       tensor<float, shape<dyn, 100>>& dx) {
  brd(x, b, dy, y, dx);
}
void odd(const tensor<float, shape<dyn, 10>>& x, const tensor<float, shape<10>>& b, tensor<float, shape<dyn, 10>>& y) {
  y = dropout(tanh(x) * b + exp(x * 0.25f), 0.5f, rng);
}
void drop(const tensor<float, shape<4096>>& x, tensor<float, shape<4096>>& y) { y = dropout(x, 0.5f, rng); }
void paths(const tensor<float, shape<dyn, path_cols>>& x, const tensor<float, shape<path_cols>>& b,
           tensor<float, shape<dyn, path_cols>>& y) {
  y = paths_expr(x, b);
}

}  // namespace solder::test::cuda_reference
