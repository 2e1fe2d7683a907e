// eval/cpu/assign.hpp: assignment on the CPU: expressions assigned to host tensors run as ONE
// pass over the output (the loop nest of pass.hpp), or, when they hold a matrix product, as
// one GEMM whose epilogue evaluates them on each register tile (product.hpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include "solder/eval/cpu/conv_product.hpp"
#include "solder/eval/cpu/pass.hpp"

namespace solder {

namespace eval::cpu {

/// The elementwise pass of assign_all.
template <class W0, class... Ws>
void assign_elementwise(const W0& w0, const Ws&... ws) {
  using T = eval::cpu::write_value_t<W0>;
  using Iter = typename eval::cpu::write_traits<W0>::iter_shape;
  using V = eval::cpu::vec<T>;
  constexpr std::size_t W = V::size;

  const std::size_t batch = eval::cpu::write_traits<W0>::batch(w0);
  ((Iter::dynamic && eval::cpu::write_traits<Ws>::batch(ws) != batch
        ? solder::detail::fail_counts("solder::assign_all: the writes' batch sizes differ: ", batch, " vs ",
                                      eval::cpu::write_traits<Ws>::batch(ws))
        : void()),
   ...);
  const std::size_t elements = Iter::elements(batch);

  constexpr bool flat = Iter::rank >= 1 && eval::cpu::write_traits<W0>::template flat<Iter> &&
                        (eval::cpu::write_traits<Ws>::template flat<Iter> && ...);
  using Lay = eval::cpu::layout<Iter, flat>;
  constexpr bool draws = (eval::cpu::mask_slots<decltype(eval::cpu::make_eval<Lay, V>(w0))> + ... +
                         eval::cpu::mask_slots<decltype(eval::cpu::make_eval<Lay, V>(ws))>) > 0;
  const eval::cpu::partition part(elements, flat ? elements : Iter::last,
                                  draws ? eval::cpu::segment_elements : eval::cpu::long_segment_elements);

  // Streaming stores need every store aligned to a vector: flat runs (segments are multiples
  // of the vector) or rows that are, over outputs that are too big for the cache.
  constexpr bool any_store = !eval::cpu::write_traits<W0>::reduces || (!eval::cpu::write_traits<Ws>::reduces || ...);
  constexpr bool rows_aligned = flat || Iter::last % W == 0;
  constexpr bool may_stream =
      any_store && rows_aligned && (Iter::dynamic || Iter::size * sizeof(T) >= eval::cpu::stream_min_bytes_floor);
  auto aligned = [](const auto& w) {
    return eval::cpu::write_traits<std::remove_cvref_t<decltype(w)>>::reduces ||
           reinterpret_cast<std::uintptr_t>(w.out.data()) % alignment == 0;
  };
  if constexpr (may_stream) {
    if (elements * sizeof(T) >= eval::cpu::tuning().stream_min_bytes && aligned(w0) && (aligned(ws) && ...)) {
      eval::cpu::run_writes<Lay, V, true>(part, batch, w0, ws...);
      return;
    }
  }
  eval::cpu::run_writes<Lay, V, false>(part, batch, w0, ws...);
}

/// Evaluates several writes in ONE pass over their common shape (see solder::assign_all).
template <class W0, class... Ws>
void assign_writes(const W0& w0, const Ws&... ws) {
  static_assert(write_traits<W0>::checked && (write_traits<Ws>::checked && ...));
  static_assert(check_same_iteration<W0, Ws...>());
  static_assert((std::is_same_v<write_value_t<Ws>, write_value_t<W0>> && ...),
                "solder::assign_all: every output of one pass must have the same element type");
  if constexpr (has_contract<W0, Ws...>)
    assign_contract(w0, ws...);
  else
    assign_elementwise(w0, ws...);
}

}  // namespace eval::cpu

}  // namespace solder
