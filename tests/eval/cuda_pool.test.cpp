// tests/eval/cuda_pool.test.cpp: eval/cuda/pool.hpp stands on ops/ alone: included first, it
// brings neither the CPU backend (xsimd, OpenMP) nor the layers' planning code (Boost.Hana),
// which nvcc must not compile into device code; and its flat-index bodies on known values (the
// comparison with the CPU layers over whole images is tests/eval/cuda_image.test.cpp's).
#include "solder/eval/cuda/pool.hpp"

#if defined(XSIMD_HPP)
#error "solder/eval/cuda/pool.hpp brings xsimd (the CPU backend) into CUDA translation units"
#endif
#if defined(BOOST_HANA_HPP) || defined(BOOST_HANA_CONFIG_HPP)
#error "solder/eval/cuda/pool.hpp brings Boost.Hana into CUDA translation units"
#endif

#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

namespace {

namespace cu = solder::eval::cuda;
using solder::ops::pool2d::geometry;
using solder::ops::pool2d::index;

}  // namespace

TEST_CASE("cuda pooling bodies: the flat index of [batch, C, rows, cols]", "[cuda][pool]") {
  // [2, 3, 4, 5]: k = ((n C + c) rows + i) cols + j.
  std::size_t k = 0;
  for (index n = 0; n < 2; ++n)
    for (index c = 0; c < 3; ++c)
      for (index i = 0; i < 4; ++i)
        for (index j = 0; j < 5; ++j, ++k) {
          const cu::plane_index p(k, 3, 4, 5);
          CHECK((p.n == n && p.c == c && p.i == i && p.j == j));
        }
}

TEST_CASE("cuda pooling bodies: every output of a max pool and every input of its backward", "[cuda][pool]") {
  // Two planes [2, 1, 2, 4] (batch 2, C 1), K = S = 2: windows of columns {0, 1} and {2, 3}.
  const geometry g{1, 2, 4, 1, 2, 2, 2, 0};
  const std::vector<float> x = {1, 4, 0, -2,  //
                                3, 2, -1, -3,  //
                                7, 7, 5, 6,  //
                                7, 8, 6, 5};
  std::vector<float> y(4), dx(16, -1.0f);
  std::vector<std::int32_t> argmax(4);
  const cu::pool_forward_body<cu::pool_kind::max> forward{x.data(), y.data(), argmax.data(), g, true};
  for (std::size_t k = 0; k < y.size(); ++k) forward(k);
  CHECK(y == std::vector<float>{4, 0, 8, 6});
  CHECK(argmax == std::vector<std::int32_t>{1, 2, 5, 3});  // ties: the first, row-major (7, 7; 6, 6)
  const std::vector<float> dy = {10, 20, 30, 40};
  const cu::pool_backward_body<cu::pool_kind::max> backward{dy.data(), argmax.data(), dx.data(), g, true};
  for (std::size_t k = 0; k < dx.size(); ++k) backward(k);
  CHECK(dx == std::vector<float>{0, 10, 20, 0, 0, 0, 0, 0,  //
                                 0, 0, 0, 40, 0, 30, 0, 0});
}
