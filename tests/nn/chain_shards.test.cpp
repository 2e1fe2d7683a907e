// tests/nn/chain_shards.test.cpp: a batch trained as parts (data-parallel shards, micro-batches).
// set_first_sample makes each part draw the whole batch's dropout masks; backward's per-kernel
// callback and block_params name which gradients are ready; dropout streams round-trip.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/expr/operators.hpp"
#include "solder/nn/chain.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;

// Widths 12 and 24 put the second shard's first mask element off a 128-element Philox group
// (4 x 12 = 48), so the unaligned path of the mask generator is exercised too.
using small_mlp = nn::chain<nn::linear<8, 12>, nn::relu, nn::dropout<0.5f>, nn::linear<12, 24>, nn::tanh,
                            nn::dropout<0.25f>, nn::linear<24, 3>>;
using wide_mlp = nn::chain<nn::linear<16, 256>, nn::relu, nn::dropout<0.5f>, nn::linear<256, 4>>;
// An elementwise block of its own (bias, gelu, dropout) after a linear layer without bias.
using block_mlp = nn::chain<nn::linear<8, 40, false>, nn::bias<40>, nn::gelu, nn::dropout<0.3f>, nn::linear<40, 2>>;

std::vector<float> inputs(std::size_t n, std::size_t f, std::uint64_t seed) {
  std::vector<float> x(n * f);
  std::uint64_t s = seed;
  for (float& v : x) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    v = float(double(s >> 40) / double(1ULL << 24) * 2.0 - 1.0);
  }
  return x;
}

std::vector<std::int32_t> labels(std::size_t n, int classes) {
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((i * 5 + 1) % std::size_t(classes));
  return y;
}

/// Forward of the whole batch in one call and in parts [0, cut) and [cut, n) with
/// set_first_sample: the same dropout masks, so the same zeros, and the same values to the GEMM's
/// rounding (a row's dot products do not depend on the rows beside it here, so bitwise).
template <class Model>
void check_parts_forward(std::size_t n, std::size_t cut) {
  constexpr std::size_t in = Model::in_features, out = Model::out_features;
  const std::vector<float> x = inputs(n, in, 11);
  Model whole(3), part(3);
  using X = typename Model::input_ref;
  const auto y = whole.forward(X(x.data(), n));
  part.set_first_sample(0);
  const auto y0 = part.forward(X(x.data(), cut));
  // Each forward advances the streams: the second part draws the same step's masks only when
  // the streams are put back to where the first part started.
  std::vector<philox_state> streams = part.dropout_streams();
  for (auto& s : streams) --s.offset;
  part.set_dropout_streams(streams);
  part.set_first_sample(cut);
  const auto y1 = part.forward(X(x.data() + cut * in, n - cut));
  CHECK(test::bit_differences(y.data(), y0.data(), cut * out) == 0);
  CHECK(test::bit_differences(y.data() + cut * out, y1.data(), (n - cut) * out) == 0);
}

}  // namespace

TEST_CASE("chain: parts of a batch draw the whole batch's dropout masks", "[nn][chain][shards]") {
  check_parts_forward<small_mlp>(8, 4);
  check_parts_forward<small_mlp>(9, 5);
  check_parts_forward<wide_mlp>(6, 2);
  check_parts_forward<block_mlp>(7, 3);
}

TEST_CASE("chain: without set_first_sample a part draws other masks", "[nn][chain][shards]") {
  // The check above can fail: the second half drawn from sample 0 drops other elements.
  constexpr std::size_t n = 8, cut = 4, in = wide_mlp::in_features, out = wide_mlp::out_features;
  const std::vector<float> x = inputs(n, in, 5);
  wide_mlp whole(3), part(3);
  const auto y = whole.forward(wide_mlp::input_ref(x.data(), n));
  const auto y1 = part.forward(wide_mlp::input_ref(x.data() + cut * in, n - cut));
  CHECK(test::bit_differences(y.data() + cut * out, y1.data(), (n - cut) * out) > 0);
}

TEST_CASE("chain: shard gradients weighted by their sizes give the whole batch's gradient", "[nn][chain][shards]") {
  constexpr std::size_t n = 10, cut = 6, in = small_mlp::in_features;
  const std::vector<float> x = inputs(n, in, 21);
  const std::vector<std::int32_t> y = labels(n, 3);
  small_mlp whole(9), a(9), b(9);
  const float loss = whole.loss_and_backward(small_mlp::input_ref(x.data(), n), std::span(y));
  a.set_first_sample(0);
  b.set_first_sample(cut);
  const float la = a.loss_and_backward(small_mlp::input_ref(x.data(), cut), std::span(y.data(), cut));
  const float lb = b.loss_and_backward(small_mlp::input_ref(x.data() + cut * in, n - cut), std::span(y.data() + cut, n - cut));
  // The mean loss over the batch is the shard means weighted by their sizes.
  CHECK_THAT(double(loss), Catch::Matchers::WithinRel(double(la) * cut / n + double(lb) * (n - cut) / n, 1e-5));
  const auto pw = whole.params(), pa = a.params(), pb = b.params();
  REQUIRE(pw.size() == pa.size());
  for (std::size_t k = 0; k < pw.size(); ++k) {
    for (std::size_t i = 0; i < pw[k].grad.size(); ++i) {
      const double g = double(pa[k].grad[i]) * cut / n + double(pb[k].grad[i]) * (n - cut) / n;
      // Float sums over 10 samples in another grouping: a few ulps of the largest term.
      CHECK_THAT(double(pw[k].grad[i]), Catch::Matchers::WithinAbs(g, 1e-6 + 1e-5 * std::fabs(g)));
    }
  }
}

TEST_CASE("chain: backward reports each kernel's gradients as they are ready", "[nn][chain][shards]") {
  constexpr std::size_t n = 5, in = small_mlp::in_features;
  const std::vector<float> x = inputs(n, in, 2);
  const std::vector<std::int32_t> y = labels(n, 3);
  small_mlp model(4), reference(4);
  const auto all = model.params();
  std::size_t listed = 0;
  for (std::size_t k = 0; k < small_mlp::kernels; ++k) listed += model.block_params(k).size();
  CHECK(listed == all.size());
  CHECK_THROWS_WITH(model.block_params(small_mlp::kernels), Catch::Matchers::Contains("out of range"));

  reference.loss_and_backward(small_mlp::input_ref(x.data(), n), std::span(y));
  const auto ref = reference.params();
  for (const auto& p : all) p.grad.fill(std::nanf(""));
  std::vector<std::size_t> order;
  model.loss_and_backward(small_mlp::input_ref(x.data(), n), std::span(y), nn::cross_entropy_loss{}, [&](std::size_t k) {
    order.push_back(k);
    // Kernel k's gradients are final when it is reported: equal to a plain backward's.
    for (const auto& p : model.block_params(k)) {
      std::size_t j = 0;
      while (ref[j].name != p.name) ++j;
      CHECK(test::bit_differences(p.grad.data(), ref[j].grad.data(), p.grad.size()) == 0);
    }
  });
  CHECK(order == std::vector<std::size_t>{2, 1, 0});
}

TEST_CASE("chain: dropout streams round-trip and are checked", "[nn][chain][shards]") {
  small_mlp model(6);
  auto streams = model.dropout_streams();
  REQUIRE(streams.size() == 2);
  CHECK(streams[0].seed != streams[1].seed);
  streams[0].offset = 41;
  streams[1].first = 7;
  model.set_dropout_streams(streams);
  const auto back = model.dropout_streams();
  CHECK(back[0].offset == 41);
  CHECK(back[1].first == 7);
  model.set_first_sample(3);
  CHECK(model.dropout_streams()[0].first == 3 * 12);
  CHECK(model.dropout_streams()[1].first == 3 * 24);
  CHECK_THROWS_WITH(model.set_dropout_streams(std::span(streams.data(), 1)),
                    Catch::Matchers::Contains("got 1 streams, the chain has 2 dropout layers"));
}

TEST_CASE("dropout mask: first shifts the element counter", "[expr][random][shards]") {
  // A mask drawn with first = f is the tail of the mask drawn from 0, for aligned and unaligned f.
  using S = shape<dyn, 40>;
  constexpr std::size_t rows = 9;
  tensor<float, S> ones(rows);
  for (std::size_t i = 0; i < ones.size(); ++i) ones.data()[i] = 1.0f;
  tensor<float, S> full(rows);
  full = solder::dropout(ones, 0.5f, philox_state{77, 3, 0});
  for (std::size_t start_row : {1, 3, 5}) {
    const std::size_t f = start_row * 40;  // 40, 120 (unaligned), 200
    tensor<float, S> part(rows - start_row);
    part = solder::dropout(tensor_ref<const float, S>(ones.data(), rows - start_row), 0.5f, philox_state{77, 3, f});
    CHECK(test::bit_differences(full.data() + f, part.data(), part.size()) == 0);
  }
}
