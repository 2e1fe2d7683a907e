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

namespace {

namespace nn = solder::nn;
namespace gen = solder::gen;

using linear_relu_dropout = nn::chain<nn::linear<256, 512>, nn::relu, nn::dropout<0.1f>>;
using linear_alone = nn::chain<nn::linear<100, 30, false>>;
using mlp = nn::chain<nn::linear<64, 128>, nn::sigmoid, nn::linear<128, 10>>;

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
