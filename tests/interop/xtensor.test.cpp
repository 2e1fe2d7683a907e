// Tests for interop/xtensor.hpp: copies to and from xtensor types, and adaptor views.
#include <catch2/catch.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>

#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "solder/interop/xtensor.hpp"

using namespace solder;

namespace {
template <class T>
void iota_fill(T& t) {
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f * float(i) - 3.0f;
}
}  // namespace

TEST_CASE("copies out to xtensor, xtensor_fixed and xarray keep shape and row-major order", "[interop]") {
  tensor<float, shape<3, 5>> a;
  iota_fill(a);
  auto x = to_xtensor(a);
  auto xf = to_xtensor_fixed(a);
  auto xa = to_xarray(a);
  REQUIRE(x.shape()[0] == 3);
  REQUIRE(x.shape()[1] == 5);
  REQUIRE(xa.dimension() == 2);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j) {
      CHECK(x(i, j) == a(i, j));
      CHECK(xf(i, j) == a(i, j));
      CHECK(xa(i, j) == a(i, j));
    }
  // A copy: later writes to the solder tensor do not show.
  a(0, 0) = 100.0f;
  CHECK(x(0, 0) == -3.0f);
}

TEST_CASE("copies in from xtensor expressions, static and dynamic batch", "[interop]") {
  xt::xtensor<float, 2> src = xt::zeros<float>({4, 6});
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 6; ++j) src(i, j) = float(i * 10 + j);

  auto s = from_xtensor<shape<4, 6>>(src);
  auto d = from_xtensor<shape<dyn, 6>>(src * 2.0f);  // a lazy xtensor expression
  REQUIRE(d.batch() == 4);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 6; ++j) {
      CHECK(s(i, j) == src(i, j));
      CHECK(d(i, j) == 2.0f * src(i, j));
    }

  // A column-major source is read in its logical order.
  xt::xtensor<float, 2, xt::layout_type::column_major> cm = src;
  auto c = from_xtensor<shape<4, 6>>(cm);
  CHECK(c(2, 3) == 23.0f);
}

TEST_CASE("copying in an xtensor of the wrong shape is a runtime error naming both shapes", "[interop]") {
  xt::xtensor<float, 2> src = xt::zeros<float>({4, 6});
  tensor<float, shape<4, 5>> t;
  t.fill(7.0f);
  CHECK_THROWS_WITH(copy_from(src, t),
                    Catch::Matchers::Contains("[4, 6]") && Catch::Matchers::Contains("[4, 5]"));
  CHECK(t(0, 0) == 7.0f);  // left unchanged
  tensor<float, shape<dyn, 6>> d(3);
  CHECK_THROWS_AS(copy_from(src, d), solder::error);
}

TEST_CASE("as_xtensor views solder storage without copying", "[interop]") {
  tensor<float, shape<2, 3>> a;
  iota_fill(a);
  auto v = as_xtensor(a);
  v(1, 2) = 42.0f;
  CHECK(a(1, 2) == 42.0f);
  CHECK(v.data() == a.data());

  tensor<float, shape<dyn, 3>> d(4);
  auto vd = as_xtensor(d);
  REQUIRE(vd.shape()[0] == 4);
  vd(3, 1) = 5.0f;
  CHECK(d(3, 1) == 5.0f);

  // A solder result read through xtensor math.
  tensor<float, shape<2, 3>> y = relu(a);
  CHECK(xt::sum(as_xtensor(y))() == 42.0f);  // the other five entries are negative: relu gives exactly 0
}
