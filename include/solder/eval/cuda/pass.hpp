// eval/cuda/pass.hpp: one fused pass of the CUDA backend (the writes of one assign_all) as
// host+device functions of the thread's coordinates: the kernels of eval/cuda/assign.hpp call
// them on the GPU, tests/support/grid.hpp calls them over a whole grid on the host.
//
// Three walks, picked from the writes at compile time:
// - elementwise: the output as one flat run of 128-element tiles, 4 threads a tile;
// - columns (a write reduces over every axis but the last, e.g. a bias gradient): blocks of
//   128 threads own one 128-column tile of `chunk_rows` rows; each thread sums its 32 columns
//   over a quarter of those rows, the block adds its 32 row lanes per column in order, and a
//   second kernel adds the chunks in order;
// - all (a write reduces to a scalar): the flat walk on a grid fixed by the size alone; each
//   thread sums its items, each block its threads by a fixed tree, a second kernel the blocks.
// No float atomics: the order of every sum is fixed by the sizes, so each run gives the same bits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/eval/cuda/evaluator.hpp"
#include "solder/expr/reduce.hpp"
#include "solder/expr/write.hpp"

namespace solder::eval::cuda {

/// What a write does to the pass: store elementwise, or reduce to columns or to a scalar.
enum class write_kind { store, columns, all };

/// Rows of one block of the column walk: 32 row lanes of 4 rows each.
inline constexpr std::size_t row_lanes = 32;
inline constexpr std::size_t chunk_rows = 128;
/// Threads of a block in the column walk (row lanes x quarters) and in the scalar walk.
inline constexpr unsigned column_threads = row_lanes * quarters;
inline constexpr unsigned all_threads = 256;
/// Blocks of the scalar walk: at most this many, fixed by the element count alone.
inline constexpr std::size_t all_blocks_max = 512;

namespace detail {

template <class E>
struct write_expr;
template <class T, class S, class E, class Space>
struct write_expr<write_target<T, S, E, Space>> {
  using value = T;
  using out_shape = S;
  using expr = E;
};

/// The kind of a reduction with kept extents K over an operand of shape Out.
template <class K, class Out>
constexpr write_kind reduction_kind() {
  bool all_ones = true, leading_ones = true;
  for (std::size_t d = 0; d < K::rank; ++d) {
    all_ones = all_ones && K::extents[d] == 1;
    if (d + 1 < K::rank) leading_ones = leading_ones && K::extents[d] == 1;
  }
  if (all_ones) return write_kind::all;
  if (Out::rank >= 2 && leading_ones && K::last == Out::last) return write_kind::columns;
  return write_kind::store;  // not supported: the executor reports it
}

}  // namespace detail

/// The kind of write W.
template <class W>
constexpr write_kind kind_of() {
  using E = typename detail::write_expr<W>::expr;
  if constexpr (is_reduce<E>)
    return detail::reduction_kind<typename E::keep_shape, shape_of<typename E::operand_type>>();
  else
    return write_kind::store;
}

template <class E>
struct operand_of {
  using type = E;
};
template <class C, class K, class R, class E>
struct operand_of<reduce_node<C, K, R, E>> {
  using type = E;
};

/// The shape a write iterates: its output's, or its reduction's operand's.
template <class W>
using pass_shape_of = shape_of<std::conditional_t<is_reduce<typename detail::write_expr<W>::expr>,
                                                  typename operand_of<typename detail::write_expr<W>::expr>::type,
                                                  tensor_ref<const typename detail::write_expr<W>::value,
                                                             typename detail::write_expr<W>::out_shape, device>>>;
/// What a thread of the column walk accumulates for one write: its 32 columns.
template <class T>
struct column_acc {
  T v[8][4];
};
/// What a thread of the scalar walk accumulates for one write.
template <class T>
struct scalar_acc {
  T v;
};
struct no_acc {};

template <class W, class Lay>
struct writer;

/// out = e, elementwise.
template <class T, class S, class E, class Lay>
  requires(!is_reduce<E>)
struct writer<write_target<T, S, E, device>, Lay> {
  static constexpr write_kind kind = write_kind::store;
  using acc = no_acc;
  T* out;
  evaluator<E, Lay> e;
  explicit writer(const write_target<T, S, E, device>& w) : out(w.out.data()), e(w.expr) {}

  SOLDER_HD SOLDER_INLINE acc start() const { return {}; }
  SOLDER_HD SOLDER_INLINE void seek(std::size_t base, unsigned t) { seek_evaluator(e, base, t); }
  template <bool Vec>
  SOLDER_HD SOLDER_INLINE void vec(std::size_t i, unsigned, acc&) const {
    const auto x = e.template at4<Vec>(i);
    lanes4<T> v;
    for (unsigned j = 0; j < 4; ++j) v.v[j] = T(x.v[j]);
    store4<Vec>(out + i, v);
  }
  SOLDER_HD SOLDER_INLINE void one(std::size_t i, unsigned, unsigned, acc&) const { out[i] = T(e.at(i)); }
  /// A whole item by the vector path: all its values first, then the stores, so a thread has
  /// all its loads in flight at once (stores in between would keep the compiler from moving a
  /// later load, which might alias them, ahead of them).
  SOLDER_HD SOLDER_INLINE void whole(std::size_t base, unsigned t, acc&) const {
    lanes4<T> v[8];
    for (unsigned k = 0; k < 8; ++k) {
      const auto x = e.template at4<true>(base + 16 * k + 4 * t);
      for (unsigned j = 0; j < 4; ++j) v[k].v[j] = T(x.v[j]);
    }
    for (unsigned k = 0; k < 8; ++k) store4<true>(out + base + 16 * k + 4 * t, v[k]);
  }
};

/// out = scale * reduce(e) over the column walk or the scalar walk; `partial` is the launch's
/// scratch for the per-chunk (per-block) results.
template <class T, class S, class C, class K, class R, class E, class Lay>
struct writer<write_target<T, S, reduce_node<C, K, R, E>, device>, Lay> {
  static constexpr write_kind kind = detail::reduction_kind<K, shape_of<E>>();
  using combine = C;
  using acc = std::conditional_t<kind == write_kind::columns, column_acc<T>, scalar_acc<T>>;
  T* out;
  T scale;
  T* partial = nullptr;
  evaluator<E, Lay> e;
  explicit writer(const write_target<T, S, reduce_node<C, K, R, E>, device>& w)
      : out(w.out.data()), scale(w.expr.scale), e(w.expr.operand) {}

  SOLDER_HD SOLDER_INLINE acc start() const {
    acc a;
    if constexpr (kind == write_kind::columns) {
      for (unsigned k = 0; k < 8; ++k)
        for (unsigned j = 0; j < 4; ++j) a.v[k][j] = C::template identity<T>();
    } else {
      a.v = C::template identity<T>();
    }
    return a;
  }
  SOLDER_HD SOLDER_INLINE void seek(std::size_t base, unsigned t) { seek_evaluator(e, base, t); }
  template <bool Vec>
  SOLDER_HD SOLDER_INLINE void vec(std::size_t i, unsigned k, acc& a) const {
    const auto x = e.template at4<Vec>(i);
    for (unsigned j = 0; j < 4; ++j) add(a, k, j, T(x.v[j]));
  }
  SOLDER_HD SOLDER_INLINE void one(std::size_t i, unsigned k, unsigned j, acc& a) const { add(a, k, j, T(e.at(i))); }
  SOLDER_HD SOLDER_INLINE void whole(std::size_t base, unsigned t, acc& a) const {
    for (unsigned k = 0; k < 8; ++k) vec<true>(base + 16 * k + 4 * t, k, a);
  }

 private:
  SOLDER_HD SOLDER_INLINE static void add(acc& a, unsigned k, unsigned j, T x) {
    if constexpr (kind == write_kind::columns)
      a.v[k][j] = C::combine(a.v[k][j], x);
    else
      a.v = C::combine(a.v, x);
  }
};

/// The writes of one pass over a walk Lay, with the vector path (16-byte accesses) when Vec.
/// A pass object is copied into each thread: its evaluators keep the item's random bits.
template <class Lay, bool Vec, class... Ws>
struct pass {
  using shape_type = typename Lay::shape;
  using value_type = std::tuple_element_t<0, std::tuple<typename detail::write_expr<Ws>::value...>>;
  static constexpr std::size_t cols = shape_type::last;
  using accs = std::tuple<typename writer<Ws, Lay>::acc...>;
  static constexpr bool columns = ((writer<Ws, Lay>::kind == write_kind::columns) || ...);
  static constexpr bool all = ((writer<Ws, Lay>::kind == write_kind::all) || ...);

  std::tuple<writer<Ws, Lay>...> writers;
  std::size_t n;  // elements of the walk

  explicit pass(std::size_t elements, const Ws&... ws) : writers(writer<Ws, Lay>(ws)...), n(elements) {}

  SOLDER_HD SOLDER_INLINE accs start() const {
    return std::apply([](const auto&... w) { return accs(w.start()...); }, writers);
  }

  /// The item of the tile at flat index `base` taken by quarter t: elements base + 16k + 4t + j
  /// below base + limit.
  SOLDER_HD SOLDER_INLINE void item(std::size_t base, unsigned t, std::size_t limit, accs& a) {
    seek_all(base, t, std::index_sequence_for<Ws...>{});
    if constexpr (Vec)
      if (limit >= tile) return whole_all(base, t, a, std::index_sequence_for<Ws...>{});
    for (unsigned k = 0; k < 8; ++k) {
      const std::size_t o = 16 * k + 4 * t;
      if (Vec && o + 4 <= limit) {
        vec_all(base + o, k, a, std::index_sequence_for<Ws...>{});
      } else {
        for (unsigned j = 0; j < 4; ++j)
          if (o + j < limit) one_all(base + o + j, k, j, a, std::index_sequence_for<Ws...>{});
      }
    }
  }

  // ---- the flat walk (elementwise and scalar reductions) -----------------------------------
  /// Threads the flat walk needs: 4 per tile.
  SOLDER_HD std::size_t flat_threads() const { return (n + tile - 1) / tile * quarters; }
  /// Thread g of the flat walk with `stride` threads in the grid: its items, grid-stride.
  SOLDER_HD SOLDER_INLINE void flat(std::size_t g, std::size_t stride, accs& a) {
    const std::size_t total = flat_threads();
    for (std::size_t it = g; it < total; it += stride) {
      const std::size_t base = it / quarters * tile;
      item(base, unsigned(it % quarters), n - base, a);
    }
  }
  /// Blocks of the scalar walk: fixed by n, so the order of the sum is too.
  SOLDER_HD std::size_t all_blocks() const {
    const std::size_t want = (flat_threads() + all_threads - 1) / all_threads;
    return want < all_blocks_max ? want : all_blocks_max;
  }

  // ---- the column walk ----------------------------------------------------------------------
  SOLDER_HD std::size_t rows() const { return n / cols; }
  SOLDER_HD static constexpr std::size_t column_tiles() { return (cols + tile - 1) / tile; }
  SOLDER_HD std::size_t chunks() const { return (rows() + chunk_rows - 1) / chunk_rows; }
  /// Thread `thread` of block `block` of the column walk: its rows of the block's chunk.
  SOLDER_HD SOLDER_INLINE void column(std::size_t block, unsigned thread, accs& a) {
    const std::size_t chunk = block / column_tiles(), ct = block % column_tiles();
    const unsigned t = thread % quarters, lane = thread / quarters;
    const std::size_t first = chunk * chunk_rows, last = first + chunk_rows < rows() ? first + chunk_rows : rows();
    for (std::size_t r = first + lane; r < last; r += row_lanes) item(r * cols + ct * tile, t, cols - ct * tile, a);
  }
  /// Stores write W's column sums of `thread` into the block's scratch [row lane][column].
  template <std::size_t W, class T>
  SOLDER_HD SOLDER_INLINE static void column_deposit(unsigned thread, const accs& a, T* scratch) {
    const unsigned t = thread % quarters, lane = thread / quarters;
    for (unsigned k = 0; k < 8; ++k)
      for (unsigned j = 0; j < 4; ++j) scratch[lane * tile + 16 * k + 4 * t + j] = std::get<W>(a).v[k][j];
  }
  /// Thread c of the block adds column c over the row lanes, in order, into the chunk's partial.
  template <std::size_t W, class T>
  SOLDER_HD SOLDER_INLINE void column_combine(std::size_t block, unsigned c, const T* scratch) const {
    using Wr = std::tuple_element_t<W, std::tuple<writer<Ws, Lay>...>>;
    const std::size_t chunk = block / column_tiles(), col = block % column_tiles() * tile + c;
    if (col >= cols) return;
    T s = scratch[c];
    for (std::size_t l = 1; l < row_lanes; ++l) s = Wr::combine::combine(s, scratch[l * tile + c]);
    std::get<W>(writers).partial[chunk * cols + col] = s;
  }
  /// Column c of write W: its chunks' partials added in order, scaled, stored.
  template <std::size_t W>
  SOLDER_HD SOLDER_INLINE void column_finish(std::size_t c) const {
    const auto& w = std::get<W>(writers);
    using Wr = std::remove_cvref_t<decltype(w)>;
    auto s = w.partial[c];
    for (std::size_t k = 1; k < chunks(); ++k) s = Wr::combine::combine(s, w.partial[k * cols + c]);
    w.out[c] = w.scale * s;
  }

  // ---- the scalar walk's block tree and finish -------------------------------------------------
  template <std::size_t W, class T>
  SOLDER_HD SOLDER_INLINE static void all_deposit(unsigned thread, const accs& a, T* scratch) {
    scratch[thread] = std::get<W>(a).v;
  }
  /// One level of the block's tree: threads below `half` add the element `half` above them.
  template <std::size_t W, class T>
  SOLDER_HD SOLDER_INLINE void all_tree(unsigned thread, unsigned half, T* scratch) const {
    using Wr = std::tuple_element_t<W, std::tuple<writer<Ws, Lay>...>>;
    if (thread < half) scratch[thread] = Wr::combine::combine(scratch[thread], scratch[thread + half]);
  }
  template <std::size_t W, class T>
  SOLDER_HD SOLDER_INLINE void all_block_result(std::size_t block, const T* scratch) const {
    std::get<W>(writers).partial[block] = scratch[0];
  }
  template <std::size_t W>
  SOLDER_HD SOLDER_INLINE void all_finish() const {
    const auto& w = std::get<W>(writers);
    using Wr = std::remove_cvref_t<decltype(w)>;
    auto s = w.partial[0];
    for (std::size_t b = 1; b < all_blocks(); ++b) s = Wr::combine::combine(s, w.partial[b]);
    w.out[0] = w.scale * s;
  }

 private:
  template <std::size_t... I>
  SOLDER_HD SOLDER_INLINE void seek_all(std::size_t base, unsigned t, std::index_sequence<I...>) {
    (std::get<I>(writers).seek(base, t), ...);
  }
  template <std::size_t... I>
  SOLDER_HD SOLDER_INLINE void vec_all(std::size_t i, unsigned k, accs& a, std::index_sequence<I...>) const {
    (std::get<I>(writers).template vec<Vec>(i, k, std::get<I>(a)), ...);
  }
  template <std::size_t... I>
  SOLDER_HD SOLDER_INLINE void whole_all(std::size_t base, unsigned t, accs& a, std::index_sequence<I...>) const {
    (std::get<I>(writers).whole(base, t, std::get<I>(a)), ...);
  }
  template <std::size_t... I>
  SOLDER_HD SOLDER_INLINE void one_all(std::size_t i, unsigned k, unsigned j, accs& a, std::index_sequence<I...>) const {
    (std::get<I>(writers).one(i, k, j, std::get<I>(a)), ...);
  }
};

/// The pass type for writes Ws (all of one walk), Vec the vector path.
template <bool Vec, class W0, class... Ws>
struct pass_for {
  using out_shape = pass_shape_of<W0>;
  static constexpr bool columns = kind_of<W0>() == write_kind::columns || ((kind_of<Ws>() == write_kind::columns) || ...);
  /// In the column walk a tile starts a bits16 group only when rows are whole tiles.
  static constexpr bool grouped = !columns || out_shape::last % tile == 0;
  using type = pass<walk<out_shape, grouped>, Vec, W0, Ws...>;
};

namespace detail {

template <class W>
using write_value_t = typename detail::write_expr<W>::value;

/// The indices of the writes of kind K among Ws, as an index_sequence.
template <write_kind K, class... Ws>
struct kind_indices {
  static constexpr std::size_t count = ((kind_of<Ws>() == K) + ... + 0);
  static constexpr std::array<std::size_t, count> list = [] {
    constexpr write_kind kinds[] = {kind_of<Ws>()...};
    std::array<std::size_t, count> l{};
    std::size_t c = 0;
    for (std::size_t i = 0; i < sizeof...(Ws); ++i)
      if (kinds[i] == K) l[c++] = i;
    return l;
  }();
  template <std::size_t... I>
  static auto seq(std::index_sequence<I...>) -> std::index_sequence<list[I]...>;
  using type = decltype(seq(std::make_index_sequence<count>{}));
};

/// The checks every write of a device pass must meet, each with its own message.
template <class W>
constexpr bool check_device_write() {
  using E = typename detail::write_expr<W>::expr;
  using Read = typename operand_of<E>::type;
  if constexpr (!device_readable<Read>) {
    return diagnostic<"solder: the CUDA backend evaluates elementwise expressions of device tensors, constants and dropout "
                      "masks (and their sums); this expression holds something else (a matrix product, a nested "
                      "reduction, or a host tensor)",
                      E>::reported;
  } else if constexpr (is_reduce<E> && kind_of<W>() == write_kind::store) {
    return diagnostic<"solder: the CUDA backend reduces over every axis but the last (a bias gradient) or over "
                      "everything; reduce this expression on the host, or sum it in two steps",
                      E>::reported;
  } else {
    return true;
  }
}

template <class W>
std::size_t write_batch(const W& w) {
  using E = typename detail::write_expr<W>::expr;
  if constexpr (is_reduce<E>)
    return w.expr.operand.batch();
  else
    return w.out.batch();
}

template <class W>
void check_write_batch(const W& w, std::size_t batch) {
  using E = typename detail::write_expr<W>::expr;
  using S = pass_shape_of<W>;
  if constexpr (S::dynamic) {
    if (write_batch(w) != batch)
      solder::detail::fail("solder::assign_all: the writes' batch sizes differ: " + std::to_string(batch) + " vs " +
                           std::to_string(write_batch(w)));
    if constexpr (!is_reduce<E> && shape_of<E>::dynamic)
      if (w.expr.batch() != w.out.batch())
        solder::detail::fail("solder::assign: the expression's batch (" + std::to_string(w.expr.batch()) +
                             ") differs from the output's (" + std::to_string(w.out.batch()) + ")");
  }
}

/// True when every address of the pass is 16-byte aligned (outputs and tensor operands).
template <class P>
bool aligned16(const P& p) {
  bool ok = true;
  auto check = [&](const void* a) { ok = ok && reinterpret_cast<std::uintptr_t>(a) % 16 == 0; };
  std::apply(
      [&](const auto&... w) {
        ((check(w.out), for_each_address(w.e, check)), ...);
      },
      p.writers);
  return ok;
}

/// Builds pass P of the writes and hands it to the runner's walk.
template <class P, class Runner, class... Ws>
void run_pass(Runner& runner, std::size_t n, const Ws&... ws) {
  P p(n, ws...);
  if constexpr (P::columns)
    runner.columns(p, typename kind_indices<write_kind::columns, Ws...>::type{});
  else if constexpr (P::all)
    runner.all(p, typename kind_indices<write_kind::all, Ws...>::type{});
  else
    runner.flat(p);
}

}  // namespace detail

/// Checks the writes of one pass, picks its walk and whether it takes 16-byte accesses, and
/// hands the pass to `runner` (device_runner in assign.hpp; a sequential grid in the tests).
template <class Runner, class W0, class... Ws>
void dispatch(Runner& runner, const W0& w0, const Ws&... ws) {
  static_assert(detail::check_device_write<W0>() && (detail::check_device_write<Ws>() && ...));
  static_assert((std::is_same_v<pass_shape_of<Ws>, pass_shape_of<W0>> && ...),
                "solder::assign_all: the writes of one pass iterate different shapes (an output, or a "
                "reduction's operand, of another shape)");
  static_assert((std::is_same_v<detail::write_value_t<Ws>, detail::write_value_t<W0>> && ...),
                "solder::assign_all: every output of one pass must have the same element type");
  constexpr bool columns = kind_of<W0>() == write_kind::columns || ((kind_of<Ws>() == write_kind::columns) || ...);
  constexpr bool all = kind_of<W0>() == write_kind::all || ((kind_of<Ws>() == write_kind::all) || ...);
  static_assert(!(columns && all), "solder::assign_all: on the CUDA backend one pass reduces to columns or to a "
                                   "scalar, not both; split the writes into two passes");
  using S = pass_shape_of<W0>;
  const std::size_t batch = detail::write_batch(w0);
  detail::check_write_batch(w0, batch);
  (detail::check_write_batch(ws, batch), ...);
  const std::size_t n = S::elements(batch);
  if (n == 0) return;

  // 16-byte accesses need four consecutive elements in one row of every broadcast operand and
  // aligned addresses; otherwise the same pass reads element by element.
  constexpr bool same = all_same_shape<typename operand_of<typename detail::write_expr<W0>::expr>::type, S> &&
                        (all_same_shape<typename operand_of<typename detail::write_expr<Ws>::expr>::type, S> && ...);
  constexpr bool may_vec = S::last % 4 == 0 || (same && !columns);
  using Vector = typename pass_for<true, W0, Ws...>::type;
  using Scalar = typename pass_for<false, W0, Ws...>::type;
  if constexpr (may_vec) {
    if (detail::aligned16(Vector(n, w0, ws...))) return detail::run_pass<Vector>(runner, n, w0, ws...);
  }
  detail::run_pass<Scalar>(runner, n, w0, ws...);
}

}  // namespace solder::eval::cuda
