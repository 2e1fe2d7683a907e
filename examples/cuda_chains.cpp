// cuda_chains: the generated CUDA kernels of bias+ReLU+dropout called from a program the C++ compiler builds alone, checked against solder's CPU backend.
//
// The kernels come from kernels/chains.hpp through solder-gen (kernels/bias_relu_dropout.cu,
// built by nvcc into solder_kernels); this file sees only their C header. The CPU block is the
// same type the kernels were generated from, and both draw the dropout mask from one Philox
// stream (seed, offset), so the masks must agree bit for bit. Without a CUDA device the program
// says so and exits 0.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <tuple>

#include "bias_relu_dropout.h"  // the launchers: C types only
#include "chains.hpp"           // the chain's type, for the CPU reference
#include "solder/device.hpp"
#include "solder/solder.hpp"

namespace {

using block_type = std::tuple_element_t<0, bias_relu_dropout::blocks_type>;  // bias<4096>, relu, dropout<0.1f>
constexpr std::size_t features = 4096;
// Not a multiple of the column walk's 128-row chunks: the last chunk is partial.
constexpr std::size_t batch = 157;
using rows = solder::shape<solder::dyn, features>;
using vec = solder::shape<features>;

// y and dx are the same float operations on both sides (an add, a max, a multiply per element),
// but nvcc and g++ may contract or reorder differently: allow a few units in the last place.
constexpr float element_tolerance = 4e-7f;
// db sums 157 terms of size ~1 in a different order on each side: about sqrt(157) ulp apart.
constexpr float sum_tolerance = 1e-5f;

bool close(float cpu, float gpu, float rel) {
  return std::fabs(cpu - gpu) <= rel * std::fmax(std::fabs(cpu), 1.0f);
}

/// Fails with the launcher's own message when a call did not succeed.
bool succeeded(int status, const char* what) {
  if (status == 0) return true;
  std::fprintf(stderr, "cuda_chains: %s returned %d: %s\n", what, status, solder_bias_relu_dropout_last_error());
  return false;
}

/// A launcher's errors are a status and a message, never an exception (no device needed).
bool show_error_reporting() {
  const int status = solder_bias_relu_dropout_f32_4096_fwd(nullptr, nullptr, nullptr, 0, 1, 0, nullptr);
  std::printf("cuda_chains: a call with an empty batch returns %d (cudaErrorInvalidValue): %s\n", status,
              solder_bias_relu_dropout_last_error());
  return status == 1 && std::strstr(solder_bias_relu_dropout_last_error(), "batch") != nullptr;
}

int run_on_device() {
  std::mt19937 gen(20240611);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  solder::tensor<float, rows> x(batch), dy(batch), y(batch), dx(batch);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = uniform(gen);
    dy[i] = uniform(gen);
  }

  // The CPU block: its forward advances the dropout to a fresh offset, as every training step.
  block_type cpu;
  auto& b = cpu.layer<0>().value;
  for (std::size_t j = 0; j < features; ++j) b[j] = 0.5f * uniform(gen);
  cpu.layer<2>().rng = {0x5eed, 41};
  cpu.forward(x, y);
  cpu.backward_from_output(y, dy, dx);
  const solder::philox_state rng = cpu.layer<2>().rng;  // the stream this forward's mask came from

  // The same on the device, on a stream of our own (allocations and copies go to it too).
  const solder::stream s;
  const solder::stream_guard on(s);
  const auto x_d = solder::to_device(x), dy_d = solder::to_device(dy);
  const auto b_d = solder::to_device(b);
  solder::tensor<float, rows, solder::device> y_d(batch, solder::uninitialized), dx_d(batch, solder::uninitialized);
  solder::tensor<float, vec, solder::device> db_d(solder::uninitialized);
  if (!succeeded(solder_bias_relu_dropout_f32_4096_fwd(x_d.data(), b_d.data(), y_d.data(), batch, rng.seed, rng.offset, s),
                 "solder_bias_relu_dropout_f32_4096_fwd") ||
      !succeeded(solder_bias_relu_dropout_f32_4096_bwd(y_d.data(), dy_d.data(), dx_d.data(), db_d.data(), batch, s),
                 "solder_bias_relu_dropout_f32_4096_bwd"))
    return 1;
  const auto y_gpu = solder::to_host(y_d), dx_gpu = solder::to_host(dx_d);  // waits for the stream
  const auto db_gpu = solder::to_host(db_d);

  std::size_t mask_differences = 0, y_differences = 0, dx_differences = 0, db_differences = 0, kept = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    // Where x + b > 0, y is 0 exactly when the mask dropped the element.
    mask_differences += (y[i] == 0.0f) != (y_gpu[i] == 0.0f);
    kept += y[i] != 0.0f;
    y_differences += !close(y[i], y_gpu[i], element_tolerance);
    dx_differences += !close(dx[i], dx_gpu[i], element_tolerance);
  }
  const auto& db = cpu.layer<0>().grad;
  for (std::size_t j = 0; j < features; ++j) db_differences += !close(db[j], db_gpu[j], sum_tolerance);

  std::printf("cuda_chains: y = dropout(relu(x + b)) on [%zu, %zu], stream (seed %llu, offset %llu): %zu of %zu "
              "elements nonzero\n",
              batch, features, (unsigned long long)rng.seed, (unsigned long long)rng.offset, kept, y.size());
  std::printf("  dropout mask  %zu elements differ from the CPU (must be 0)\n", mask_differences);
  std::printf("  y             %zu elements differ beyond %.0e relative\n", y_differences, double(element_tolerance));
  std::printf("  dx            %zu elements differ beyond %.0e relative\n", dx_differences, double(element_tolerance));
  std::printf("  db            %zu columns differ beyond %.0e relative\n", db_differences, double(sum_tolerance));
  const bool ok = mask_differences == 0 && y_differences == 0 && dx_differences == 0 && db_differences == 0;
  std::puts(ok ? "cuda_chains: the generated kernels match the CPU backend" : "cuda_chains: MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    if (!show_error_reporting()) {
      std::fputs("cuda_chains: the launcher did not report the empty batch as expected\n", stderr);
      return 1;
    }
    if (solder::eval::cuda::device_count() == 0) {
      std::puts("cuda_chains: no CUDA device is present; the generated kernels were not run (nothing to check)");
      return 0;
    }
    return run_on_device();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_chains: %s\n", e.what());
    return 1;
  }
}
