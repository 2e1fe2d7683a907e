// tests/generators/sketched_group.test.cpp: the passes solder-gen writes for a sketched group
// (generators/solder_gen.hpp, sketched_definitions; kernels/sketched_mlp.cu), run on the host over
// whole grids (support/grid.hpp) against the CPU layer, nn::sketched_block: the sign sketches and
// the dropout masks bit for bit, values and every gradient within rounding of the CPU's; and the
// generated text builds exactly these passes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "../../generators/solder_gen.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/sketched_linear.hpp"
#include "solder/random/seed.hpp"
#include "support/data.hpp"
#include "support/device_view.hpp"
#include "support/grid.hpp"

namespace {

using namespace solder;
namespace cu = solder::eval::cuda;
namespace gen = solder::gen;
using solder::test::dev;
using solder::test::dev_out;

/// The definitions solder-gen writes for a sketched group (sketched_definitions), for any block
/// type: the same operands, epilogues and tilings, with host memory seen as device memory.
template <class Block>
struct generated_group {
  using layer = std::remove_cvref_t<decltype(std::declval<Block&>().head())>;
  using tail_type = typename Block::tail_type;
  static constexpr std::size_t In = layer::in_features, Out = layer::out_features, K = layer::rank, T = layer::terms;
  static constexpr std::size_t Lk = T * K, H = 2 * Lk;
  using u1 = cu::sketch_operand<K, Out, T, sketch_stack::rows, false>;
  using u1_t = cu::sketch_operand<K, Out, T, sketch_stack::rows, true>;
  using u2 = cu::sketch_operand<In, K, T, sketch_stack::columns, false>;
  using u2_t = cu::sketch_operand<In, K, T, sketch_stack::columns, true>;
  using left = cu::concat_operand<cu::matrix_operand<false>, u2, sketch_stack::columns, Lk>;
  using right = cu::concat_operand<u1, cu::matrix_operand<false>, sketch_stack::rows, Lk>;
  using left_t = cu::concat_operand<cu::matrix_operand<true>, u2_t, sketch_stack::rows, Lk>;
  using right_t = cu::concat_operand<u1_t, cu::matrix_operand<true>, sketch_stack::columns, Lk>;
  struct sketches {
    std::uint64_t u1_seed, u2_seed;
    float scale;
  };
  static sketches sketches_of(std::uint64_t sketch_seed) {
    return {random::derive_seed(sketch_seed, 0), random::derive_seed(sketch_seed, 1), layer::sign_scale};
  }

  /// h = x [S1 | U2].
  static void first(const tensor<float, shape<dyn, In>>& x, const float* s1, const sketches& u, tensor<float, shape<dyn, H>>& h) {
    const std::size_t batch = x.batch();
    test::run_product(cu::product<cu::product_tiling_for<H>>(cu::matrix_operand<false>{x.data(), In},
                                                            left{{s1, Lk}, {u.u2_seed, u.scale}}, batch, In,
                                                            write(dev_out(h), cu::product_value<shape<dyn, H>>(batch))));
  }
  /// y = tail(h [U1; S2] / (2L) + b).
  static void forward(const tail_type& tail, const tensor<float, shape<dyn, H>>& h, const float* s2, const sketches& u,
                      const float* b, tensor<float, shape<dyn, Out>>& y) {
    const std::size_t batch = h.batch();
    const auto z = [&] {
      const auto p = cu::product_value<shape<dyn, Out>>(batch) * layer::scale;
      if constexpr (layer::has_bias)
        return p + tensor_ref<const float, shape<Out>, device>(b);
      else
        return p;
    }();
    test::run_product(cu::product<cu::product_tiling_for<Out>>(cu::matrix_operand<false>{h.data(), H},
                                                              right{{u.u1_seed, u.scale}, {s2, Out}}, batch, H,
                                                              write(dev_out(y), tail.template expression<nn::mode::train>(z))));
  }
  /// g and db from y and dy (the gate pass, run by the host form of the device's dispatch).
  static void gate(const tail_type& tail, const tensor<float, shape<dyn, Out>>& y, const tensor<float, shape<dyn, Out>>& dy,
                   tensor<float, shape<dyn, Out>>& g, tensor<float, shape<Out>>& db) {
    const auto ge = tail.template gate_from_output<nn::mode::train>(dev(y), dev(dy));
    test::host_runner r;
    if constexpr (layer::has_bias)
      cu::dispatch(r, write(dev_out(g), ge), write(dev_out(db), sum_to<shape<Out>>(ge)));
    else
      cu::dispatch(r, write(dev_out(g), ge));
  }
  static void s2_grad(const tensor<float, shape<dyn, H>>& h, const tensor<float, shape<dyn, Out>>& g, tensor<float, shape<Lk, Out>>& ds2) {
    test::run_product(cu::product<cu::product_tiling_for<Out>>(
        cu::matrix_operand<true>{h.data() + Lk, H}, cu::matrix_operand<false>{g.data(), Out}, Lk, g.batch(),
        write(dev_out(ds2), cu::product_value<shape<Lk, Out>>() * layer::scale)));
  }
  static void h_grad(const tensor<float, shape<dyn, Out>>& g, const float* s2, const sketches& u, tensor<float, shape<dyn, H>>& dh) {
    const std::size_t batch = g.batch();
    test::run_product(cu::product<cu::product_tiling_for<H>>(
        cu::matrix_operand<false>{g.data(), Out}, right_t{{u.u1_seed, u.scale}, {s2, Out}}, batch, Out,
        write(dev_out(dh), cu::product_value<shape<dyn, H>>(batch) * layer::scale)));
  }
  static void s1_grad(const tensor<float, shape<dyn, In>>& x, const tensor<float, shape<dyn, H>>& dh, tensor<float, shape<In, Lk>>& ds1) {
    test::run_product(cu::product<cu::product_tiling_for<Lk>>(cu::matrix_operand<true>{x.data(), In},
                                                             cu::matrix_operand<false>{dh.data(), H}, In, x.batch(),
                                                             write(dev_out(ds1), cu::product_value<shape<In, Lk>>())));
  }
  static void input_grad(const tensor<float, shape<dyn, H>>& dh, const float* s1, const sketches& u, tensor<float, shape<dyn, In>>& dx) {
    const std::size_t batch = dh.batch();
    test::run_product(cu::product<cu::product_tiling_for<In>>(cu::matrix_operand<false>{dh.data(), H},
                                                             left_t{{s1, Lk}, {u.u2_seed, u.scale}}, batch, H,
                                                             write(dev_out(dx), cu::product_value<shape<dyn, In>>(batch))));
  }
};

/// The largest |b| of a tensor (at least 1e-30).
template <class B>
double largest(const B& b) {
  double m = 1e-30;
  for (float v : b) m = std::max(m, double(std::fabs(v)));
  return m;
}
/// Elements where |a - b| > tol max |b|: the products' sums run in another order on each side
/// (the CPU's GEMM blocks k; each product here is one fma chain in ascending k), so they agree
/// within a few ulp of the sums' magnitude, not bit for bit.
template <class A, class B>
std::size_t differing(const A& a, const B& b, double tol) {
  const double bound = tol * largest(b);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < b.size(); ++i) bad += !(std::fabs(double(a.data()[i]) - double(b.data()[i])) <= bound);
  return bad;
}
// Sums of at most 256 float products, compared at the scale of each tensor's largest element:
// fp32 rounding of the two summation orders stays below 1e-5 of it.
constexpr double value_tolerance = 1e-5;

/// The forward and backward of a sketched block with a dropout last in its tail (position D in
/// the tail), on the host through the generated definitions and on the CPU, compared.
template <class Block, std::size_t D>
void compare_with_cpu(std::size_t batch) {
  using G = generated_group<Block>;
  constexpr std::size_t In = G::In, Out = G::Out, Lk = G::Lk, H = G::H;
  constexpr std::uint64_t seed = 0x5eedULL, offset = 4;
  Block block(3);
  auto& layer = block.head();
  std::get<D>(block.tail.layers).rng = {seed, offset - 1};  // a training forward moves it on first
  tensor<float, shape<dyn, In>> x(batch), dx(batch), dx_host(batch);
  tensor<float, shape<dyn, Out>> y(batch), y_host(batch), dy(batch), g(batch);
  tensor<float, shape<dyn, H>> h(batch), dh(batch);
  test::fill_uniform(x, -1, 1, 21 + std::uint32_t(batch));
  test::fill_uniform(dy, -1, 1, 22 + std::uint32_t(batch));
  block.train();
  block.forward(x, y);
  REQUIRE(std::get<D>(block.tail.layers).rng.offset == offset);
  block.backward(x, y, dy, dx);

  // The generated forward, with the CPU layer's parameters and sketch seed.
  typename Block::tail_type tail;
  std::get<D>(tail.layers).rng = {seed, offset};
  const auto u = G::sketches_of(layer.sketch_seed);
  G::first(x, layer.s1.data(), u, h);
  const float* b = nullptr;
  if constexpr (std::remove_cvref_t<decltype(layer)>::has_bias) b = layer.bias.data();
  G::forward(tail, h, layer.s2.data(), u, b, y_host);

  // The mask alone: the same dropout on ones with the stream the forward drew.
  auto drop = std::get<D>(tail.layers);
  tensor<float, shape<dyn, Out>> ones(batch), mask(batch);
  std::fill(ones.begin(), ones.end(), 1.0f);
  assign(mask, drop.template apply<nn::mode::train>(ones.ref()));
  std::size_t dropped = 0, mask_errors = 0;
  for (std::size_t i = 0; i < mask.size(); ++i) {
    if (mask.data()[i] == 0.0f) {
      ++dropped;
      // Dropped on the CPU: +0 on both sides, bit for bit.
      mask_errors += !(y.data()[i] == 0.0f && y_host.data()[i] == 0.0f && !std::signbit(y_host.data()[i]));
    } else if (std::fabs(y.data()[i]) > value_tolerance * largest(y)) {
      mask_errors += y_host.data()[i] == 0.0f;  // kept where the CPU keeps it
    }
  }
  CHECK(dropped > 0);
  CHECK(mask_errors == 0);
  CHECK(differing(y_host, y, value_tolerance) == 0);

  // The generated backward from the CPU's y (the gate is then the CPU's bit for bit) and the
  // host's h.
  tensor<float, shape<Out>> db;
  tensor<float, shape<Lk, Out>> ds2;
  tensor<float, shape<In, Lk>> ds1;
  G::gate(tail, y, dy, g, db);
  G::s2_grad(h, g, ds2);
  G::h_grad(g, layer.s2.data(), u, dh);
  G::s1_grad(x, dh, ds1);
  G::input_grad(dh, layer.s1.data(), u, dx_host);
  if constexpr (std::remove_cvref_t<decltype(layer)>::has_bias) CHECK(differing(db, layer.bias_grad, value_tolerance) == 0);
  CHECK(differing(ds2, layer.s2_grad, value_tolerance) == 0);
  CHECK(differing(ds1, layer.s1_grad, value_tolerance) == 0);
  CHECK(differing(dx_host, dx, value_tolerance) == 0);
}

std::uint32_t bits(float v) { return cu::float_bits(v); }

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

using sketched_mlp = nn::chain<nn::sketched_linear<64, 256, 2, 8>, nn::relu, nn::dropout<0.1f>,
                               nn::sketched_linear<256, 128, 2, 8>, nn::relu, nn::dropout<0.1f>, nn::linear<128, 10>>;
/// Odd extents, three terms, no bias, a sigmoid: every tail of the tiles and the operands.
using odd_layer = nn::sketched_linear<37, 19, 3, 5, false, nn::sketch_strategy::automatic, true>;

}  // namespace

TEST_CASE("sketched group: the staged sign sketches are the CPU layer's, bit for bit", "[gen][sketched]") {
  using layer_t = nn::sketched_linear<37, 19, 3, 5, true, nn::sketch_strategy::automatic, true>;
  using G = generated_group<nn::sketched_block<layer_t>>;
  const layer_t layer(9);
  const auto u = G::sketches_of(layer.sketch_seed);
  // The CPU's packed signs, written out by products with identities (one nonzero term each: exact).
  tensor<float, shape<15, 15>> i15;
  tensor<float, shape<37, 37>> i37;
  tensor<float, shape<19, 19>> i19;
  std::fill(i15.begin(), i15.end(), 0.0f);
  std::fill(i37.begin(), i37.end(), 0.0f);
  std::fill(i19.begin(), i19.end(), 0.0f);
  for (std::size_t k = 0; k < 15; ++k) i15.data()[k * 15 + k] = 1.0f;
  for (std::size_t k = 0; k < 37; ++k) i37.data()[k * 37 + k] = 1.0f;
  for (std::size_t k = 0; k < 19; ++k) i19.data()[k * 19 + k] = 1.0f;
  tensor<float, shape<15, 19>> u1;
  tensor<float, shape<37, 15>> u2;
  tensor<float, shape<19, 15>> u1_t;
  tensor<float, shape<15, 37>> u2_t;
  u1 = matmul(i15, layer.u1());              // [U1_1; U1_2; U1_3]
  u2 = matmul(i37, layer.u2());              // [U2_1 | U2_2 | U2_3]
  u1_t = matmul(i19, transpose(layer.u1()));  // U1^T
  u2_t = matmul(i15, transpose(layer.u2()));  // U2^T
  const G::u1 d1{u.u1_seed, u.scale};
  const G::u2 d2{u.u2_seed, u.scale};
  const G::u1_t d1t{u.u1_seed, u.scale};
  const G::u2_t d2t{u.u2_seed, u.scale};
  std::size_t bad = 0, negative = 0;
  for (std::size_t r = 0; r < 15; ++r)
    for (std::size_t c = 0; c < 19; ++c) {
      bad += bits(u1.data()[r * 19 + c]) != bits(d1.at(r, c));
      bad += bits(u1_t.data()[c * 15 + r]) != bits(d1t.at(c, r));
      negative += u1.data()[r * 19 + c] < 0;
    }
  for (std::size_t r = 0; r < 37; ++r)
    for (std::size_t c = 0; c < 15; ++c) {
      bad += bits(u2.data()[r * 15 + c]) != bits(d2.at(r, c));
      bad += bits(u2_t.data()[c * 37 + r]) != bits(d2t.at(c, r));
    }
  CHECK(bad == 0);
  CHECK(negative > 0);
  CHECK(negative < 15 * 19);
  CHECK(std::fabs(std::fabs(d1.at(3, 4)) - 1.0f / std::sqrt(5.0f)) < 1e-7f);
  // The concatenations: [S1 | U2] and [U1; S2] read their parts at the split.
  const G::left lf{{layer.s1.data(), 15}, d2};
  const G::right rf{d1, {layer.s2.data(), 19}};
  CHECK(lf.at(5, 14) == layer.s1.data()[5 * 15 + 14]);
  CHECK(lf.at(5, 15) == d2.at(5, 0));
  CHECK(rf.at(14, 3) == d1.at(14, 3));
  CHECK(rf.at(15, 3) == layer.s2.data()[3]);
}

TEST_CASE("sketched group: the generated forward and backward against nn::sketched_block", "[gen][sketched]") {
  const std::size_t batch = GENERATE(1, 5, 37);
  INFO("batch " << batch);
  SECTION("sketched_mlp's first group: 64 -> 256, L 2, k 8, relu, dropout") {
    compare_with_cpu<nn::sketched_block<nn::sketched_linear<64, 256, 2, 8>, nn::relu, nn::dropout<0.1f>>, 1>(batch);
  }
  SECTION("37 -> 19, L 3, k 5, no bias, sigmoid, dropout") {
    compare_with_cpu<nn::sketched_block<odd_layer, nn::sigmoid, nn::dropout<0.25f>>, 1>(batch);
  }
}

TEST_CASE("solder-gen: a sketched layer and its tail are one sketched product group", "[gen][sketched]") {
  const gen::chain_desc c = gen::describe<sketched_mlp>("sketched_mlp");
  REQUIRE(c.groups.size() == 3);
  CHECK(c.groups[0].product);
  CHECK(c.groups[0].sketched);
  CHECK(c.groups[0].terms == 2);
  CHECK(c.groups[0].rank == 8);
  CHECK(c.groups[0].in_width == 64);
  CHECK(c.groups[0].width == 256);
  CHECK(c.groups[0].product_bias);
  CHECK(c.groups[1].sketched);
  CHECK_FALSE(c.groups[2].sketched);
  CHECK(c.layers[0].type == "solder::nn::sketched_linear<64, 256, 2, 8>");
  const gen::chain_desc odd = gen::describe<nn::chain<odd_layer, nn::sigmoid>>("odd");
  CHECK(odd.layers[0].type == "solder::nn::sketched_linear<37, 19, 3, 5, false, solder::nn::sketch_strategy::automatic, true>");
  CHECK_FALSE(odd.groups[0].product_bias);
}

TEST_CASE("solder-gen: a sketched group's passes, launchers and the chain's layout", "[gen][sketched]") {
  const gen::files f = gen::generate(gen::describe<sketched_mlp>("sketched_mlp"), "chains.hpp");
  // The passes above, as the generator writes them.
  CHECK(holds(f.cu, "using g0_u1 = solder::eval::cuda::sketch_operand<8, 256, 2, solder::sketch_stack::rows, false>;"));
  CHECK(holds(f.cu, "using g0_u2_t = solder::eval::cuda::sketch_operand<64, 8, 2, solder::sketch_stack::columns, true>;"));
  CHECK(holds(f.cu, "return {solder::random::derive_seed(sketch_seed, 0), solder::random::derive_seed(sketch_seed, 1),"));
  CHECK(holds(f.cu, "using g0_left = solder::eval::cuda::concat_operand<matrix_operand<false>, g0_u2,"));
  CHECK(holds(f.cu, "matrix_operand<false>{x.data(), 64}, g0_left{{s1, 16}, {u.u2_seed, u.scale}}"));
  CHECK(holds(f.cu, "const auto z = product_value<solder::shape<solder::dyn, 256>>(batch) * g0_layer::scale + b;"));
  CHECK(holds(f.cu, "g0_right{{u.u1_seed, u.scale}, {s2, 256}}, batch, 32,"));
  CHECK(holds(f.cu, "solder::write(y, tail.expression<solder::nn::mode::train>(z))"));
  CHECK(holds(f.cu, "matrix_operand<true>{h.data() + 16, 32}, matrix_operand<false>{g.data(), 256}"));
  CHECK(holds(f.cu, "solder::write(ds2, product_value<solder::shape<16, 256>>() * g0_layer::scale)"));
  CHECK(holds(f.cu, "g0_right_t{{u.u1_seed, u.scale}, {s2, 256}}, batch, 256,"));
  CHECK(holds(f.cu, "solder::write(dh, product_value<solder::shape<solder::dyn, 32>>(batch) * g0_layer::scale)"));
  CHECK(holds(f.cu, "matrix_operand<true>{x.data(), 64}, matrix_operand<false>{dh.data(), 32}, 64,"));
  CHECK(holds(f.cu, "g0_left_t{{s1, 16}, {u.u2_seed, u.scale}}, batch, 32,"));
  // Every pass's kernel is instantiated.
  for (const char* pass : {"first", "forward", "s2_grad", "h_grad", "s1_grad", "input_grad"})
    CHECK(holds(f.cu, std::string("product_kernel<solder_gen_sketched_mlp::g1_") + pass + "_pass>"));
  // The group's launchers: the factors, h, the sketch seed.
  CHECK(holds(f.h, "int solder_sketched_linear_relu_dropout_f32_64x256_l2k8_fwd(const float* x, const float* s1,"));
  CHECK(holds(f.h, "const float* b, float* h, float* y, size_t batch,"));
  CHECK(holds(f.h, "uint64_t sketch_seed, uint64_t seed,"));
  CHECK(holds(f.h, "float* dx, float* ds1, float* ds2, float* db, size_t batch, uint64_t sketch_seed, cudaStream_t stream);"));
  // The chain: torch's order (S1, S2, bias per sketched layer), h kept in hidden, the seeds.
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_PARAM_FLOATS 12938\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_0_S1 0  /* [64, 16] */\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_0_S2 1024  /* [16, 256] */\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_0_BIAS 5120  /* [256] */\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_3_S1 5376  /* [256, 16] */\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_6_WEIGHT 11648  /* [10, 128] */\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_HIDDEN_FLOATS 448\n"));
  CHECK(holds(f.h, "#define SOLDER_SKETCHED_MLP_SKETCHES 2\n"));
  CHECK(holds(f.h, "int solder_sketched_mlp_sketch_seeds(uint64_t seed, uint64_t* sketch_seeds);"));
  CHECK(holds(f.cu, "sketch_seeds[1] = solder::random::derive_seed(solder::random::derive_seed(seed, 3), 2);"));
  CHECK(holds(f.cu, "run_product(stream, g1_first(g1_in_rows(hidden + batch * 32, batch), params + 5376, u,"));
  CHECK(holds(f.cu, "run_product(stream, g0_s1_grad(g0_in_rows(x, batch), g0_h_rows(dh, batch), g0_s1_out(grads)));"));
  // The first group's input gets no gradient, as the CPU chain's backward_params.
  CHECK_FALSE(holds(f.cu, "run_product(stream, g0_input_grad(g0_h_rows(dh, batch)"));
  CHECK(holds(f.cu, "run_product(stream, g1_input_grad(g1_h_rows(dh, batch), params + 5376, u, g1_in_rows_out(d, batch)));"));
}

TEST_CASE("solder-gen: the sketched chain's parameters and seeds are the CPU chain's", "[gen][sketched]") {
  // SOLDER_SKETCHED_MLP_* above against the CPU chain's params() and its layers' sketch seeds.
  sketched_mlp model(1);
  std::size_t at = 0;
  std::vector<std::size_t> starts;
  for (const auto& p : model.params()) {
    starts.push_back(at);
    at += p.value.size();
  }
  CHECK(at == 12938);
  CHECK(starts == std::vector<std::size_t>{0, 1024, 5120, 5376, 9472, 11520, 11648, 12928});
  CHECK(model.layer<0>().sketch_seed == random::derive_seed(random::derive_seed(1, 0), 2));
  CHECK(model.layer<3>().sketch_seed == random::derive_seed(random::derive_seed(1, 3), 2));
}

TEST_CASE("solder-gen: a group two chains hold gets its launchers in the first chain's file", "[gen]") {
  const gen::chain_desc c = gen::describe<sketched_mlp>("sketched_mlp");
  const gen::files f = gen::generate(c, "chains.hpp", {{"solder_linear_f32_128x10", "digits_mlp"}});
  CHECK(holds(f.cu, "//   solder_linear_f32_128x10_fwd, _bwd  defined in digits_mlp.cu"));
  CHECK_FALSE(holds(f.cu, "extern \"C\" int solder_linear_f32_128x10_fwd("));
  CHECK(holds(f.h, "/// solder_linear_f32_128x10_fwd and _bwd: declared in digits_mlp.h."));
  // Its definitions stay: the chain-level launchers run it.
  CHECK(holds(f.cu, "run_product(stream, g2_forward(tail, g2_in_rows(hidden + batch * 320, batch), params + 11648,"));
  CHECK(holds(f.cu, "product_kernel<solder_gen_sketched_mlp::g2_forward_pass>"));
  // Alone, the chain defines them.
  CHECK(holds(gen::generate(c, "chains.hpp").cu, "extern \"C\" int solder_linear_f32_128x10_fwd("));
}
