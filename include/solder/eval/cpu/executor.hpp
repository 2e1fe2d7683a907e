// eval/cpu/executor.hpp: executor<cpu>, the CPU backend as the rest of solder sees it (chosen
// by tag, backend.hpp; its verbs are declared in executor.hpp): assignment, and the loops and
// row walks the layers' math from ops/ runs in. Layers, losses and optimizers reach the CPU
// through these names only.
#pragma once

#include <cstddef>
#include <cstring>

#include "solder/backend.hpp"
#include "solder/eval/cpu/assign.hpp"
#include "solder/eval/cpu/chunking.hpp"
#include "solder/eval/cpu/conv2d.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/row.hpp"
#include "solder/eval/cpu/row_writes.hpp"
#include "solder/executor.hpp"
#include "solder/expr/write.hpp"

namespace solder {

/// The CPU backend: evaluates into host memory.
template <>
struct executor<cpu> {
  using space = host;
  /// A product's epilogue may fill several outputs in its one pass.
  static constexpr bool product_writes_several = true;
  /// The vector type of float math on this target (xsimd::batch<float, arch>).
  using vec = eval::cpu::vec<float>;
  /// The vector walk of a row of N floats (whole vectors, then a padded tail).
  template <std::size_t N>
  using row = eval::cpu::row<N>;
  /// How a loop over items is cut into chunks, fixed by the sizes alone.
  using chunking = eval::cpu::chunking;
  /// Denormals flushed to zero while alive (see eval::cpu::flush_denormals).
  using flush_denormals = eval::cpu::flush_denormals;

  /// Evaluates several writes in ONE pass over their common shape (see solder::assign_all).
  template <class W0, class... Ws>
  static void run(const W0& w0, const Ws&... ws) {
    eval::cpu::assign_writes(w0, ws...);
  }
  /// The gradient of a batch's image patches written back onto its images (col2im of a
  /// convolution's g W, eval/cpu/conv_product.hpp).
  template <class G, std::size_t C, class E, std::size_t Stored>
  static void run(const patch_gradient_write<G, C, host, E, Stored>& w) {
    eval::cpu::assign_patch_gradient(w);
  }
  /// out = e in one pass.
  template <class Out, class E>
  static void assign(const Out& out, const E& e) {
    run(write(out, e));
  }

  /// Elementwise writes a producer runs on a few rows of its output at a time, as it stores
  /// them (eval/cpu/row_writes.hpp): row_writes<S>(batch, writes...).epilogue() is the
  /// row_epilogue the producer calls.
  using row_epilogue = eval::cpu::row_epilogue;
  template <class S, class... Ws>
  static auto row_writes(std::size_t batch, const Ws&... ws) {
    return eval::cpu::make_row_writes<S>(batch, ws...);
  }

  /// A convolution layer's work (Spec: ops::conv2d_spec, eval/cpu/conv2d.hpp): an object the
  /// layer keeps (it holds the weights packed for a frozen model) whose forward<G>,
  /// forward_layouts<G> and backward<G> run the layer on images of geometry G
  /// (ops::conv2d_geometry), and pack_weights / weights_changed.
  template <class Spec>
  using conv2d = eval::cpu::conv2d<Spec>;

  /// f(r) for every row r of [0, rows) (rows of row_elements elements), over the threads.
  template <class F>
  static void for_rows(std::size_t rows, std::size_t row_elements, const F& f) {
    eval::cpu::for_rows(rows, row_elements, f);
  }
  /// The sum of f(r) (a double) over rows, the same bits for any thread count.
  template <class F>
  static double sum_rows(std::size_t rows, std::size_t row_elements, const F& f) {
    return eval::cpu::sum_rows(rows, row_elements, f);
  }
  /// f(c) for every chunk c of `parts`, over the threads.
  template <class F>
  static void for_chunks(const chunking& parts, std::size_t item_elements, const F& f) {
    eval::cpu::for_chunks(parts, item_elements, f);
  }
  /// f.template operator()<V>(i) for every element i of [0, n): V = vec over whole vectors,
  /// float over the tail.
  template <class F>
  static void for_each_element(std::size_t n, const F& f) {
    eval::cpu::for_each_element(n, f);
  }

  /// body(row<N>{}, r) for every row r of [0, count) (row<dyn>{body.n} when N is dyn), over
  /// the threads.
  template <std::size_t N, class Body>
  static void rows(std::size_t count, const Body& body) {
    std::size_t n = N;
    if constexpr (N == dyn) n = body.n;
    for_rows(count, n, [&](std::size_t r) { one_row<N>(body, r); });
  }
  /// The sum of body(row<N>{}, r) over [0, count): sum_rows's order, each row flattened.
  template <std::size_t N, class Body>
  static double row_sums(std::size_t count, const Body& body) {
    std::size_t n = N;
    if constexpr (N == dyn) n = body.n;
    return sum_rows(count, n, [&](std::size_t r) { return one_row<N>(body, r); });
  }
  /// Rows of row_elements cut into chunks (at most max_chunks, each worth a thread's start).
  static chunking chunks_of(std::size_t rows, std::size_t row_elements) { return chunking(rows, row_elements); }
  /// body(row<N>{}, c) for every chunk c of parts, over the threads.
  template <std::size_t N, class Body>
  static void chunks(const chunking& parts, const Body& body) {
    std::size_t n = N;
    if constexpr (N == dyn) n = body.n;
    for_chunks(parts, n, [&](std::size_t c) { one_row<N>(body, c); });
  }
  /// body(p, i, j) for every element of every plane, the planes over the threads (work: the
  /// elements a plane reads, which decides whether threads pay).
  template <class Body>
  static void planes(std::size_t count, std::size_t rows, std::size_t cols, std::size_t work, const Body& body) {
    for_rows(count, work, [&](std::size_t p) {
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) body(p, i, j);
    });
  }
  /// body.template operator()<V>(i): V = vec at every whole vector of [0, n), float after.
  template <class Body>
  static void elements(std::size_t n, const Body& body) {
    for_each_element(n, body);
  }
  /// The sum of body(b) over [0, count), blocks of about `size` elements: sum_rows's order.
  template <class Body>
  static double sum_blocks(std::size_t count, std::size_t size, const Body& body) {
    return sum_rows(count, size, body);
  }
  /// Host memory is the CPU's own: plain copies.
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src) std::memmove(dst, src, n * sizeof(T));
  }
  template <class T>
  static void copy_from_host(T* dst, const T* src, std::size_t n) {
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }
  template <class T>
  static void copy_to_host(T* dst, const T* src, std::size_t n) {
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }

 private:
  // One row, flattened: the op's loops with exp and the walker's reductions become one body
  // whatever else the translation unit holds (left to GCC's unit-growth budget, a large unit
  // calls exp out of line, once per vector).
  template <std::size_t N, class Body>
  SOLDER_FLATTEN_KERNEL static auto one_row(const Body& body, std::size_t r) {
    if constexpr (N == dyn)
      return body(row<dyn>(body.n), r);
    else
      return body(row<N>{}, r);
  }
};

static_assert(Executor<executor<cpu>>, "solder: executor<cpu> must provide every verb executor.hpp declares");

}  // namespace solder
