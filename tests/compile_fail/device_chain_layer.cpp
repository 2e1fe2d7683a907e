// A chain in device memory takes the layers that have a form there; the first that has none (a
// layer of the user's own, written for host memory) is named.
// MESSAGE[solder::chain_in: layer 1 \(scale_by_two\) has no form in this memory space yet]
#include "solder/device.hpp"
#include "solder/solder.hpp"

/// y = 2 x, a block of its own in host memory only (it names no in_space).
struct scale_by_two : solder::nn::block_defaults<> {
  static constexpr const char* name = "scale_by_two";
  struct planner_traits {
    static constexpr solder::nn::layer_kind kind = solder::nn::layer_kind::block;
    static constexpr std::size_t in = 0, out = 0, parameters = 0;
    static constexpr double forward_flops(std::size_t f) { return double(f); }
    static constexpr double backward_flops(std::size_t f) { return double(f); }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
    static constexpr bool takes(solder::nn::sample_shape) { return true; }
    static constexpr solder::nn::sample_shape gives(solder::nn::sample_shape s) { return s; }
    static constexpr void append_takes(solder::fixed_string& m) { m.append("any shape"); }
  };
  template <class SX, class SY>
  void forward(solder::tensor_ref<const float, SX> x, solder::tensor_ref<float, SY> y) {
    solder::assign(y, x * 2.0f);
  }
  template <class SX, class SY>
  void backward(solder::tensor_ref<const float, SX>, solder::tensor_ref<const float, SY>,
                solder::tensor_ref<const float, SY> dy, solder::tensor_ref<float, SX> dx) {
    solder::assign(dx, dy * 2.0f);
  }
};

int main() {
  using model = solder::nn::chain_in<solder::device, solder::nn::linear<8, 4>, scale_by_two, solder::nn::relu>;
  static_assert(model::kernels >= 1);
}
