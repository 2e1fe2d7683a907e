// tests/generators/shard_masks.test.cpp: the chain-level launchers solder-gen writes take
// first_sample, the index of a batch's first row in a global batch, and start every dropout's
// counter at first_sample * (its features per sample), as basic_chain::set_first_sample: the
// generated text, and the generated passes run on the host (support/grid.hpp), where a shard of
// rows [s, n) draws the masks of the whole batch's rows [s, n) bit for bit. train_step is built
// from the pieces loss_and_backward and optimizer_step run.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "../../generators/solder_gen.hpp"
#include "../../kernels/chains.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/linear_block.hpp"
#include "support/data.hpp"
#include "support/grid.hpp"

namespace {

using namespace solder;
namespace cu = solder::eval::cuda;
namespace gen = solder::gen;

/// A chain whose second dropout has 100 features per sample: a shard starting at row s draws
/// from counter 100 s, off the masks' 128-element groups for most s.
using shard_mlp = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 100>, nn::relu,
                            nn::dropout<0.25f>, nn::linear<100, 10>>;

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// y = tail(x W^T + b) as the generated gN_forward writes it: the product x W^T as the epilogue's
/// accumulator, W [Out, In] read transposed, the dropout's stream (seed, offset, first).
template <std::size_t In, std::size_t Out, class Block>
std::vector<float> product_forward(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                                   std::size_t batch, philox_state rng) {
  typename Block::tail_type tail;
  std::get<1>(tail.layers).rng = rng;
  std::vector<float> y(batch * Out);
  const auto z = cu::product_value<shape<dyn, Out>>(batch) + tensor_ref<const float, shape<Out>, device>(b.data());
  test::run_product(cu::product<cu::product_tiling_for<Out>>(
      cu::matrix_operand<false>{x.data(), In}, cu::matrix_operand<true>{w.data(), In}, batch, In,
      write(tensor_ref<float, shape<dyn, Out>, device>(y.data(), batch), tail.template expression<nn::mode::train>(z))));
  return y;
}

/// A dropout alone (an elementwise group): y = dropout(x) and dx from x and dy, the mask drawn
/// again, as the generated gN_forward and gN_backward write them.
template <std::size_t W>
std::pair<std::vector<float>, std::vector<float>> dropout_group(const std::vector<float>& x, const std::vector<float>& dy,
                                                                std::size_t batch, philox_state rng) {
  using block_type = nn::elementwise_block<nn::dropout<0.5f>>;
  using rows = tensor_ref<const float, shape<dyn, W>, device>;
  using rows_out = tensor_ref<float, shape<dyn, W>, device>;
  block_type block{};
  std::get<0>(block.layers).rng = rng;
  std::vector<float> y(batch * W), dx(batch * W);
  test::host_runner r;
  cu::dispatch(r, write(rows_out(y.data(), batch), block.expression<nn::mode::train>(rows(x.data(), batch))));
  const auto forward = [&](const auto& xv) { return block.expression<nn::mode::train>(xv); };
  const auto grads = vjp(forward, rows(dy.data(), batch), rows(x.data(), batch));
  cu::dispatch(r, write(rows_out(dx.data(), batch), std::get<0>(grads)));
  return {y, dx};
}

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("solder-gen: the chain-level launchers take first_sample and start each mask at first_sample * features",
          "[gen][dist]") {
  const gen::files f = gen::generate(gen::describe<shard_mlp>("shard_mlp"), "chains.hpp");
  CHECK(holds(f.cu, "std::get<1>(tail.layers).rng = {seeds[0], offsets[0], first_sample * 256};"));
  CHECK(holds(f.cu, "std::get<1>(tail.layers).rng = {seeds[1], offsets[1], first_sample * 100};"));
  CHECK(holds(f.h, "const uint64_t* seeds, uint64_t* offsets, uint64_t first_sample,"));
  // The split step: the loss on the device, the labels' check a device row index.
  CHECK(holds(f.h, "int solder_shard_mlp_loss_and_backward(const float* x, const int32_t* labels, const float* params,"));
  CHECK(holds(f.h, "float label_smoothing, float* loss, uint64_t* bad_label_row,"));
  CHECK(holds(f.h, "int solder_shard_mlp_optimizer_step(float* params, const float* grads, float* optimizer_state,"));
  CHECK(holds(f.cu, "solder::eval::cuda::softmax_cross_entropy_async<10>("));
  // train_step from the same pieces: one definition of the passes, one of the update.
  const auto train = f.cu.find("extern \"C\" int solder_shard_mlp_train_step(");
  const auto split = f.cu.find("extern \"C\" int solder_shard_mlp_loss_and_backward(");
  const auto update = f.cu.find("extern \"C\" int solder_shard_mlp_optimizer_step(");
  REQUIRE(train != std::string::npos);
  REQUIRE(split != std::string::npos);
  REQUIRE(update != std::string::npos);
  const std::string train_body = f.cu.substr(train, f.cu.find("\n}\n", train) - train);
  CHECK(holds(train_body, "chain_loss_and_backward("));
  CHECK(holds(train_body, "solder::eval::cuda::wait_for_loss<10>(mean.data(), first_bad.data(), labels, stream);"));
  CHECK(holds(train_body, "update(settings, *optimizer, params, grads, optimizer_state, stream);"));
  CHECK_FALSE(holds(train_body, "chain_forward("));
  CHECK_FALSE(holds(train_body, "optimizer_step(settings"));
  std::size_t definitions = 0;
  for (auto at = f.cu.find("void chain_loss_and_backward("); at != std::string::npos;
       at = f.cu.find("void chain_loss_and_backward(", at + 1))
    ++definitions;
  CHECK(definitions == 1);

  // A chain whose dropout's gradient follows from its input: the backward draws it again from
  // the same counters (digits_cnn's dropout over [512] after the flatten).
  const gen::files cnn = gen::generate(gen::describe<digits_cnn>("digits_cnn"), "chains.hpp");
  const auto backward = cnn.cu.find("void chain_backward(");
  REQUIRE(backward != std::string::npos);
  CHECK(cnn.cu.find("std::get<0>(block.layers).rng = {seeds[0], offsets[0], first_sample * 512};") < backward);
  CHECK(cnn.cu.find("std::get<0>(block.layers).rng = {seeds[0], offsets[0], first_sample * 512};", backward) !=
        std::string::npos);
  CHECK(holds(cnn.h, "const uint64_t* seeds, const uint64_t* offsets, uint64_t first_sample,"));
}

TEST_CASE("generated passes: a shard starting at row s draws the whole batch's masks of its rows", "[gen][dist]") {
  constexpr std::size_t n = 37;
  // The masks draw counters in groups of 128: s * 100 is a group boundary for s = 32 only (3200 =
  // 25 * 128), s * 50 for none of these s.
  const std::size_t s = GENERATE(std::size_t(3), std::size_t(17), std::size_t(32), std::size_t(36));
  const philox_state whole{0x5eedull, 7, 0};
  const philox_state shard{whole.seed, whole.offset, s * 100};

  SECTION("product group: linear<256, 100>, relu, dropout in the epilogue") {
    using block = nn::linear_block<nn::linear<256, 100>, nn::relu, nn::dropout<0.25f>>;
    std::vector<float> x(n * 256), w(100 * 256), b(100);
    test::fill_uniform(x, -1, 1, 11);
    test::fill_uniform(w, -0.1, 0.1, 12);
    test::fill_uniform(b, -0.1, 0.1, 13);
    const std::vector<float> all = product_forward<256, 100, block>(x, w, b, n, whole);
    const std::vector<float> tail_x(x.begin() + std::ptrdiff_t(s * 256), x.end());
    const std::vector<float> part = product_forward<256, 100, block>(tail_x, w, b, n - s, shard);
    CHECK(same_bits(part.data(), all.data() + s * 100, (n - s) * 100));
    // Without first_sample the shard draws other masks: the check above has teeth.
    const std::vector<float> own = product_forward<256, 100, block>(tail_x, w, b, n - s, whole);
    CHECK_FALSE(same_bits(own.data(), all.data() + s * 100, (n - s) * 100));
  }

  SECTION("elementwise group: a dropout over 50 features, forward and its backward drawing the mask again") {
    std::vector<float> x(n * 50), dy(n * 50);
    test::fill_uniform(x, -1, 1, 21);
    test::fill_uniform(dy, -1, 1, 22);
    const philox_state shard50{whole.seed, whole.offset, s * 50};
    const auto [y_all, dx_all] = dropout_group<50>(x, dy, n, whole);
    const std::vector<float> x_tail(x.begin() + std::ptrdiff_t(s * 50), x.end());
    const std::vector<float> dy_tail(dy.begin() + std::ptrdiff_t(s * 50), dy.end());
    const auto [y_part, dx_part] = dropout_group<50>(x_tail, dy_tail, n - s, shard50);
    CHECK(same_bits(y_part.data(), y_all.data() + s * 50, (n - s) * 50));
    CHECK(same_bits(dx_part.data(), dx_all.data() + s * 50, (n - s) * 50));
  }
}

TEST_CASE("generated passes: a shard's masks are the CPU chain's under set_first_sample", "[gen][dist]") {
  // The CPU chain on rows [s, n) after set_first_sample(s), against the generated product pass
  // on the same rows with the stream the launchers build, {seed, offset, s * 100}: the same
  // dropped elements (exact zeros on both sides where the CPU's are), the kept ones within the
  // products' rounding (the CPU's GEMM sums in another order).
  constexpr std::size_t n = 11, s = 3;  // 300: off the 128-element groups
  using cpu_chain = nn::chain<nn::linear<256, 100>, nn::relu, nn::dropout<0.25f>>;
  cpu_chain model(3);
  model.train();
  model.set_first_sample(s);
  std::vector<float> x(n * 256);
  test::fill_uniform(x, -1, 1, 31);
  const auto y = model.forward(cpu_chain::input_ref(x.data() + s * 256, n - s));
  const philox_state rng = model.layer<2>().rng;  // as the forward drew it
  REQUIRE(rng.first == s * 100);
  const auto& lin = model.layer<0>();
  const std::vector<float> w(lin.weight.data(), lin.weight.data() + 100 * 256), b(lin.bias.data(), lin.bias.data() + 100);
  const std::vector<float> tail_x(x.begin() + std::ptrdiff_t(s * 256), x.end());
  using block = nn::linear_block<nn::linear<256, 100>, nn::relu, nn::dropout<0.25f>>;
  const std::vector<float> g = product_forward<256, 100, block>(tail_x, w, b, n - s, {rng.seed, rng.offset, s * 100});
  std::size_t dropped = 0, mismatched = 0;
  for (std::size_t i = 0; i < (n - s) * 100; ++i) {
    const float c = y.data()[i];
    dropped += c == 0.0f;
    // A kept element is (relu z) / 0.75 on both sides; the CPU's zeros are dropped or relu'd.
    mismatched += (c == 0.0f) != (g[i] == 0.0f) || std::fabs(double(c) - double(g[i])) > 1e-5 * (1 + std::fabs(double(c)));
  }
  CHECK(dropped > 0);
  CHECK(mismatched == 0);
}
