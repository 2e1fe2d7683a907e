// cublaslt.cuh: cuBLASLt in the GPU benchmarks: the matmul peer of solder's product, the measured
// dense peak (cuBLASLt's GEMM at 8192^3 per precision), and the products' tolerances per precision.
// A binary that includes it links CUDA::cublasLt (bench/CMakeLists.txt).
#pragma once

#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.cuh"
#include "solder/cuda.hpp"
#include "solder/eval/cuda/product.hpp"

namespace solder_bench::gpu {

namespace cu = solder::eval::cuda;

/// How the product multiplies: fp32 fma (CUDA cores), TF32 or BF16 tensor cores with fp32 accumulation.
enum class math { fp32, tf32, bf16 };

inline const char* name_of(math m) { return m == math::fp32 ? "fp32" : m == math::tf32 ? "tf32" : "bf16"; }

/// solder's tiling of a product with N static output columns for `Math`: product_tiling_for
/// (fp32 fma) or mma_tiling_for (tensor cores).
template <math Math, std::size_t N>
using solder_tiling = std::conditional_t<Math == math::fp32, cu::product_tiling_for<N>,
                                         cu::mma_tiling_for<N, Math == math::tf32 ? cu::product_math::tf32 : cu::product_math::bf16>>;

// ---------------------------------------------------------------------------------------------
// Tolerances
// ---------------------------------------------------------------------------------------------

// Tolerances of one element of a product A B (+ bias) of inner extent K, relative to its magnitude
// sum_k |A_mk B_kn| (+ |bias|):
/// fp32: K fused multiply-adds in sequence, each rounding once by at most 2^-24 of a partial sum
/// no larger than the magnitude, and the bias's add.
inline double fp32_tol(std::size_t K) { return double(K + 1) * 0x1p-24; }
/// Tensor cores add a fragment's products in their own order and width: 4 ulps per addition.
inline double tensor_core_accumulation_tol(std::size_t K) { return double(K + 1) * 0x1p-22; }
/// TF32: an input keeps 10 fraction bits, losing up to 2^-10 of itself where it is truncated
/// (cuBLASLt may pass fp32 bits to the tensor cores; solder rounds to nearest: 2^-11), so a
/// product up to 2^-9 (+ 2^-20).
inline double tf32_tol(std::size_t K) { return 0x1p-9 + 0x1p-20 + tensor_core_accumulation_tol(K); }
/// BF16: an input rounded to nearest even with 7 fraction bits is off by up to 2^-8 of itself,
/// a product by 2^-7 (+ 2^-16); solder and the conversion before cuBLASLt round alike.
inline double bf16_tol(std::size_t K) { return 0x1p-7 + 0x1p-16 + tensor_core_accumulation_tol(K); }

inline double tol_of(math m, std::size_t K) { return m == math::fp32 ? fp32_tol(K) : m == math::tf32 ? tf32_tol(K) : bf16_tol(K); }

// ---------------------------------------------------------------------------------------------
// cuBLASLt
// ---------------------------------------------------------------------------------------------

inline void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

/// The process's cuBLASLt handle and the workspace every matmul may use.
class lt_library {
 public:
  /// What cuBLAS asks for on Hopper; the heuristic is told this is the most it may use.
  static constexpr std::size_t workspace_bytes = std::size_t{32} << 20;

  lt_library() {
    check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
    check(cudaMalloc(&workspace_, workspace_bytes), "cudaMalloc of the cuBLASLt workspace");
    current() = this;
  }
  ~lt_library() {
    current() = nullptr;
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  lt_library(const lt_library&) = delete;
  lt_library& operator=(const lt_library&) = delete;

  static lt_library& get() { return *current(); }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

 private:
  static lt_library*& current() {
    static lt_library* p = nullptr;
    return p;
  }
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

template <class T>
void set_attribute(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t a, const T& value) {
  check_lt(cublasLtMatmulDescSetAttribute(op, a, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
}

/// y [M, N] row-major = x [M, K] W^T, W [N, K], by cublasLtMatmul, with `epilogue` (DEFAULT or
/// RELU_BIAS: relu(. + b), b [N]). cuBLASLt is column-major, so it computes y^T [N, M] = W x^T:
/// A = W, a column-major [K, N] read transposed; B = x, a column-major [K, M]; D [N, M] with the
/// bias along its rows, the N out features. Inputs fp32 (fp32: CUBLAS_COMPUTE_32F; tf32:
/// CUBLAS_COMPUTE_32F_FAST_TF32) or bf16 (CUBLAS_COMPUTE_32F: fp32 accumulation); D fp32.
class lt_linear {
 public:
  lt_linear(math m, std::size_t M, std::size_t N, std::size_t K, cublasLtEpilogue_t epilogue) {
    const cudaDataType_t in = m == math::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = m == math::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check_lt(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    set_attribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
    set_attribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
    set_attribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(epilogue));
    check_lt(cublasLtMatrixLayoutCreate(&a_, in, K, N, std::int64_t(K)), "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&b_, in, K, M, std::int64_t(K)), "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, N, M, std::int64_t(N)), "cublasLtMatrixLayoutCreate");
  }
  ~lt_linear() {
    if (d_) cublasLtMatrixLayoutDestroy(d_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (op_) cublasLtMatmulDescDestroy(op_);
  }
  lt_linear(const lt_linear&) = delete;
  lt_linear& operator=(const lt_linear&) = delete;

  /// Queues y = x W^T (+ bias, relu) on `stream`; bias null without the bias epilogue. The first
  /// call asks the heuristic for its best algorithm (the bias pointer set, as it is in every call).
  void run(const void* x, const void* w, const float* bias, float* y, cudaStream_t stream) {
    if (bias) set_attribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (!chosen_) choose();
    const float one = 1.0f, zero = 0.0f;
    check_lt(cublasLtMatmul(lt_library::get().handle(), op_, &one, w, a_, x, b_, &zero, y, d_, y, d_, &algo_,
                            lt_library::get().workspace(), lt_library::workspace_bytes, stream),
             "cublasLtMatmul");
  }

 private:
  void choose() {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t bytes = lt_library::workspace_bytes;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(lt_library::get().handle(), op_, a_, b_, d_, d_, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) throw std::runtime_error("cuBLASLt's heuristic has no algorithm for this matmul");
    algo_ = result.algo;
    chosen_ = true;
  }

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool chosen_ = false;
};

/// out[i] = x[i] rounded to bf16, to nearest even (as solder's BF16 staging rounds).
__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* out, std::size_t n) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

inline cu::device_array<__nv_bfloat16> bf16_copy(const float* x, std::size_t n) {
  auto out = cu::device_array<__nv_bfloat16>::allocate(n, solder::current_stream());
  to_bf16_kernel<<<unsigned(device().multiprocessors * 8), 256, 0, solder::current_stream()>>>(x, out.data(), n);
  check(cudaGetLastError(), "to_bf16_kernel");
  return out;
}

// ---------------------------------------------------------------------------------------------
// The measured peak: cuBLASLt's dense GEMM at peak_extent cubed, per precision
// ---------------------------------------------------------------------------------------------

/// The square GEMM whose cuBLASLt rate is the measured peak: large enough that each precision's
/// best kernel fills every multiprocessor for milliseconds.
inline constexpr std::size_t peak_extent = 8192;
/// Seeds of the peak GEMM's operands (set k adds 16 k).
inline constexpr std::uint64_t peak_seed_a = 1, peak_seed_b = 2;

/// TFLOP/s of the peak GEMM per precision: set by its case, else measured on first use.
inline std::map<math, double>& peak_rates() {
  static std::map<math, double> rates;
  return rates;
}

/// The peak GEMM of one precision: y = x W^T over 8192 x 8192 operands, rotated through buffer sets.
struct peak_gemm {
  using square = solder::tensor<float, solder::shape<solder::dyn, peak_extent>, solder::device>;
  struct set {
    std::optional<square> x, w;                 // fp32 and tf32
    cu::device_array<__nv_bfloat16> x16, w16;   // bf16
    square y;
    const void* a() const { return x ? static_cast<const void*>(x->data()) : x16.data(); }
    const void* b() const { return w ? static_cast<const void*>(w->data()) : w16.data(); }
  };

  static constexpr double flops = 2.0 * peak_extent * peak_extent * peak_extent;
  math m;
  std::vector<set> sets;
  lt_linear op;

  explicit peak_gemm(math m_) : m(m_), op(m_, peak_extent, peak_extent, peak_extent, CUBLASLT_EPILOGUE_DEFAULT) {
    const std::size_t e2 = peak_extent * peak_extent;
    const std::size_t bytes = e2 * ((m == math::bf16 ? 2 * 2 : 2 * 4) + 4);  // reads x and W, writes y
    const float w_bound = 1.0f / std::sqrt(float(peak_extent));
    for (std::size_t k = 0, n = rotation_sets(bytes); k < n; ++k) {
      square x(peak_extent, solder::uninitialized), w(peak_extent, solder::uninitialized);
      fill_uniform(x.data(), e2, peak_seed_a + 16 * k);
      fill_uniform(w.data(), e2, peak_seed_b + 16 * k, -w_bound, w_bound);
      set s{std::nullopt, std::nullopt, {}, {}, square(peak_extent, solder::uninitialized)};
      if (m == math::bf16) {
        s.x16 = bf16_copy(x.data(), e2);
        s.w16 = bf16_copy(w.data(), e2);
      } else {
        s.x.emplace(std::move(x));
        s.w.emplace(std::move(w));
      }
      sets.push_back(std::move(s));
    }
  }
  void pass(std::size_t k) { op.run(sets[k].a(), sets[k].b(), nullptr, sets[k].y.data(), solder::current_stream()); }
};

/// The peak TFLOP/s of `m`: the peak case's, or the median of 11 timed GEMMs.
inline double peak_tflops(math m) {
  auto& rates = peak_rates();
  if (auto it = rates.find(m); it != rates.end()) return it->second;
  peak_gemm g(m);
  const double seconds = median_seconds(g.sets.size(), 11, [&](std::size_t k) { g.pass(k); });
  return rates[m] = peak_gemm::flops / seconds * 1e-12;
}

inline void peak_case(benchmark::State& state, math m) {
  peak_gemm g(m);
  const double tflops = peak_gemm::flops / timed_seconds(state, g.sets.size(), [&](std::size_t k) { g.pass(k); }) * 1e-12;
  peak_rates()[m] = tflops;
  state.counters["flops"] = peak_gemm::flops;
  state.counters["TFLOPs"] = tflops;
  state.counters["peak_TFLOPs"] = tflops;
  state.counters["peak_fraction"] = 1.0;
  state.SetLabel(std::to_string(g.sets.size()) + " buffer sets; cublasLtMatmul, " +
                 (m == math::bf16 ? "bf16 inputs, " : "") + "fp32 out: the measured peak of " + name_of(m));
}

/// Registers BM_cuda_gemm_peak/cublaslt_<fp32|tf32|bf16>/8192x8192x8192; register them before
/// the cases that divide by the peaks, so a full run measures them first.
inline void register_peaks() {
  const std::string shape = std::to_string(peak_extent) + "x" + std::to_string(peak_extent) + "x" + std::to_string(peak_extent);
  for (math m : {math::fp32, math::tf32, math::bf16})
    benchmark::RegisterBenchmark(("BM_cuda_gemm_peak/cublaslt_" + std::string(name_of(m)) + "/" + shape).c_str(),
                                 [m](benchmark::State& state) { guarded(state, [&] { peak_case(state, m); }); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

/// Sets flops, TFLOPs, peak_TFLOPs (the measured peak of `m`) and peak_fraction of a case.
inline void set_flop_rates(benchmark::State& state, double flops, double seconds, math m) {
  const double tflops = flops / seconds * 1e-12, peak = peak_tflops(m);
  state.counters["flops"] = flops;
  state.counters["TFLOPs"] = tflops;
  state.counters["peak_TFLOPs"] = peak;
  state.counters["peak_fraction"] = tflops / peak;
}

}  // namespace solder_bench::gpu
