# solder_helpers.cmake: compiler flags for solder's own targets (tests, benchmarks,
# examples). None of this reaches the exported solder::solder target.
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

set(SOLDER_SANITIZE_FLAGS
  -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
# The AVX2 test build: AVX2+FMA on top of baseline x86-64, AVX-512 explicitly off, so the
# 8-lane path is compiled and run even on an AVX-512 machine.
set(SOLDER_AVX2_FLAGS -mavx2 -mfma -mno-avx512f)

if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(SOLDER_WARNING_FLAGS -Wall -Wextra -Wpedantic)
else()
  set(SOLDER_WARNING_FLAGS "")
endif()

set(SOLDER_NATIVE_FLAGS "")
if(SOLDER_NATIVE)
  check_cxx_compiler_flag(-march=native SOLDER_HAVE_MARCH_NATIVE)
  if(SOLDER_HAVE_MARCH_NATIVE)
    set(SOLDER_NATIVE_FLAGS -march=native)
  else()
    message(WARNING "SOLDER_NATIVE: ${CMAKE_CXX_COMPILER_ID} does not accept -march=native")
  endif()
endif()

# solder_internal_target(<target> [ARCH native|avx2|baseline] [NO_SANITIZE])
#   Warnings, the instruction set and (with SOLDER_SANITIZE) ASan+UBSan for one of solder's
#   own targets. C++ flags only: CUDA sources in the same target get nvcc's defaults.
#   ARCH native (default) is -march=native when SOLDER_NATIVE is ON, else the compiler's
#   default; avx2 is SOLDER_AVX2_FLAGS; baseline adds nothing.
function(solder_internal_target tgt)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_SANITIZE" "ARCH" "")
  if(NOT arg_ARCH)
    set(arg_ARCH native)
  endif()
  if(arg_ARCH STREQUAL "native")
    set(arch_flags ${SOLDER_NATIVE_FLAGS})
  elseif(arg_ARCH STREQUAL "avx2")
    set(arch_flags ${SOLDER_AVX2_FLAGS})
  elseif(arg_ARCH STREQUAL "baseline")
    set(arch_flags "")
  else()
    message(FATAL_ERROR "solder_internal_target(${tgt}): unknown ARCH '${arg_ARCH}'")
  endif()
  target_compile_options(${tgt} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${SOLDER_WARNING_FLAGS};${arch_flags}>")
  if(SOLDER_SANITIZE AND NOT arg_NO_SANITIZE)
    target_compile_options(${tgt} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${SOLDER_SANITIZE_FLAGS}>")
    target_link_options(${tgt} PRIVATE ${SOLDER_SANITIZE_FLAGS})
  endif()
endfunction()

# solder_xtensor_for_clang(): xtensor 0.24 (Debian bookworm's) declares two partial
# specializations of rebind_container that Clang 19's relaxed template template arguments
# (P0522, on by default since Clang 19) find ambiguous for its svector. Until xtensor 0.25 the
# imported target asks Clang for the old rule. Call after find_package(xtensor).
function(solder_xtensor_for_clang)
  if(TARGET xtensor AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang"
     AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 19 AND xtensor_VERSION VERSION_LESS 0.25)
    set_property(TARGET xtensor APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
      "$<$<COMPILE_LANGUAGE:CXX>:-fno-relaxed-template-template-args;-Wno-deprecated-no-relaxed-template-template-args>")
  endif()
endfunction()
