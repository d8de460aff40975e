# Runs one compile-fail case (see CMakeLists.txt in this folder):
#   cmake -DCXX=<compiler> -DRSP=<flags file> -DSRC=<source> -DCASE=<NAME> -DOBJ=<object>
#         [-DEXPECT=<regex>] -P check.cmake
# Without EXPECT the compile must succeed (the positive control). With EXPECT it must
# fail, and its first error must be cgx's own static_assert message EXPECT.
execute_process(COMMAND ${CXX} @${RSP} -DCGX_CF_${CASE} -c ${SRC} -o ${OBJ}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
set(cmd "${CXX} @${RSP} -DCGX_CF_${CASE} -c ${SRC} -o ${OBJ}")
if(NOT DEFINED EXPECT)
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "${CASE}: the positive control does not compile:\n  ${cmd}")
  endif()
  message(STATUS "${CASE}: compiles, as it must")
  return()
endif()
if(rc EQUAL 0)
  message("${out}")
  message(FATAL_ERROR "${CASE}: compiles, but it must fail with '${EXPECT}':\n  ${cmd}")
endif()
# The first line that reports an error. GCC: error: static assertion failed: MSG
# Clang 14: error: static_assert failed due to requirement '...' "MSG"
# Clang 16+: error: static assertion failed due to requirement '...': MSG
string(REGEX MATCH "[^\n]*error:[^\n]*" first "${out}")
if(NOT first MATCHES "static[_ ]assert[^\n]*${EXPECT}")
  message("${out}")
  if(out MATCHES "static[_ ]assert[^\n]*${EXPECT}")
    message(FATAL_ERROR "${CASE}: fails with '${EXPECT}', but not first; the first error is:\n  ${first}")
  endif()
  message(FATAL_ERROR "${CASE}: fails, but not with cgx's message '${EXPECT}':\n  ${cmd}")
endif()
string(REGEX MATCHALL "[^\n]*error:[^\n]*" errors "${out}")
list(LENGTH errors n)
message(STATUS "${CASE}: fails as it must (${n} error lines); the first:\n  ${first}")
