# run_install_check.cmake: install solder into PREFIX, then configure, build and run the
# consumer project at CONSUMER_SOURCE_DIR, which finds it with find_package(solder).
#   cmake -DSOLDER_BUILD_DIR=... -DPREFIX=... -DCONSUMER_SOURCE_DIR=... \
#         -DCONSUMER_BINARY_DIR=... -DGENERATOR=... [-DMAKE_PROGRAM=...] [-DCXX=...] \
#         -P run_install_check.cmake
cmake_minimum_required(VERSION 3.25)
foreach(var SOLDER_BUILD_DIR PREFIX CONSUMER_SOURCE_DIR CONSUMER_BINARY_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_install_check.cmake: -D${var}=... is required")
  endif()
endforeach()

function(step what)
  message("-- ${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "FAIL: ${what} (exit status ${status})")
  endif()
endfunction()

# Start clean, so nothing from an earlier run can satisfy the consumer.
file(REMOVE_RECURSE "${PREFIX}" "${CONSUMER_BINARY_DIR}")

step("install solder" "${CMAKE_COMMAND}" --install "${SOLDER_BUILD_DIR}" --prefix "${PREFIX}")

set(configure_args -S "${CONSUMER_SOURCE_DIR}" -B "${CONSUMER_BINARY_DIR}" -G "${GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${PREFIX}"
  "-DSOLDER_EXPECTED_PREFIX=${PREFIX}"
  # Only the fresh install may answer find_package(solder), not a registry entry.
  "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"
  "-DCMAKE_BUILD_TYPE=Release")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX}")
endif()
step("configure the consumer" "${CMAKE_COMMAND}" ${configure_args})
step("build the consumer" "${CMAKE_COMMAND}" --build "${CONSUMER_BINARY_DIR}")
step("run the consumer" "${CONSUMER_BINARY_DIR}/solder_consumer")
message("PASS: a project found the installed solder with find_package and linked solder::solder")
