// tests/generators/solder_gen.test.cpp: what solder-gen (generators/solder_gen.hpp) makes of
// chains with product groups: the planner's groups as descriptions, and the launchers, passes
// and kernels the generated text names. The drift test (build:generated kernels match
// kernels/) checks the checked-in files; nvcc compiles them where CUDA is built.
#include <catch2/catch.hpp>

#include <string>

#include "../../generators/solder_gen.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/pool.hpp"

namespace {

namespace nn = solder::nn;
namespace gen = solder::gen;

using linear_relu_dropout = nn::chain<nn::linear<256, 512>, nn::relu, nn::dropout<0.1f>>;
using linear_alone = nn::chain<nn::linear<100, 30, false>>;
using mlp = nn::chain<nn::linear<64, 128>, nn::sigmoid, nn::linear<128, 10>>;

using pools = nn::chain<nn::input<32, 8, 8>, nn::max_pool2d<2>, nn::avg_pool2d<3, 1, 1, false>, nn::flatten<>>;

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("solder-gen: a linear layer and the elementwise layers after it are one product group", "[gen]") {
  const gen::chain_desc c = gen::describe<linear_relu_dropout>("linear_relu_dropout");
  REQUIRE(c.groups.size() == 1);
  const gen::group_desc& g = c.groups[0];
  CHECK(g.product);
  CHECK_FALSE(g.elementwise);
  CHECK(g.in_width == 256);
  CHECK(g.width == 512);
  CHECK(g.product_bias);
  REQUIRE(g.layers.size() == 3);
  CHECK(g.layers[0].type == "solder::nn::linear<256, 512>");
  CHECK(g.layers[2].type == "solder::nn::dropout<0.1f>");
}

TEST_CASE("solder-gen: a product group's launchers, passes and kernels", "[gen]") {
  const gen::files f = gen::generate(gen::describe<linear_relu_dropout>("linear_relu_dropout"), "chains.hpp");
  // The C header: PyTorch's layout (w [Out, In]), the dropout's stream, the gradients.
  CHECK(holds(f.h, "int solder_linear_relu_dropout_f32_256x512_fwd(const float* x, const float* w, const float* b, "
                   "float* y,"));
  CHECK(holds(f.h, "size_t batch, uint64_t seed, uint64_t offset,"));
  CHECK(holds(f.h, "int solder_linear_relu_dropout_f32_256x512_bwd(const float* x, const float* w, const float* y,"));
  CHECK(holds(f.h, "const float* dy, float* dx, float* dw, float* db, size_t batch,"));
  CHECK(holds(f.h, "const char* solder_linear_relu_dropout_last_error(void);"));

  // The forward: one product whose epilogue is the block's tail on the accumulator + b.
  CHECK(holds(f.cu, "using g0_block = solder::nn::linear_block<solder::nn::linear<256, 512>, solder::nn::relu,"));
  CHECK(holds(f.cu, "const auto z = product_value<solder::shape<solder::dyn, 512>>(batch) + b;"));
  CHECK(holds(f.cu, "matrix_operand<false>{x.data(), 256}, matrix_operand<true>{w, 256}"));
  CHECK(holds(f.cu, "solder::write(y, tail.expression<solder::nn::mode::train>(z))"));
  CHECK(holds(f.cu, "std::get<1>(tail.layers).rng = {seed, offset};"));
  CHECK(holds(f.cu, "run_product(stream, g0_forward(tail, g0_in_rows(x, batch), w, g0_features(b), "
                    "g0_rows_out(y, batch)));"));
  // The backward: the gate with db in one pass, then dx = g W and dW = g^T x.
  CHECK(holds(f.cu, "const auto ge = tail.gate_from_output<solder::nn::mode::train>(y, dy);"));
  CHECK(holds(f.cu, "solder::write(db, solder::sum_to<solder::shape<512>>(ge))"));
  CHECK(holds(f.cu, "matrix_operand<false>{g.data(), 512}, matrix_operand<false>{w, 256}, batch"));
  CHECK(holds(f.cu, "matrix_operand<true>{g.data(), 512}, matrix_operand<false>{x.data(), 256}, 512"));
  CHECK(holds(f.cu, "run_product(stream, g0_input_grad("));
  CHECK(holds(f.cu, "run_product(stream, g0_weight_grad("));
  // Every kernel the launchers start is instantiated.
  for (const char* kernel :
       {"product_kernel<solder_gen_linear_relu_dropout::g0_forward_pass>", "g0_input_grad_pass>(",
        "g0_weight_grad_pass>(", "column_kernel<\n    solder_gen_linear_relu_dropout::g0_gate_pass, float, 1>",
        "column_finish_kernel<\n    solder_gen_linear_relu_dropout::g0_gate_pass_unaligned, 1>"})
    CHECK(holds(f.cu, kernel));
  CHECK(holds(f.cu, "#include \"solder/eval/cuda/product_kernel.hpp\""));
}

TEST_CASE("solder-gen: a linear layer without bias or tail", "[gen]") {
  const gen::chain_desc c = gen::describe<linear_alone>("linear_alone");
  REQUIRE(c.groups.size() == 1);
  CHECK(c.groups[0].product);
  CHECK_FALSE(c.groups[0].product_bias);
  const gen::files f = gen::generate(c, "chains.hpp");
  CHECK(holds(f.h, "int solder_linear_f32_100x30_fwd(const float* x, const float* w, float* y, size_t batch,"));
  CHECK(holds(f.h, "int solder_linear_f32_100x30_bwd(const float* x, const float* w, const float* y, const float* dy,"));
  CHECK_FALSE(holds(f.h, "db"));
  CHECK(holds(f.cu, "const auto z = product_value<solder::shape<solder::dyn, 30>>(batch);"));
  // No column sums: the gate is one elementwise walk, whole vectors allowed.
  CHECK(holds(f.cu, "flat_kernel<solder_gen_linear_alone::g0_gate_pass>"));
  CHECK_FALSE(holds(f.cu, "column_kernel"));
}

TEST_CASE("solder-gen: each linear layer of a chain is a group of its own", "[gen]") {
  const gen::chain_desc c = gen::describe<mlp>("mlp");
  REQUIRE(c.groups.size() == 2);
  CHECK(c.groups[0].in_width == 64);
  CHECK(c.groups[0].layers.size() == 2);
  CHECK(c.groups[1].in_width == 128);
  CHECK(c.groups[1].width == 10);
  const gen::files f = gen::generate(c, "chains.hpp");
  CHECK(holds(f.h, "int solder_linear_sigmoid_f32_64x128_fwd("));
  CHECK(holds(f.h, "int solder_linear_f32_128x10_bwd("));
  CHECK(holds(f.cu, "std::tuple_element_t<1, mlp::blocks_type>"));
  // 10 columns are not whole 16-byte vectors and the gate sums them: element by element only.
  CHECK_FALSE(holds(f.cu, "using g1_gate_pass = "));
  CHECK(holds(f.cu, "using g1_gate_pass_unaligned = "));
}

// ---- chain-level launchers -----------------------------------------------------------------------

namespace {
using digits = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 128>, nn::relu,
                         nn::dropout<0.1f>, nn::linear<128, 10>>;
/// Two identical groups: the second runs through the first one's definitions, with its own stream.
using twins = nn::chain<nn::linear<32, 32>, nn::relu, nn::dropout<0.2f>, nn::linear<32, 32>, nn::relu,
                        nn::dropout<0.2f>, nn::linear<32, 4, false>>;
using with_bias_group = nn::chain<nn::bias<16>, nn::relu, nn::linear<16, 4>>;
}  // namespace

TEST_CASE("solder-gen: chain-level launchers for chains of product groups only", "[gen]") {
  CHECK(gen::detail::has_chain_launchers(gen::describe<digits>("digits")));
  CHECK(gen::detail::has_chain_launchers(gen::describe<linear_alone>("linear_alone")));
  CHECK_FALSE(gen::detail::has_chain_launchers(gen::describe<with_bias_group>("with_bias_group")));
  const gen::files f = gen::generate(gen::describe<with_bias_group>("with_bias_group"), "chains.hpp");
  CHECK_FALSE(holds(f.h, "solder_with_bias_group_train_step"));
  CHECK_FALSE(holds(f.cu, "optimizer_step.hpp"));
}

TEST_CASE("solder-gen: the chain-level launchers' C declarations and layout", "[gen]") {
  const gen::files f = gen::generate(gen::describe<digits>("digits"), "chains.hpp");
  CHECK(holds(f.h, "int solder_digits_forward(const float* x, const float* params, float* hidden, float* y, "
                   "size_t batch,"));
  CHECK(holds(f.h, "const uint64_t* seeds, uint64_t* offsets, uint64_t first_sample,"));
  CHECK(holds(f.h, "int solder_digits_backward(const float* x, const float* params, const float* hidden, "
                   "const float* y,"));
  CHECK(holds(f.h, "int solder_digits_train_step(const float* x, const int32_t* labels, float* params, float* grads,"));
  CHECK(holds(f.h, "float* optimizer_state, solder_optimizer* optimizer, float* hidden, float* y,"));
  CHECK(holds(f.h, "uint64_t* offsets, uint64_t first_sample, float label_smoothing,"));
  CHECK(holds(f.h, "float* loss, cudaStream_t stream);"));
  CHECK(holds(f.h, "int solder_digits_dropout_streams(uint64_t seed, uint64_t* seeds, uint64_t* offsets);"));
  // The optimizer's settings, once for every generated header a program includes.
  CHECK(holds(f.h, "#ifndef SOLDER_GEN_OPTIMIZER\n#define SOLDER_GEN_OPTIMIZER\n"));
  CHECK(holds(f.h, "typedef enum solder_optimizer_kind { solder_sgd = 0, solder_adam = 1, solder_adamw = 2 }"));
  CHECK(holds(f.h, "  int64_t steps;"));
  // torch's named_parameters() order, flat: 64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10.
  CHECK(holds(f.h, "#define SOLDER_DIGITS_PARAM_FLOATS 50826\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_0_BIAS 16384 "));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_3_WEIGHT 16640 "));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_6_BIAS 50816 "));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_HIDDEN_FLOATS 384\n"));
  CHECK(holds(f.h, "#define SOLDER_DIGITS_DROPOUTS 2\n"));
}

TEST_CASE("solder-gen: the chain's forward, backward and training step", "[gen]") {
  const gen::files f = gen::generate(gen::describe<digits>("digits"), "chains.hpp");
  // Forward: the streams move on first, then each group draws its own; outputs into hidden, then y.
  CHECK(holds(f.cu, "  for (std::size_t i = 0; i < 2; ++i) ++offsets[i];\n  // group 0"));
  CHECK(holds(f.cu, "std::get<1>(tail.layers).rng = {seeds[1], offsets[1], first_sample * 128};"));
  CHECK(holds(f.cu, "g1_forward(tail, g1_in_rows(hidden, batch), params + 16640,"));
  CHECK(holds(f.cu, "g1_features(params + 49408), g1_rows_out(hidden + batch * 256, batch)"));
  CHECK(holds(f.cu, "g2_rows_out(y, batch)"));
  // Backward: last group first, from dy; the first group's input gets no gradient.
  CHECK(f.cu.find("// group 2: linear<128, 10>\n  {\n    const g2_tail_type tail{};\n    run(stream, g2_gate") <
        f.cu.find("// group 0: linear<64, 256>, relu, dropout<0.1f>\n  {\n    const g0_tail_type tail{};"));
  CHECK(holds(f.cu, "g2_gate(tail, g2_rows(y, batch), g2_rows(dy, batch), g2_rows_out(g, batch),"));
  CHECK(holds(f.cu, "g1_rows(d, batch), g1_rows_out(g, batch)"));
  CHECK(holds(f.cu, "g0_weight_grad(g0_rows(g, batch), g0_in_rows(x, batch), g0_weight_out(grads))"));
  CHECK_FALSE(holds(f.cu, "run_product(stream, g0_input_grad(g0_rows(g, batch), params"));
  // The step: loss and gradient by the row kernels, the update by the shared functors.
  CHECK(holds(f.cu, "solder::eval::cuda::softmax_cross_entropy_async<10>("));
  // The update and the settings' checks are the library's (eval/cuda/optimizer_step.hpp), fed
  // the caller's C struct field by field, the step count written back.
  CHECK(holds(f.cu, "solder::eval::cuda::check_optimizer(settings, optimizer_state);"));
  CHECK(holds(f.cu, "solder::eval::cuda::optimizer_step(settings, params, grads, optimizer_state, param_floats, stream);"));
  CHECK(holds(f.cu, "optimizer.steps = settings.steps;"));
  CHECK(holds(f.cu, "o.lr, o.weight_decay, o.momentum, o.dampening, o.nesterov != 0, o.beta1, o.beta2, o.eps, o.steps};"));
  CHECK(holds(f.cu, "seeds[1] = solder::random::derive_seed(seed, 5);"));
  CHECK(holds(f.cu, "#include \"solder/eval/cuda/optimizer_step.hpp\""));
}

TEST_CASE("solder-gen: identical groups of a chain share definitions, not streams", "[gen]") {
  const gen::chain_desc c = gen::describe<twins>("twins");
  REQUIRE(c.groups.size() == 3);
  const gen::files f = gen::generate(c, "chains.hpp");
  CHECK_FALSE(holds(f.cu, "using g1_block"));
  CHECK(holds(f.cu, "std::get<1>(tail.layers).rng = {seeds[1], offsets[1], first_sample * 32};"));
  CHECK(holds(f.cu, "g0_forward(tail, g0_in_rows(hidden, batch), params + 1056,"));
  // No bias on the last layer: 2 * (32 * 32 + 32) + 4 * 32 parameters, no db.
  CHECK(holds(f.h, "#define SOLDER_TWINS_PARAM_FLOATS 2240\n"));
  CHECK_FALSE(holds(f.h, "SOLDER_TWINS_6_BIAS"));
}

TEST_CASE("solder-gen: pooling and flatten groups of a chain over images", "[gen]") {
  const gen::files f = gen::generate(gen::describe<pools>("pools"), "chains.hpp");
  // Names from the input image each layer sees: [32, 8, 8], then [32, 4, 4] (flatten: 512).
  CHECK(holds(f.h, "int solder_max_pool2d_f32_32x8x8_fwd(const float* x, float* y, int32_t* argmax, size_t batch,"));
  CHECK(holds(f.h, "int solder_max_pool2d_f32_32x8x8_bwd(const float* dy, const int32_t* argmax, float* dx, size_t batch,"));
  CHECK(holds(f.h, "int solder_avg_pool2d_f32_32x4x4_fwd(const float* x, float* y, size_t batch, cudaStream_t stream);"));
  CHECK(holds(f.h, "int solder_flatten_f32_512_fwd(const float* x, float* y, size_t batch, cudaStream_t stream);"));
  // The bodies of eval/cuda/pool.hpp with the geometry fixed: channels, H, W, Ho, Wo, K, S, P.
  CHECK(holds(f.cu, "constexpr solder::ops::pool2d::geometry g0_geometry{32, 8, 8, 4, 4, 2, 2, 0};"));
  CHECK(holds(f.cu, "constexpr solder::ops::pool2d::geometry g1_geometry{32, 4, 4, 4, 4, 3, 1, 1};"));
  CHECK(holds(f.cu, "solder::eval::cuda::pool_kind::max"));
  CHECK(holds(f.cu, "solder::eval::cuda::pool_kind::avg"));
  CHECK(holds(f.cu, "cudaMemcpyDeviceToDevice"));
}
