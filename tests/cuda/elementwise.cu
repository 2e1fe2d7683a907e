// tests/cuda/elementwise.cu: the CUDA backend's fused passes on a GPU against the CPU backend:
// bias + ReLU + dropout forward and its backward with the bias sum (masks and every value
// computed without transcendentals bit for bit, any NaN equal to any other), transcendental
// ops within a few ulp, tails and broadcasting, column and scalar reductions the same bits run
// to run and within a stated tolerance of a double sum, the vector and element paths, and a
// non-default stream.
// Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "elementwise.hpp"
#include "solder/cuda.hpp"
#include "support/data.hpp"
#include "support/gpu_program.hpp"

namespace {

using namespace solder;

using test::gpu::expect;

std::size_t bitwise(const float* a, const float* b, std::size_t n) { return test::bit_differences(a, b, n); }

/// Elements where the device's result differs from the CPU's in any bit, any two NaNs equal (a
/// GPU returns its canonical NaN from arithmetic on a NaN, x86 the operand's); prints the first.
std::size_t bitwise_any_nan(const float* cpu, const float* gpu, std::size_t n) {
  const std::size_t d = test::bit_differences_any_nan(cpu, gpu, n);
  for (std::size_t i = 0; d != 0 && i < n; ++i)
    if (test::bit_differences_any_nan(cpu + i, gpu + i, 1) != 0) {
      std::printf("solder: %zu of %zu differ; the first at %zu: CPU %.9g, device %.9g\n", d, n, i, double(cpu[i]),
                  double(gpu[i]));
      break;
    }
  return d;
}

using test::cuda_reference::rng;

template <std::size_t N>
void bias_relu_dropout(std::size_t batch) {
  using S = shape<dyn, N>;
  tensor<float, S> x(batch), dy(batch);
  tensor<float, shape<N>> b;
  test::fill_uniform(x, -2, 2, 1);
  test::fill_uniform(dy, -1, 1, 2);
  test::fill_uniform(b, -1, 1, 3);
  x[1] = NAN;

  tensor<float, S> y_cpu(batch), dx_cpu(batch);
  test::cuda_reference::bias_relu_dropout(x, b, dy, y_cpu, dx_cpu);
  auto g = [](const auto& y, const auto& d) { return where(y > 0.0f, d * 1.1111f, 0.0f); };

  auto xd = to_device(x), dyd = to_device(dy);
  auto bd = to_device(b);
  tensor<float, S, device> yd(batch, uninitialized), dxd(batch, uninitialized);
  tensor<float, shape<N>, device> dbd(uninitialized), dbd2(uninitialized);
  yd = dropout(relu(xd + bd), 0.1f, rng);
  assign_all(write(dxd, g(yd, dyd)), write(dbd, sum_to<shape<N>>(g(yd, dyd))));
  assign_all(write(dxd, g(yd, dyd)), write(dbd2, sum_to<shape<N>>(g(yd, dyd))));

  const auto y = to_host(yd), dx = to_host(dxd);
  const auto db = to_host(dbd), db2 = to_host(dbd2);
  expect(bitwise_any_nan(y_cpu.data(), y.data(), y.size()) == 0, "bias+relu+dropout forward equals the CPU bit for bit");
  expect(bitwise_any_nan(dx_cpu.data(), dx.data(), dx.size()) == 0, "its backward equals the CPU bit for bit");
  expect(bitwise(db.data(), db2.data(), N) == 0, "the bias sum is the same bits run to run");
  std::size_t off = 0;
  for (std::size_t c = 0; c < N; ++c) {
    double s = 0, mag = 0;
    for (std::size_t r = 0; r < batch; ++r) {
      s += dx_cpu[r * N + c];
      mag += std::fabs(dx_cpu[r * N + c]);
    }
    off += !(std::fabs(db[c] - s) <= 1e-5 * mag + 1e-30);
  }
  expect(off == 0, "the bias sum is within 1e-5 of the double sum, relative to the sum of |terms|");
}

void odd_shapes() {
  using S = shape<dyn, 10>;
  tensor<float, S> x(37);
  tensor<float, shape<10>> b;
  test::fill_uniform(x, -3, 3, 4);
  test::fill_uniform(b, -1, 1, 5);
  tensor<float, S> cpu(37);
  test::cuda_reference::odd(x, b, cpu);
  auto xd = to_device(x);
  auto bd = to_device(b);
  tensor<float, S, device> yd(37);
  yd = dropout(tanh(xd) * bd + exp(xd * 0.25f), 0.5f, rng);
  const auto y = to_host(yd);
  expect(test::ulp_differences(cpu.data(), y.data(), y.size()) == 0, "rows of 10 with broadcasting and transcendentals");
}

/// The vector path (16-byte accesses) and the element path over the same expression: rows of
/// path_cols (a multiple of 4), so the aligned run takes the vector path; a view one float into
/// its buffer is not 16-byte aligned and takes the element path (tests/eval/
/// cuda_elementwise_paths.test.cpp checks on the host that dispatch chooses so).
void vector_and_element_paths() {
  constexpr std::size_t C = test::cuda_reference::path_cols, rows = 37;
  using S = shape<dyn, C>;
  tensor<float, S> x(rows);
  tensor<float, shape<C>> b;
  test::fill_uniform(x, -3, 3, 8);
  test::fill_uniform(b, -1, 1, 9);
  tensor<float, S> cpu(rows);
  test::cuda_reference::paths(x, b, cpu);
  auto xd = to_device(x);
  auto bd = to_device(b);
  tensor<float, S, device> yd(rows);
  yd = test::cuda_reference::paths_expr(xd, bd);  // fresh allocations are 256-byte aligned: the vector path
  const auto y = to_host(yd);
  expect(test::ulp_differences(cpu.data(), y.data(), y.size()) == 0, "the vector path with a broadcast operand");

  tensor<float, S, device> big(rows + 1);
  tensor_ref<float, S, device> shifted(big.data() + 1, rows);
  shifted = test::cuda_reference::paths_expr(xd, bd);  // misaligned output: the element path
  tensor<float, S, device> back(rows);
  back = tensor_ref<const float, S, device>(big.data() + 1, rows) * 1.0f;
  const auto y2 = to_host(back);
  expect(bitwise(y.data(), y2.data(), y.size()) == 0, "the element path gives the vector path's bits");
}

void scalar_reduction() {
  using S = shape<dyn, 1000>;
  tensor<float, S> x(997);
  test::fill_uniform(x, -1, 1, 6);
  auto xd = to_device(x);
  tensor<float, shape<>, device> t1, t2;
  t1 = mean(xd * xd);
  t2 = mean(xd * xd);
  const auto a = to_host(t1), b = to_host(t2);
  double ref = 0;
  for (float v : x) ref += double(v) * v;
  ref /= double(x.size());
  expect(bitwise(a.data(), b.data(), 1) == 0, "a mean is the same bits run to run");
  expect(std::fabs(a[0] - ref) <= 1e-5 * ref, "a mean is within 1e-5 of the double mean");
}

void on_a_stream() {
  stream s;
  stream_guard on(s);
  using S = shape<4096>;
  tensor<float, S> x;
  test::fill_uniform(x, -1, 1, 7);
  tensor<float, S> cpu;
  test::cuda_reference::drop(x, cpu);
  auto xd = to_device(x);
  tensor<float, S, device> yd;
  yd = dropout(xd, 0.5f, rng);
  const auto y = to_host(yd);
  expect(bitwise(cpu.data(), y.data(), y.size()) == 0, "a pass on a non-default stream");
}

}  // namespace

int main() {
  return test::gpu::run("tests/cuda/elementwise.cu", "solder: the CUDA passes match the CPU", [] {
    bias_relu_dropout<4096>(300);
    bias_relu_dropout<100>(131);
    odd_shapes();
    vector_and_element_paths();
    scalar_reduction();
    on_a_stream();
  });
}
