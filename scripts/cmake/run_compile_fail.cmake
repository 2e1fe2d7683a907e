# run_compile_fail.cmake: one compile-fail test. Passes only if compiling SOURCE fails and
# the compiler's output matches every `// MESSAGE[<regex>]` line of SOURCE.
#   cmake -DCXX=<compiler> -DRSP=<flags.rsp> -DSOURCE=<file.cpp> -P run_compile_fail.cmake
cmake_minimum_required(VERSION 3.25)
foreach(var CXX RSP SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_compile_fail.cmake: -D${var}=... is required")
  endif()
endforeach()
include("${CMAKE_CURRENT_LIST_DIR}/solder_compile_fail.cmake")

solder_read_compile_fail_messages("${SOURCE}" expected)
if(expected_COUNT EQUAL 0)
  message(FATAL_ERROR "${SOURCE}: no // MESSAGE[<regex>] line")
endif()

# The C locale makes the diagnostics plain ASCII and the same on every machine: gcc quotes
# names as 'operator=' there, but with Unicode quotes (3 bytes each) under a UTF-8 locale.
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env LC_ALL=C LANG=C LANGUAGE=
    "${CXX}" "@${RSP}" "${SOURCE}"
  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
message("$ ${CXX} @${RSP} ${SOURCE}\n${output}")
if(status EQUAL 0)
  message(FATAL_ERROR "FAIL: ${SOURCE} compiled, but it must not")
endif()

set(missing "")
foreach(i RANGE 1 ${expected_COUNT})
  if(output MATCHES "${expected_${i}}")
    message("found:     MESSAGE[${expected_${i}}]")
  else()
    message("NOT FOUND: MESSAGE[${expected_${i}}]")
    math(EXPR missing "${missing} + 1")
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "FAIL: ${missing} of ${expected_COUNT} expected messages not in the "
    "compiler's output (exit status ${status})")
endif()
message("PASS: failed to compile with all ${expected_COUNT} expected messages")
