// tests/eval/threads.test.cpp: the CPU evaluator's thread count: elementwise and dropout
// results bitwise identical for 1 and 2 threads on tensors big enough to be split, static
// and dynamic, flat and row by row, with and without streaming stores; set_num_threads.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "support/data.hpp"
#include "support/tuning.hpp"

namespace {

using solder::test::make;
using solder::test::bit_differences;

using solder::dyn;
using solder::shape;
using solder::tensor;

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

/// Evaluates `assign(y)` with 1 and then 2 threads into fresh outputs of shape S, checks the
/// two bitwise equal, and checks the 2-thread result against want(i) (so that two equally
/// wrong results cannot pass).
template <class S, class Assign, class Want>
void check_thread_invariant(const std::string& what, std::size_t batch, Assign assign, Want want) {
  auto y1 = make<S>(batch), y2 = make<S>(batch);
  REQUIRE(y1.size() >= (std::size_t(1) << 20));  // big enough to be cut into chunks
  y1.fill(-1.0f);
  y2.fill(-2.0f);
  {
    thread_count one(1);
    assign(y1);
  }
  {
    thread_count two(2);
    assign(y2);
  }
  const std::string name = what + " on " + solder::to_string<S>(batch);
  {
    INFO(name << ": 1 thread vs 2 threads");
    CHECK(bit_differences(y1.data(), y2.data(), y1.size()) == 0);
  }
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < y2.size(); ++i) {
    const float w = want(i);
    if (std::memcmp(&w, &y2[i], sizeof(float)) != 0 && wrong++ == 0) first = i;
  }
  INFO(name << ": against the scalar loop; first difference at " << first);
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("threads: set_num_threads and num_threads", "[threads]") {
  const int saved = solder::num_threads();
  CHECK(saved >= 1);
  {
    thread_count t(3);
    CHECK(solder::num_threads() == 3);
  }
  CHECK(solder::num_threads() == saved);
  CHECK_THROWS_AS(solder::set_num_threads(0), solder::error);
  CHECK_THROWS_AS(solder::set_num_threads(-2), solder::error);
  CHECK(solder::num_threads() == saved);
}

TEST_CASE("threads: elementwise results do not depend on the thread count", "[threads]") {
  SECTION("static [1024, 1024], flat") {
    using S = shape<1024, 1024>;
    tensor<float, S> x, z;
    solder::test::fill_uniform(x, -2, 2, 601);
    solder::test::fill_away(z, -2, 2, 602, {0.0}, 0.25);
    check_thread_invariant<S>(
        "where(x > z, x / z, relu(x - z))", 1,
        [&](auto& y) { y = solder::where(x > z, x / z, solder::relu(x - z)); },
        [&](std::size_t i) { return x[i] > z[i] ? x[i] / z[i] : std::max(x[i] - z[i], 0.0f); });
  }
  SECTION("static [2048, 1024], 8 MiB: streaming stores") {
    using S = shape<2048, 1024>;
    STATIC_REQUIRE(S::size * sizeof(float) >= solder::eval::cpu::stream_min_bytes_floor);
    const solder::test::stream_from_floor streams;
    tensor<float, S> x;
    solder::test::fill_uniform(x, -2, 2, 603);
    check_thread_invariant<S>("(x + 1) * x", 1, [&](auto& y) { y = (x + 1.0f) * x; },
                              [&](std::size_t i) { return (x[i] + 1.0f) * x[i]; });
  }
  SECTION("static [4099, 257], a bias: row by row, each row with a tail") {
    using S = shape<4099, 257>;
    tensor<float, S> x;
    tensor<float, shape<257>> b;
    solder::test::fill_uniform(x, -2, 2, 604);
    solder::test::fill_uniform(b, -1, 1, 605);
    check_thread_invariant<S>("relu(x + b)", 1, [&](auto& y) { y = solder::relu(x + b); },
                              [&](std::size_t i) { return std::max(x[i] + b[i % 257], 0.0f); });
  }
  SECTION("dynamic [2048, 1024]: streaming stores") {
    using S = shape<dyn, 1024>;
    STATIC_REQUIRE(2048 * S::size * sizeof(float) >= solder::eval::cpu::stream_min_bytes_floor);
    const solder::test::stream_from_floor streams;
    tensor<float, S> x(2048);
    tensor<float, shape<1024>> b;
    solder::test::fill_uniform(x, -2, 2, 606);
    solder::test::fill_uniform(b, -1, 1, 607);
    check_thread_invariant<S>("(x - b) * b", 2048, [&](auto& y) { y = (x - b) * b; },
                              [&](std::size_t i) { return (x[i] - b[i % 1024]) * b[i % 1024]; });
  }
  SECTION("dynamic [2048, 1024] into an unaligned view: no streaming stores there") {
    using S = shape<dyn, 1024>;
    tensor<float, S> x(2048);
    solder::test::fill_uniform(x, -2, 2, 609);
    std::vector<float> buf(x.size() + 1);
    solder::tensor_ref<float, S> y1(buf.data() + 1, 2048);  // 4 bytes past a 64-byte boundary at best
    {
      thread_count one(1);
      y1 = solder::relu(x) * 2.0f;
    }
    tensor<float, S> y2(2048);
    {
      thread_count two(2);
      y2 = solder::relu(x) * 2.0f;
    }
    CHECK(bit_differences(y1.data(), y2.data(), y2.size()) == 0);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) wrong += y1[i] != std::max(x[i], 0.0f) * 2.0f;
    CHECK(wrong == 0);
  }
  SECTION("dynamic [4099, 257]") {
    using S = shape<dyn, 257>;
    tensor<float, S> x(4099);
    solder::test::fill_uniform(x, -2, 2, 608);
    check_thread_invariant<S>("(x - 1) * 3", 4099, [&](auto& y) { y = (x - 1.0f) * 3.0f; },
                              [&](std::size_t i) { return (x[i] - 1.0f) * 3.0f; });
  }
}

TEST_CASE("threads: dropout masks do not depend on the thread count", "[threads]") {
  SECTION("static [2048, 1024], p = 0.1") {
    using S = shape<2048, 1024>;
    tensor<float, S> x;
    solder::test::fill_uniform(x, -2, 2, 611);
    const solder::test::dropout_rule rule{0.1, 1234, 5};
    check_thread_invariant<S>("dropout(x, 0.1)", 1,
                              [&](auto& y) { y = solder::dropout(x, 0.1f, solder::philox_state{1234, 5}); },
                              [&](std::size_t i) { return rule.keep(i) ? x[i] * rule.scale() : 0.0f; });
  }
  SECTION("static [4099, 257], p = 0.5, fused with a bias and relu") {
    using S = shape<4099, 257>;
    tensor<float, S> x;
    tensor<float, shape<257>> b;
    solder::test::fill_uniform(x, -2, 2, 612);
    solder::test::fill_uniform(b, -1, 1, 613);
    const solder::test::dropout_rule rule{0.5, 77, 0};
    check_thread_invariant<S>(
        "dropout(relu(x + b), 0.5)", 1,
        [&](auto& y) { y = solder::dropout(solder::relu(x + b), 0.5f, solder::philox_state{77, 0}); },
        [&](std::size_t i) { return rule.keep(i) ? std::max(x[i] + b[i % 257], 0.0f) * rule.scale() : 0.0f; });
  }
  SECTION("dynamic [2048, 1024], p = 0.3") {
    using S = shape<dyn, 1024>;
    tensor<float, S> x(2048);
    solder::test::fill_uniform(x, -2, 2, 614);
    const solder::test::dropout_rule rule{0.3, 9, 1u << 20};
    check_thread_invariant<S>("dropout(x, 0.3)", 2048,
                              [&](auto& y) { y = solder::dropout(x, 0.3f, solder::philox_state{9, 1u << 20}); },
                              [&](std::size_t i) { return rule.keep(i) ? x[i] * rule.scale() : 0.0f; });
  }
}
