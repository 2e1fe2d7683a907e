// conv_bn_relu.cu: conv3x3 + batch_norm + ReLU in inference on a CUDA device: solder's product over implicit im2col, the normalization folded into W and b, ReLU in the epilogue, NHWC out (fp32, TF32, BF16), against cuBLASLt's GEMM as the measured peak.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"
#include "cublaslt.cuh"
#include "solder/cuda.hpp"
#include "solder/eval/cuda/product_kernel.hpp"
#include "solder/nn/conv2d.hpp"

namespace {

using namespace solder_bench::gpu;
namespace cu = solder::eval::cuda;
using solder::dyn;
using solder::shape;

/// Seeds of the data, fixed so every run sees the same numbers; set k adds 16 k.
enum seed : std::uint64_t { seed_x = 11, seed_w = 12, seed_gamma = 13, seed_beta = 14, seed_mean = 15, seed_var = 16 };

/// BatchNorm2d's default eps.
constexpr double bn_eps = 1e-5;

/// Where the input's channels are: NHWC (channels_last, PyTorch's layout for cuDNN's fast
/// convolutions) or NCHW (PyTorch's default). The output is NHWC either way.
enum class input_layout { nhwc, nchw };

const char* name_of(input_layout l) { return l == input_layout::nhwc ? "nhwc" : "nchw"; }

/// y = relu(batch_norm(conv2d(x, W))) in evaluation mode, C -> C channels, 3 x 3, stride 1,
/// padding 1 (ResNet's basic block; the convolution without a bias, as there), as one product:
/// y [N Ho Wo, C] (NHWC) = relu(im2col(x) W'^T + b'), W' = W g / sqrt(var + eps),
/// b' = beta - mean g / sqrt(var + eps). x in [-1, 1), W in +-1/sqrt(9 C) (nn.Conv2d's range),
/// gamma in [0.5, 1.5), beta in [-0.5, 0.5), running mean in [-0.2, 0.2), running var in [0.5, 2).
template <std::size_t C, std::size_t H, std::size_t W>
struct cases {
  static constexpr std::size_t kernel = 3;
  using geometry = solder::ops::conv2d_geometry<H, W, kernel, kernel, 1, 1, 1>;
  static constexpr std::size_t Ho = geometry::out_height, Wo = geometry::out_width;
  static constexpr std::size_t K = C * kernel * kernel;  // the product's inner extent
  using S = shape<dyn, C>;
  using output = solder::tensor<float, S, solder::device>;
  using weight = solder::tensor<float, shape<C, K>, solder::device>;
  using bias_vector = solder::tensor<float, shape<C>, solder::device>;

  static double flops(std::size_t n) { return 2.0 * double(n) * Ho * Wo * C * K; }
  /// What a pass must move at least: x read once, y written once (fp32).
  static double bytes(std::size_t n) { return 4.0 * double(n) * (H * W + Ho * Wo) * C; }

  /// The folded layer, made once: W' [C, C 3 3] (PyTorch's weight order) and b' [C] on the
  /// device, and the unfolded parameters on the host in double for the check.
  struct folded {
    weight w;
    bias_vector b;
    std::vector<double> w_raw, scale, shift;  // W, g / sqrt(var + eps), beta - mean g / sqrt(var + eps)
  };
  static folded make_layer() {
    const auto random = [](std::size_t n, std::uint64_t seed, float lo, float hi) {
      auto d = cu::device_array<float>::allocate(n, solder::current_stream());
      fill_uniform(d.data(), n, seed, lo, hi);
      std::vector<float> h(n);
      check(cudaMemcpyAsync(h.data(), d.data(), n * sizeof(float), cudaMemcpyDeviceToHost, solder::current_stream()),
            "cudaMemcpyAsync");
      check(cudaStreamSynchronize(solder::current_stream()), "cudaStreamSynchronize");
      return h;
    };
    const float bound = 1.0f / std::sqrt(float(K));
    const auto w = random(C * K, seed_w, -bound, bound), gamma = random(C, seed_gamma, 0.5f, 1.5f),
               beta = random(C, seed_beta, -0.5f, 0.5f), mean = random(C, seed_mean, -0.2f, 0.2f),
               var = random(C, seed_var, 0.5f, 2.0f);
    folded f{weight(solder::uninitialized), bias_vector(solder::uninitialized), {}, {}, {}};
    std::vector<float> wf(C * K), bf(C);
    f.w_raw.assign(w.begin(), w.end());
    for (std::size_t c = 0; c < C; ++c) {
      const double s = double(gamma[c]) / std::sqrt(double(var[c]) + bn_eps);
      f.scale.push_back(s);
      f.shift.push_back(double(beta[c]) - double(mean[c]) * s);
      for (std::size_t k = 0; k < K; ++k) wf[c * K + k] = float(double(w[c * K + k]) * s);
      bf[c] = float(f.shift[c]);
    }
    // Uploaded on the stream that computes (a non-blocking stream does not wait for the legacy
    // stream cudaMemcpy uses, and a pageable copy may return before its data has arrived), after
    // the allocations queued on it; the wait keeps wf and bf alive until the copies have read them.
    const cudaStream_t stream = solder::current_stream();
    check(cudaMemcpyAsync(f.w.data(), wf.data(), wf.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(f.b.data(), bf.data(), bf.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return f;
  }

  struct set {
    cu::device_array<float> x;  // [N, H, W, C] or [N, C, H, W]
    output y;                   // [N Ho Wo, C]: NHWC
  };

  template <math Math, input_layout Layout>
  static auto pass(const folded& f, set& s, std::size_t n) {
    const std::size_t M = n * Ho * Wo;
    using im2col = cu::im2col_operand<geometry, C, kernel, kernel, Layout == input_layout::nhwc>;
    return cu::product<solder_tiling<Math, C>>(
        im2col{s.x.data()}, cu::matrix_operand<true>{f.w.data(), K}, M, K,
        solder::write(s.y.ref(),
                      solder::relu(cu::product_value<S>(M) + f.b.ref())));
  }

  /// "" when output pixels at the corners, edges and middle of the first, middle and last
  /// images, every channel, equal relu((conv2d(x, W) - mean) g / sqrt(var + eps) + beta) in
  /// double (the unfolded layer) within `Math`'s product tolerance for K = 9 C terms, plus the
  /// folded weights' own rounding (one float rounding, 2^-24, of each of them).
  template <math Math, input_layout Layout>
  static std::string check_pixels(const folded& f, const set& s, std::size_t n) {
    std::vector<float> x(n * C * H * W);
    const cudaStream_t stream = solder::current_stream();
    check(cudaMemcpyAsync(x.data(), s.x.data(), x.size() * sizeof(float), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto at = [&](std::size_t img, std::size_t ci, std::size_t hi, std::size_t wi) {
      return double(Layout == input_layout::nhwc ? x[((img * H + hi) * W + wi) * C + ci] : x[((img * C + ci) * H + hi) * W + wi]);
    };
    const double tol = tol_of(Math, K) + 0x1p-24;
    std::vector<float> row(C);
    for (std::size_t img : {std::size_t{0}, n / 2, n - 1})
      for (std::size_t ho : {std::size_t{0}, Ho / 2, Ho - 1})
        for (std::size_t wo : {std::size_t{0}, Wo / 3, Wo - 1}) {
          const std::size_t pixel = (img * Ho + ho) * Wo + wo;
          check(cudaMemcpyAsync(row.data(), s.y.data() + pixel * C, C * sizeof(float), cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync");
          check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          for (std::size_t co = 0; co < C; ++co) {
            double z = 0, magnitude = std::abs(f.shift[co]);
            for (std::size_t ci = 0; ci < C; ++ci)
              for (std::size_t kh = 0; kh < kernel; ++kh)
                for (std::size_t kw = 0; kw < kernel; ++kw) {
                  const std::size_t hi = geometry::in_row(ho, kh), wi = geometry::in_col(wo, kw);
                  if (!(hi < H && wi < W)) continue;  // the padding (wraps past the top or left edge)
                  const double t = at(img, ci, hi, wi) * f.w_raw[co * K + (ci * kernel + kh) * kernel + kw];
                  z += t;
                  magnitude += std::abs(t) * f.scale[co];
                }
            const double want = std::max(0.0, z * f.scale[co] + f.shift[co]), got = row[co];
            if (!(std::abs(got - want) <= tol * magnitude))
              return "y[n=" + std::to_string(img) + ", h=" + std::to_string(ho) + ", w=" + std::to_string(wo) + ", c=" +
                     std::to_string(co) + "] is " + std::to_string(got) + ", the unfolded layer gives " + std::to_string(want) +
                     " (tolerance " + std::to_string(tol * magnitude) + ")";
          }
        }
    return "";
  }

  /// solder's folded layer, math `Math`, input in `Layout`: one product per pass, y written once.
  template <math Math, input_layout Layout>
  static void solder_case(benchmark::State& state, std::size_t n) {
    const std::size_t x_floats = n * C * H * W, M = n * Ho * Wo;
    const folded f = make_layer();
    std::vector<set> sets;
    for (std::size_t k = 0, count = rotation_sets(std::size_t(bytes(n))); k < count; ++k) {
      set s{cu::device_array<float>::allocate(x_floats, solder::current_stream()), output(M, solder::uninitialized)};
      fill_uniform(s.x.data(), x_floats, seed_x + 16 * k);  // the same numbers in either layout: other images, alike
      sets.push_back(std::move(s));
    }
    using pass_type = decltype(pass<Math, Layout>(f, sets[0], n));
    std::vector<pass_type> passes;
    for (set& s : sets) passes.push_back(pass<Math, Layout>(f, s, n));
    const cudaStream_t stream = solder::current_stream();
    cu::run_product(stream, passes[0]);
    if (const std::string err = check_pixels<Math, Layout>(f, sets[0], n); !err.empty()) return state.SkipWithError(err.c_str());
    const double seconds = timed_seconds(state, sets.size(), [&](std::size_t k) { cu::run_product(stream, passes[k]); });
    set_flop_rates(state, flops(n), seconds, Math);
    state.counters["bytes"] = bytes(n);
    state.counters["GBps"] = bytes(n) / seconds * 1e-9;
    const char* how = Math == math::fp32   ? "fp32 fma"
                      : Math == math::tf32 ? "TF32 mma.sync, float x and W' rounded to tf32 while staged"
                                           : "BF16 mma.sync, float x and W' rounded to bf16 while staged";
    state.SetLabel(std::to_string(sets.size()) + " buffer sets; one product over implicit im2col (" + name_of(Layout) +
                   " input), batch norm folded, ReLU in the epilogue, NHWC out; " + how);
  }
};

/// The cases of N images of C x H x W, C -> C channels.
template <std::size_t C, std::size_t H, std::size_t W>
void register_shape(std::size_t n) {
  using Cs = cases<C, H, W>;
  const std::string shape = std::to_string(n) + "x" + std::to_string(C) + "x" + std::to_string(H) + "x" + std::to_string(W);
  using case_fn = void (*)(benchmark::State&, std::size_t);
  const std::pair<const char*, case_fn> list[] = {
      {"solder_folded_fp32_nhwc", &Cs::template solder_case<math::fp32, input_layout::nhwc>},
      {"solder_folded_tf32_nhwc", &Cs::template solder_case<math::tf32, input_layout::nhwc>},
      {"solder_folded_bf16_nhwc", &Cs::template solder_case<math::bf16, input_layout::nhwc>},
      {"solder_folded_fp32_nchw", &Cs::template solder_case<math::fp32, input_layout::nchw>},
      {"solder_folded_tf32_nchw", &Cs::template solder_case<math::tf32, input_layout::nchw>},
      {"solder_folded_bf16_nchw", &Cs::template solder_case<math::bf16, input_layout::nchw>},
  };
  for (const auto& [impl, fn] : list)
    benchmark::RegisterBenchmark(("BM_cuda_conv_bn_relu_infer/" + std::string(impl) + "/" + shape).c_str(),
                                 [fn = fn, n](benchmark::State& state) { guarded(state, [&] { fn(state, n); }); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, [] {
    benchmark::AddCustomContext("cublasLt_version", std::to_string(cublasLtGetVersion()));
    auto lt = std::make_unique<lt_library>();
    // The peaks first: the cases after them divide by the rates they measured.
    register_peaks();
    register_shape<64, 56, 56>(32);   // ResNet-18/34 stage 1: N = 32, 64 -> 64, 56 x 56
    register_shape<128, 28, 28>(32);  // stage 2: N = 32, 128 -> 128, 28 x 28
    return lt;
  });
}
