// tests/eval/row_groups.test.cpp: passes that fold columns (a bias gradient: [B, N] summed into
// [N]) run rows in groups of eval::cpu::group_rows with the partial sums in registers. Checked
// on shapes that make every case of the walk happen: rows of several segments with a tail,
// chunks that start inside a row, rows left over after the last group, and a kept shape whose
// partial row changes inside a group (which must run row by row). Integer data makes every sum
// exact in any order, so results are compared bitwise with the sum computed in double, and the
// combination order, the same as row by row, is checked through 1 and 2 threads giving the same
// bits on non-integer data.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/solder.hpp"
#include "support/data.hpp"

namespace {

using solder::dyn;
using solder::shape;
using solder::tensor;

struct thread_count {
  int saved = solder::num_threads();
  explicit thread_count(int n) { solder::set_num_threads(n); }
  ~thread_count() { solder::set_num_threads(saved); }
};

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("row groups: [B, N] -> [N] with rows of two segments, chunks starting inside rows", "[reduce][row_groups]") {
  // 5003 columns: a 4096-element segment and a 907-element one (with a tail); 301 rows: 602
  // segments, chunks of 19, so chunks start inside rows and rows are left over after groups.
  constexpr std::size_t B = 301, N = 5003;
  STATIC_REQUIRE(N > solder::eval::cpu::long_segment_elements);
  tensor<float, shape<dyn, N>> x(B), dx(B);
  tensor<float, shape<N>> db, dmax;
  solder::test::fill_integers(x, -40, 40, 811);
  solder::assign_all(solder::write(dx, x * 2.0f), solder::write(db, solder::sum<0>(x * 2.0f)),
                     solder::write(dmax, solder::max<0>(x * 2.0f)));
  bool stores_ok = true, sums_ok = true, max_ok = true;
  for (std::size_t j = 0; j < N; ++j) {
    double s = 0;
    float m = -INFINITY;
    for (std::size_t i = 0; i < B; ++i) {
      const float v = x.data()[i * N + j] * 2.0f;
      stores_ok = stores_ok && dx.data()[i * N + j] == v;
      s += v;
      m = std::max(m, v);
    }
    sums_ok = sums_ok && db.data()[j] == float(s);
    max_ok = max_ok && dmax.data()[j] == m;
  }
  CHECK(stores_ok);
  CHECK(sums_ok);
  CHECK(max_ok);
}

TEST_CASE("row groups: a kept shape whose partial row changes inside a group", "[reduce][row_groups]") {
  // [B, H, 300] summed over axis 1 with H one and a half groups: rows of H fold into one partial
  // row each, so the group after a whole one crosses into the next partial row and must run
  // row by row until a group fits again.
  constexpr std::size_t B = 37, H = solder::eval::cpu::group_rows * 3 / 2, N = 300;
  tensor<float, shape<dyn, H, N>> x(B), y(B);
  tensor<float, shape<dyn, N>> s(B);
  solder::test::fill_integers(x, -100, 100, 812);
  solder::assign_all(solder::write(y, x - 1.0f), solder::write(s, solder::sum<1>(x - 1.0f)));
  bool ok = true;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t j = 0; j < N; ++j) {
      double sum = 0;
      for (std::size_t h = 0; h < H; ++h) {
        const float v = x.data()[(b * H + h) * N + j] - 1.0f;
        ok = ok && y.data()[(b * H + h) * N + j] == v;
        sum += v;
      }
      ok = ok && s.data()[b * N + j] == float(sum);
    }
  CHECK(ok);
}

TEST_CASE("row groups: the same bits for 1 and 2 threads, and as a mean", "[reduce][row_groups]") {
  constexpr std::size_t B = 515, N = 1000;
  tensor<float, shape<dyn, N>> x(B), y1(B), y2(B);
  tensor<float, shape<N>> b;
  tensor<float, shape<N>> s1, s2, m1, m2;
  solder::test::fill_uniform(x, -3, 3, 813);
  solder::test::fill_uniform(b, -1, 1, 814);
  {
    thread_count one(1);
    solder::assign_all(solder::write(y1, solder::relu(x + b)), solder::write(s1, solder::sum<0>(solder::relu(x + b))),
                       solder::write(m1, solder::mean<0>(x * b)));
  }
  {
    thread_count two(2);
    solder::assign_all(solder::write(y2, solder::relu(x + b)), solder::write(s2, solder::sum<0>(solder::relu(x + b))),
                       solder::write(m2, solder::mean<0>(x * b)));
  }
  CHECK(same_bits(y1, y2));
  CHECK(same_bits(s1, s2));
  CHECK(same_bits(m1, m2));
  double worst = 0;
  for (std::size_t j = 0; j < N; ++j) {
    double s = 0, m = 0;
    for (std::size_t i = 0; i < B; ++i) {
      s += std::max(double(x.data()[i * N + j]) + b.data()[j], 0.0);
      m += double(x.data()[i * N + j]) * b.data()[j];
    }
    worst = std::max({worst, std::abs(s1.data()[j] - s) / (1 + std::abs(s)), std::abs(m1.data()[j] - m / B) / (1 + std::abs(m / B))});
  }
  CHECK(worst < 1e-5);
}

TEST_CASE("row groups: writes of one expression type over different data are not shared", "[reduce][row_groups]") {
  // Each pair has the same expression type, so the pass may evaluate it once for both writes,
  // but only after checking that the tensors and constants are the same: here they are not.
  constexpr std::size_t B = 203, N = 1000;
  tensor<float, shape<dyn, N>> x(B), z(B), y(B), y2(B);
  tensor<float, shape<N>> s, s2;
  solder::test::fill_integers(x, -50, 50, 815);
  solder::test::fill_integers(z, -50, 50, 816);
  solder::assign_all(solder::write(y, x * 2.0f), solder::write(s, solder::sum<0>(z * 2.0f)));
  solder::assign_all(solder::write(y2, x * 2.0f), solder::write(s2, solder::sum<0>(x * 3.0f)));
  bool ok = true;
  for (std::size_t j = 0; j < N; ++j) {
    double sz = 0, sx = 0;
    for (std::size_t i = 0; i < B; ++i) {
      ok = ok && y.data()[i * N + j] == x.data()[i * N + j] * 2.0f && y2.data()[i * N + j] == y.data()[i * N + j];
      sz += z.data()[i * N + j] * 2.0;
      sx += x.data()[i * N + j] * 3.0;
    }
    ok = ok && s.data()[j] == float(sz) && s2.data()[j] == float(sx);
  }
  CHECK(ok);
}

TEST_CASE("row groups: a shared expression gives the bits of separate passes", "[reduce][row_groups]") {
  // dx = g and db = sum(g) in one pass, g evaluated once per element, against each write in a
  // pass of its own, on non-integer data (so the order of the additions shows in the bits).
  constexpr std::size_t B = 300, N = 1100;
  tensor<float, shape<dyn, N>> y(B), dy(B), dx(B), dx_alone(B);
  tensor<float, shape<N>> db, db_alone;
  solder::test::fill_uniform(y, -1, 2, 817);
  solder::test::fill_uniform(dy, -1, 1, 818);
  const auto g = solder::map(solder::ops::gradient_from_output<solder::ops::relu, true>{{}, 1.25f}, y, dy);
  solder::assign_all(solder::write(dx, g), solder::write(db, solder::sum<0>(g)));
  solder::assign(dx_alone, g);
  solder::assign(db_alone, solder::sum<0>(g));
  CHECK(same_bits(dx, dx_alone));
  CHECK(same_bits(db, db_alone));
}

TEST_CASE("row groups: chunks whose first group starts the column sums, beside row sums", "[reduce][row_groups]") {
  // 512 columns (whole vectors) and 300 rows: chunks of 32 whole rows, each starting with a
  // group that writes its whole partial row, so the column folds start at identity rather than
  // at a filled block; the row sums in the same pass fold through memory as before.
  constexpr std::size_t B = 300, N = 512;
  tensor<float, shape<dyn, N>> x(B), y(B);
  tensor<float, shape<N>> cols, colmax;
  tensor<float, shape<dyn>> rows(B);
  solder::test::fill_integers(x, -60, 60, 819);
  solder::assign_all(solder::write(y, x * 2.0f), solder::write(cols, solder::sum<0>(x * 2.0f)),
                     solder::write(colmax, solder::max<0>(x * 2.0f)), solder::write(rows, solder::sum<1>(x * 2.0f)));
  bool ok = true;
  for (std::size_t j = 0; j < N; ++j) {
    double s = 0;
    float m = -INFINITY;
    for (std::size_t i = 0; i < B; ++i) {
      s += x.data()[i * N + j] * 2.0;
      m = std::max(m, x.data()[i * N + j] * 2.0f);
    }
    ok = ok && cols.data()[j] == float(s) && colmax.data()[j] == m;
  }
  for (std::size_t i = 0; i < B; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < N; ++j) s += x.data()[i * N + j] * 2.0;
    ok = ok && rows.data()[i] == float(s);
  }
  CHECK(ok);
}
