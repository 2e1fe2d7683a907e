// nn/batch_check.hpp: the error every layer raises when the tensors a forward or backward call
// is given differ in batch size (the one thing their types cannot fix: a dynamic batch).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>

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
[[noreturn]] inline void batches_differ(const std::string& who, std::initializer_list<named_batch> args) {
  std::string m = who + ": the batch sizes of ";
  std::size_t i = 0;
  for (const named_batch& a : args) {
    if (i > 0) m += i + 1 == args.size() ? " and " : ", ";
    m += std::string(a.name) + " (" + std::to_string(a.batch) + ")";
    ++i;
  }
  solder::detail::fail(m + " differ");
}

}  // namespace solder::nn::detail
