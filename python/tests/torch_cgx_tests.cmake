# Scripts written the way torch_cgx's users write them (`import torch_cgx`, `from cgx_utils
# import CGXState, cgx_hook`, init_process_group("cgx", init_method="env://"), the rank
# variables set from the MPI launcher's), launched with mpirun as they are: Open MPI's at 2
# and 4 ranks, and MPICH's (mpirun.mpich) where it is installed. The ranks make no MPI
# call: mpirun only starts them; cgx's messages go over the `cgx` group's gloo connections.
# Included from tests/CMakeLists.txt; needs cgx_torch2_tests.cmake's venv and build (the
# cgx_torch2 fixture). python/tests/torch_cgx_style/:
#
#   torch_cgx.test_cgx.<mpi><np>  test_cgx.py: a unittest as torch_cgx's own: constants exact
#                                 at 2/4/8 bits (float16, float32, int32, up to 10^6 values),
#                                 ramps within torch_cgx's bound at 2-8 bits x buckets 64, 512,
#                                 2048 with the variables changed between calls, 32 bits exact,
#                                 minimal size, bad values, CGXState's settings,
#                                 register_layer & co. with the hook
#   torch_cgx.train.<mpi><np>     train.py: a CIFAR-example-style DDP script (synthetic images, a
#                                 small CNN, CGXState(compression_params=...), cgx_hook), over the
#                                 `cgx` backend, and over gloo: loss drops, identical parameters,
#                                 validation loss within 0.02 of the uncompressed run's
#   torch_cgx.launcher_env.<mpi>2 launcher_env.py: RANK/WORLD_SIZE filled in by `import torch_cgx`
#   torch_cgx.train.torchrun2     train.py under torchrun
#
# Each test gets ports of its own (MASTER_PORT and, for test_cgx.py, the 8 above it), below
# the ephemeral range, so that ctest -j runs them side by side.
if(NOT CGX_TORCH2_PYTHON OR CGX_SANITIZE OR CMAKE_CROSSCOMPILING)
  return()
endif()

find_program(CGX_OPENMPI_MPIRUN NAMES mpirun.openmpi)
find_program(CGX_MPICH_MPIRUN NAMES mpirun.mpich)
set(_tc_dir ${PROJECT_SOURCE_DIR}/python/tests/torch_cgx_style)
# torch_cgx and cgx_utils are in the built package (setup.py's packages) with cgx_torch
set(_tc_env PYTHONPATH=${CMAKE_CURRENT_BINARY_DIR}/cgx_torch2/lib PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
            GLOO_SOCKET_IFNAME=lo)
set(_tc_launchers)
if(CGX_OPENMPI_MPIRUN)
  list(APPEND _tc_launchers ompi)
  set(_tc_run_ompi ${CGX_OPENMPI_MPIRUN} --allow-run-as-root --oversubscribe -np)
  set(_tc_env_ompi OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                   OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1)
endif()
if(CGX_MPICH_MPIRUN)
  list(APPEND _tc_launchers mpich)
  set(_tc_run_mpich ${CGX_MPICH_MPIRUN} -np)
  set(_tc_env_mpich)
endif()

set(_tc_port 24100)  # each test: its own 10 ports
# _tc_add(LAUNCHERS NAME NP SCRIPT ARGS...): NAME run at NP ranks by each of LAUNCHERS (a
# ;-list of ompi, mpich) that is installed.
function(_tc_add launchers name np script)
  foreach(l IN LISTS launchers)
    if(NOT l IN_LIST _tc_launchers)
      continue()
    endif()
    set(test torch_cgx.${name}.${l}${np})
    add_test(NAME ${test} COMMAND ${_tc_run_${l}} ${np} "${CGX_TORCH2_PYTHON}" ${_tc_dir}/${script} ${ARGN})
    set_tests_properties(${test} PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2" PROCESSORS ${np}
                         ENVIRONMENT "${_tc_env};${_tc_env_${l}};MASTER_PORT=${_tc_port}" TIMEOUT 900
                         FAIL_REGULAR_EXPRESSION "FAILED|Traceback")
    math(EXPR _tc_port "${_tc_port} + 10")
    set(_tc_port ${_tc_port} PARENT_SCOPE)
  endforeach()
endfunction()

# MPICH runs the unittest at 2 ranks and the 4-rank training (its rank variables are what
# differs; the unittest at 4 ranks under Open MPI).
_tc_add("ompi;mpich" test_cgx 2 test_cgx.py)
_tc_add(ompi test_cgx 4 test_cgx.py)
_tc_add(ompi train 2 train.py --dist-backend cgx --quantization-bits 4 --quantization-bucket-size 512 --tolerance 0.02)
_tc_add("ompi;mpich" train 4 train.py --dist-backend cgx --quantization-bits 2 --quantization-bucket-size 64
        --tolerance 0.02)
_tc_add(ompi train_gloo 2 train.py --dist-backend gloo --quantization-bits 8 --quantization-bucket-size 2048
        --tolerance 0.02)
_tc_add("ompi;mpich" launcher_env 2 launcher_env.py)

# The same training script under torchrun (its RANK/WORLD_SIZE/MASTER_PORT; --standalone picks a free port).
add_test(NAME torch_cgx.train.torchrun2
         COMMAND "${CGX_TORCH2_PYTHON}" -m torch.distributed.run --standalone --nproc-per-node 2 ${_tc_dir}/train.py
                 --dist-backend cgx --quantization-bits 4 --quantization-bucket-size 2048 --tolerance 0.02)
set_tests_properties(torch_cgx.train.torchrun2 PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                     PROCESSORS 2 ENVIRONMENT "${_tc_env}" TIMEOUT 900 FAIL_REGULAR_EXPRESSION "FAILED|Traceback")
