// tests/expr/same.test.cpp: same_expression, the check a pass makes before it evaluates an
// expression once for several writes: true only for the same tensors, constants, masks and op
// parameters.
#include <catch2/catch.hpp>

#include "solder/solder.hpp"

namespace {

using solder::shape;
using solder::tensor;

}  // namespace

TEST_CASE("same_expression: tensors, constants and op parameters", "[expr][same]") {
  tensor<float, shape<4, 8>> a, b;
  tensor<float, shape<8>> bias;
  CHECK(solder::same_expression(solder::as_expr(a), solder::as_expr(a)));
  CHECK_FALSE(solder::same_expression(solder::as_expr(a), solder::as_expr(b)));
  CHECK(solder::same_expression(solder::relu(a + bias), solder::relu(a + bias)));
  CHECK_FALSE(solder::same_expression(solder::relu(a + bias), solder::relu(b + bias)));
  CHECK(solder::same_expression(a * 2.0f, a * 2.0f));
  CHECK_FALSE(solder::same_expression(a * 2.0f, a * 3.0f));
  CHECK_FALSE(solder::same_expression(a * 0.0f, a * -0.0f));  // different bits: not called the same
  CHECK(solder::same_expression(solder::map(solder::ops::leaky_relu{0.1f}, a), solder::map(solder::ops::leaky_relu{0.1f}, a)));
  CHECK_FALSE(solder::same_expression(solder::map(solder::ops::leaky_relu{0.1f}, a), solder::map(solder::ops::leaky_relu{0.2f}, a)));
  using grad = solder::ops::gradient_from_output<solder::ops::relu, true>;
  STATIC_REQUIRE(sizeof(grad) == sizeof(float));  // no padding for the byte comparison to trip on
  CHECK(solder::same_expression(solder::map(grad{{}, 1.25f}, a, b), solder::map(grad{{}, 1.25f}, a, b)));
  CHECK_FALSE(solder::same_expression(solder::map(grad{{}, 1.25f}, a, b), solder::map(grad{{}, 1.5f}, a, b)));
  CHECK_FALSE(solder::same_expression(solder::map(grad{{}, 1.25f}, a, b), solder::map(grad{{}, 1.25f}, b, a)));
}

TEST_CASE("same_expression: dropout masks and batch sizes", "[expr][same]") {
  using S = shape<solder::dyn, 8>;
  const solder::philox_state rng{1, 2, 3};
  const auto m = solder::dropout_mask<S>::with_p(0.1f, rng, 5);
  CHECK(solder::same_expression(m, m));
  CHECK_FALSE(solder::same_expression(m, solder::dropout_mask<S>::with_p(0.2f, rng, 5)));
  CHECK_FALSE(solder::same_expression(m, solder::dropout_mask<S>::with_p(0.1f, rng, 6)));
  CHECK_FALSE(solder::same_expression(m, solder::dropout_mask<S>::with_p(0.1f, solder::philox_state{1, 2, 4}, 5)));
  solder::philox_state ten = rng;
  ten.rounds = 10;
  CHECK_FALSE(solder::same_expression(m, solder::dropout_mask<S>::with_p(0.1f, ten, 5)));
  tensor<float, S> x(5);
  const float* p = x.data();
  const solder::tensor_ref<const float, S> five(p, 5), three(p, 3);
  CHECK(solder::same_expression(five, five));
  CHECK_FALSE(solder::same_expression(five, three));
}
