// tests/executor.test.cpp: the verbs every backend declares (executor.hpp), run on the host: the
// CPU's rows<N> and elements, and the CUDA backend's adapters of the same bodies (warp_rows on an
// emulated warp, thread_elements per element), against a double reference and against each
// other, at row lengths that leave tails and partial warps, static and dynamic.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <type_traits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/executor.hpp"
#include "solder/nn/softmax.hpp"
#include "solder/ops/rows.hpp"
#include "solder/ops/softmax.hpp"
#include "support/data.hpp"
#include "support/warp_emulation.hpp"

namespace {

namespace ops = solder::ops;
using exec = solder::executor<solder::cpu>;
using solder::dyn;

static_assert(solder::Executor<exec>);
static_assert(std::is_same_v<exec::space, solder::host>);

/// The walkers run the same float algorithm in different orders (see tests/eval/cuda_row.test.cpp):
/// exp within 2 ulp each, row sums within about 20 u; 1e-5 leaves room for both, while an
/// indexing mistake is off by the size of the values.
constexpr double row_tol = 1e-5;

/// softmax of each row of x [rows, n] in double.
std::vector<double> softmax_reference(const std::vector<float>& x, std::size_t rows, std::size_t n) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (std::size_t j = 0; j < n; ++j) m = std::max(m, double(x[r * n + j]));
    for (std::size_t j = 0; j < n; ++j) s += std::exp(double(x[r * n + j]) - m);
    for (std::size_t j = 0; j < n; ++j) y[r * n + j] = std::exp(double(x[r * n + j]) - m) / s;
  }
  return y;
}

template <class Got>
void check_close(const Got& got, const std::vector<double>& want, const std::string& what) {
  INFO(what);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= row_tol)) ++bad;
  CHECK(bad == 0);
}

/// The CPU's rows<N> and the warp adapter of the same body, forward and backward.
template <std::size_t N>
void check_softmax_rows(std::size_t n, std::size_t rows) {
  constexpr std::size_t SN = N;
  std::vector<float> x(rows * n), dy(rows * n);
  solder::test::fill_uniform(x, -4.0, 4.0, std::uint32_t(11 + n));
  solder::test::fill_uniform(dy, -1.0, 1.0, std::uint32_t(12 + n));
  const auto want = softmax_reference(x, rows, n);

  std::vector<float> cpu_y(x.size()), warp_y(x.size());
  exec::rows<SN>(rows, ops::rows_forward<ops::softmax, SN>{x.data(), cpu_y.data(), n});
  solder::test::run_warp(rows, solder::eval::cuda::warp_rows<SN, ops::rows_forward<ops::softmax, SN>>{
                                   {x.data(), warp_y.data(), n}});
  check_close(cpu_y, want, "CPU rows<N>, n = " + std::to_string(n));
  check_close(warp_y, want, "warp_rows, n = " + std::to_string(n));

  // Backward from the output: dx = y (dy - sum(dy y)).
  std::vector<double> want_dx(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (std::size_t j = 0; j < n; ++j) s += double(dy[r * n + j]) * want[r * n + j];
    for (std::size_t j = 0; j < n; ++j) want_dx[r * n + j] = want[r * n + j] * (double(dy[r * n + j]) - s);
  }
  std::vector<float> cpu_dx(x.size()), warp_dx(x.size());
  exec::rows<SN>(rows, ops::rows_backward_from_output<ops::softmax, SN>{cpu_y.data(), dy.data(), cpu_dx.data(), n});
  solder::test::run_warp(rows, solder::eval::cuda::warp_rows<SN, ops::rows_backward_from_output<ops::softmax, SN>>{
                                   {cpu_y.data(), dy.data(), warp_dx.data(), n}});
  check_close(cpu_dx, want_dx, "CPU rows<N> backward, n = " + std::to_string(n));
  check_close(warp_dx, want_dx, "warp_rows backward, n = " + std::to_string(n));
}

}  // namespace

TEST_CASE("executor: rows<N> runs a row op on every row, on the CPU walker and on a warp", "[executor]") {
  const std::size_t rows = GENERATE(1, 3, 17);
  check_softmax_rows<1>(1, rows);
  check_softmax_rows<7>(7, rows);
  check_softmax_rows<33>(33, rows);
  check_softmax_rows<100>(100, rows);
  const std::size_t n = GENERATE(1, 5, 32, 37);
  check_softmax_rows<dyn>(n, rows);
}

TEST_CASE("executor: the CPU's rows<N> gives nn::softmax's bits", "[executor]") {
  constexpr std::size_t N = 37;
  const std::size_t rows = 19;
  solder::tensor<float, solder::shape<dyn, N>> x(rows), y(rows);
  solder::test::fill_uniform(std::span<float>(x.data(), x.size()), -3.0, 3.0, 5);
  solder::nn::softmax<N>{}.forward(x, y);
  std::vector<float> got(rows * N);
  exec::rows<N>(rows, ops::rows_forward<ops::softmax, N>{x.data(), got.data()});
  CHECK(std::memcmp(got.data(), y.data(), got.size() * sizeof(float)) == 0);
}

namespace {

/// Writes, at every element it is called for, how often it was called there and with how wide
/// a value: out[i] += 1 for each call that covers i; wide[i] = V's width.
struct count_body {
  float* out;
  float* wide;
  template <class V>
  void operator()(std::size_t i) const {
    constexpr std::size_t lanes = sizeof(V) / sizeof(float);
    for (std::size_t k = 0; k < lanes; ++k) {
      out[i + k] += 1.0f;
      wide[i + k] = float(lanes);
    }
  }
};

}  // namespace

TEST_CASE("executor: elements covers every index below n once, whole vectors first", "[executor]") {
  const std::size_t n = GENERATE(0, 1, 7, 16, 17, 4097, 70001);
  INFO("n = " << n);
  constexpr std::size_t lanes = exec::vec::size;
  std::vector<float> out(n + 1, 0.0f), wide(n + 1, 0.0f);
  exec::elements(n, count_body{out.data(), wide.data()});
  std::size_t twice = 0, missed = 0, wrong_width = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i] == 0.0f) ++missed;
    if (out[i] > 1.0f) ++twice;
  }
  CHECK(out[n] == 0.0f);  // nothing past the end
  CHECK(missed == 0);
  CHECK(twice == 0);
  // The loop's pieces are fixed by n (chunking.hpp): within each, whole vectors, then floats.
  for (std::size_t i = 0; i < n; ++i)
    if (wide[i] != float(lanes) && wide[i] != 1.0f) ++wrong_width;
  CHECK(wrong_width == 0);
  if (n >= lanes) CHECK(wide[0] == float(lanes));

  // The device adapter: one float per element.
  std::vector<float> dev(n + 1, 0.0f), dev_wide(n + 1, 0.0f);
  const solder::eval::cuda::thread_elements<count_body> per_thread{{dev.data(), dev_wide.data()}};
  for (std::size_t i = 0; i < n; ++i) per_thread(i);
  for (std::size_t i = 0; i < n; ++i) {
    if (dev[i] != 1.0f || dev_wide[i] != 1.0f) ++wrong_width;
  }
  CHECK(wrong_width == 0);
}

namespace {

/// A row body whose value is the row's index plus its length: row_sums must add every row's.
struct row_index_value {
  std::size_t n;
  template <class R>
  SOLDER_HD double operator()(const R&, std::size_t r) const {
    return double(r) + double(n);
  }
};

/// Counts the calls at every (p, i, j) of planes [count, rows, cols].
struct plane_count_body {
  int* hits;
  std::size_t rows, cols;
  SOLDER_HD void operator()(std::size_t p, std::size_t i, std::size_t j) const { ++hits[(p * rows + i) * cols + j]; }
};

/// Writes, for chunk c, c + 1 at each of its rows (a chunk body that sees its rows).
template <class Chunks>
struct chunk_mark_body {
  int* owner;
  Chunks parts;
  std::size_t n = 4;
  template <class R>
  void operator()(const R&, std::size_t c) const {
    for (std::size_t r = parts.begin(c); r < parts.end(c); ++r) owner[r] += int(c) + 1;
  }
};

}  // namespace

TEST_CASE("executor: row_sums adds every row's value once, the CPU's and the device adapter's", "[executor]") {
  const std::size_t rows = GENERATE(1, 5, 100, 1000);
  INFO("rows = " << rows);
  const double want = double(rows) * double(rows - 1) / 2.0 + double(rows) * 7.0;
  CHECK(exec::row_sums<dyn>(rows, row_index_value{7}) == want);
  // The device form stores each row's value (ops::row_value_into) before its fixed-order total.
  std::vector<double> values(rows, -1.0);
  solder::test::run_warp(rows, solder::eval::cuda::warp_rows<dyn, ops::row_value_into<row_index_value>>{
                                   {row_index_value{7}, values.data()}});
  double sum = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    CHECK(values[r] == double(r) + 7.0);
    sum += values[r];
  }
  CHECK(sum == want);
}

TEST_CASE("executor: planes calls every element of every plane once, on the CPU and per device thread",
          "[executor]") {
  const std::size_t count = GENERATE(1, 3, 64), rows = GENERATE(1, 5), cols = GENERATE(1, 7);
  INFO("planes " << count << " of " << rows << " x " << cols);
  std::vector<int> cpu(count * rows * cols, 0), dev(cpu.size(), 0);
  exec::planes(count, rows, cols, rows * cols, plane_count_body{cpu.data(), rows, cols});
  const solder::eval::cuda::plane_elements<plane_count_body> per_thread{{dev.data(), rows, cols}, rows, cols};
  for (std::size_t k = 0; k < dev.size(); ++k) per_thread(k);
  CHECK(std::count(cpu.begin(), cpu.end(), 1) == std::ptrdiff_t(cpu.size()));
  CHECK(std::count(dev.begin(), dev.end(), 1) == std::ptrdiff_t(dev.size()));
}

TEST_CASE("executor: chunks runs every chunk of chunks_of once, and the chunks cover the rows in order",
          "[executor]") {
  const std::size_t rows = GENERATE(1, 31, 5000, 100000);
  INFO("rows = " << rows);
  const exec::chunking parts = exec::chunks_of(rows, 4);
  std::vector<int> owner(rows, 0);
  exec::chunks<4>(parts, chunk_mark_body<exec::chunking>{owner.data(), parts});
  std::size_t bad = 0;
  for (std::size_t c = 0; c < parts.count; ++c)
    for (std::size_t r = parts.begin(c); r < parts.end(c); ++r) bad += owner[r] != int(c) + 1;
  CHECK(parts.end(parts.count - 1) == rows);
  CHECK(bad == 0);
  // The device's chunking: the same cover, by at most 256 chunks.
  const solder::eval::cuda::row_chunks dev(rows);
  CHECK(dev.count <= 256);
  CHECK(dev.end(dev.count - 1) == rows);
  for (std::size_t c = 1; c < dev.count; ++c) CHECK(dev.begin(c) == dev.end(c - 1));
}
