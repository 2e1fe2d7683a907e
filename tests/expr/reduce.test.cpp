// tests/expr/reduce.test.cpp: sum, mean and max over each axis and over everything, sum_to,
// reductions fused with the expression they consume and with stores (assign_all), NaN in max,
// and results bitwise independent of the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "solder/expr/reduce.hpp"
#include "support/data.hpp"
#include "support/tuning.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinULP;
using solder::dyn;
using solder::shape;
using solder::tensor;

constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float infty = std::numeric_limits<float>::infinity();

/// Float's unit roundoff. Any order of summing n floats errs by at most (n - 1) u sum|x_i|
/// (Higham, Accuracy and Stability, 4.2), whatever order the kernel's vectors, segments and
/// chunks impose; that is the tolerance of sums over real-valued data.
constexpr double unit_roundoff = 0x1p-24;
/// A mean is a sum times 1/n in float: two more roundings of the result.
constexpr std::uint64_t mean_scale_ulps = 2;

enum class op { sum, mean, max };

/// The double reference of a reduction of x (row-major, extents `ext`) over `axis`, or over
/// everything when axis == ext.size(); also sum|x| per output element, for the error bound.
struct reference {
  std::vector<double> value, abs_sum;
  std::size_t count = 0;  // elements combined into each output
};

template <std::size_t R>
reference reduce_ref(const float* x, std::array<std::size_t, R> ext, std::size_t axis, op o) {
  std::size_t total = 1, out = 1;
  for (std::size_t d = 0; d < R; ++d) {
    total *= ext[d];
    if (d != axis) out *= ext[d];
  }
  if (axis == R) out = 1;
  reference r;
  r.count = total / out;
  r.value.assign(out, o == op::max ? -std::numeric_limits<double>::infinity() : 0.0);
  r.abs_sum.assign(out, 0.0);
  for (std::size_t i = 0; i < total; ++i) {
    // The output index: i's multi-index without the reduced axis, row-major.
    std::size_t rest = i, k = 0, stride = 1;
    for (std::size_t d = R; d-- > 0;) {
      const std::size_t idx = rest % ext[d];
      rest /= ext[d];
      if (d != axis && axis != R) {
        k += idx * stride;
        stride *= ext[d];
      }
    }
    const double v = x[i];
    if (o == op::max)
      r.value[k] = (std::isnan(v) || std::isnan(r.value[k])) ? std::nan("") : std::max(r.value[k], v);
    else
      r.value[k] += v;
    r.abs_sum[k] += std::fabs(v);
  }
  if (o == op::mean)
    for (auto& v : r.value) v /= double(r.count);
  return r;
}

/// Two data sets per shape: small integers (sums exact in any order, so any misplaced or
/// missing element shows) and reals in [-1, 1) (the rounding bound).
enum class data { integers, reals };

template <class T>
void fill(T& x, data d, std::uint32_t seed) {
  if (d == data::integers)
    solder::test::fill_integers(x, -64, 64, seed);
  else
    solder::test::fill_uniform(x, -1, 1, seed);
}

const char* name_of(data d) { return d == data::integers ? "integers" : "reals"; }

/// Checks a reduction's output against its reference: max exactly; sums exactly over integer
/// data (every partial sum is an integer below 2^24), else within the summation bound; means
/// as their sum, plus the scaling.
void check_reduction(const std::string& what, const float* got, const reference& want, op o, data d = data::reals) {
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t k = 0; k < want.value.size(); ++k) {
    const double w = want.value[k];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(got[k]);
    } else if (o == op::max) {
      ok = got[k] == float(w);
    } else {
      double bound = d == data::integers ? 0.0 : double(want.count - 1) * unit_roundoff * want.abs_sum[k];
      if (o == op::mean) bound /= double(want.count);
      ok = (WithinAbs(w, bound) || WithinULP(float(w), o == op::mean ? mean_scale_ulps : 0)).match(got[k]);
      if (o == op::mean && !ok)  // the sum's error, then the scaling's
        ok = WithinAbs(w, bound + 4 * unit_roundoff * std::fabs(w)).match(got[k]);
    }
    if (!ok && bad++ == 0)
      first << std::setprecision(9) << "output " << k << ": got " << got[k] << ", want " << w;
  }
  INFO(what << ": " << bad << " of " << want.value.size() << " outputs off; first: " << first.str());
  CHECK(bad == 0);
}

template <class S>
std::array<std::size_t, S::rank> extents_of(std::size_t batch) {
  std::array<std::size_t, S::rank> e = S::extents;
  if constexpr (S::dynamic) e[0] = batch;
  return e;
}

/// RAII: a thread count for this scope, the previous one restored after it.
class thread_count {
 public:
  explicit thread_count(int n) : saved_(solder::num_threads()) { solder::set_num_threads(n); }
  ~thread_count() { solder::set_num_threads(saved_); }
  thread_count(const thread_count&) = delete;
  thread_count& operator=(const thread_count&) = delete;

 private:
  int saved_;
};

bool bitwise_equal(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEMPLATE_TEST_CASE_SIG("reduce: sum, mean and max over each axis of [B, N] and over all", "[reduce]",
                       ((int B, int N), B, N), (1, 1), (3, 37), (4, 16), (1, 257), (17, 255)) {
  using S = shape<B, N>;
  const data d = GENERATE(data::integers, data::reals);
  tensor<float, S> x;
  fill(x, d, 501);
  const auto ext = extents_of<S>(1);
  const std::string at = solder::to_string<S>() + " (" + name_of(d) + ")";
  tensor<float, shape<N>> cols;
  tensor<float, shape<B>> rows;
  tensor<float, shape<>> all;

  cols = solder::sum<0>(x);
  check_reduction("sum<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, d);
  rows = solder::sum<1>(x);
  check_reduction("sum<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum, d);
  cols = solder::mean<0>(x);
  check_reduction("mean<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::mean), op::mean, d);
  rows = solder::mean<1>(x);
  check_reduction("mean<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::mean), op::mean, d);
  cols = solder::max<0>(x);
  check_reduction("max<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::max), op::max, d);
  rows = solder::max<1>(x);
  check_reduction("max<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::max), op::max, d);
  all = solder::sum(x);
  check_reduction("sum of " + at, all.data(), reduce_ref(x.data(), ext, 2, op::sum), op::sum, d);
  all = solder::mean(x);
  check_reduction("mean of " + at, all.data(), reduce_ref(x.data(), ext, 2, op::mean), op::mean, d);
}

TEST_CASE("reduce: rank 1", "[reduce]") {
  const data d = GENERATE(data::integers, data::reals);
  auto run = [&](auto x) {
    using S = typename decltype(x)::shape_type;
    fill(x, d, 511);
    const auto ext = extents_of<S>(1);
    const std::string at = solder::to_string<S>() + " (" + name_of(d) + ")";
    tensor<float, shape<>> r;
    r = solder::sum<0>(x);
    check_reduction("sum<0> of " + at, r.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, d);
    r = solder::mean<0>(x);
    check_reduction("mean<0> of " + at, r.data(), reduce_ref(x.data(), ext, 0, op::mean), op::mean, d);
    r = solder::max<0>(x);  // the max of everything, for rank 1
    check_reduction("max<0> of " + at, r.data(), reduce_ref(x.data(), ext, 0, op::max), op::max, d);
    r = solder::sum(x);
    check_reduction("sum of " + at, r.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum, d);
  };
  run(tensor<float, shape<1>>());
  run(tensor<float, shape<37>>());
  run(tensor<float, shape<257>>());
  run(tensor<float, shape<9000>>());  // several of the loop's segments (256 or 4096 elements)
}

TEST_CASE("reduce: rank 3, every axis", "[reduce]") {
  const data d = GENERATE(data::integers, data::reals);
  auto run = [&](auto x) {
    using S = typename decltype(x)::shape_type;
    constexpr std::size_t E0 = S::extents[0], E1 = S::extents[1], E2 = S::extents[2];
    fill(x, d, 521);
    const auto ext = extents_of<S>(1);
    const std::string at = solder::to_string<S>() + " (" + name_of(d) + ")";
    tensor<float, shape<E1, E2>> r0;
    tensor<float, shape<E0, E2>> r1;
    tensor<float, shape<E0, E1>> r2;
    tensor<float, shape<>> all;
    r0 = solder::sum<0>(x);
    check_reduction("sum<0> of " + at, r0.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, d);
    r1 = solder::sum<1>(x);
    check_reduction("sum<1> of " + at, r1.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum, d);
    r2 = solder::sum<2>(x);
    check_reduction("sum<2> of " + at, r2.data(), reduce_ref(x.data(), ext, 2, op::sum), op::sum, d);
    r0 = solder::max<0>(x);
    check_reduction("max<0> of " + at, r0.data(), reduce_ref(x.data(), ext, 0, op::max), op::max, d);
    r1 = solder::max<1>(x);
    check_reduction("max<1> of " + at, r1.data(), reduce_ref(x.data(), ext, 1, op::max), op::max, d);
    r2 = solder::max<2>(x);
    check_reduction("max<2> of " + at, r2.data(), reduce_ref(x.data(), ext, 2, op::max), op::max, d);
    r1 = solder::mean<1>(x);
    check_reduction("mean<1> of " + at, r1.data(), reduce_ref(x.data(), ext, 1, op::mean), op::mean, d);
    all = solder::sum(x);
    check_reduction("sum of " + at, all.data(), reduce_ref(x.data(), ext, 3, op::sum), op::sum, d);
  };
  run(tensor<float, shape<2, 3, 5>>());
  run(tensor<float, shape<3, 5, 37>>());
}

TEST_CASE("reduce: rows longer than one segment of the loop", "[reduce]") {
  constexpr std::size_t B = 3, N = 9000;  // segments are 256 or 4096 elements long
  const data d = GENERATE(data::integers, data::reals);
  tensor<float, shape<B, N>> x;
  fill(x, d, 525);
  const std::array<std::size_t, 2> ext{B, N};
  const std::string at = std::string("[3, 9000] (") + name_of(d) + ")";
  tensor<float, shape<N>> cols;
  tensor<float, shape<B>> rows;
  cols = solder::sum<0>(x);
  check_reduction("sum<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, d);
  rows = solder::sum<1>(x);  // each row's segments fold into the same output
  check_reduction("sum<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum, d);
  rows = solder::max<1>(x);
  check_reduction("max<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::max), op::max, d);
}

TEST_CASE("reduce: a dynamic batch", "[reduce]") {
  constexpr std::size_t N = 37;
  using S = shape<dyn, N>;
  const std::size_t batch = GENERATE(1, 5, 300);
  const data d = GENERATE(data::integers, data::reals);
  tensor<float, S> x(batch);
  fill(x, d, 531);
  const auto ext = extents_of<S>(batch);
  const std::string at = solder::to_string<S>(batch) + " (" + name_of(d) + ")";
  tensor<float, shape<N>> cols;
  tensor<float, shape<dyn>> rows(batch);  // one value per batch entry: dynamic too
  tensor<float, shape<>> all;
  cols = solder::sum<0>(x);
  check_reduction("sum<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, d);
  cols = solder::mean<0>(x);  // divides by the runtime batch
  check_reduction("mean<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::mean), op::mean, d);
  cols = solder::max<0>(x);
  check_reduction("max<0> of " + at, cols.data(), reduce_ref(x.data(), ext, 0, op::max), op::max, d);
  rows = solder::sum<1>(x);
  check_reduction("sum<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum, d);
  rows = solder::max<1>(x);
  check_reduction("max<1> of " + at, rows.data(), reduce_ref(x.data(), ext, 1, op::max), op::max, d);
  all = solder::mean(x);
  check_reduction("mean of " + at, all.data(), reduce_ref(x.data(), ext, 2, op::mean), op::mean, d);
}

TEST_CASE("reduce: a batch mismatch between a reduction and its output throws", "[reduce]") {
  tensor<float, shape<dyn, 8>> x(5);
  tensor<float, shape<dyn>> rows(4);
  CHECK_THROWS_AS(rows = solder::sum<1>(x), solder::error);
}

TEST_CASE("reduce: max propagates NaN, and handles infinities", "[reduce]") {
  constexpr std::size_t B = 5, N = 37;
  tensor<float, shape<B, N>> x;
  solder::test::fill_uniform(x, -1, 1, 541);
  x(2, 7) = qnan;      // column 7 and row 2 become NaN
  x(4, 36) = infty;    // column 36 and row 4 become +inf
  for (std::size_t r = 0; r < B; ++r) x(r, 20) = -infty;  // an all -inf column stays -inf
  tensor<float, shape<N>> cols;
  tensor<float, shape<B>> rows;
  cols = solder::max<0>(x);
  rows = solder::max<1>(x);
  CHECK(std::isnan(cols[7]));
  CHECK(std::isnan(rows[2]));
  CHECK(cols[36] == infty);
  CHECK(rows[4] == infty);
  CHECK(cols[20] == -infty);
  check_reduction("max<0> with NaN and inf", cols.data(), reduce_ref(x.data(), std::array<std::size_t, 2>{B, N}, 0, op::max), op::max);
  check_reduction("max<1> with NaN and inf", rows.data(), reduce_ref(x.data(), std::array<std::size_t, 2>{B, N}, 1, op::max), op::max);
  // A NaN in the first or the last lane of a vector, and in a tail.
  for (const std::size_t at : {std::size_t(0), std::size_t(15), std::size_t(16), std::size_t(N - 1)}) {
    tensor<float, shape<1, N>> v;
    solder::test::fill_uniform(v, -1, 1, 542);
    v[at] = qnan;
    tensor<float, shape<1>> m;
    m = solder::max<1>(v);
    INFO("NaN at " << at);
    CHECK(std::isnan(m[0]));
  }
  // Sums propagate NaN as IEEE addition does.
  tensor<float, shape<>> s;
  s = solder::sum(x);
  CHECK(std::isnan(s[0]));
}

TEST_CASE("reduce: fused with the expression that produces its operand", "[reduce]") {
  constexpr std::size_t B = 17, N = 255;
  tensor<float, shape<B, N>> x, y;
  tensor<float, shape<N>> b, cols;
  tensor<float, shape<B>> rows;
  tensor<float, shape<>> all;
  solder::test::fill_integers(x, -8, 8, 551);
  solder::test::fill_integers(y, -8, 8, 552);
  solder::test::fill_integers(b, -4, 4, 553);
  const std::array<std::size_t, 2> ext{B, N};

  // sum<0>(x * y): products of small integers, so the column sums are exact.
  cols = solder::sum<0>(x * y);
  std::vector<float> xy(B * N), act(B * N), mask(B * N);
  for (std::size_t i = 0; i < B * N; ++i) {
    xy[i] = x[i] * y[i];
    act[i] = std::max(x[i] + b[i % N], 0.0f);
    mask[i] = x[i] > 0.0f ? 1.0f : 0.0f;
  }
  check_reduction("sum<0>(x * y)", cols.data(), reduce_ref(xy.data(), ext, 0, op::sum), op::sum, data::integers);
  rows = solder::max<1>(solder::relu(x + b));
  check_reduction("max<1>(relu(x + b))", rows.data(), reduce_ref(act.data(), ext, 1, op::max), op::max, data::integers);
  cols = solder::sum<0>(x > 0.0f);  // a mask sums as 1s and 0s: a count
  check_reduction("sum<0>(x > 0)", cols.data(), reduce_ref(mask.data(), ext, 0, op::sum), op::sum, data::integers);
  all = solder::sum(x * y);
  check_reduction("sum(x * y)", all.data(), reduce_ref(xy.data(), ext, 2, op::sum), op::sum, data::integers);
  // A broadcast operand inside a whole reduction (the loop walks rows, not one flat run).
  all = solder::sum(solder::relu(x + b));
  check_reduction("sum(relu(x + b))", all.data(), reduce_ref(act.data(), ext, 2, op::sum), op::sum, data::integers);
}

TEST_CASE("reduce: sum_to sums over the broadcast dimensions", "[reduce]") {
  tensor<float, shape<17, 37>> x;
  solder::test::fill_integers(x, -16, 16, 561);
  const std::array<std::size_t, 2> ext{17, 37};
  tensor<float, shape<37>> bias_grad;
  bias_grad = solder::sum_to<shape<37>>(x);  // a bias [N] over [B, N]
  check_reduction("sum_to<[37]>", bias_grad.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, data::integers);
  tensor<float, shape<1, 37>> row_grad;
  row_grad = solder::sum_to<shape<1, 37>>(x);
  check_reduction("sum_to<[1, 37]>", row_grad.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum, data::integers);
  tensor<float, shape<17, 1>> col_grad;
  col_grad = solder::sum_to<shape<17, 1>>(x);
  check_reduction("sum_to<[17, 1]>", col_grad.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum, data::integers);
  tensor<float, shape<>> scalar_grad;
  scalar_grad = solder::sum_to<shape<>>(x);
  check_reduction("sum_to<[]>", scalar_grad.data(), reduce_ref(x.data(), ext, 2, op::sum), op::sum, data::integers);

  // A per-channel [C, 1, 1] over [C, H, W]: sums over H and W.
  constexpr std::size_t C = 3, H = 5, W = 37;
  tensor<float, shape<C, H, W>> t;
  solder::test::fill_integers(t, -16, 16, 562);
  tensor<float, shape<C, 1, 1>> channel;
  channel = solder::sum_to<shape<C, 1, 1>>(t);
  for (std::size_t c = 0; c < C; ++c) {
    double want = 0;
    for (std::size_t i = 0; i < H * W; ++i) want += t[c * H * W + i];
    CHECK(channel[c] == float(want));
  }
}

TEST_CASE("reduce: a store and reductions in one pass (assign_all)", "[reduce]") {
  constexpr std::size_t B = 17, N = 255;
  const std::array<std::size_t, 2> ext{B, N};
  tensor<float, shape<B, N>> x, z, y;
  solder::test::fill_integers(x, -8, 8, 571);
  solder::test::fill_integers(z, -8, 8, 572);
  tensor<float, shape<N>> cols;
  tensor<float, shape<B>> rows;
  solder::assign_all(solder::write(y, x * z), solder::write(cols, solder::sum<0>(x * z)),
                     solder::write(rows, solder::max<1>(x * z)));
  std::vector<float> xz(B * N);
  for (std::size_t i = 0; i < B * N; ++i) xz[i] = x[i] * z[i];
  CHECK(bitwise_equal(y.data(), xz.data(), B * N));
  check_reduction("sum<0> next to a store", cols.data(), reduce_ref(xz.data(), ext, 0, op::sum), op::sum,
                  data::integers);
  check_reduction("max<1> next to a store", rows.data(), reduce_ref(xz.data(), ext, 1, op::max), op::max);

  // The gradient-and-bias pattern on a dynamic batch: dx = g, db = sum<0>(g).
  const std::size_t batch = GENERATE(1, 40);
  tensor<float, shape<dyn, N>> g(batch), dx(batch);
  solder::test::fill_uniform(g, -1, 1, 573);
  tensor<float, shape<N>> db;
  solder::assign_all(solder::write(dx, g * 2.0f), solder::write(db, solder::sum<0>(g * 2.0f)));
  std::vector<float> g2(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) g2[i] = g[i] * 2.0f;
  CHECK(bitwise_equal(dx.data(), g2.data(), g.size()));
  check_reduction("db next to dx", db.data(), reduce_ref(g2.data(), std::array<std::size_t, 2>{batch, N}, 0, op::sum),
                  op::sum);
}

TEST_CASE("reduce: results are bitwise identical for 1 and 2 threads", "[reduce][threads]") {
  SECTION("[3000, 257]: every axis and everything") {
    constexpr std::size_t B = 3000, N = 257;
    tensor<float, shape<B, N>> x;
    solder::test::fill_uniform(x, -1, 1, 581);
    const std::array<std::size_t, 2> ext{B, N};
    tensor<float, shape<N>> c1, c2, m1, m2;
    tensor<float, shape<B>> r1, r2;
    tensor<float, shape<>> a1, a2;
    {
      thread_count one(1);
      c1 = solder::sum<0>(x);
      r1 = solder::sum<1>(x);
      a1 = solder::mean(x);
      m1 = solder::max<0>(x);
    }
    {
      thread_count two(2);
      c2 = solder::sum<0>(x);
      r2 = solder::sum<1>(x);
      a2 = solder::mean(x);
      m2 = solder::max<0>(x);
    }
    CHECK(bitwise_equal(c1.data(), c2.data(), N));
    CHECK(bitwise_equal(r1.data(), r2.data(), B));
    CHECK(bitwise_equal(a1.data(), a2.data(), 1));
    CHECK(bitwise_equal(m1.data(), m2.data(), N));
    // And right: identical results could be identically wrong.
    check_reduction("sum<0> of [3000, 257]", c2.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum);
    check_reduction("sum<1> of [3000, 257]", r2.data(), reduce_ref(x.data(), ext, 1, op::sum), op::sum);
    check_reduction("mean of [3000, 257]", a2.data(), reduce_ref(x.data(), ext, 2, op::mean), op::mean);
    check_reduction("max<0> of [3000, 257]", m2.data(), reduce_ref(x.data(), ext, 0, op::max), op::max);
  }
  SECTION("[4096, 64] and a dynamic [4096, 64], fused with a product") {
    constexpr std::size_t B = 4096, N = 64;
    tensor<float, shape<B, N>> x, y;
    tensor<float, shape<dyn, N>> xd(B);
    solder::test::fill_uniform(x, -1, 1, 582);
    solder::test::fill_uniform(y, -1, 1, 583);
    std::copy(x.begin(), x.end(), xd.begin());
    tensor<float, shape<N>> c1, c2, d1, d2;
    tensor<float, shape<B>> r1, r2;
    tensor<float, shape<>> a1, a2;
    {
      thread_count one(1);
      c1 = solder::sum<0>(x * y);
      r1 = solder::sum<1>(x);
      a1 = solder::sum(x);
      d1 = solder::sum<0>(xd);
    }
    {
      thread_count two(2);
      c2 = solder::sum<0>(x * y);
      r2 = solder::sum<1>(x);
      a2 = solder::sum(x);
      d2 = solder::sum<0>(xd);
    }
    CHECK(bitwise_equal(c1.data(), c2.data(), N));
    CHECK(bitwise_equal(r1.data(), r2.data(), B));
    CHECK(bitwise_equal(a1.data(), a2.data(), 1));
    CHECK(bitwise_equal(d1.data(), d2.data(), N));
    const std::array<std::size_t, 2> ext{B, N};
    check_reduction("sum<0> of dynamic [4096, 64]", d2.data(), reduce_ref(x.data(), ext, 0, op::sum), op::sum);
    check_reduction("sum of [4096, 64]", a2.data(), reduce_ref(x.data(), ext, 2, op::sum), op::sum);
  }
  SECTION("dynamic [2048, 1024]: a streamed store and a reduction in one pass") {
    constexpr std::size_t B = 2048, N = 1024;
    STATIC_REQUIRE(B * N * sizeof(float) >= solder::eval::cpu::stream_min_bytes_floor);
    const solder::test::stream_from_floor streams;  // the store streams
    tensor<float, shape<dyn, N>> g(B), dx1(B), dx2(B);
    solder::test::fill_uniform(g, -1, 1, 584);
    tensor<float, shape<N>> db1, db2;
    {
      thread_count one(1);
      solder::assign_all(solder::write(dx1, g * 0.5f), solder::write(db1, solder::sum<0>(g * 0.5f)));
    }
    {
      thread_count two(2);
      solder::assign_all(solder::write(dx2, g * 0.5f), solder::write(db2, solder::sum<0>(g * 0.5f)));
    }
    CHECK(bitwise_equal(dx1.data(), dx2.data(), g.size()));
    CHECK(bitwise_equal(db1.data(), db2.data(), N));
    std::vector<float> half(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) half[i] = g[i] * 0.5f;
    CHECK(bitwise_equal(dx2.data(), half.data(), g.size()));
    check_reduction("db of dynamic [2048, 1024]", db2.data(),
                    reduce_ref(half.data(), std::array<std::size_t, 2>{B, N}, 0, op::sum), op::sum);
  }
  CHECK(solder::num_threads() >= 1);
}
