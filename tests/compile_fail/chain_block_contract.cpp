// A layer of the user's own that is a block of its own but provides only forward and backward:
// the chain names the block contract it lacks.
// MESSAGE[solder::chain: this block lacks a member of the block contract \(nn/block.hpp\); a layer that is a block of its own can derive from nn::block_defaults]
#include <cstddef>
#include <string>
#include <vector>

#include "solder/solder.hpp"

struct halve {
  static constexpr std::size_t in_features = 8, out_features = 8, parameter_count = 0;
  static constexpr double forward_flops = 8, backward_flops = 8;
  static constexpr std::size_t saved_floats = 0;
  std::vector<solder::optim::param> params(const std::string& = "") { return {}; }
  template <class SX, class SY>
  void forward(solder::tensor_ref<const float, SX> x, solder::tensor_ref<float, SY> y) {
    solder::assign(y, x * 0.5f);
  }
  template <class SX, class SY>
  void backward(solder::tensor_ref<const float, SX>, solder::tensor_ref<const float, SY>,
                solder::tensor_ref<const float, SY> dy, solder::tensor_ref<float, SX> dx) {
    solder::assign(dx, dy * 0.5f);
  }
};

int main() {
  solder::nn::chain<solder::nn::linear<4, 8>, halve, solder::nn::linear<8, 2>> model(1);
}
