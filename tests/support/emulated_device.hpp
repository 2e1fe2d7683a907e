// support/emulated_device.hpp: CUDA memory and the CUDA backend's executor emulated on the host,
// for the tests that run what is written over the memory space (blocks, losses, optimizers,
// chains) in `device` memory without a GPU. tensor<T, S, device> owns host memory, and
// executor<cuda> runs the CUDA backend's own bodies the way its kernels do, over whole grids on
// the host: passes and products (support/grid.hpp), warp rows and chunks on an emulated warp
// (support/warp_emulation.hpp), one call per device thread for elements and planes, totals in
// the device's fixed order. Only for a program that never includes the real ones
// (solder/device.hpp, solder/cuda.hpp): this header defines those two templates in their place.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "grid.hpp"
#include "solder/assign.hpp"
#include "solder/backend.hpp"
#include "solder/eval/cuda/product.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/executor.hpp"
#include "solder/tensor.hpp"
#include "warp_emulation.hpp"

namespace solder {

/// The CUDA backend's verbs, each running the bodies the device kernels run, on the host.
template <>
struct executor<cuda> {
  using space = device;
  static constexpr bool product_writes_several = false;
  struct flush_denormals {
    explicit flush_denormals(bool) {}
  };

  template <class W0, class... Ws>
  static void run(const W0& w0, const Ws&... ws) {
    if constexpr (eval::cuda::holds_product<W0>) {
      static_assert(sizeof...(Ws) == 0, "emulated executor<cuda>: a product runs alone, as on the device");
      test::run_product(eval::cuda::product_of(w0));
    } else {
      test::host_runner runner;
      eval::cuda::dispatch(runner, w0, ws...);
    }
  }
  /// The device's col2im write (eval::cuda::run_patch_gradient), its scratch host memory.
  template <class G, std::size_t C, class E, std::size_t Stored>
  static void run(const patch_gradient_write<G, C, device, E, Stored>& w) {
    const std::size_t rows = w.out.batch();
    if (rows == 0) return;
    std::vector<float> columns(rows * C * G::taps);
    eval::cuda::run_patch_gradient<executor>(w, columns.data());
  }
  template <class Out, class E>
  static void assign(const Out& out, const E& e) {
    run(write(out, e));
  }

  template <std::size_t N, class Body>
  static void rows(std::size_t count, const Body& body) {
    test::run_warp(count, eval::cuda::warp_rows<N, Body>{body});
  }
  template <std::size_t N, class Body>
  static double row_sums(std::size_t count, const Body& body) {
    std::vector<double> values(count);
    test::run_warp(count, eval::cuda::warp_rows<N, ops::row_value_into<Body>>{{body, values.data()}});
    return total(values);
  }
  using chunking = eval::cuda::row_chunks;
  static chunking chunks_of(std::size_t rows, std::size_t) { return chunking(rows); }
  template <std::size_t N, class Body>
  static void chunks(const chunking& parts, const Body& body) {
    test::run_warp(parts.count, eval::cuda::warp_rows<N, Body>{body});
  }
  template <class Body>
  static void planes(std::size_t count, std::size_t rows, std::size_t cols, std::size_t, const Body& body) {
    const eval::cuda::plane_elements<Body> per_thread{body, rows, cols};
    for (std::size_t k = 0; k < count * rows * cols; ++k) per_thread(k);
  }
  template <class Body>
  static void elements(std::size_t n, const Body& body) {
    const eval::cuda::thread_elements<Body> per_thread{body};
    for (std::size_t i = 0; i < n; ++i) per_thread(i);
  }
  template <class Body>
  static double sum_blocks(std::size_t count, std::size_t, const Body& body) {
    std::vector<double> values(count);
    for (std::size_t b = 0; b < count; ++b) values[b] = body(b);
    return total(values);
  }
  // Emulated device memory is host memory: the CPU backend's copies.
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    executor<cpu>::copy(dst, src, n);
  }
  template <class T>
  static void copy_from_host(T* dst, const T* src, std::size_t n) {
    executor<cpu>::copy(dst, src, n);
  }
  template <class T>
  static void copy_to_host(T* dst, const T* src, std::size_t n) {
    executor<cpu>::copy(dst, src, n);
  }

 private:
  /// The device's fixed-order total of doubles (eval/cuda/total.hpp's block tree), by one
  /// thread: a different order than the device's two-level tree, the same values within a
  /// rounding of a double.
  static double total(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
  }
};

/// Device memory, emulated: zero-filled host memory with the real device tensor's interface.
template <class T, class S>
class tensor<T, S, device> {
 public:
  using expression_tag = solder::expression_tag;
  using value_type = T;
  using shape_type = S;
  using space_type = device;
  using element_type = T;

  tensor()
    requires(!S::dynamic)
      : batch_(1), data_(S::elements(1)) {}
  tensor(uninitialized_t)
    requires(!S::dynamic)
      : tensor() {}
  explicit tensor(std::size_t batch)
    requires(S::dynamic)
      : batch_(batch), data_(S::elements(batch)) {}
  tensor(std::size_t batch, uninitialized_t)
    requires(S::dynamic)
      : tensor(batch) {}

  /// A tensor holding e, evaluated by the executor (the device pass).
  template <ExpressionType E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
  tensor(const E& e) : tensor(make_for(e)) {  // NOLINT: implicit, as the real device tensor
    executor<cuda>::assign(ref(), e);
  }

  template <ExpressionType E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
  tensor& operator=(const E& e) {
    executor<cuda>::assign(ref(), e);
    return *this;
  }

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  std::size_t batch() const { return batch_; }
  std::size_t size() const { return data_.size(); }
  static constexpr std::size_t rank() { return S::rank; }
  tensor_ref<T, S, device> ref() { return tensor_ref<T, S, device>(data(), batch_); }
  tensor_ref<const T, S, device> ref() const { return tensor_ref<const T, S, device>(data(), batch_); }
  operator tensor_ref<T, S, device>() { return ref(); }
  operator tensor_ref<const T, S, device>() const { return ref(); }

 private:
  template <class E>
  static tensor make_for(const E& e) {
    if constexpr (S::dynamic)
      return tensor(e.batch());
    else
      return tensor();
  }

  std::size_t batch_;
  std::vector<T> data_;
};

static_assert(Executor<executor<cuda>>, "the emulated executor<cuda> provides every verb executor.hpp declares");

}  // namespace solder
