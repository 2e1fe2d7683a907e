// The CUDA backend reduces to columns (a bias gradient) or to a scalar; a row sum is refused
// with a message instead of a wrong kernel.
// MESSAGE[solder: the CUDA backend reduces over every axis but the last]
#include "solder/eval/cuda/pass.hpp"
#include "solder/expr/operators.hpp"
#include "solder/expr/reduce.hpp"

struct runner {
  template <class P> void flat(P&) {}
  template <class P, class I> void columns(P&, I) {}
  template <class P, class I> void all(P&, I) {}
};

int main() {
  solder::tensor_ref<const float, solder::shape<4, 8>, solder::device> x(nullptr);
  solder::tensor_ref<float, solder::shape<4>, solder::device> rows(nullptr);
  runner r;
  solder::eval::cuda::dispatch(r, solder::write(rows, solder::sum<1>(x * 2.0f)));
}
