# Helpers to register cgx's tests with CTest.
#
# cgx_add_mpi_test(NAME SOURCES src... [RANKS 1 2 3 4] [LABELS ...] [MAIN target])
#   Builds NAME from the sources plus the MPI test main (MAIN: another one, e.g.
#   cgx_mpi_test_main_multiple for MPI_THREAD_MULTIPLE) and registers NAME.np<k> for
#   each rank count, launched with ${MPIEXEC_EXECUTABLE}. Works with Open MPI run as
#   root on a 2-core machine (oversubscription is added for Open MPI) and with MPICH
#   (configure with -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich -DMPI_CXX_COMPILER=mpicxx.mpich).
#
# cgx_add_test (below) needs no MPI: a build without MPI (e.g. a cross build) includes
# this file for it alone.

set(CGX_TEST_RANKS 1 2 3 4 CACHE STRING "Rank counts the MPI tests are registered for")

# No launcher to ask where MPI was not found. CGX_MPIEXEC_IS_HYDRA: MPICH's launcher.
if((NOT DEFINED CGX_MPIEXEC_IS_OPENMPI OR NOT DEFINED CGX_MPIEXEC_IS_HYDRA) AND MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _cgx_mpiexec_version
                  ERROR_VARIABLE _cgx_mpiexec_version RESULT_VARIABLE _rc)
  if(_cgx_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(CGX_MPIEXEC_IS_OPENMPI ON CACHE INTERNAL "")
  else()
    set(CGX_MPIEXEC_IS_OPENMPI OFF CACHE INTERNAL "")
  endif()
  if(_cgx_mpiexec_version MATCHES "HYDRA")
    set(CGX_MPIEXEC_IS_HYDRA ON CACHE INTERNAL "")
  else()
    set(CGX_MPIEXEC_IS_HYDRA OFF CACHE INTERNAL "")
  endif()
endif()

set(CGX_MPI_TEST_ENV "")
set(CGX_MPIEXEC_EXTRA "")
if(CGX_MPIEXEC_IS_OPENMPI)
  # Root is allowed in CI containers; more ranks than cores; ranks yield when idle so
  # that 4 ranks on 2 cores do not spin each other out; no CMA single-copy (blocked by
  # ptrace restrictions in containers).
  list(APPEND CGX_MPI_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
       OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1)
  if(NOT MPIEXEC_PREFLAGS MATCHES "oversubscribe")
    set(CGX_MPIEXEC_EXTRA --oversubscribe)
  endif()
endif()

# CGX_TEST_MPI_SCALAR: the MPI tests built with the scalar host kernels alone
# (CGX_NO_HOST_SIMD, in every translation unit of each test program), a third less
# compile time, for builds that test the schedules, transports and failure paths with
# another MPI or under the sanitizers (scripts/test's stages 3 and 5). The SIMD kernels
# write the scalar ones' bytes (test_host_isa), and the main build runs the MPI tests
# with them.
option(CGX_TEST_MPI_SCALAR "Build the MPI tests with the scalar host kernels only (CGX_NO_HOST_SIMD)" OFF)

# cgx_mpi_test_options(TARGET): what every MPI test program gets (CGX_TEST_MPI_SCALAR).
function(cgx_mpi_test_options target)
  if(CGX_TEST_MPI_SCALAR)
    target_compile_definitions(${target} PRIVATE CGX_NO_HOST_SIMD)
  endif()
endfunction()

function(cgx_add_mpi_test name)
  cmake_parse_arguments(ARG "" "MAIN" "SOURCES;RANKS;LABELS" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${CGX_TEST_RANKS})
  endif()
  if(NOT ARG_MAIN)
    set(ARG_MAIN cgx_mpi_test_main)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE cgx::cgx ${ARG_MAIN} cgx_project_options)
  cgx_mpi_test_options(${name})
  foreach(np IN LISTS ARG_RANKS)
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${CGX_MPIEXEC_EXTRA} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}.np${np} PROPERTIES PROCESSORS ${np} LABELS "mpi;${ARG_LABELS}"
                         ENVIRONMENT "${CGX_MPI_TEST_ENV}" TIMEOUT 600)
  endforeach()
endfunction()

# cgx_add_test(NAME SOURCES src... [LABELS ...]): a single-process doctest test.
function(cgx_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE cgx::cgx cgx_test_main cgx_project_options)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;${ARG_LABELS}" TIMEOUT 600)
endfunction()
