// eval/cpu/row_writes.hpp: elementwise writes run a few output rows at a time, by a producer
// that has just stored those rows (a convolution's output row, one sample's planes) and calls
// them while they are still in cache: the epilogue of a product that cannot hold its tile in
// registers until the end. Each row is walked as the loop nest walks it (pass.hpp), at its own
// coordinates, so a dropout mask drawn here is bit for bit the one assign_all draws over the
// whole output, and the results equal assign_all(writes...) run after the producer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "solder/eval/cpu/product.hpp"
#include "solder/eval/cpu/pass.hpp"

namespace solder::eval::cpu {

/// What a producer calls: rows(first, count, step) runs the writes over output rows first,
/// first + step, ... (count of them; a row is all dimensions but the last), from any thread.
/// Erased, so the producer is compiled once whatever the writes are. `none()` runs nothing.
struct row_epilogue {
  const void* self = nullptr;
  void (*run)(const void* self, std::size_t first, std::size_t count, std::size_t step) = nullptr;

  static row_epilogue none() { return {}; }
  explicit operator bool() const { return run != nullptr; }
  void rows(std::size_t first, std::size_t count, std::size_t step) const {
    if (run != nullptr) run(self, first, count, step);
  }
};

/// The writes ws... (solder::write(out, expression), elementwise, every one iterating over S),
/// ready to run row by row. Keep it alive while the producer runs; epilogue() is what it calls.
template <class S, class... Ws>
class row_writes {
  static_assert(sizeof...(Ws) >= 1);
  static_assert(((!write_traits<Ws>::reduces) && ...),
                "solder: a reduction cannot run in a producer's row epilogue; assign it after the product");
  static_assert((std::is_same_v<typename write_traits<Ws>::iter_shape, S> && ...),
                "solder: the writes of a row epilogue must have the producer's output shape");
  static_assert((write_traits<Ws>::checked && ...));
  static_assert(((contracts_in<Ws> == 0) && ...), "solder: a row epilogue holds no matrix product");
  static_assert(((std::is_same_v<write_value_t<Ws>, float>) && ...), "solder: row epilogues write float tensors");

  using V = vec<float>;
  using Lay = layout<S, false>;
  template <class>
  using sink = store_sink<float, Lay, V, false>;
  using Evals = solder::detail::tuple<decltype(make_eval<Lay, V>(std::declval<const Ws&>()))...>;
  using Sinks = solder::detail::tuple<sink<Ws>...>;

 public:
  explicit row_writes(std::size_t batch, const Ws&... ws)
      : evals{{{make_eval<Lay, V>(ws)}...}}, sinks{{{sink<Ws>(ws.out.data())}...}}, batch(batch) {
    ((S::dynamic && write_traits<Ws>::batch(ws) != batch
          ? solder::detail::fail_counts("solder: a row epilogue's writes have batch ", write_traits<Ws>::batch(ws),
                                        ", its product ", batch)
          : void()),
     ...);
  }
  row_epilogue epilogue() const { return {this, &run}; }

 private:
  static constexpr std::size_t slots = (mask_leaves<write_expr_t<Ws>> + ... + 0);
  /// Segments no longer than the whole pass would cut them: short when they draw random bits.
  static constexpr std::size_t seg_len = slots > 0 ? segment_elements : long_segment_elements;
  Evals evals;
  Sinks sinks;
  std::size_t batch;

  static void run(const void* me, std::size_t first, std::size_t count, std::size_t step) {
    const auto& self = *static_cast<const row_writes*>(me);
    tile_context<slots> ctx;  // for its Philox group cache: a short row lies inside one group
    Evals ev = self.evals;    // locals: the stores may alias anything reached through `self`
    Sinks sk = self.sinks;
    constexpr auto writes = std::index_sequence_for<Ws...>{};
    const std::size_t rows = S::elements(self.batch) / S::last;
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t row = first + i * step;
      // The next row's operands (the producer's next output row, or the next row of a run):
      // on their way into L2 while this row and the producer's next one run.
      if (row + 1 < rows)
        solder::detail::apply([&](const auto&... e) { (prefetch_row(e, row + 1), ...); }, ev);
      for (std::size_t col = 0; col < S::last; col += seg_len)
        run_segment<V, 0>(segment{row, col, std::min(seg_len, S::last - col)}, ctx, ev, sk, writes, writes);
    }
  }

  /// Prefetches row `row` of every operand of the output's own shape in e (broadcast ones are
  /// small and stay cached; masks are generated, not read).
  template <class E>
  static void prefetch_row(const E& e, std::size_t row) {
    if constexpr (requires { e.args; }) {
      solder::detail::apply([&](const auto&... a) { (prefetch_row(a, row), ...); }, e.args);
    } else if constexpr (requires { E::streams; e.base; }) {
      if constexpr (E::streams && !Lay::flat) {
        const char* p = reinterpret_cast<const char*>(e.base + row * S::last);
        for (std::size_t b = 0; b < S::last * sizeof(float); b += 64) prefetch_l2<0>(p + b);
      }
    }
  }
};

/// The row epilogue of writes ws... over a producer's output of shape S, `batch` samples.
template <class S, class... Ws>
row_writes<S, Ws...> make_row_writes(std::size_t batch, const Ws&... ws) {
  return row_writes<S, Ws...>(batch, ws...);
}

}  // namespace solder::eval::cpu
