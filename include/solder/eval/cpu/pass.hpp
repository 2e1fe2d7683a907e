// eval/cpu/pass.hpp: the CPU loop nest. A pass walks its output in segments; for each one,
// every write's expression is loaded into registers, then stored or folded into a reduction,
// vector by vector; tails go through the same vector code, so every element is computed the
// same way whatever the segment, tile or thread it falls in. assign.hpp runs it over whole
// tensors; product.hpp runs it over the register tiles of a matrix product.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "solder/eval/cpu/chunking.hpp"
#include "solder/eval/cpu/evaluator.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/tuning.hpp"
#include "solder/memory.hpp"
#include "solder/expr/reduce.hpp"
#include "solder/expr/same.hpp"
#include "solder/expr/write.hpp"

namespace solder {

namespace eval::cpu {

/// A value as T: masks become 1 or 0 (as torch converts bool to float).
template <class V, class X>
SOLDER_INLINE V as_value(const X& x) {
  if constexpr (std::is_same_v<X, V>)
    return x;
  else
    return simd::select(x, V(1), V(0));
}

/// Stores a write's values into its output tensor.
template <class T, class Lay, class V, bool Stream>
struct store_sink {
  static constexpr bool reduces = false;
  T* base;
  T* p = nullptr;
  explicit store_sink(T* b) : base(b) {}
  SOLDER_INLINE void begin_chunk(std::size_t, bool) {}
  SOLDER_INLINE void seek(const segment& s) {
    p = base + (Lay::flat ? s.col : s.row * Lay::shape::last + s.col);
  }
  template <class X>
  SOLDER_INLINE void put(std::size_t j, const X& x) {
    if constexpr (Stream)
      stream_store(p + j, as_value<V>(x));
    else
      as_value<V>(x).store_unaligned(p + j);
  }
  template <class X>
  SOLDER_INLINE void put_partial(std::size_t j, std::size_t n, const X& x) {
    store_first(p + j, as_value<V>(x), n);
  }
  SOLDER_INLINE void end_segment() {}
};

/// What a sink that does not fold columns keeps across the rows of a group: nothing.
struct no_column_acc {};

/// Folds a write's values into per-chunk partial results of shape Keep (see reduce_node).
template <class T, class Keep, class Combine, class Lay, class V>
struct reduce_sink {
  static constexpr bool reduces = true;
  using vec = V;
  using map = broadcast_map<Keep, typename Lay::shape>;
  static constexpr bool inner = !Lay::flat && map::inner;

  T* partials;            // max_chunks (or fewer) blocks of keep_size
  std::size_t keep_size;  // elements of Keep for this batch
  T* partial = nullptr;   // the current chunk's block
  T* p = nullptr;
  V acc{};

  reduce_sink(T* parts, std::size_t ks) : partials(parts), keep_size(ks) {}
  /// `fresh`: the chunk's first row group writes the whole block (it starts at identity), so
  /// it is not filled.
  SOLDER_INLINE void begin_chunk(std::size_t c, bool fresh) {
    partial = partials + c * keep_size;
    if (!(inner && fresh)) std::fill(partial, partial + keep_size, Combine::template identity<T>());
  }
  SOLDER_INLINE void seek(const segment& s) {
    p = partial + (Lay::flat ? 0 : map::row_offset(s.row)) + (inner ? s.col : 0);
    if constexpr (!inner) acc = V(Combine::template identity<T>());
  }
  template <class X>
  SOLDER_INLINE void put(std::size_t j, const X& x) {
    if constexpr (inner)
      Combine::combine(V::load_unaligned(p + j), as_value<V>(x)).store_unaligned(p + j);
    else
      acc = Combine::combine(acc, as_value<V>(x));
  }
  template <class X>
  SOLDER_INLINE void put_partial(std::size_t j, std::size_t n, const X& x) {
    alignas(alignment) T buf[V::size];
    as_value<V>(x).store_aligned(buf);
    for (std::size_t k = n; k < V::size; ++k) buf[k] = Combine::template identity<T>();
    if constexpr (inner) {
      for (std::size_t k = 0; k < n; ++k) p[j + k] = Combine::combine(p[j + k], buf[k]);
    } else {
      acc = Combine::combine(acc, V::load_aligned(buf));
    }
  }
  SOLDER_INLINE void end_segment() {
    if constexpr (!inner) {
      alignas(alignment) T lanes[V::size];
      acc.store_aligned(lanes);
      T h = lanes[0];
      for (std::size_t k = 1; k < V::size; ++k) h = Combine::combine(h, lanes[k]);
      *p = Combine::combine(*p, h);
    }
  }

  // A row group (run_row_group): a column fold keeps the partial vector in a register across
  // the group's rows, loaded and stored once per group instead of once per row. The rows are
  // combined in the same order, so the bits are the same.
  SOLDER_INLINE V column_begin(std::size_t j, bool fresh) const {
    return fresh ? V(Combine::template identity<T>()) : V::load_unaligned(p + j);
  }
  template <class X>
  SOLDER_INLINE void column_put(V& a, const X& x) const {
    a = Combine::combine(a, as_value<V>(x));
  }
  SOLDER_INLINE void column_end(std::size_t j, const V& a) const { a.store_unaligned(p + j); }
  /// Whether rows [row, row + n) fold into the same partial row.
  SOLDER_INLINE static bool same_partial(std::size_t row, std::size_t n) {
    for (std::size_t r = 1; r < n; ++r)
      if (map::row_offset(row + r) != map::row_offset(row)) return false;
    return true;
  }
  /// Whether a row group over whole rows of `row_len` elements writes every partial element.
  SOLDER_INLINE bool one_partial_row(std::size_t row_len) const { return keep_size == row_len; }
};

/// The group interface for every sink: column folds keep a register, the others put each row.
template <class Sink>
struct folds_columns_trait : std::false_type {};
template <class T, class Keep, class Combine, class Lay, class V>
struct folds_columns_trait<reduce_sink<T, Keep, Combine, Lay, V>> : std::bool_constant<reduce_sink<T, Keep, Combine, Lay, V>::inner> {};
template <class Sink>
inline constexpr bool folds_columns_v = folds_columns_trait<Sink>::value;

/// The partial vectors of C consecutive vectors of columns from j (a block of a row group): the
/// identity in a chunk's first group over fresh partials.
template <std::size_t C, class Sink>
SOLDER_INLINE auto column_block_begin(const Sink& sk, std::size_t j, bool fresh) {
  if constexpr (folds_columns_v<Sink>) {
    std::array<typename Sink::vec, C> a;
#pragma GCC unroll 16
    for (std::size_t c = 0; c < C; ++c) a[c] = sk.column_begin(j + c * Sink::vec::size, fresh);
    return a;
  } else {
    return no_column_acc{};
  }
}
template <class A>
SOLDER_INLINE auto& column_block_at(A& a, std::size_t c) {
  if constexpr (std::is_same_v<A, no_column_acc>)
    return a;
  else
    return a[c];
}
template <std::size_t C, class Sink, class A>
SOLDER_INLINE void column_block_end(const Sink& sk, std::size_t j, const A& a) {
  if constexpr (folds_columns_v<Sink>) {
#pragma GCC unroll 16
    for (std::size_t c = 0; c < C; ++c) sk.column_end(j + c * Sink::vec::size, a[c]);
  }
}
template <class Sink, class A, class X>
SOLDER_INLINE void column_put(Sink& row_sink, const Sink& group_sink, A& a, std::size_t j, const X& x) {
  if constexpr (folds_columns_v<Sink>)
    group_sink.column_put(a, x);
  else
    row_sink.put(j, x);
}
template <class Sink>
SOLDER_INLINE bool same_partial(const Sink&, std::size_t row, std::size_t n) {
  if constexpr (folds_columns_v<Sink>)
    return Sink::same_partial(row, n);
  else
    return true;
}
template <class Sink>
SOLDER_INLINE bool one_partial_row(const Sink& sk, std::size_t row_len) {
  if constexpr (folds_columns_v<Sink>)
    return sk.one_partial_row(row_len);
  else
    return true;
}

/// Scratch memory for partial reductions, reused across calls (no allocation per pass once warm).
template <class T>
T* scratch(std::size_t n) {
  thread_local growing_buffer<T> buf;
  return buf.get(n);
}

/// How a pass is cut: segments of at most segment_elements along rows, grouped into chunks.
struct partition {
  std::size_t rows, row_len, seg_len, seg_per_row, segments, seg_per_chunk, chunks;

  /// `segment_length`: segment_elements for passes that draw random bits, else
  /// long_segment_elements.
  partition(std::size_t elements, std::size_t row_length, std::size_t segment_length) {
    row_len = row_length;
    seg_len = segment_length;
    rows = elements / row_len;
    seg_per_row = (row_len + seg_len - 1) / seg_len;
    segments = rows * seg_per_row;
    const chunking parts(segments, std::min(row_len, seg_len));
    seg_per_chunk = parts.per_chunk;
    chunks = parts.count;
  }
  segment at(std::size_t s) const {
    const std::size_t r = s / seg_per_row, c = (s % seg_per_row) * seg_len;
    return {r, c, std::min(seg_len, row_len - c)};
  }
  /// The segment after `s`.
  void step(segment& s) const {
    s.col += seg_len;
    if (s.col >= row_len) {
      s.col = 0;
      ++s.row;
    }
    s.len = std::min(seg_len, row_len - s.col);
  }
};

/// One chunk of a pass: its segments in order (run_segment). Evaluators and sinks are
/// copied into locals first: the vector stores may alias anything, and state reached through a
/// reference would be reloaded from memory after every store.
/// One segment: seek every evaluator and sink, then each vector of every expression is loaded
/// (all loads before any store, so common subexpressions of several writes can be merged by
/// the compiler) and handed to its sink. Operands are prefetched `Ahead` bytes ahead where
/// `prefetch` says so (Ahead 0: never).
/// Write I takes its values from evaluator S_I: its own, or an earlier write's of the same
/// expression (shared_sources).
template <class V, std::size_t Ahead, class Ctx, class Evals, class Sinks, std::size_t... I, std::size_t... S>
SOLDER_INLINE void run_segment(const segment& seg, Ctx& ctx, Evals& ev, Sinks& sk, std::index_sequence<I...>,
                               std::index_sequence<S...>, bool prefetch = false) {
  constexpr std::size_t W = V::size;
  ctx.next_segment();
  ((I == S ? solder::detail::get<I>(ev).seek(seg, ctx) : void()), ...);
  (solder::detail::get<I>(sk).seek(seg), ...);
  std::size_t j = 0;
  for (; j + W <= seg.len; j += W) {
    if constexpr (Ahead > 0)
      if (prefetch) ((I == S ? solder::detail::get<I>(ev).template prefetch<Ahead>(j) : void()), ...);
    auto values = solder::detail::make_tuple(solder::detail::get<S>(ev).load(j)...);
    (solder::detail::get<I>(sk).put(j, solder::detail::get<I>(values)), ...);
  }
  if (j < seg.len) {
    const std::size_t n = seg.len - j;
    auto values = solder::detail::make_tuple(solder::detail::get<S>(ev).load_partial(j, n)...);
    (solder::detail::get<I>(sk).put_partial(j, n, solder::detail::get<I>(values)), ...);
  }
  (solder::detail::get<I>(sk).end_segment(), ...);
}

/// Rows of a row group: a pass that folds columns (a bias gradient: [B, N] summed into [N])
/// runs this many rows' segments at the same columns together, so each partial vector is loaded
/// and stored once per group rather than once per row: the partial row's store per vector was
/// the second store stream of the pass (docs/hosts.md).
inline constexpr std::size_t group_rows = 8;

/// Vectors of columns in one block of a row group: the partial vectors of its column folds fill
/// half the register file.
template <class V, std::size_t Folds>
inline constexpr std::size_t group_block_vectors =
    std::max<std::size_t>(1, vector_registers<typename V::arch_type> / 2 / std::max<std::size_t>(1, Folds));

/// The segments at seg's columns of rows seg.row .. seg.row + group_rows - 1, in blocks of
/// group_block_vectors vectors of columns: each block row by row, every row in order (its own
/// evaluators and sinks), column folds through registers (the same order of combination as row
/// by row). Within a block a row is read contiguously, so the group's rows are not all streams
/// at once: one vector down all eight rows at a time kept 24 streams in flight, which the Zen 5
/// prefetchers did not follow (docs/hosts.md). The vectors left after the last block go down
/// the rows one at a time; tails run row by row. No software prefetches (see run_chunk).
template <class V, class Ctx, class Evals, class Sinks, std::size_t... I, std::size_t... S>
SOLDER_INLINE void run_row_group(const segment& seg, Ctx& ctx, const Evals& ev0, const Sinks& sk0,
                                 std::index_sequence<I...>, std::index_sequence<S...>, bool fresh) {
  constexpr std::size_t R = group_rows, W = V::size;
  constexpr std::size_t C = group_block_vectors<V, (std::size_t{folds_columns_v<solder::detail::tuple_element_t<I, Sinks>>} + ...)>;
  // Written out: nvcc's front end emits host code g++ rejects for an array built by a pack.
  static_assert(R == 8, "solder: run_row_group copies its evaluators and sinks for 8 rows");
  std::array<Evals, R> ev{ev0, ev0, ev0, ev0, ev0, ev0, ev0, ev0};
  std::array<Sinks, R> sk{sk0, sk0, sk0, sk0, sk0, sk0, sk0, sk0};
  ctx.next_segment();
#pragma GCC unroll 8
  for (std::size_t r = 0; r < R; ++r) {
    const segment s{seg.row + r, seg.col, seg.len};
    ((I == S ? solder::detail::get<I>(ev[r]).seek(s, ctx) : void()), ...);
    (solder::detail::get<I>(sk[r]).seek(s), ...);
  }
  // Blocks of N vectors from j: each row in turn, the column folds' partials in registers.
  auto block = [&]<std::size_t N>(std::integral_constant<std::size_t, N>, std::size_t j) SOLDER_INLINE_LAMBDA {
    auto acc = solder::detail::make_tuple(column_block_begin<N>(solder::detail::get<I>(sk[0]), j, fresh)...);
    for (std::size_t r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (std::size_t c = 0; c < N; ++c) {
        auto values = solder::detail::make_tuple(solder::detail::get<S>(ev[r]).load(j + c * W)...);
        (column_put(solder::detail::get<I>(sk[r]), solder::detail::get<I>(sk[0]),
                    column_block_at(solder::detail::get<I>(acc), c), j + c * W, solder::detail::get<I>(values)),
         ...);
      }
    }
    (column_block_end<N>(solder::detail::get<I>(sk[0]), j, solder::detail::get<I>(acc)), ...);
  };
  std::size_t j = 0;
  for (; j + C * W <= seg.len; j += C * W) block(std::integral_constant<std::size_t, C>{}, j);
  for (; j + W <= seg.len; j += W) block(std::integral_constant<std::size_t, 1>{}, j);
  for (std::size_t r = 0; r < R; ++r) {
    if (j < seg.len) {
      const std::size_t n = seg.len - j;
      auto values = solder::detail::make_tuple(solder::detail::get<S>(ev[r]).load_partial(j, n)...);
      (solder::detail::get<I>(sk[r]).put_partial(j, n, solder::detail::get<I>(values)), ...);
    }
    (solder::detail::get<I>(sk[r]).end_segment(), ...);
  }
}

template <class V, bool Stream, bool Plain, class Evals, class Sinks, std::size_t... I, class Sources>
void run_chunk(const partition& part, std::size_t c, const Evals& evals, const Sinks& sinks,
               std::index_sequence<I...> writes, Sources sources) {
  constexpr std::size_t ahead = Stream ? prefetch_bytes_streaming : prefetch_bytes_cached;
  const bool prefetch = Stream || tuning().prefetch_cached;
  constexpr std::size_t slots = (mask_slots<solder::detail::tuple_element_t<I, Evals>> + ... + 0);
  Evals ev = evals;
  Sinks sk = sinks;
  pass_context<slots> ctx;
  const std::size_t s_begin = c * part.seg_per_chunk;
  const std::size_t s_end = std::min(part.segments, s_begin + part.seg_per_chunk);
  segment seg = part.at(s_begin);  // then stepped without divisions
  // Passes that fold columns, draw no random bits and store to cache run whole rows in groups
  // where they can; the segments left over (a chunk's first partial row, its last rows) run
  // one by one. A group's rows are several streams the hardware prefetcher follows, and
  // software prefetches on top of them only cost. With streaming stores, rows one by one
  // measured faster (docs/hosts.md).
  constexpr bool grouped = !Plain && !Stream && slots == 0 && (folds_columns_v<solder::detail::tuple_element_t<I, Sinks>> || ...);
  if constexpr (grouped) {
    const std::size_t group = group_rows * part.seg_per_row;  // segments
    auto group_fits = [&](std::size_t s) {
      return seg.col == 0 && s_end - s >= group && (same_partial(solder::detail::get<I>(sk), seg.row, group_rows) && ...);
    };
    // A chunk that starts with a group whose partial row is the whole partial block (a [B, N] ->
    // [N] fold, N whole vectors: a tail is folded through memory) starts its sums at identity
    // instead of filling the block and loading it back.
    bool fresh = part.row_len % V::size == 0 && group_fits(s_begin) &&
                 (one_partial_row(solder::detail::get<I>(sk), part.row_len) && ...);
    (solder::detail::get<I>(sk).begin_chunk(c, fresh), ...);
    std::size_t s = s_begin;
    while (s < s_end) {
      if (group_fits(s)) {
        for (std::size_t k = 0; k < part.seg_per_row; ++k, part.step(seg))
          run_row_group<V>(seg, ctx, ev, sk, writes, sources, fresh);
        fresh = false;
        seg.row += group_rows - 1;  // stepping left seg at the group's first row + 1
        s += group;
      } else {
        run_segment<V, ahead>(seg, ctx, ev, sk, writes, sources, prefetch);
        ++s;
        part.step(seg);
      }
    }
  } else {
    (solder::detail::get<I>(sk).begin_chunk(c, false), ...);
    for (std::size_t s = s_begin; s < s_end; ++s, part.step(seg)) run_segment<V, ahead>(seg, ctx, ev, sk, writes, sources, prefetch);
  }
}

/// The evaluator write I of a pass takes its values from: the first write's whose expression has
/// the same type (the pass checks that they are the same expression before it shares them).
template <class Evals, std::size_t I>
constexpr std::size_t first_of_type() {
  return []<std::size_t... J>(std::index_sequence<J...>) {
    std::size_t first = I;
    ((first = first == I && std::is_same_v<solder::detail::tuple_element_t<J, Evals>, solder::detail::tuple_element_t<I, Evals>> ? J : first), ...);
    return first;
  }(std::make_index_sequence<I>{});
}
template <class Evals, class Writes>
struct shared_sources_of;
template <class Evals, std::size_t... I>
struct shared_sources_of<Evals, std::index_sequence<I...>> {
  using type = std::index_sequence<first_of_type<Evals, I>()...>;
};
/// S_I = first_of_type<I>: each write's values from the first write of its expression.
template <class Evals>
using shared_sources = typename shared_sources_of<Evals, std::make_index_sequence<solder::detail::tuple_size_v<Evals>>>::type;

/// Runs the pass over all chunks, spread over the threads when it is large enough; write I takes
/// its values from evaluator Sources_I. `Plain`: segments one by one, never in row groups (less
/// code, for a pass that is rarely taken).
template <class V, bool Stream, class Sources, bool Plain = false, class Evals, class Sinks>
void run_pass(const partition& part, const Evals& evals, const Sinks& sinks, int threads) {
  constexpr auto writes = std::make_index_sequence<solder::detail::tuple_size_v<Evals>>{};
  const bool parallel = threads > 1 && part.chunks > 1 && part.rows * part.row_len >= parallel_min_elements;
  parallel_for(part.chunks, parallel ? threads : 1,
               [&](std::size_t c) { run_chunk<V, Stream, Plain>(part, c, evals, sinks, writes, Sources{}); });
}

template <class W>
struct write_traits;

/// A store: iterates over the output's shape.
template <class T, class S, class E>
struct write_traits<write_target<T, S, E>> {
  static constexpr bool reduces = false;
  using iter_shape = S;
  template <class Out>
  static constexpr bool flat = flat_ok<E, Out>::value;
  static constexpr bool checked = check_broadcasts_to<shape_of<E>, S>();
  static std::size_t batch(const write_target<T, S, E>& w) {
    if constexpr (S::dynamic && shape_of<E>::dynamic) {
      if (w.out.batch() != w.expr.batch())
        solder::detail::fail_counts("solder::assign: the output's batch size (", w.out.batch(),
                                    ") differs from the expression's (", w.expr.batch(), ")");
    }
    return w.out.batch();
  }
};

/// A reduction: iterates over its operand's shape.
template <class T, class S, class C, class K, class R, class E>
struct write_traits<write_target<T, S, reduce_node<C, K, R, E>>> {
  static constexpr bool reduces = true;
  using iter_shape = shape_of<E>;
  template <class Out>
  static constexpr bool flat = flat_ok<E, Out>::value && K::size == 1 && !K::dynamic;
  static constexpr bool checked = [] {
    if constexpr (std::is_same_v<S, R>) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder: cannot assign a reduction of shape ");
        solder::detail::append_shape<R>(s);
        s.append(" to a tensor of shape ");
        solder::detail::append_shape<S>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }();
  static std::size_t batch(const write_target<T, S, reduce_node<C, K, R, E>>& w) {
    if constexpr (S::dynamic) {
      if (w.out.batch() != w.expr.operand.batch())
        solder::detail::fail_counts("solder::assign: the output's batch size (", w.out.batch(),
                                    ") differs from the reduction's (", w.expr.operand.batch(), ")");
    }
    return w.expr.operand.batch();
  }
};

template <class W0, class... Ws>
constexpr bool check_same_iteration() {
  using First = typename write_traits<W0>::iter_shape;
  if constexpr ((std::is_same_v<typename write_traits<Ws>::iter_shape, First> && ...)) {
    return true;
  } else {
    return diagnostic<"solder::assign_all: every write must run over the same shape (a reduction runs over its "
                      "operand's shape); split the writes into separate passes",
                      First, typename write_traits<Ws>::iter_shape...>::reported;
  }
}

/// The expression a write evaluates: its own, or the operand of its reduction.
template <class Wt>
const auto& expression_of(const Wt& w) {
  if constexpr (write_traits<Wt>::reduces)
    return w.expr.operand;
  else
    return w.expr;
}

template <class Lay, class V, class Wt>
auto make_eval(const Wt& w) {
  if constexpr (write_traits<Wt>::reduces)
    return evaluator<typename std::remove_cvref_t<decltype(w.expr)>::operand_type, Lay, V>(w.expr.operand);
  else
    return evaluator<std::remove_cvref_t<decltype(w.expr)>, Lay, V>(w.expr);
}

template <class Lay, class V, bool Stream, class T, class S, class E>
auto make_sink(const write_target<T, S, E>& w, T*&, std::size_t, std::size_t) {
  return store_sink<T, Lay, V, Stream>(w.out.data());
}
template <class Lay, class V, bool Stream, class T, class S, class C, class K, class R, class E>
auto make_sink(const write_target<T, S, reduce_node<C, K, R, E>>&, T*& scratch_cursor, std::size_t chunks,
               std::size_t batch) {
  const std::size_t keep = K::elements(batch);
  T* parts = scratch_cursor;
  scratch_cursor += chunks * keep;
  return reduce_sink<T, K, C, Lay, V>(parts, keep);
}

template <class W>
std::size_t scratch_size(const W&, std::size_t chunks, std::size_t batch) {
  if constexpr (write_traits<W>::reduces)
    return chunks * std::remove_cvref_t<decltype(std::declval<W>().expr)>::keep_shape::elements(batch);
  else
    return 0;
}

/// out[k] = scale (the partials of element k of the `chunks` blocks of n, combined in block
/// order), k in [0, n): the same operations per element for whole vectors and the scalar tail.
/// Blocks of vectors read each chunk's partials contiguously (one vector down all the chunks at
/// a time made one stream per chunk). One function per combination and type, not per write.
template <class C, class V, class T>
[[gnu::noinline]] void combine_chunks(const T* parts, std::size_t n, std::size_t chunks, T scale, T* out) {
  constexpr std::size_t L = V::size, Block = vector_registers<typename V::arch_type> / 2;
  std::size_t k = 0;
  for (; k + Block * L <= n; k += Block * L) {
    V acc[Block];
#pragma GCC unroll 16
    for (std::size_t v = 0; v < Block; ++v) acc[v] = V::load_unaligned(parts + k + v * L);
    for (std::size_t c = 1; c < chunks; ++c)
#pragma GCC unroll 16
      for (std::size_t v = 0; v < Block; ++v) acc[v] = C::combine(acc[v], V::load_unaligned(parts + c * n + k + v * L));
#pragma GCC unroll 16
    for (std::size_t v = 0; v < Block; ++v) (acc[v] * V(scale)).store_unaligned(out + k + v * L);
  }
  for (; k + L <= n; k += L) {
    V acc = V::load_unaligned(parts + k);
    for (std::size_t c = 1; c < chunks; ++c) acc = C::combine(acc, V::load_unaligned(parts + c * n + k));
    (acc * V(scale)).store_unaligned(out + k);
  }
  for (; k < n; ++k) {
    T acc = parts[k];
    for (std::size_t c = 1; c < chunks; ++c) acc = C::combine(acc, parts[c * n + k]);
    out[k] = acc * scale;
  }
}

/// After the pass: a reduction's chunk partials are combined in chunk order (the same order
/// for any thread count) and scaled into the output.
template <class Sink, class W>
void finish_write(const Sink& sink, const W& w, std::size_t chunks) {
  if constexpr (Sink::reduces) {
    using C = typename std::remove_cvref_t<decltype(w.expr)>::combine_type;
    using T = std::remove_cvref_t<decltype(*sink.partials)>;
    combine_chunks<C, typename Sink::vec, T>(sink.partials, sink.keep_size, chunks, T(w.expr.scale), w.out.data());
  }
}

template <class Lay, class V, bool Stream, class... Ws>
void run_writes(const partition& part, std::size_t batch, const Ws&... ws) {
  using T = typename V::value_type;
  const std::size_t scratch_total = (scratch_size(ws, part.chunks, batch) + ... + 0);
  T* cursor = scratch_total ? scratch<T>(scratch_total) : nullptr;
  auto evals = solder::detail::make_tuple(make_eval<Lay, V>(ws)...);
  auto sinks = solder::detail::make_tuple(make_sink<Lay, V, Stream>(ws, cursor, part.chunks, batch)...);
  using Evals = decltype(evals);
  using own = std::make_index_sequence<sizeof...(Ws)>;
  using shared = shared_sources<Evals>;
  // Writes of one expression (dx = g and db = sum(g)) evaluate it once per element: half the
  // loads and arithmetic of such a backward, which the compiler cannot merge by itself since it
  // cannot know that two evaluators read the same tensors. Writes of one expression type over
  // different data (not made by solder's layers) take the plain pass, which costs less code.
  if constexpr (!std::is_same_v<shared, own>) {
    const auto ref = std::forward_as_tuple(expression_of(ws)...);
    const bool same = [&]<std::size_t... I, std::size_t... S>(std::index_sequence<I...>, std::index_sequence<S...>) {
      return (same_expression(std::get<I>(ref), std::get<S>(ref)) && ...);
    }(own{}, shared{});
    if (same)
      run_pass<V, Stream, shared>(part, evals, sinks, num_threads());
    else
      run_pass<V, Stream, own, true>(part, evals, sinks, num_threads());
  } else {
    run_pass<V, Stream, own>(part, evals, sinks, num_threads());
  }
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (finish_write(solder::detail::get<I>(sinks), ws, part.chunks), ...);
  }(std::index_sequence_for<Ws...>{});
}

template <class W>
using write_value_t = std::remove_const_t<typename std::remove_cvref_t<decltype(std::declval<W>().out)>::element_type>;

}  // namespace eval::cpu

}  // namespace solder
