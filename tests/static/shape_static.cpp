// Static checks of shapes, broadcasting and expression types: this file passes by compiling.
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "solder/expr/reduce.hpp"

namespace {
using namespace solder;

// Extents, sizes and row-major strides.
static_assert(shape<256, 4096>::rank == 2 && shape<256, 4096>::size == 256 * 4096);
static_assert(shape<2, 3, 4>::strides == std::array<std::size_t, 3>{12, 4, 1});
static_assert(shape<>::rank == 0 && shape<>::size == 1);
static_assert(shape<dyn, 64>::dynamic && shape<dyn, 64>::inner_size == 64 && shape<dyn, 64>::elements(3) == 192);
static_assert(Shape<shape<dyn, 4>> && !Shape<shape<4, dyn>> && !Shape<shape<0, 4>>);

// Broadcasting: a bias over rows, a per-channel scale over [C, H, W], scalars, a runtime batch.
static_assert(std::is_same_v<broadcast_t<shape<256, 4096>, shape<4096>>, shape<256, 4096>>);
static_assert(std::is_same_v<broadcast_t<shape<3, 1, 1>, shape<3, 5, 7>>, shape<3, 5, 7>>);
static_assert(std::is_same_v<broadcast_t<shape<>, shape<5>>, shape<5>>);
static_assert(std::is_same_v<broadcast_t<shape<dyn, 64>, shape<64>>, shape<dyn, 64>>);
static_assert(std::is_same_v<broadcast_t<shape<4, 1>, shape<1, 6>>, shape<4, 6>>);
static_assert(!broadcastable<shape<256, 4096>, shape<1024>>);
static_assert(broadcasts_to<shape<4096>, shape<8, 4096>> && !broadcasts_to<shape<8, 4096>, shape<4096>>);

// Expression shapes and value types.
using X = tensor<float, shape<8, 16>>;
using B = tensor<float, shape<16>>;
static_assert(std::is_same_v<shape_of<decltype(relu(std::declval<X&>() + std::declval<B&>()))>, shape<8, 16>>);
static_assert(std::is_same_v<value_of<decltype(std::declval<X&>() * 2)>, float>);  // scalars take the tensor's type
static_assert(std::is_same_v<value_of<decltype(std::declval<X&>() > 0.f)>, bool>);  // comparisons are masks
static_assert(std::is_same_v<shape_of<decltype(sum<0>(std::declval<X&>()))>, shape<16>>);
static_assert(std::is_same_v<shape_of<decltype(sum<1>(std::declval<X&>()))>, shape<8>>);
static_assert(std::is_same_v<shape_of<decltype(sum(std::declval<X&>()))>, shape<>>);
static_assert(std::is_same_v<decltype(sum<0>(std::declval<X&>()))::keep_shape, shape<1, 16>>);
static_assert(std::is_same_v<decltype(sum_to<shape<16>>(std::declval<X&>()))::keep_shape, shape<1, 16>>);
static_assert(Expression<X> && Expression<constant<float>> && !Expression<float>);
}  // namespace
