// executor.hpp: what every backend provides, declared once. A layer, a loss or an optimizer
// written over a memory space calls executor<backend_of_t<Space>> through these verbs only;
// eval/cpu/executor.hpp and eval/cuda/executor.hpp implement the same list (each checks itself
// against the Executor concept below), as every xsimd architecture implements one declared API.
//
//   verb                              what it runs
//   space                             the memory space it evaluates into (host, device)
//   run(writes...), assign(out, e)    ONE pass over expressions: elementwise maps, reductions,
//                                     and a matrix product with its epilogue (a contract node)
//   flush_denormals                   a scope (constructed with on/off) in which the backend's
//                                     arithmetic flushes denormals to zero where it can choose
//   product_writes_several            whether run takes, beside a write holding a product, more
//                                     writes of its shape filled from the same epilogue (else a
//                                     product runs alone and its caller makes a second pass)
//   rows<N>(count, body)              body(walker, r) for every row r of [0, count): rows of N
//                                     floats (N = dyn: body.n of them), walked by the backend's
//                                     row walker, which ops/ row ops are written over (docs/ops.md)
//   row_sums<N>(count, body)          the double sum of body(walker, r) over the rows of rows<N>,
//                                     added in an order fixed by count; returns it to the host
//   chunking, chunks_of(rows, n)      how rows of n elements are cut into chunks of consecutive
//                                     rows, fixed by the sizes alone (count, begin(c), end(c))
//   chunks<N>(parts, body)            body(walker, c) for every chunk c of parts: a body that sums
//                                     over its chunk's rows, its walker one of rows<N>'s
//   planes(count, rows, cols, work, body)
//                                     body(p, i, j) for every (i, j) of a rows x cols plane of
//                                     every plane p of [0, count); work: elements a plane reads
//   elements(n, body)                 body.template operator()<V>(i) covering [0, n) once: V the
//                                     backend's widest value (a vector on the CPU, float on CUDA)
//                                     at i, float for the elements a vector cannot take
//   sum_blocks(count, size, body)     the double sum of body(b) over the blocks b of [0, count)
//                                     (each of about `size` elements), added in an order fixed
//                                     by count; returns it to the host
//   copy(dst, src, n)                 n elements (float, int32...) within the space's memory
//                                     (dst == src: nothing)
//   copy_from_host(dst, src, n)       n elements from host memory into the space's memory
//   copy_to_host(dst, src, n)         n elements of the space's memory into host memory, finished
//                                     on return
//
// Results never depend on the thread count or the launch shape: rows and elements hand out
// independent pieces, and a body that reduces does so in an order fixed by its sizes.
#pragma once

#include <concepts>
#include <cstddef>

#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/shape.hpp"

namespace solder {

namespace detail {

/// A row body of the shape rows<N> takes, reading nothing: for the concept's check only.
struct probe_row_body {
  std::size_t n = 0;
  template <class R>
  SOLDER_HD void operator()(const R&, std::size_t) const {}
};

/// An element body of the shape elements takes: for the concept's check only.
struct probe_element_body {
  template <class V>
  SOLDER_HD void operator()(std::size_t) const {}
};

/// A row body of the shape row_sums takes: for the concept's check only.
struct probe_row_value_body {
  std::size_t n = 0;
  template <class R>
  SOLDER_HD double operator()(const R&, std::size_t) const {
    return 0.0;
  }
};

/// A plane body of the shape planes takes: for the concept's check only.
struct probe_plane_body {
  SOLDER_HD void operator()(std::size_t, std::size_t, std::size_t) const {}
};

/// A block body of the shape sum_blocks takes: for the concept's check only.
struct probe_block_body {
  SOLDER_HD double operator()(std::size_t) const { return 0.0; }
};

}  // namespace detail

/// E provides every verb of the list above. Checked by each backend's own header, so a verb
/// one backend lacks is a compile error there and not in the layer that calls it.
template <class E>
concept Executor = MemorySpace<typename E::space> &&
                   std::same_as<E, executor<backend_of_t<typename E::space>>> &&
                   std::convertible_to<decltype(E::product_writes_several), bool> &&
                   std::constructible_from<typename E::flush_denormals, bool> &&
                   requires(std::size_t n, float* dst, const float* src) {
                     E::template rows<4>(n, detail::probe_row_body{});
                     E::template rows<dyn>(n, detail::probe_row_body{});
                     E::elements(n, detail::probe_element_body{});
                     { E::template row_sums<4>(n, detail::probe_row_value_body{}) } -> std::same_as<double>;
                     { E::chunks_of(n, n) } -> std::same_as<typename E::chunking>;
                     { E::chunks_of(n, n).count } -> std::convertible_to<std::size_t>;
                     E::template chunks<4>(E::chunks_of(n, n), detail::probe_row_body{});
                     E::planes(n, n, n, n, detail::probe_plane_body{});
                     { E::sum_blocks(n, n, detail::probe_block_body{}) } -> std::same_as<double>;
                     E::copy(dst, src, n);
                     E::copy_from_host(dst, src, n);
                     E::copy_to_host(dst, src, n);
                   };

}  // namespace solder
