// eval/cuda/executor.hpp: executor<cuda>, the CUDA backend as the rest of solder sees it; nvcc only.
// Chosen by tag (backend.hpp); its verbs are declared in executor.hpp. Assignments into device
// tensors run as one fused pass, row and element bodies as warp-per-row and thread-per-element
// kernels, all on the calling thread's current stream (solder::current_stream(), set by
// solder::stream_guard); every call returns before the GPU has finished.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "solder/backend.hpp"
#include "solder/eval/cuda/assign.hpp"
#include "solder/eval/cuda/product.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/eval/cuda/row_kernels.hpp"
#include "solder/eval/cuda/stream.hpp"
#include "solder/executor.hpp"
#include "solder/expr/write.hpp"

namespace solder {

/// The CUDA backend: evaluates into device memory.
template <>
struct executor<cuda> {
  using space = device;
  /// A product kernel's epilogue writes one output.
  static constexpr bool product_writes_several = false;
  /// The kernels are built without flushing denormals (no -ftz): a scope that changes nothing.
  struct flush_denormals {
    explicit flush_denormals(bool) {}
  };

  /// Evaluates several writes in ONE pass over their common shape (see solder::assign_all).
  template <class W0, class... Ws>
  static void run(const W0& w0, const Ws&... ws) {
    eval::cuda::run_writes(current_stream(), w0, ws...);
  }
  /// The gradient of a batch's image patches written back onto its images: the product into
  /// stream-ordered scratch [batch Ho Wo, C Kh Kw], then gathered per input element (col2im,
  /// no atomics: the same bits every run).
  template <class G, std::size_t C, class E, std::size_t Stored>
  static void run(const patch_gradient_write<G, C, device, E, Stored>& w) {
    const std::size_t rows = w.out.batch();
    if (rows == 0) return;
    const eval::cuda::detail::stream_scratch<float> columns(rows * C * G::taps, current_stream(),
                                                            "solder::executor<cuda>::run (col2im)");
    eval::cuda::run_patch_gradient<executor>(w, columns.get());
  }
  /// out = e in one pass.
  template <class Out, class E>
  static void assign(const Out& out, const E& e) {
    run(write(out, e));
  }

  /// body(walker, r) for every row r of [0, count): one warp per row (eval::cuda::warp_row).
  template <std::size_t N, class Body>
  static void rows(std::size_t count, const Body& body) {
    eval::cuda::detail::launch_rows(eval::cuda::warp_rows<N, Body>{body}, count, current_stream(), "solder::executor<cuda>::rows");
  }
  /// The sum of body(walker, r) over [0, count): a warp per row stores each row's value, then
  /// the fixed-order device total (sum_terms), waited for and read back.
  template <std::size_t N, class Body>
  static double row_sums(std::size_t count, const Body& body) {
    if (count == 0) return 0.0;
    const cudaStream_t stream = current_stream();
    constexpr const char* what = "solder::executor<cuda>::row_sums";
    const eval::cuda::detail::stream_scratch<double> values(count + 1, stream, what);  // per row, then the total
    eval::cuda::detail::launch_rows(eval::cuda::warp_rows<N, ops::row_value_into<Body>>{{body, values.get()}}, count,
                                    stream, what);
    eval::cuda::detail::sum_terms(eval::cuda::double_terms{values.get()}, count, values.get() + count, stream, what);
    return eval::cuda::detail::read_back(values.get() + count, stream, what);
  }
  /// Rows cut into at most 256 chunks (eval::cuda::row_chunks: enough warps for a GPU).
  using chunking = eval::cuda::row_chunks;
  static chunking chunks_of(std::size_t rows, std::size_t) { return chunking(rows); }
  /// body(walker, c) for every chunk c: one warp per chunk.
  template <std::size_t N, class Body>
  static void chunks(const chunking& parts, const Body& body) {
    eval::cuda::detail::launch_rows(eval::cuda::warp_rows<N, Body>{body}, parts.count, current_stream(),
                                    "solder::executor<cuda>::chunks");
  }
  /// body(p, i, j) for every element of every plane: one thread per element.
  template <class Body>
  static void planes(std::size_t count, std::size_t rows, std::size_t cols, std::size_t, const Body& body) {
    eval::cuda::detail::launch_elements(eval::cuda::plane_elements<Body>{body, rows, cols}, count * rows * cols,
                                        current_stream(), "solder::executor<cuda>::planes");
  }
  /// body.template operator()<float>(i) for every i of [0, n): one thread per element.
  template <class Body>
  static void elements(std::size_t n, const Body& body) {
    eval::cuda::detail::launch_elements(eval::cuda::thread_elements<Body>{body}, n, current_stream(),
                                "solder::executor<cuda>::elements");
  }
  /// The sum of body(b) over [0, count): the fixed-order device total (sum_terms), waited for
  /// and read back.
  template <class Body>
  static double sum_blocks(std::size_t count, std::size_t, const Body& body) {
    if (count == 0) return 0.0;
    const cudaStream_t stream = current_stream();
    const eval::cuda::detail::stream_scratch<double> total(1, stream, "solder::executor<cuda>::sum_blocks");
    eval::cuda::detail::sum_terms(body, count, total.get(), stream, "solder::executor<cuda>::sum_blocks");
    return eval::cuda::detail::read_back(total.get(), stream, "solder::executor<cuda>::sum_blocks");
  }
  /// Device to device on the current stream.
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src)
      eval::cuda::check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, current_stream()),
                        "solder::executor<cuda>::copy");
  }
  /// Host to device on the current stream (pageable host memory: the source may be reused on
  /// return).
  template <class T>
  static void copy_from_host(T* dst, const T* src, std::size_t n) {
    if (n)
      eval::cuda::check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, current_stream()),
                        "solder::executor<cuda>::copy_from_host");
  }
  /// Device to host on the current stream, which is waited for.
  template <class T>
  static void copy_to_host(T* dst, const T* src, std::size_t n) {
    if (n == 0) return;
    const cudaStream_t stream = current_stream();
    eval::cuda::check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream),
                      "solder::executor<cuda>::copy_to_host");
    eval::cuda::check(cudaStreamSynchronize(stream), "solder::executor<cuda>::copy_to_host");
  }
};

static_assert(Executor<executor<cuda>>, "solder: executor<cuda> must provide every verb executor.hpp declares");

}  // namespace solder
