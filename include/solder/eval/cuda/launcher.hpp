// eval/cuda/launcher.hpp: what solder-gen's extern "C" launchers are made of (nvcc only): the
// guard that turns every exception into a status and a message, the argument checks, and
// running a tuple of writes as one pass.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>
#include <tuple>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/assign.hpp"
#include "solder/eval/cuda/pass.hpp"

namespace solder::eval::cuda {

namespace detail {
/// Keeps the message of a failed call in `last_error` and returns its status.
inline int failed(std::string& last_error, const char* launcher, const char* message, cudaError_t code) noexcept {
  try {
    last_error = std::string(launcher) + ": " + message;
  } catch (...) {  // no memory for the message: the status still says what failed
  }
  return int(code);
}
}  // namespace detail

/// Runs a launcher's body: every exception becomes a cudaError_t value (0 on success) and a
/// message in `last_error`, so none crosses the C boundary. Arguments solder refuses give
/// cudaErrorInvalidValue.
template <class Body>
int guarded(std::string& last_error, const char* launcher, Body&& body) noexcept {
  last_error.clear();
  try {
    body();
    return int(cudaSuccess);
  } catch (const cuda_error& e) {
    return detail::failed(last_error, launcher, e.what(), e.code);
  } catch (const error& e) {
    return detail::failed(last_error, launcher, e.what(), cudaErrorInvalidValue);
  } catch (const std::bad_alloc&) {
    return detail::failed(last_error, launcher, "out of host memory", cudaErrorMemoryAllocation);
  } catch (const std::exception& e) {
    return detail::failed(last_error, launcher, e.what(), cudaErrorUnknown);
  } catch (...) {
    return detail::failed(last_error, launcher, "unknown exception", cudaErrorUnknown);
  }
}

/// Throws solder::error for an empty batch or a null pointer, naming it.
inline void check_arguments(std::size_t batch, std::initializer_list<std::pair<const char*, const void*>> pointers) {
  if (batch == 0) throw error("batch must be at least 1");
  for (const auto& [name, pointer] : pointers)
    if (pointer == nullptr) throw error(std::string(name) + " is a null pointer");
}

/// The return type of a function type.
template <class F>
struct returned;
template <class R, class... A>
struct returned<R(A...)> {
  using type = R;
};

/// The pass of a tuple of writes (pass.hpp), with 16-byte accesses or without.
template <bool Vec, class Writes>
struct pass_of;
template <bool Vec, class... Ws>
struct pass_of<Vec, std::tuple<Ws...>> {
  using type = typename pass_for<Vec, Ws...>::type;
};

/// Runs a tuple of writes as one pass on `stream`.
template <class Writes>
void run(cudaStream_t stream, const Writes& writes) {
  std::apply([&](const auto&... w) { run_writes(stream, w...); }, writes);
}

}  // namespace solder::eval::cuda
