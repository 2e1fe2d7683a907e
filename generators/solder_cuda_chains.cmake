# solder_cuda_chains.cmake: solder_add_cuda_chains(), which runs solder-gen at build time and compiles its .cu into a target.
#
#   solder_add_cuda_chains(<target> HEADER <header> CHAINS <name>...
#                          [ARCHITECTURES <arch>...] [OUTPUT_DIR <dir>])
#
# HEADER declares the chains as types (nn::chain in host memory; the generated code runs each one's
# device form) and must compile with the host C++ compiler and nvcc; CHAINS names them as C++ sees
# them after including it ("bias_relu_dropout", "models::mlp"). For each name, solder-gen
# writes <stem>.cu and <stem>.h into OUTPUT_DIR (default: <current binary dir>/solder_gen/<target>),
# "::" becoming "_" in <stem>; the .cu are compiled by nvcc into <target>, for ARCHITECTURES (its
# CUDA_ARCHITECTURES property; default 80 90), and OUTPUT_DIR is a PUBLIC include directory of
# <target>, so code linked with it includes "<stem>.h". The generator is rebuilt and rerun when the
# header or solder-gen changes. docs/cuda.md describes the generated files.
#
#   solder_add_chain_generator(<generator target> HEADER <header> CHAINS <name>...)
#
# The generator program alone (host C++): `<generator target> <dir>` writes the files into <dir>.
include_guard(GLOBAL)

function(solder_add_chain_generator gen)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "HEADER" "CHAINS")
  if(arg_UNPARSED_ARGUMENTS OR NOT arg_HEADER OR NOT arg_CHAINS)
    message(FATAL_ERROR "solder_add_chain_generator(${gen} HEADER <header> CHAINS <name>...): "
      "HEADER and CHAINS are required (unexpected: '${arg_UNPARSED_ARGUMENTS}')")
  endif()
  get_filename_component(header "${arg_HEADER}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  if(NOT EXISTS "${header}")
    message(FATAL_ERROR "solder_add_chain_generator(${gen}): the header ${header} does not exist")
  endif()
  get_filename_component(header_dir "${header}" DIRECTORY)
  get_filename_component(header_name "${header}" NAME)

  set(entries "")
  foreach(chain IN LISTS arg_CHAINS)
    if(NOT chain MATCHES "^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*$")
      message(FATAL_ERROR "solder_add_chain_generator(${gen}): '${chain}' is not a C++ name "
        "(identifiers joined by ::, without a leading ::)")
    endif()
    string(APPEND entries "\n       solder::gen::describe<${chain}>(\"${chain}\"),")
  endforeach()
  string(REGEX REPLACE ",$" "" entries "${entries}")
  # CONFIGURE writes only when the text changes: a reconfigure does not rebuild the generator.
  set(main "${CMAKE_CURRENT_BINARY_DIR}/solder_gen/${gen}.cpp")
  file(CONFIGURE OUTPUT "${main}" @ONLY CONTENT
"// ${gen}.cpp: solder-gen for the chains of ${header_name}; written by solder_cuda_chains.cmake.
#include \"${header_name}\"
#include \"solder_gen.hpp\"

int main(int argc, char** argv) {
  return solder::gen::main(argc, argv, \"${header_name}\", {${entries}});
}
")
  add_executable(${gen} "${main}")
  target_include_directories(${gen} PRIVATE "${header_dir}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}")
  target_link_libraries(${gen} PRIVATE solder::solder)
  set_target_properties(${gen} PROPERTIES SOLDER_GEN_HEADER "${header}" SOLDER_GEN_CHAINS "${arg_CHAINS}")
endfunction()

function(solder_add_cuda_chains target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "HEADER;OUTPUT_DIR" "CHAINS;ARCHITECTURES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "solder_add_cuda_chains(${target}): unexpected arguments '${arg_UNPARSED_ARGUMENTS}'")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "solder_add_cuda_chains(${target}): no target ${target}; create it first "
      "(add_library or add_executable)")
  endif()
  if(NOT CMAKE_CUDA_COMPILER_LOADED)
    message(FATAL_ERROR "solder_add_cuda_chains(${target}): CUDA is not enabled in ${CMAKE_CURRENT_SOURCE_DIR}; "
      "call enable_language(CUDA) there (solder's own tree: configure with SOLDER_BUILD_CUDA=ON)")
  endif()
  if(NOT TARGET CUDA::cudart)
    find_package(CUDAToolkit REQUIRED)
  endif()
  if(NOT arg_ARCHITECTURES)
    set(arg_ARCHITECTURES 80 90)
  endif()
  if(NOT arg_OUTPUT_DIR)
    set(arg_OUTPUT_DIR "${CMAKE_CURRENT_BINARY_DIR}/solder_gen/${target}")
  endif()
  get_filename_component(out "${arg_OUTPUT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")

  set(gen ${target}_solder_gen)
  if(TARGET ${gen})
    message(FATAL_ERROR "solder_add_cuda_chains(${target}): already called for ${target}; name all its chains "
      "in one call")
  endif()
  solder_add_chain_generator(${gen} HEADER "${arg_HEADER}" CHAINS ${arg_CHAINS})
  get_target_property(header ${gen} SOLDER_GEN_HEADER)
  get_filename_component(header_dir "${header}" DIRECTORY)

  set(sources "")
  set(headers "")
  foreach(chain IN LISTS arg_CHAINS)
    string(REPLACE "::" "_" stem "${chain}")
    list(APPEND sources "${out}/${stem}.cu")
    list(APPEND headers "${out}/${stem}.h")
  endforeach()
  file(MAKE_DIRECTORY "${out}")
  list(JOIN arg_CHAINS ", " names)
  add_custom_command(
    OUTPUT ${sources} ${headers}
    COMMAND ${gen} "${out}"
    DEPENDS ${gen} "${header}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/solder_gen.hpp"
      "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/describe.hpp" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/c_interface.hpp"
    COMMENT "solder-gen: CUDA kernels of ${names} for ${target}"
    VERBATIM)
  target_sources(${target} PRIVATE ${sources} ${headers})
  target_include_directories(${target} PUBLIC "${out}" PRIVATE "${header_dir}")
  target_link_libraries(${target} PRIVATE solder::solder PUBLIC CUDA::cudart)
  # Where nvcc links <target>, the shared runtime CUDA::cudart stands for, not a second static copy.
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${arg_ARCHITECTURES}" CUDA_RUNTIME_LIBRARY Shared)
  if(DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_VERSION VERSION_GREATER_EQUAL 3.26)
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  else()
    # CMake 3.25 knows no C++20 flag for nvcc; solder's top level sets one for its own tree only.
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>")
  endif()
endfunction()
