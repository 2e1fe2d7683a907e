// assign.hpp: assignment, for every backend. assign(out, e) and assign_all(write(out, e), ...)
// run one pass (or one product with its epilogue) on the backend of the outputs' memory space:
// executor<cpu> for host tensors, which this header brings (host memory always has the CPU),
// executor<cuda> for device tensors with solder/cuda.hpp.
#pragma once

#include <type_traits>

#include "solder/backend.hpp"
#include "solder/eval/cpu/executor.hpp"
#include "solder/expr/write.hpp"

namespace solder {

/// Evaluates several writes in ONE pass over their common shape, e.g. a gradient and its bias
/// reduction: assign_all(write(dx, g), write(db, sum<0>(g))). Writes holding a matrix product
/// (matmul) run as that product with the writes as its epilogue. Every output lives in one
/// memory space, whose backend runs the pass.
template <class W0, class... Ws>
void assign_all(const W0& w0, const Ws&... ws) {
  using Space = typename decltype(w0.out)::space_type;
  static_assert((std::is_same_v<typename decltype(ws.out)::space_type, Space> && ...),
                "solder::assign_all: every output of one pass must live in the same memory space");
  executor<backend_of_t<Space>>::run(w0, ws...);
}

/// out = e in one pass (e elementwise, broadcast to out's shape, a reduction, or a product
/// with the rest of e as its epilogue).
template <class T, class S, class Space, class E>
void assign(tensor_ref<T, S, Space> out, const E& e) {
  assign_all(write(out, e));
}
template <class T, class S, class Space, class E>
void assign(tensor<T, S, Space>& out, const E& e) {
  assign(out.ref(), e);
}

}  // namespace solder
