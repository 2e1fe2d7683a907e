// Static checks of the block contract (nn/block.hpp): every block the planner makes provides it,
// from its input's shape to its output's. This file passes by compiling.
#include "solder/solder.hpp"

namespace {
using namespace solder;
using nn::Block;

template <std::size_t... E>
using batch = shape<dyn, E...>;

// Product blocks: with a tail, with a folded batch_norm, sketched, convolutions.
static_assert(Block<nn::linear_block<nn::linear<4, 8>, nn::relu, nn::dropout<0.1f>>, batch<4>, batch<8>>);
static_assert(Block<nn::linear_block<nn::linear<4, 8>, nn::batch_norm<8>, nn::gelu>, batch<4>, batch<8>>);
static_assert(Block<nn::sketched_block<nn::sketched_linear<64, 32, 1, 4>, nn::relu>, batch<64>, batch<32>>);
static_assert(Block<nn::conv_block<nn::conv2d<1, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu>, batch<1, 8, 8>, batch<8, 8, 8>>);
static_assert(nn::conv_block<nn::conv2d<1, 8, 3, 3, 1, 1>, nn::relu>::channels_last_capable);
static_assert(nn::linear_block<nn::linear<4, 8>>::input_grad_optional);

// A run of elementwise layers, and layers that are blocks of their own.
static_assert(Block<nn::elementwise_block<nn::bias<8>, nn::tanh, nn::dropout<0.5f>>, batch<8>, batch<8>>);
static_assert(Block<nn::batch_norm<3>, batch<3, 4, 4>, batch<3, 4, 4>>);
static_assert(Block<nn::layer_norm<8>, batch<8>, batch<8>>);
static_assert(Block<nn::softmax<8>, batch<8>, batch<8>>);
static_assert(Block<nn::log_softmax<8>, batch<8>, batch<8>>);
static_assert(Block<nn::max_pool2d<2>, batch<3, 4, 4>, batch<3, 2, 2>>);
static_assert(Block<nn::avg_pool2d<2>, batch<3, 4, 4>, batch<3, 2, 2>>);
static_assert(Block<nn::adaptive_avg_pool2d<1, 1>, batch<3, 4, 4>, batch<3, 1, 1>>);
static_assert(Block<nn::flatten<>, batch<3, 4, 4>, batch<48>>);
static_assert(!nn::softmax<8>::input_grad_optional && !nn::flatten<>::channels_last_capable);

// Something that is not a block: a layer's description alone.
static_assert(!Block<nn::linear<4, 8>, batch<4>, batch<8>>);

}  // namespace
