// expr/broadcast.hpp: where an operand broadcast into an output sits in memory: the stride of
// each output row dimension in the operand (0 where it is broadcast) and the offset of an output
// row's first element. Every backend's evaluator reads broadcast operands through it.
#pragma once

#include <array>
#include <cstddef>

#include "solder/config.hpp"
#include "solder/shape.hpp"

namespace solder {

/// How an operand of shape L sits in the output of shape Out (rows mode): the stride of each
/// output row dimension in the operand (0 where broadcast), and whether it varies along a row.
template <class L, class Out>
struct broadcast_map {
  static constexpr std::size_t R = Out::rank;
  static constexpr std::size_t lead = R - L::rank;  // output dimensions L does not have
  /// True when the operand has the row's extent (read contiguously), false when it is splatted.
  static constexpr bool inner = L::rank > 0 && L::last != 1;
  static constexpr std::array<std::size_t, (R > 1 ? R - 1 : 1)> strides = [] {
    std::array<std::size_t, (R > 1 ? R - 1 : 1)> s{};
    for (std::size_t d = 0; d + 1 < R; ++d)
      s[d] = (d >= lead && L::extents[d - lead] != 1) ? L::strides[d - lead] : 0;
    return s;
  }();
  /// Offset of output row `row`'s first element in the operand.
  SOLDER_HD static SOLDER_INLINE std::size_t row_offset(std::size_t row) {
    if constexpr (R <= 1) {
      return 0;
    } else if constexpr (R == 2) {
      return row * strides[0];
    } else {
      std::size_t off = 0;
      for (std::size_t d = R - 1; d-- > 0;) {
        const std::size_t e = d == 0 ? row + 1 : Out::extents[d];  // the leading extent may be dyn
        off += (row % e) * strides[d];
        row /= e;
      }
      return off;
    }
  }
};

}  // namespace solder
