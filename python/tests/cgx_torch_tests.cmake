# The tests of cgx_torch (python/), included from tests/CMakeLists.txt. Registered only
# where, at configure time, a python3 imports torch and mpi4py and mpi4py's MPI is the one
# the tests are launched with (Open MPI's mpiexec; Debian's python3-mpi4py is built on
# Open MPI), and not in sanitizer builds (the extension is not sanitized).
#
#   cgx_torch.build   builds the extension with torch's cpp_extension into this build
#                     tree (python/setup.py build; incremental through ninja): a fixture
#   cgx_torch.np3     python/tests/test_cgx_torch.py at 3 ranks (allreduce_, errors, the hook)
#   train_ddp.np4     examples/python/train_ddp.py at 4 ranks: cgx 4-bit within 1 point of
#                     fp32, identical parameters on all ranks (its exit status)
#   cgx_torch.torchrun3  test_cgx_torch.py at 3 ranks started with torchrun's environment
#                     (env_launch.py: Debian's torch 1.13 torchrun fails under Python 3.11):
#                     the same build over the gloo group instead of MPI
#
# CGX_PYTHON names the interpreter; by default python3 on PATH, then /usr/bin/python3 (a
# python3 of pyenv or conda earlier on PATH may lack Debian's torch).

if(CGX_SANITIZE OR CMAKE_CROSSCOMPILING OR NOT CGX_MPIEXEC_IS_OPENMPI)
  return()
endif()

set(CGX_PYTHON "" CACHE FILEPATH "python3 with torch and mpi4py for cgx_torch's tests (empty: search)")
set(_cgx_py_candidates ${CGX_PYTHON})
if(NOT CGX_PYTHON)
  find_program(_cgx_py_path NAMES python3 NO_CACHE)
  list(APPEND _cgx_py_candidates ${_cgx_py_path} /usr/bin/python3)
endif()
set(_cgx_py "")
foreach(py IN LISTS _cgx_py_candidates)
  if(NOT EXISTS "${py}")
    continue()
  endif()
  execute_process(
    COMMAND "${py}" -c "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; import torch; print(MPI.Get_library_version().splitlines()[0])"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _mpi OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET TIMEOUT 120)
  if(_rc EQUAL 0 AND _mpi MATCHES "Open MPI")
    set(_cgx_py "${py}")
    break()
  endif()
endforeach()
if(NOT _cgx_py)
  message(STATUS "cgx: no python3 with torch and mpi4py (Open MPI) found: cgx_torch's tests are not registered")
  return()
endif()
message(STATUS "cgx: cgx_torch's tests use ${_cgx_py} (${_mpi})")

set(_cgx_torch_dir ${CMAKE_CURRENT_BINARY_DIR}/cgx_torch)
add_test(NAME cgx_torch.build
         COMMAND ${CMAKE_COMMAND} -E env MAX_JOBS=2
                 "${_cgx_py}" ${PROJECT_SOURCE_DIR}/python/setup.py -q build --build-base ${_cgx_torch_dir}/setup
                 --build-lib ${_cgx_torch_dir}/lib)
set_tests_properties(cgx_torch.build PROPERTIES FIXTURES_SETUP cgx_torch LABELS "python" PROCESSORS 2 TIMEOUT 3600
                     ENVIRONMENT "CGX_INCLUDE_DIR=${PROJECT_SOURCE_DIR}/include")

set(_cgx_torch_env ${CGX_MPI_TEST_ENV} PYTHONPATH=${_cgx_torch_dir}/lib PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1)
add_test(NAME cgx_torch.np3
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 ${CGX_MPIEXEC_EXTRA} ${MPIEXEC_PREFLAGS}
                 "${_cgx_py}" ${PROJECT_SOURCE_DIR}/python/tests/test_cgx_torch.py ${MPIEXEC_POSTFLAGS})
set_tests_properties(cgx_torch.np3 PROPERTIES FIXTURES_REQUIRED cgx_torch LABELS "python;mpi" PROCESSORS 3
                     ENVIRONMENT "${_cgx_torch_env}" TIMEOUT 600)
add_test(NAME train_ddp.np4
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${CGX_MPIEXEC_EXTRA} ${MPIEXEC_PREFLAGS}
                 "${_cgx_py}" ${PROJECT_SOURCE_DIR}/examples/python/train_ddp.py ${MPIEXEC_POSTFLAGS})
set_tests_properties(train_ddp.np4 PROPERTIES FIXTURES_REQUIRED cgx_torch LABELS "python;mpi;example;training"
                     PROCESSORS 4 ENVIRONMENT "${_cgx_torch_env}" TIMEOUT 900
                     FAIL_REGULAR_EXPRESSION "FAILED")
add_test(NAME cgx_torch.torchrun3
         COMMAND "${_cgx_py}" ${PROJECT_SOURCE_DIR}/python/tests/env_launch.py 3
                 ${PROJECT_SOURCE_DIR}/python/tests/test_cgx_torch.py)
set_tests_properties(cgx_torch.torchrun3 PROPERTIES FIXTURES_REQUIRED cgx_torch LABELS "python" PROCESSORS 3
                     ENVIRONMENT "PYTHONPATH=${_cgx_torch_dir}/lib;PYTHONDONTWRITEBYTECODE=1;OMP_NUM_THREADS=1;GLOO_SOCKET_IFNAME=lo"
                     TIMEOUT 600)
