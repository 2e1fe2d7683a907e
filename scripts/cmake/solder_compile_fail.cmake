# solder_compile_fail.cmake: reads the expected-error lines of a tests/compile_fail file.
# Used at configure time (tests/CMakeLists.txt) and at test time (run_compile_fail.cmake).
include_guard(GLOBAL)

# solder_read_compile_fail_messages(<file> <out>)
#   Every line of the form `// MESSAGE[<regex>]` (only whitespace before it) gives one
#   regex: the text between `MESSAGE[` and the line's last `]`. Sets <out>_COUNT and
#   <out>_1 ... <out>_<COUNT> in the caller's scope. The regexes are kept in separate
#   variables, not a list, because `;` and brackets are common in them and special in
#   CMake lists. Syntax: CMake's regular expressions (the ones ctest uses), matched against
#   the compiler's output in the C locale (ASCII quotes: 'operator=').
function(solder_read_compile_fail_messages file out)
  file(READ "${file}" text)
  string(REPLACE "\r" "" text "${text}")
  set(count 0)
  set(line_re "(^|\n)[ \t]*//[ \t]*MESSAGE\\[[^\n]*")
  while(TRUE)
    string(REGEX MATCH "${line_re}" line "${text}")
    if(line STREQUAL "")
      break()
    endif()
    string(FIND "${text}" "${line}" at)
    string(LENGTH "${line}" length)
    math(EXPR at "${at} + ${length}")
    string(SUBSTRING "${text}" ${at} -1 text)
    string(REGEX REPLACE "^\n?[ \t]*//[ \t]*MESSAGE\\[" "" regex "${line}")
    string(REGEX REPLACE "\\][ \t]*$" "" stripped "${regex}")
    if(stripped STREQUAL regex OR stripped STREQUAL "")
      message(FATAL_ERROR "${file}: malformed line '${line}'; "
        "write // MESSAGE[<regex>] with a non-empty regex")
    endif()
    math(EXPR count "${count} + 1")
    set(${out}_${count} "${stripped}" PARENT_SCOPE)
  endwhile()
  set(${out}_COUNT ${count} PARENT_SCOPE)
endfunction()
