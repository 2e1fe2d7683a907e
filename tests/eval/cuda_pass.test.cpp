// tests/eval/cuda_pass.test.cpp: the CUDA backend's fused passes (eval/cuda/pass.hpp), run over
// whole grids on the host (support/grid.hpp), against the CPU backend and double references:
// the flat and column walks, the vector and element paths, tails, broadcasting, the dropout
// masks (equal to the CPU's bit for bit), and the fixed order of every reduction.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/eval/cuda/pass.hpp"
#include "solder/expr/operators.hpp"
#include "solder/expr/reduce.hpp"
#include "support/data.hpp"
#include "support/device_view.hpp"
#include "support/grid.hpp"

namespace {

using namespace solder;
using solder::test::bit_differences;
using solder::test::host_runner;

using solder::test::dev;
using solder::test::dev_out;

template <class... W>
host_runner run(const W&... w) {
  host_runner r;
  eval::cuda::dispatch(r, w...);
  return r;
}

constexpr philox_state rng{0x1234abcdULL, 7};

}  // namespace

TEST_CASE("cuda pass: bias + relu + dropout equals the CPU bit for bit, vector and element paths", "[cuda][pass]") {
  using S = shape<dyn, 4096>;
  const std::size_t batch = 5;
  auto x = test::make<S>(batch);
  tensor<float, shape<4096>> b;
  test::fill_uniform(x, -2, 2, 1);
  test::fill_uniform(b, -1, 1, 2);
  // Special values reach the op's NaN/Inf rules through the same body.
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[200] = std::numeric_limits<float>::infinity();
  x[201] = -std::numeric_limits<float>::infinity();

  tensor<float, S> cpu = dropout(relu(x + b), 0.3f, rng);

  auto gpu = test::make<S>(batch);
  const auto r = run(write(dev_out(gpu), dropout(relu(dev(x) + dev(b)), 0.3f, rng)));
  {
    // A 10-round stream: its own masks, the same on both sides.
    const philox_state ten{rng.seed, rng.offset, 0, 10};
    tensor<float, S> cpu10 = dropout(relu(x + b), 0.3f, ten);
    auto gpu10 = test::make<S>(batch);
    run(write(dev_out(gpu10), dropout(relu(dev(x) + dev(b)), 0.3f, ten)));
    CHECK(bit_differences(cpu10.data(), gpu10.data(), cpu10.size()) == 0);
    CHECK(bit_differences(cpu10.data(), cpu.data(), cpu.size()) > cpu.size() / 20);
  }
  CHECK(r.flats == 1);
  CHECK(r.last_vector);
  CHECK(bit_differences(cpu.data(), gpu.data(), cpu.size()) == 0);

  // A view one element into its buffer is not 16-byte aligned: the element path, same bits.
  std::vector<float> xs(x.size() + 1), ys(x.size() + 1, -1.0f);
  std::memcpy(xs.data() + 1, x.data(), x.size() * sizeof(float));
  tensor_ref<const float, S, device> xu(xs.data() + 1, batch);
  tensor_ref<float, S, device> yu(ys.data() + 1, batch);
  const auto ru = run(write(yu, dropout(relu(xu + dev(b)), 0.3f, rng)));
  CHECK(!ru.last_vector);
  CHECK(bit_differences(cpu.data(), ys.data() + 1, cpu.size()) == 0);
  CHECK(ys[0] == -1.0f);  // nothing written before the view

  // A grid smaller than the items: threads stride over them, same result.
  auto strided = test::make<S>(batch);
  host_runner small;
  small.grid_threads = 7;
  eval::cuda::dispatch(small, write(dev_out(strided), dropout(relu(dev(x) + dev(b)), 0.3f, rng)));
  CHECK(bit_differences(cpu.data(), strided.data(), cpu.size()) == 0);
}

TEST_CASE("cuda pass: tails, odd widths and broadcasting match the CPU", "[cuda][pass]") {
  SECTION("rows of 10 with a bias: four elements may span two rows, so the element path") {
    using S = shape<dyn, 10>;
    auto x = test::make<S>(13);
    tensor<float, shape<10>> b;
    test::fill_uniform(x, -3, 3, 3);
    test::fill_uniform(b, -1, 1, 4);
    tensor<float, S> cpu = dropout(exp(x * 0.5f) - b, 0.5f, rng);
    auto gpu = test::make<S>(13);
    const auto r = run(write(dev_out(gpu), dropout(exp(dev(x) * 0.5f) - dev(b), 0.5f, rng)));
    CHECK(!r.last_vector);
    CHECK(test::ulp_differences(cpu.data(), gpu.data(), cpu.size()) == 0);
  }
  SECTION("same shapes of odd width: the flat walk keeps 16-byte accesses, with a partial last vector") {
    using S = shape<7, 3, 5>;  // 105 elements: one partial tile, a partial vector
    tensor<float, S> x, y;
    test::fill_uniform(x, -3, 3, 5);
    test::fill_uniform(y, -3, 3, 6);
    tensor<float, S> cpu = dropout(tanh(x) * y + 1.0f, 0.25f, rng);
    tensor<float, S> gpu;
    gpu.fill(-7.0f);
    const auto r = run(write(dev_out(gpu), dropout(tanh(dev(x)) * dev(y) + 1.0f, 0.25f, rng)));
    CHECK(r.last_vector);
    CHECK(test::ulp_differences(cpu.data(), gpu.data(), cpu.size()) == 0);
  }
  SECTION("rank 3 with operands broadcast along the middle and the last axis") {
    using S = shape<4, 6, 8>;
    tensor<float, S> x;
    tensor<float, shape<4, 1, 8>> a;
    tensor<float, shape<6, 1>> c;
    test::fill_uniform(x, -1, 1, 7);
    test::fill_uniform(a, -1, 1, 8);
    test::fill_uniform(c, -1, 1, 9);
    tensor<float, S> cpu = x * a + c;
    tensor<float, S> gpu;
    const auto r = run(write(dev_out(gpu), dev(x) * dev(a) + dev(c)));
    CHECK(r.last_vector);  // rows of 8: a vector never leaves its row
    CHECK(test::ulp_differences(cpu.data(), gpu.data(), cpu.size()) == 0);
  }
  SECTION("a mask broadcast over rows draws each element's bits alone, as the CPU's") {
    using S = shape<9, 40>;
    tensor<float, S> x;
    test::fill_uniform(x, -1, 1, 10);
    const auto keep = dropout_mask<shape<1, 40>>::with_p(0.5f, rng);
    tensor<float, S> cpu = map(ops::dropout{float(keep.scale())}, keep, x);
    tensor<float, S> gpu;
    run(write(dev_out(gpu), map(ops::dropout{float(keep.scale())}, keep, dev(x))));
    CHECK(bit_differences(cpu.data(), gpu.data(), cpu.size()) == 0);
  }
  SECTION("several outputs in one pass") {
    using S = shape<dyn, 300>;
    auto x = test::make<S>(3);
    test::fill_uniform(x, -2, 2, 11);
    tensor<float, S> c1 = dropout(x, 0.1f, rng), c2 = sigmoid(x);
    auto g1 = test::make<S>(3), g2 = test::make<S>(3);
    const auto r = run(write(dev_out(g1), dropout(dev(x), 0.1f, rng)), write(dev_out(g2), sigmoid(dev(x))));
    CHECK(r.flats == 1);
    CHECK(bit_differences(c1.data(), g1.data(), c1.size()) == 0);
    CHECK(test::ulp_differences(c2.data(), g2.data(), c2.size()) == 0);
  }
}

TEST_CASE("cuda pass: a gradient and its bias sum in one column walk, in a fixed order", "[cuda][pass]") {
  auto check_width = [](auto width, std::size_t batch) {
    constexpr std::size_t N = decltype(width)::value;
    using S = shape<dyn, N>;
    auto y = test::make<S>(batch), dy = test::make<S>(batch);
    test::fill_uniform(y, -1, 2, 12);
    test::fill_uniform(dy, -1, 1, 13);
    // The backward of dropout(relu(.)) from the forward's output, and from the input with the
    // mask regenerated.
    auto g_cpu = [&](const auto& yy, const auto& gg) { return dropout(where(yy > 0.0f, gg, 0.0f), 0.2f, rng); };
    tensor<float, S> dx_cpu = g_cpu(y, dy);
    auto dx = test::make<S>(batch);
    tensor<float, shape<N>> db;
    const auto r = run(write(dev_out(dx), g_cpu(dev(y), dev(dy))), write(dev_out(db), sum_to<shape<N>>(g_cpu(dev(y), dev(dy)))));
    CHECK(r.column_walks == 1);
    CHECK(r.last_vector == (N % 4 == 0));
    CHECK(bit_differences(dx_cpu.data(), dx.data(), dx.size()) == 0);
    // db against a double sum of the CPU's gradient: float sums of `batch` terms.
    double worst = 0;
    for (std::size_t c = 0; c < N; ++c) {
      double s = 0, mag = 0;
      for (std::size_t r2 = 0; r2 < batch; ++r2) {
        s += dx_cpu[r2 * N + c];
        mag += std::fabs(dx_cpu[r2 * N + c]);
      }
      worst = std::max(worst, std::fabs(db[c] - s) / (mag + 1e-30));
    }
    CHECK(worst < 1e-5);  // a few float roundings of partial sums, relative to the sum of |terms|
    // Run to run: the same bits.
    tensor<float, shape<N>> db2;
    run(write(dev_out(dx), g_cpu(dev(y), dev(dy))), write(dev_out(db2), sum_to<shape<N>>(g_cpu(dev(y), dev(dy)))));
    CHECK(bit_differences(db.data(), db2.data(), N) == 0);
  };
  SECTION("rows of 4096 (whole tiles: the mask draws a group per tile), three chunks of rows") {
    check_width(std::integral_constant<std::size_t, 4096>{}, 300);
  }
  SECTION("rows of 100: tiles straddle mask groups, each element draws its own bits") {
    check_width(std::integral_constant<std::size_t, 100>{}, 131);
  }
  SECTION("rows of 37: element path") { check_width(std::integral_constant<std::size_t, 37>{}, 9); }
}

TEST_CASE("cuda pass: integer sums are exact, so the column walk equals the CPU's bias sum bit for bit",
          "[cuda][pass]") {
  using S = shape<dyn, 256>;
  auto g = test::make<S>(257);
  test::fill_integers(g, -50, 50, 14);
  tensor<float, shape<256>> cpu = sum<0>(g);
  tensor<float, shape<256>> gpu;
  run(write(dev_out(gpu), sum<0>(dev(g))));
  CHECK(bit_differences(cpu.data(), gpu.data(), 256) == 0);
  tensor<float, shape<256>> mean_gpu;
  run(write(dev_out(mean_gpu), mean<0>(dev(g))));
  for (std::size_t c = 0; c < 256; ++c) CHECK(mean_gpu[c] == Approx(cpu[c] / 257.0f).epsilon(1e-6));
}

TEST_CASE("cuda pass: a reduction to a scalar over many blocks, in a fixed order", "[cuda][pass]") {
  using S = shape<dyn, 1000>;
  auto x = test::make<S>(97);  // 97000 elements: 758 tiles, 12 blocks of 256 threads
  test::fill_uniform(x, -1, 1, 15);
  tensor<float, shape<>> total, again;
  const auto r = run(write(dev_out(total), mean(dev(x) * dev(x))));
  CHECK(r.all_walks == 1);
  double ref = 0;
  for (float v : x) ref += double(v) * v;
  ref /= double(x.size());
  CHECK(total[0] == Approx(ref).epsilon(1e-5));
  run(write(dev_out(again), mean(dev(x) * dev(x))));
  CHECK(bit_differences(total.data(), again.data(), 1) == 0);
}

TEST_CASE("cuda pass: max propagates NaN through the column walk", "[cuda][pass]") {
  using S = shape<dyn, 8>;
  auto x = test::make<S>(40);
  test::fill_uniform(x, -1, 1, 16);
  x[5 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
  tensor<float, shape<8>> cpu = max<0>(x), gpu;
  run(write(dev_out(gpu), max<0>(dev(x))));
  for (std::size_t c = 0; c < 8; ++c) {
    if (c == 3)
      CHECK(std::isnan(gpu[c]));
    else
      CHECK(gpu[c] == cpu[c]);
  }
}
