// eval/cuda/launcher.hpp: what solder-gen's extern "C" functions are made of (nvcc only): the
// guard that turns every exception into a status and a message, and the pointer checks.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cuda/error.hpp"

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

/// Throws solder::error for the first null pointer, naming it: what a C function checks of the
/// pointers it is given before anything runs.
inline void check_pointers(std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, pointer] : pointers)
    if (pointer == nullptr) throw error(std::string(name) + " is a null pointer");
}

}  // namespace solder::eval::cuda
