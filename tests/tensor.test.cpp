// tests/tensor.test.cpp: tensor<T, S> and tensor_ref<T, S>: 64-byte alignment, zero fill,
// element access, copy and move, a dynamic batch, printing, heap storage of large tensors
// and the runtime errors of a bad batch.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "solder/tensor.hpp"
#include "support/data.hpp"

namespace {

using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % solder::alignment == 0; }

template <class T>
bool all_zero(const T& t) {
  return std::all_of(t.begin(), t.end(), [](float v) { return v == 0.0f; });
}

/// The lines of a printed tensor.
std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// Counts the numbers printed in one row line "  [a, b, ...]".
std::size_t numbers_in(const std::string& row) {
  std::size_t n = 0;
  bool in_number = false;
  for (char c : row) {
    const bool digit = (c >= '0' && c <= '9');
    if (digit && !in_number) ++n;
    in_number = digit || (in_number && (c == '.' || c == 'e' || c == '-'));
  }
  return n;
}

struct holder {
  char c;
  tensor<float, shape<5>> t;  // inline storage: the member itself must be aligned
};

}  // namespace

TEST_CASE("tensor: storage is 64-byte aligned, inline or on the heap", "[tensor]") {
  tensor<float, shape<1, 1>> one;
  tensor<float, shape<3>> three;
  tensor<float, shape<3, 37>> small;   // 444 bytes: inline
  tensor<float, shape<64, 64>> large;  // 16 KiB: heap
  tensor<double, shape<17, 255>> wide;
  tensor<float, shape<dyn, 37>> dynamic(3);
  CHECK(aligned64(one.data()));
  CHECK(aligned64(three.data()));
  CHECK(aligned64(small.data()));
  CHECK(aligned64(large.data()));
  CHECK(aligned64(wide.data()));
  CHECK(aligned64(dynamic.data()));

  // Inside another object, in a vector, and from new.
  holder h{};
  CHECK(aligned64(h.t.data()));
  std::vector<tensor<float, shape<3>>> many(5);
  for (const auto& t : many) CHECK(aligned64(t.data()));
  auto boxed = std::make_unique<tensor<float, shape<3, 37>>>();
  CHECK(aligned64(boxed->data()));
}

TEST_CASE("tensor: new tensors are zero-filled", "[tensor]") {
  tensor<float, shape<3, 37>> small;
  tensor<float, shape<64, 64>> large;
  tensor<float, shape<2, 3, 5>> rank3;
  tensor<float, shape<dyn, 257>> dynamic(17);
  tensor<int, shape<7>> ints;
  CHECK(all_zero(small));
  CHECK(all_zero(large));
  CHECK(all_zero(rank3));
  CHECK(all_zero(dynamic));
  CHECK(std::all_of(ints.begin(), ints.end(), [](int v) { return v == 0; }));
  CHECK(dynamic.size() == 17 * 257);
  CHECK(std::size_t(dynamic.end() - dynamic.begin()) == 17 * 257);
}

TEST_CASE("tensor: fill writes every element", "[tensor]") {
  tensor<float, shape<3, 37>> t;
  t.fill(2.5f);
  CHECK(std::all_of(t.begin(), t.end(), [](float v) { return v == 2.5f; }));
  tensor<float, shape<dyn, 5>> d(4);
  d.ref().fill(-1.0f);
  CHECK(std::all_of(d.begin(), d.end(), [](float v) { return v == -1.0f; }));
}

TEST_CASE("tensor: element access is row-major", "[tensor]") {
  tensor<float, shape<2, 3, 5>> t;
  solder::test::fill_uniform(t, -1, 1, 7);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 5; ++k) {
        CHECK(t(i, j, k) == t[std::size_t(15 * i + 5 * j + k)]);
        CHECK(&t(i, j, k) == t.data() + 15 * i + 5 * j + k);
      }

  tensor<float, shape<3, 37>> m;
  m(2, 36) = 4.0f;
  m(1, 0) = 3.0f;
  CHECK(m[2 * 37 + 36] == 4.0f);
  CHECK(m[37] == 3.0f);
  const auto& cm = m;
  CHECK(cm(2, 36) == 4.0f);
  CHECK(cm[37] == 3.0f);

  // A view reads and writes the same memory.
  tensor_ref<float, shape<3, 37>> view = m.ref();
  CHECK(view.data() == m.data());
  view(0, 1) = 9.0f;
  CHECK(m(0, 1) == 9.0f);
  tensor_ref<const float, shape<3, 37>> cview = view;
  CHECK(cview(2, 36) == 4.0f);
  CHECK(cview.size() == 111);
  STATIC_REQUIRE(decltype(view)::rank() == 2);

  tensor<float, shape<dyn, 4>> d(3);
  d(2, 3) = 1.0f;
  CHECK(d[11] == 1.0f);
  CHECK(d.ref()(2, 3) == 1.0f);
}

TEST_CASE("tensor: copies are deep, moves keep the data", "[tensor]") {
  SECTION("inline storage") {
    tensor<float, shape<3, 37>> a;
    solder::test::fill_uniform(a, -1, 1, 1);
    tensor<float, shape<3, 37>> b = a;
    CHECK(b.data() != a.data());
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
    a[0] = 100.0f;
    CHECK(b[0] != 100.0f);
    tensor<float, shape<3, 37>> c;
    c = a;
    CHECK(std::equal(a.begin(), a.end(), c.begin()));
    const std::vector<float> before(a.begin(), a.end());
    tensor<float, shape<3, 37>> moved = std::move(a);
    CHECK(std::equal(before.begin(), before.end(), moved.begin()));
    CHECK(aligned64(moved.data()));
  }
  SECTION("heap storage") {
    tensor<float, shape<64, 64>> a;
    solder::test::fill_uniform(a, -1, 1, 2);
    tensor<float, shape<64, 64>> b = a;
    CHECK(b.data() != a.data());
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
    const float* storage = a.data();
    tensor<float, shape<64, 64>> moved = std::move(a);
    CHECK(moved.data() == storage);  // the buffer changes hands, nothing is copied
    CHECK(std::equal(b.begin(), b.end(), moved.begin()));
    tensor<float, shape<64, 64>> target;
    target = std::move(moved);
    CHECK(target.data() == storage);
  }
  SECTION("dynamic batch: copy assignment takes the source's batch") {
    tensor<float, shape<dyn, 5>> a(3), b(7);
    solder::test::fill_uniform(b, -1, 1, 3);
    a = b;
    CHECK(a.batch() == 7);
    CHECK(a.size() == 35);
    CHECK(std::equal(b.begin(), b.end(), a.begin()));
    tensor<float, shape<dyn, 5>> c = b;
    CHECK(c.batch() == 7);
    CHECK(std::equal(b.begin(), b.end(), c.begin()));
  }
}

TEST_CASE("tensor: a moved-from tensor is empty or valid, so it can be assigned again", "[tensor]") {
  // Assigning to a moved-from object is ordinary C++ (std::swap, containers, `t = next;`).
  // Heap storage leaves the source with data() == nullptr; its size() must then not claim
  // elements, or begin()..end() spans a null buffer and `moved_from = other` memcpys into it.
  SECTION("static shape on the heap") {
    tensor<float, shape<64, 64>> a, other;
    other.fill(1.0f);
    tensor<float, shape<64, 64>> b = std::move(a);
    INFO("moved-from: data() = " << static_cast<const void*>(a.data()) << ", size() = " << a.size());
    REQUIRE((a.data() != nullptr || a.size() == 0));
    a = other;
    CHECK(std::all_of(a.begin(), a.end(), [](float v) { return v == 1.0f; }));
  }
  SECTION("dynamic shape") {
    tensor<float, shape<dyn, 8>> a(4), other(4);
    other.fill(1.0f);
    tensor<float, shape<dyn, 8>> b = std::move(a);
    INFO("moved-from: data() = " << static_cast<const void*>(a.data()) << ", size() = " << a.size());
    REQUIRE((a.data() != nullptr || a.size() == 0));
    a = other;
    CHECK(a.size() == 32);
    CHECK(std::all_of(a.begin(), a.end(), [](float v) { return v == 1.0f; }));
  }
}

TEST_CASE("tensor: dynamic batch", "[tensor]") {
  tensor<float, shape<dyn, 37>> t(5);
  CHECK(t.batch() == 5);
  CHECK(t.size() == 5 * 37);
  STATIC_REQUIRE(decltype(t)::rank() == 2);
  auto view = t.ref();
  CHECK(view.batch() == 5);
  CHECK(view.size() == 5 * 37);

  tensor<float, shape<dyn, 37>> one(1);
  CHECK(one.size() == 37);

  // A view of caller memory with a runtime batch.
  std::vector<float> buf(4 * 37, 2.0f);
  tensor_ref<float, shape<dyn, 37>> r(buf.data(), 4);
  CHECK(r.batch() == 4);
  CHECK(r.size() == 4 * 37);
  CHECK(r(3, 36) == 2.0f);

  // Static tensors and views report batch 1 whatever they are given.
  tensor<float, shape<3, 37>> s;
  CHECK(s.batch() == 1);
  tensor_ref<float, shape<3, 37>> sr(s.data(), 9);
  CHECK(sr.batch() == 1);
  CHECK(sr.size() == 111);
}

TEST_CASE("tensor: a bad batch is a solder::error", "[tensor]") {
  using Catch::Matchers::Contains;
  using T = tensor<float, shape<dyn, 8>>;
  using R = tensor_ref<float, shape<dyn, 8>>;
  CHECK_THROWS_AS(T(0), solder::error);
  CHECK_THROWS_WITH(T(0), Contains("batch"));
  CHECK_THROWS_AS(T(0, solder::uninitialized), solder::error);
  float buf[8] = {};
  CHECK_THROWS_AS(R(buf, 0), solder::error);
  CHECK_THROWS_AS(R(buf), solder::error);  // a dynamic view needs its batch
  CHECK_NOTHROW(R(buf, 1));
  // solder::error is a std::runtime_error, so generic handlers catch it too.
  CHECK_THROWS_AS(T(0), std::runtime_error);
}

TEST_CASE("tensor: a 4096x4096 tensor lives on the heap", "[tensor]") {
  using Big = tensor<float, shape<4096, 4096>>;
  STATIC_REQUIRE(sizeof(Big) <= 256);  // a pointer, a one-line inline slot and the batch
  auto t = std::make_unique<Big>();    // and the same on the stack below: no 64 MiB frame
  Big local;
  CHECK(aligned64(local.data()));
  CHECK(local.size() == std::size_t(4096) * 4096);
  CHECK(local[0] == 0.0f);
  CHECK(local(4095, 4095) == 0.0f);
  local(4095, 4095) = 1.0f;
  CHECK(local[std::size_t(4096) * 4096 - 1] == 1.0f);
  CHECK(t->data() != local.data());
  CHECK(std::all_of(t->begin(), t->end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("tensor: constructed or assigned from an expression", "[tensor]") {
  tensor<float, shape<3, 37>> x;
  solder::test::fill_uniform(x, -2, 2, 11);
  tensor<float, shape<3, 37>> y = x * 2.0f;  // evaluated on construction
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == x[i] * 2.0f);
  tensor<float, shape<dyn, 37>> d(2);
  solder::test::fill_uniform(d, -2, 2, 12);
  tensor<float, shape<dyn, 37>> e = d + 1.0f;  // takes the expression's batch
  CHECK(e.batch() == 2);
  for (std::size_t i = 0; i < d.size(); ++i) CHECK(e[i] == d[i] + 1.0f);
  // A view assigned from a view copies elements (it does not rebind).
  tensor<float, shape<3, 37>> z;
  z.ref() = x.ref();
  CHECK(std::equal(x.begin(), x.end(), z.begin()));
  CHECK(z.data() != x.data());
}

TEST_CASE("tensor: printing", "[tensor]") {
  using Catch::Matchers::Contains;
  using Catch::Matchers::StartsWith;

  SECTION("a small tensor in full") {
    tensor<float, shape<2, 3>> t;
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(i) + 0.5f;
    std::ostringstream os;
    os << t;
    const auto lines = lines_of(os.str());
    REQUIRE(lines.size() == 3);
    CHECK(lines[0] == "tensor[2, 3]");
    CHECK_THAT(lines[1], Contains("0.5") && Contains("1.5") && Contains("2.5"));
    CHECK_THAT(lines[2], Contains("3.5") && Contains("4.5") && Contains("5.5"));
    CHECK(numbers_in(lines[1]) == 3);
  }
  SECTION("a dynamic tensor names its batch") {
    tensor<float, shape<dyn, 4>> t(3);
    std::ostringstream os;
    os << t;
    CHECK_THAT(os.str(), StartsWith("tensor[3, 4]\n"));
    CHECK(lines_of(os.str()).size() == 4);
    std::ostringstream vs;
    vs << t.ref();  // views print the same
    CHECK(vs.str() == os.str());
  }
  SECTION("large tensors are abbreviated: six rows and columns at each end") {
    tensor<float, shape<20, 20>> t;
    for (std::size_t r = 0; r < 20; ++r)
      for (std::size_t c = 0; c < 20; ++c) t(r, c) = float(100 * r + c);
    std::ostringstream os;
    os << t;
    const auto lines = lines_of(os.str());
    REQUIRE(lines.size() == 1 + 12 + 1);  // header, 12 rows, one "..." line
    CHECK(lines[0] == "tensor[20, 20]");
    CHECK_THAT(lines[7], Contains("...") && !Contains("["));
    const std::string& first = lines[1];
    INFO("first row: '" << first << "'");
    CHECK(numbers_in(first) == 12);
    CHECK_THAT(first, Contains("...") && Contains("14,") && Contains("19]"));
    CHECK_THAT(lines.back(), Contains("1900") && Contains("1919]"));
    // One separator between neighbours, also around the ellipsis: "5, ..., 14", never ",,".
    CHECK_THAT(first, !Contains(",,") && !Contains(", ,"));
  }
}
