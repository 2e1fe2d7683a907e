// nn/batch_check.hpp: the error every layer raises when the tensors a forward or backward call
// is given differ in batch size (the one thing their types cannot fix: a dynamic batch).
#pragma once

#include <cstddef>
#include <initializer_list>

#include "solder/config.hpp"

namespace solder::nn::detail {

/// A tensor argument's name and batch size, for batches_differ.
struct named_batch {
  const char* name;
  std::size_t batch;
};

/// Throws solder::error "<who>: the batch sizes of x (3), y (3), dy (3) and dx (5) differ".
/// Called where the comparison failed: the comparison stays at the call site, so the compiler
/// knows the sizes agree on the path that goes on (it checks the copies that follow).
/// (who and what: the caller, as "solder::nn::softmax" and "::forward", or one string.)
[[noreturn, gnu::cold, gnu::noinline]] inline void batches_differ(const char* who, const char* what,
                                                                std::initializer_list<named_batch> args) {
  using part = solder::detail::message_part;
  constexpr std::size_t most = 16;  // arguments named; no layer call has more
  part parts[4 + 5 * most] = {who, what, ": the batch sizes of "};
  std::size_t n = 3, i = 0;
  for (const named_batch& a : args) {
    if (i == most) break;
    if (i > 0) parts[n++] = i + 1 == args.size() ? " and " : ", ";
    parts[n++] = a.name;
    parts[n++] = " (";
    parts[n++] = a.batch;
    parts[n++] = ")";
    ++i;
  }
  parts[n++] = " differ";
  solder::detail::fail_message(parts, n);
}
[[noreturn]] inline void batches_differ(const char* who, std::initializer_list<named_batch> args) {
  batches_differ(who, "", args);
}

}  // namespace solder::nn::detail
