// bias_relu_dropout_demo: y = dropout(relu(x + b)) as one fused pass, checked against the
// unfused composition (three passes with temporaries, as an eager framework runs it), then
// timed both ways, forward and backward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "solder/nn/elementwise_block.hpp"

using namespace solder;

constexpr std::size_t B = 256, N = 4096;
constexpr float p = 0.1f;
using X = tensor<float, shape<B, N>>;

template <class F>
double median_seconds(F&& f, int reps = 21) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  set_num_threads(1);
  nn::bias_relu_dropout<N, p> layer;
  X x, y, dy, dx;
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.001f * float(i)) * 2.0f;
    dy[i] = std::cos(0.003f * float(i));
  }
  auto& b = layer.layer<0>().value;
  for (std::size_t j = 0; j < N; ++j) b[j] = 0.1f * std::cos(float(j));

  // Fused forward and backward.
  layer.forward(x, y);
  layer.backward(x, dy, dx);
  const philox_state rng = layer.layer<2>().rng;  // the stream the forward used

  // The unfused composition: three passes, two temporaries.
  X t1, t2, y_ref, dx_ref;
  tensor<float, shape<N>> db_ref;
  auto unfused_forward = [&] {
    t1 = x + b;
    t2 = relu(t1);
    y_ref = dropout(t2, p, rng);
  };
  auto unfused_backward = [&] {
    t1 = x + b;                        // recompute the pre-activation
    t2 = dropout(dy, p, rng);          // dy through the mask
    dx_ref = where(t1 > 0.f, t2, 0.f);  // through relu
    db_ref = sum<0>(dx_ref);
  };
  unfused_forward();
  unfused_backward();

  std::size_t y_diff = 0, dx_diff = 0, kept = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    y_diff += y[i] != y_ref[i];
    dx_diff += dx[i] != dx_ref[i];
    kept += y[i] != 0.0f;
  }
  double db_err = 0;
  for (std::size_t j = 0; j < N; ++j)
    db_err = std::max(db_err, double(std::fabs(layer.layer<0>().grad[j] - db_ref[j])) / (1.0 + std::fabs(db_ref[j])));
  std::printf("y = dropout(relu(x + b)), x [%zu, %zu], p = %.2f, training mode\n", B, N, p);
  std::printf("  fused vs unfused: y differs in %zu elements, dx in %zu, max relative db difference %.2e\n", y_diff,
              dx_diff, db_err);
  std::printf("  nonzero outputs: %.4f of elements\n\n", double(kept) / double(y.size()));
  if (y_diff || dx_diff || db_err > 1e-4) {
    std::printf("MISMATCH between fused and unfused results\n");
    return 1;
  }

  const double fwd_bytes = 2.0 * double(x.size()) * sizeof(float);  // read x, write y
  const double bwd_bytes = 3.0 * double(x.size()) * sizeof(float);  // read x and dy, write dx
  const double f_fused = median_seconds([&] { layer.forward(x, y); });
  const double f_unfused = median_seconds(unfused_forward);
  const double b_fused = median_seconds([&] { layer.backward(x, dy, dx); });
  const double b_unfused = median_seconds(unfused_backward);
  std::printf("%-10s %-8s %10s %8s %8s\n", "pass", "impl", "time (us)", "GB/s", "speedup");
  std::printf("%-10s %-8s %10.1f %8.1f %8s\n", "forward", "fused", f_fused * 1e6, fwd_bytes / f_fused / 1e9, "");
  std::printf("%-10s %-8s %10.1f %8.1f %7.2fx\n", "forward", "unfused", f_unfused * 1e6, fwd_bytes / f_unfused / 1e9,
              f_unfused / f_fused);
  std::printf("%-10s %-8s %10.1f %8.1f %8s\n", "backward", "fused", b_fused * 1e6, bwd_bytes / b_fused / 1e9, "");
  std::printf("%-10s %-8s %10.1f %8.1f %7.2fx\n", "backward", "unfused", b_unfused * 1e6, bwd_bytes / b_unfused / 1e9,
              b_unfused / b_fused);
  std::printf("\n(single thread, median of 21 runs; GB/s counts the bytes that must move)\n");
}
