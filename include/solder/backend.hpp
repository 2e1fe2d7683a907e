// backend.hpp: where memory lives (the spaces host and device) and what evaluates it (the
// backend tags cpu and cuda). An assignment is run by the backend of its destination's space,
// chosen here by tag: executor<backend_of_t<Space>>.
#pragma once

#include <type_traits>

#include "solder/diagnostic.hpp"

namespace solder {

/// Memory spaces, the last template argument of tensor and tensor_ref.
/// host: the CPU's memory (the default).
struct host {};
/// device: CUDA device memory, read and written by the CUDA backend only.
struct device {};

/// The space of a leaf that lives in no memory (a scalar constant, a random mask regenerated
/// from its counter): it joins an expression of either space.
struct any_space {};

template <class S>
concept MemorySpace = std::is_same_v<S, host> || std::is_same_v<S, device>;

/// Backend tags: the CPU backend (xsimd loops and GEMM, eval/cpu/) and the CUDA backend
/// (generated kernels, eval/cuda/).
struct cpu {};
struct cuda {};

/// The backend that evaluates assignments into memory of `Space`.
template <class Space>
struct backend_of;
template <>
struct backend_of<host> {
  using type = cpu;
};
template <>
struct backend_of<device> {
  using type = cuda;
};
template <class Space>
using backend_of_t = typename backend_of<Space>::type;

/// The memory space of a tensor or view type T (its space_type), host where T does not say.
template <class T>
struct memory_space {
  using type = host;
};
template <class T>
  requires requires { typename T::space_type; }
struct memory_space<T> {
  using type = typename T::space_type;
};
template <class T>
using memory_space_t = typename memory_space<T>::type;

/// What a backend provides to evaluate assignments: `run(writes...)` evaluates several
/// write_target's in one pass (or one product with its epilogue). Each backend specializes it
/// in its own folder: executor<cpu> in eval/cpu/executor.hpp (included by solder/assign.hpp,
/// since host memory always has the CPU), executor<cuda> with solder/cuda.hpp.
template <class Backend>
struct executor {
  static_assert(never<"solder: no evaluator for this backend is included; include solder/solder.hpp for host "
                      "tensors, or solder/cuda.hpp (compiled by nvcc) for device tensors",
                      Backend>);
  // Present so that the missing backend is the only error reported.
  template <class... A>
  static void run(const A&...) {}
  template <class... A>
  static void assign(const A&...) {}
};

namespace detail {

template <class A, class B>
struct join_space;
template <class A>
struct join_space<A, A> {
  using type = A;
};
template <class A>
  requires(!std::is_same_v<A, any_space>)
struct join_space<A, any_space> {
  using type = A;
};
template <class B>
  requires(!std::is_same_v<B, any_space>)
struct join_space<any_space, B> {
  using type = B;
};
template <>
struct join_space<host, device> {
  using type = void;
};
template <>
struct join_space<device, host> {
  using type = void;
};

template <class... S>
struct common_space {
  using type = any_space;
};
template <class S0, class... S>
struct common_space<S0, S...> {
  using rest = typename common_space<S...>::type;
  using type = std::conditional_t<std::is_void_v<rest>, void, typename join_space<S0, std::conditional_t<std::is_void_v<rest>, S0, rest>>::type>;
};

}  // namespace detail

/// The space an expression of leaves in spaces S... lives in: any_space when none has one,
/// void when they mix host and device (see check_spaces).
template <class... S>
using common_space_t = typename detail::common_space<S...>::type;

/// True when leaves in spaces S... can be evaluated together; otherwise one compile error
/// that says so.
template <class... S>
constexpr bool check_spaces() {
  if constexpr (!std::is_void_v<common_space_t<S...>>) {
    return true;
  } else {
    return diagnostic<"solder: an expression mixes host and device tensors; one backend evaluates one memory space, "
                      "so copy the operands into one space first",
                      S...>::reported;
  }
}

}  // namespace solder
