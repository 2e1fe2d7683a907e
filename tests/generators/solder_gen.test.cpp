// tests/generators/solder_gen.test.cpp: what solder-gen (generators/solder_gen.hpp) makes of a
// chain: its description (the flat layouts of parameters and buffers, read from the chain
// itself), and the C interface it writes, the same text for any chain but its names and
// numbers. The drift test (build:generated kernels match kernels/) checks the checked-in files;
// nvcc compiles them where CUDA is built; tests/interop/c_chain.test.cpp runs what they call.
#include <catch2/catch.hpp>

#include <string>

#include "../../generators/solder_gen.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/pool.hpp"

namespace {

namespace nn = solder::nn;
namespace gen = solder::gen;

using mlp = nn::chain<nn::linear<64, 128>, nn::relu, nn::dropout<0.1f>, nn::linear<128, 10, false>>;
using cnn = nn::chain<nn::input<1, 8, 8>, nn::conv2d<1, 4, 3, 3, 1, 1>, nn::batch_norm<4>, nn::relu, nn::max_pool2d<2>,
                      nn::flatten<>, nn::linear<64, 10>>;
using images = nn::chain<nn::input<3, 8, 8>, nn::conv2d<3, 4, 3, 3, 1, 1>, nn::relu>;

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("solder-gen: a chain's description comes from the chain", "[gen]") {
  const gen::chain_desc c = gen::describe<mlp>("models::mlp");
  CHECK(c.stem == "models_mlp");
  CHECK(c.in_floats == 64);
  CHECK(c.out_floats == 10);
  CHECK(c.flat_output);
  CHECK(c.kernels == mlp::kernels);
  CHECK(c.dropouts == 1);
  REQUIRE(c.layers.size() == 4);
  CHECK(c.layers[0] == "0 linear -> [128]");
  CHECK(c.layers[3] == "3 linear -> [10]");
  // The parameters in params() order, torch's names: the last linear layer has no bias.
  REQUIRE(c.params.size() == 3);
  CHECK(c.params[0].name == "0.weight");
  CHECK(c.params[0].dims == std::vector<std::size_t>{128, 64});
  CHECK(c.params[1].floats == 128);
  CHECK(c.params[2].name == "3.weight");
  CHECK(c.buffers.empty());

  const gen::chain_desc k = gen::describe<cnn>("cnn");
  CHECK(k.in_floats == 64);
  CHECK(k.input_shape == "[1, 8, 8]");
  REQUIRE(k.params.size() == 6);
  CHECK(k.params[2].name == "1.weight");  // the batch_norm's gamma
  REQUIRE(k.buffers.size() == 2);
  CHECK(k.buffers[0].name == "1.running_mean");
  CHECK(k.buffers[1].floats == 4);
  CHECK(k.dropouts == 0);
  CHECK_FALSE(gen::describe<images>("images").flat_output);
}

TEST_CASE("solder-gen: the header lays out the flat arrays and declares the interface", "[gen]") {
  const gen::files f = gen::generate(gen::describe<cnn>("cnn"), "models.hpp");
  CHECK(holds(f.h, "typedef struct solder_cnn solder_cnn;"));
  CHECK(holds(f.h, "#define SOLDER_CNN_IN_FLOATS 64\n"));
  CHECK(holds(f.h, "#define SOLDER_CNN_PARAMS 6\n"));
  // conv 4x1x3x3 + 4, batch_norm 4 + 4, linear 10x64 + 10.
  CHECK(holds(f.h, "#define SOLDER_CNN_PARAM_FLOATS " + std::to_string(36 + 4 + 8 + 640 + 10) + "\n"));
  CHECK(holds(f.h, "#define SOLDER_CNN_0_WEIGHT 0  /* [4, 1, 3, 3] */\n"));
  CHECK(holds(f.h, "#define SOLDER_CNN_0_BIAS 36  /* [4] */\n"));
  CHECK(holds(f.h, "#define SOLDER_CNN_5_WEIGHT 48  /* [10, 64] */\n"));
  CHECK(holds(f.h, "#define SOLDER_CNN_BUFFER_FLOATS 8\n"));
  CHECK(holds(f.h, "#define SOLDER_CNN_1_RUNNING_VAR 4  /* [4] */\n"));
  for (const char* fn : {"solder_cnn_create(uint64_t seed, solder_cnn** model);", "solder_cnn_forward(",
                         "solder_cnn_backward(", "solder_cnn_loss_and_backward(", "solder_cnn_train_step(",
                         "solder_cnn_optimizer_step(", "solder_cnn_params(", "solder_cnn_read_buffers(",
                         "const char* solder_cnn_last_error(void);"})
    CHECK(count(f.h, fn) == 1);
  CHECK(holds(f.h, "#ifndef SOLDER_GEN_CNN_H"));
  CHECK(count(f.h, "#ifndef SOLDER_GEN_COMMON") == 1);
  // A chain whose output is images has no loss over classes.
  const gen::files g = gen::generate(gen::describe<images>("images"), "models.hpp");
  CHECK_FALSE(holds(g.h, "loss_and_backward"));
  CHECK_FALSE(holds(g.cu, "train_step"));
  CHECK(holds(g.h, "solder_images_optimizer_step("));
}

TEST_CASE("solder-gen: the CUDA source instantiates the chain's device form, and nothing per layer", "[gen]") {
  const gen::files f = gen::generate(gen::describe<cnn>("cnn"), "models.hpp");
  CHECK(holds(f.cu, "#include \"cnn.h\""));
  CHECK(holds(f.cu, "#include \"models.hpp\""));
  CHECK(holds(f.cu, "solder::interop::c_chain<cnn::in_space<solder::device>> chain;"));
  CHECK(holds(f.cu, "model_type::in_features == SOLDER_CNN_IN_FLOATS"));
  for (const char* fn : {"int solder_cnn_create(", "void solder_cnn_destroy(", "int solder_cnn_train_step(",
                         "int solder_cnn_write_params(", "const char* solder_cnn_last_error(void)"})
    CHECK(count(f.cu, fn) == 1);
  // The layers appear in comments only: the text is the same for any chain but its names.
  const gen::files m = gen::generate(gen::describe<mlp>("cnn"), "models.hpp");
  const auto code = [](const std::string& text) {
    std::string out;
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t end = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, end - at);
      if (line.rfind("//", 0) != 0) out += line + "\n";
      at = end + 1;
    }
    return out;
  };
  CHECK(code(f.cu) == code(m.cu));
}

TEST_CASE("solder-gen: two chains with one stem are refused", "[gen]") {
  char name[] = "solder-gen";
  char dir[] = "/nonexistent-solder-gen-dir";
  char* argv[] = {name, dir};
  CHECK(gen::main(2, argv, "models.hpp", {gen::describe<mlp>("a::b"), gen::describe<cnn>("a_b")}) == 1);
  // One chain, an output directory that cannot be written.
  CHECK(gen::main(2, argv, "models.hpp", {gen::describe<mlp>("mlp")}) == 1);
  CHECK(gen::main(1, argv, "models.hpp", {gen::describe<mlp>("mlp")}) == 1);
}
