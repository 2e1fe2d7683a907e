# run_codegen_check.cmake: one codegen check. Compiles SOURCE to assembly with the flags in RSP
# and passes only if, for every `// EXPECT[<instruction> <count>]` line of SOURCE, the
# assembly holds the instruction at least <count> times.
#   cmake -DCXX=<compiler> -DRSP=<flags.rsp> -DSOURCE=<file.cpp> -P run_codegen_check.cmake
cmake_minimum_required(VERSION 3.25)
foreach(var CXX RSP SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_codegen_check.cmake: -D${var}=... is required")
  endif()
endforeach()

file(STRINGS "${SOURCE}" expect_lines REGEX "^// EXPECT\\[[a-z0-9]+ [0-9]+\\]")
list(LENGTH expect_lines expect_count)
if(expect_count EQUAL 0)
  message(FATAL_ERROR "${SOURCE}: no // EXPECT[<instruction> <count>] line")
endif()

execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env LC_ALL=C "${CXX}" "@${RSP}" "${SOURCE}" -o -
  RESULT_VARIABLE status OUTPUT_VARIABLE assembly ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "FAIL: ${CXX} @${RSP} ${SOURCE} -o - failed:\n${errors}")
endif()

set(failed 0)
foreach(line IN LISTS expect_lines)
  string(REGEX MATCH "^// EXPECT\\[([a-z0-9]+) ([0-9]+)\\]" _ "${line}")
  set(instruction "${CMAKE_MATCH_1}")
  set(want "${CMAKE_MATCH_2}")
  string(REGEX MATCHALL "[ \t]${instruction}[ \t]" found "${assembly}")
  list(LENGTH found got)
  if(got LESS want)
    message("FAIL: ${instruction}: ${got} in the assembly, expected at least ${want}")
    set(failed 1)
  else()
    message("ok:   ${instruction}: ${got} in the assembly (at least ${want})")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "FAIL: ${SOURCE}")
endif()
