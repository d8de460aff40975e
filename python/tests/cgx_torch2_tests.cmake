# cgx_torch against torch 2.x from PyPI, launched as its users launch it (torchrun), in
# the venv CGX_TORCH2_PYTHON names (scripts/torch2-venv makes one; scripts/test sets it).
# Included from tests/CMakeLists.txt; nothing is registered when CGX_TORCH2_PYTHON is empty.
#
#   cgx_torch2.build          the extension without MPI (CGX_TORCH_MPI=0): torch.distributed
#                             process groups only; a fixture
#   cgx_torch2.torchrun3      python/tests/test_cgx_torch.py under torchrun, 3 ranks, over
#                             the gloo group; CGX_TEST_NO_MPI=1: no MPI library in the
#                             extension or the processes
#   cgx_backend.torchrun2..4  python/tests/test_backend.py: dist.init_process_group("cgx")
#   cgx_path.torchrun2..3     python/tests/test_path_choice.py: the measured choice of the
#                             compressed or the exact path (backend and hook), forcing either
#   unchanged.gpt_train4      python/tests/third_party/gpt_train.py (a minimal-GPT-style trainer)
#   unchanged.ddp_tutorial2   and ddp_tutorial.py (torch's DDP tutorial's style), scripts with no
#                             cgx in them, run by run_unchanged.py with --backend gloo and cgx:
#                             the backend found through torch's entry points, every rank's calls
#                             compressed, the loss within a tolerance of gloo's
#   train_ddp2.torchrun4      examples/python/train_ddp.py under torchrun, 4 ranks: cgx 4-bit
#                             within 1 point of fp32, identical parameters
#   lm_adam2.torchrun4        bench/ddp_lm.py --ci under torchrun, 4 ranks: a small transformer
#                             LM with AdamW; cgx 4-bit and the hook's 2- and 1-bit defaults
#                             within the validation-loss tolerances measured for them
#                             (docs/results/lm-adam.md), identical parameters on every rank
#   store_boot2.torchrun3     python/tests/test_store_bootstrap.py: the device transports'
#                             set-up over the job's Store (_C.StoreBootstrap), on CPU
#   device_choice2            python/tests/test_device_choice.py: CGX_TORCH_DEVICE_TRANSPORT
#                             (host, cuda_ipc, auto) and the Store plan's refusals
#   ddp_device2.torchrun2     python/tests/test_ddp_device.py --device cpu: the DDP check that
#                             scripts/gpu-check runs on CUDA tensors, on CPU ones
#   (cgx_torch2.torchrun3, train_ddp2.torchrun4 and lm_adam2.torchrun4 run under
#   without_mpi.sh: Open MPI and MPICH hidden, as on a machine without MPI)
# The CUDA build of cgx_torch against this venv's torch (the device plans, with MPI) is not
# here: scripts/gpu-rehearsal (scripts/test's stage 2) builds it through `scripts/gpu-check
# --build-only`, from the carried folder's Open MPI and mpi4py with the system's hidden, as
# the GPU machine will (sm_90, host code at -O0), imports it (build_info must say "device
# plans: compiled" and SIMD host kernels) and runs its MPI half at 2 ranks on CPU tensors
# (python/tests/test_mpi_device.py). It was cgx_torch2.build_cuda here, against the system's
# MPI: the same nvcc work twice per CI run.
set(CGX_TORCH2_PYTHON "" CACHE FILEPATH "python of a venv with torch 2.x for cgx_torch's torchrun tests (empty: none)")
if(NOT CGX_TORCH2_PYTHON OR CGX_SANITIZE OR CMAKE_CROSSCOMPILING)
  return()
endif()

set(_t2 ${CMAKE_CURRENT_BINARY_DIR}/cgx_torch2)
# The build, then its metadata (egg_info) beside it: the entry points through which torch
# finds the `cgx` backend with no import (cgx_torch_autoload.py), as an installed package has.
add_test(NAME cgx_torch2.build
         COMMAND ${CMAKE_COMMAND} -E env CGX_TORCH_MPI=0 CGX_TORCH_CUDA=0 CGX_INCLUDE_DIR=${PROJECT_SOURCE_DIR}/include
                 MAX_JOBS=2 sh -c "\"$0\" \"$1\" -q build --build-base \"$2/setup\" --build-lib \"$2/lib\" && cd \"$2/lib\" && \"$0\" \"$1\" -q egg_info --egg-base \"$2/lib\""
                 "${CGX_TORCH2_PYTHON}" ${PROJECT_SOURCE_DIR}/python/setup.py ${_t2})
set_tests_properties(cgx_torch2.build PROPERTIES FIXTURES_SETUP cgx_torch2 LABELS "python;torch2" PROCESSORS 2
                     TIMEOUT 1800)

set(_t2_env PYTHONPATH=${_t2}/lib PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo)
set(_t2_run "${CGX_TORCH2_PYTHON}" -m torch.distributed.run --standalone)
# without_mpi.sh: as on a machine without MPI (as root: Open MPI and MPICH hidden in a
# private mount namespace; the test output's first line says whether they were).
set(_t2_no_mpi ${PROJECT_SOURCE_DIR}/python/tests/without_mpi.sh)
add_test(NAME cgx_torch2.torchrun3
         COMMAND ${_t2_no_mpi} ${_t2_run} --nproc-per-node 3 ${PROJECT_SOURCE_DIR}/python/tests/test_cgx_torch.py)
set_tests_properties(cgx_torch2.torchrun3 PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2" PROCESSORS 3
                     ENVIRONMENT "${_t2_env};CGX_TEST_NO_MPI=1" TIMEOUT 600)
foreach(np 2 3 4)
  add_test(NAME cgx_backend.torchrun${np}
           COMMAND ${_t2_run} --nproc-per-node ${np} ${PROJECT_SOURCE_DIR}/python/tests/test_backend.py)
  set_tests_properties(cgx_backend.torchrun${np} PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                       PROCESSORS ${np} ENVIRONMENT "${_t2_env}" TIMEOUT 600)
endforeach()
# The measured choice of the compressed or the exact path (issue 50): the backend's and the hook's.
foreach(np 2 3)
  add_test(NAME cgx_path.torchrun${np}
           COMMAND ${_t2_run} --nproc-per-node ${np} ${PROJECT_SOURCE_DIR}/python/tests/test_path_choice.py)
  set_tests_properties(cgx_path.torchrun${np} PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                       PROCESSORS ${np} ENVIRONMENT "${_t2_env}" TIMEOUT 600
                       PASS_REGULAR_EXPRESSION "cgx path choice tests: [0-9]+ passed, 0 failed")
endforeach()
add_test(NAME train_ddp2.torchrun4
         COMMAND ${_t2_no_mpi} ${_t2_run} --nproc-per-node 4 ${PROJECT_SOURCE_DIR}/examples/python/train_ddp.py)
set_tests_properties(train_ddp2.torchrun4 PROPERTIES FIXTURES_REQUIRED cgx_torch2
                     LABELS "python;torch2;example;training" PROCESSORS 4 ENVIRONMENT "${_t2_env}" TIMEOUT 900
                     FAIL_REGULAR_EXPRESSION "FAILED")

add_test(NAME lm_adam2.torchrun4
         COMMAND ${_t2_no_mpi} ${_t2_run} --nproc-per-node 4 ${PROJECT_SOURCE_DIR}/bench/ddp_lm.py --ci)
set_tests_properties(lm_adam2.torchrun4 PROPERTIES FIXTURES_REQUIRED cgx_torch2
                     LABELS "python;torch2;training" PROCESSORS 4 ENVIRONMENT "${_t2_env}" TIMEOUT 600
                     FAIL_REGULAR_EXPRESSION "FAILED")

# The device transports' set-up over the job's Store (comm::store_bootstrap behind
# _C.StoreBootstrap), on CPU: a fake NCCL id exchange, same_node, a late rank, unequal lengths.
add_test(NAME store_boot2.torchrun3
         COMMAND ${_t2_no_mpi} ${_t2_run} --nproc-per-node 3 ${PROJECT_SOURCE_DIR}/python/tests/test_store_bootstrap.py)
set_tests_properties(store_boot2.torchrun3 PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2" PROCESSORS 3
                     ENVIRONMENT "${_t2_env}" TIMEOUT 300 PASS_REGULAR_EXPRESSION "test_store_bootstrap: PASS"
                     FAIL_REGULAR_EXPRESSION "FAIL")

# Which transport a group's CUDA tensors take (CGX_TORCH_DEVICE_TRANSPORT), one process.
add_test(NAME device_choice2 COMMAND "${CGX_TORCH2_PYTHON}" ${PROJECT_SOURCE_DIR}/python/tests/test_device_choice.py)
set_tests_properties(device_choice2 PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                     ENVIRONMENT "${_t2_env}" TIMEOUT 120 PASS_REGULAR_EXPRESSION "test_device_choice: PASS"
                     FAIL_REGULAR_EXPRESSION "FAIL")

# python/tests/test_ddp_device.py, which scripts/gpu-check runs on CUDA tensors on a GPU
# machine, here on CPU tensors: the script itself is tested on every CI run.
add_test(NAME ddp_device2.torchrun2
         COMMAND ${_t2_run} --nproc-per-node 2 ${PROJECT_SOURCE_DIR}/python/tests/test_ddp_device.py --device cpu)
set_tests_properties(ddp_device2.torchrun2 PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2" PROCESSORS 2
                     ENVIRONMENT "${_t2_env}" TIMEOUT 300 PASS_REGULAR_EXPRESSION "test_ddp_device: OK"
                     FAIL_REGULAR_EXPRESSION "FAILED")

# Scripts that know nothing of cgx, `--backend cgx` (run_unchanged.py checks their source,
# that the cgx run went through cgx on every rank, and the loss against gloo's in the same run).
set(_t2_tp ${PROJECT_SOURCE_DIR}/python/tests/third_party)
add_test(NAME unchanged.gpt_train4
         COMMAND "${CGX_TORCH2_PYTHON}" ${PROJECT_SOURCE_DIR}/python/tests/run_unchanged.py --nproc 4
                 --metric "val loss" --tol 0.1 -- ${_t2_tp}/gpt_train.py --device=cpu "--backend={backend}"
                 --max_iters=60 --lr_decay_iters=60 --eval_interval=20)
add_test(NAME unchanged.ddp_tutorial2
         COMMAND "${CGX_TORCH2_PYTHON}" ${PROJECT_SOURCE_DIR}/python/tests/run_unchanged.py --nproc 2
                 --metric "rank 0: final loss" --tol 0.02 --expect "parameters identical on every rank: True"
                 -- ${_t2_tp}/ddp_tutorial.py --backend "{backend}")
set_tests_properties(unchanged.gpt_train4 unchanged.ddp_tutorial2 PROPERTIES FIXTURES_REQUIRED cgx_torch2
                     LABELS "python;torch2;training" ENVIRONMENT "${_t2_env}" TIMEOUT 900
                     PASS_REGULAR_EXPRESSION "run_unchanged: OK")
set_tests_properties(unchanged.gpt_train4 PROPERTIES PROCESSORS 4)
set_tests_properties(unchanged.ddp_tutorial2 PROPERTIES PROCESSORS 2)
# The same script when torch's autoloading is off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): torch
# finds `cgx` through its torch.distributed.backends entry point when the group asks for it.
add_test(NAME unchanged.ddp_tutorial2_lazy
         COMMAND "${CGX_TORCH2_PYTHON}" ${PROJECT_SOURCE_DIR}/python/tests/run_unchanged.py --nproc 2
                 --metric "rank 0: final loss" --tol 0.02 --expect "parameters identical on every rank: True"
                 -- ${_t2_tp}/ddp_tutorial.py --backend "{backend}")
set_tests_properties(unchanged.ddp_tutorial2_lazy PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                     ENVIRONMENT "${_t2_env};TORCH_DEVICE_BACKEND_AUTOLOAD=0" TIMEOUT 900 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION "run_unchanged: OK")
# `import torch` registers `cgx` and loads nothing of cgx_torch (the hook is import-light).
add_test(NAME cgx_torch2.autoload_light
         COMMAND "${CGX_TORCH2_PYTHON}" -c "import sys, torch, torch.distributed as d; ok = 'cgx' in d.Backend.backend_list and not any(m.startswith('cgx_torch.') or m == 'cgx_torch' for m in sys.modules); print('autoload:', 'OK' if ok else 'FAILED', sorted(m for m in sys.modules if 'cgx' in m))")
set_tests_properties(cgx_torch2.autoload_light PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                     ENVIRONMENT "${_t2_env}" TIMEOUT 120 PASS_REGULAR_EXPRESSION "autoload: OK")
