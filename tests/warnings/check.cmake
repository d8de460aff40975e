# The warnings test: cgx's headers give no warning under -Wall -Wextra (-Werror) with
# each compiler, with and without -march=native, as a user's code would include them.
#   cmake -DCOMPILERS=<c1;c2> -DSOURCES=<s1;s2> -DINCLUDES=<cgx include dir>
#         -DSYSTEM_INCLUDES=<MPI's include dirs> -P check.cmake
# Each compiler compiles each source at -O2 (g++ also with -march=native) (code generation: -Wpsabi and friends only
# appear there) to an object it throws away; any diagnostic fails the test. MPI's
# headers are system headers, as CMake's MPI::MPI_CXX makes them, without the
# deprecated C++ bindings (as there).
set(_failed 0)
set(_runs 0)
foreach(cxx IN LISTS COMPILERS)
  # -march=native with g++ only: what it changes is GCC's vector ABI diagnostics (-Wpsabi
  # on the baseline copies of the kernels); clang compiles the same code to the same
  # diagnostics either way, and the second pass would double the test's time.
  set(_archs "" "-march=native")
  get_filename_component(_cxx_name "${cxx}" NAME)
  if(_cxx_name MATCHES "clang")
    set(_archs "")
  endif()
  foreach(arch IN LISTS _archs)
    foreach(src IN LISTS SOURCES)
      set(_inc "")
      foreach(d IN LISTS INCLUDES)
        list(APPEND _inc "-I${d}")
      endforeach()
      foreach(d IN LISTS SYSTEM_INCLUDES)
        list(APPEND _inc "-isystem" "${d}")
      endforeach()
      set(_cmd ${cxx} -std=c++20 -O2 -Wall -Wextra -Werror ${arch} -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX ${_inc}
               -c ${src} -o /dev/null)
      execute_process(COMMAND ${_cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
      math(EXPR _runs "${_runs} + 1")
      get_filename_component(_name ${src} NAME)
      if(NOT rc EQUAL 0 OR NOT "${err}${out}" STREQUAL "")
        message("FAIL: ${cxx} ${arch} ${_name}:\n${out}${err}")
        math(EXPR _failed "${_failed} + 1")
      else()
        message("ok: ${cxx} ${arch} ${_name}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(_runs EQUAL 0)
  message(FATAL_ERROR "no compiler or source given")
endif()
if(_failed GREATER 0)
  message(FATAL_ERROR "${_failed} of ${_runs} compiles gave warnings or errors")
endif()
message("all ${_runs} compiles clean")
