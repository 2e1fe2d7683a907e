// tests/eval/cuda_elementwise_paths.test.cpp: the paths tests/cuda/elementwise.cu compares on a
// GPU, chosen on the host as the device's dispatch chooses them (eval/cuda/pass.hpp): its
// aligned run takes the vector path (16-byte accesses) and its run into a view one float into
// a buffer the element path, with the same bits; the expression and its shape are the GPU
// test's own (tests/cuda/elementwise.hpp).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/elementwise.hpp"
#include "solder/assign.hpp"
#include "solder/eval/cuda/pass.hpp"
#include "support/data.hpp"
#include "support/device_view.hpp"
#include "support/grid.hpp"

TEST_CASE("cuda elementwise test: the vector and element paths it compares are both taken", "[cuda][pass]") {
  using namespace solder;
  namespace ref = solder::test::cuda_reference;
  constexpr std::size_t C = ref::path_cols, rows = 37;
  using S = shape<dyn, C>;
  auto x = test::make<S>(rows);
  tensor<float, shape<C>> b;
  test::fill_uniform(x, -3, 3, 8);
  test::fill_uniform(b, -1, 1, 9);

  auto y = test::make<S>(rows);
  test::host_runner aligned;
  eval::cuda::dispatch(aligned, write(test::dev_out(y), ref::paths_expr(test::dev(x), test::dev(b))));
  CHECK(aligned.flats == 1);
  CHECK(aligned.last_vector);

  // Host tensors are at least 16-byte aligned, as device allocations are (256): one float in
  // is not.
  std::vector<float> big(rows * C + 4);
  REQUIRE(reinterpret_cast<std::uintptr_t>(big.data()) % 16 == 0);
  tensor_ref<float, S, device> shifted(big.data() + 1, rows);
  test::host_runner misaligned;
  eval::cuda::dispatch(misaligned, write(shifted, ref::paths_expr(test::dev(x), test::dev(b))));
  CHECK(misaligned.flats == 1);
  CHECK(!misaligned.last_vector);
  CHECK(test::bit_differences(y.data(), big.data() + 1, y.size()) == 0);
}
