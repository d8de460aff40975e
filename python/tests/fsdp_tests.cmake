# FSDP2 and DTensor over cgx (torch >= 2.9), in the venv CGX_TORCH2_PYTHON names, under
# torchrun as its users launch it. Included from tests/CMakeLists.txt; uses the extension
# that cgx_torch2.build (python/tests/cgx_torch2_tests.cmake, fixture cgx_torch2) builds.
#
#   fsdp2.torchrun2, fsdp2.torchrun4   python/tests/test_fsdp.py: a fully_shard transformer LM
#       over init_process_group("cgx"), AdamW, 30 steps: FSDP2's reduce-scatters (AVG, and SUM
#       under set_force_sum_reduction_for_comms) within cgx's bound through the backend and
#       through cgx_torch.fsdp.CompressedReduceScatter (over cgx and over gloo); exact all-gather
#       by default; full_tensor() identical on every rank; a torch.distributed.checkpoint round
#       trip; validation loss within 0.05 of the same run over gloo (also bf16
#       MixedPrecisionPolicy and the 8-bit parameter all-gather, whose effect it prints)
set(CGX_TORCH2_PYTHON "" CACHE FILEPATH "python of a venv with torch 2.x for cgx_torch's torchrun tests (empty: none)")
if(NOT CGX_TORCH2_PYTHON OR CGX_SANITIZE OR CMAKE_CROSSCOMPILING)
  return()
endif()

set(_fsdp_env PYTHONPATH=${CMAKE_CURRENT_BINARY_DIR}/cgx_torch2/lib PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
              GLOO_SOCKET_IFNAME=lo)
foreach(np 2 4)
  add_test(NAME fsdp2.torchrun${np}
           COMMAND "${CGX_TORCH2_PYTHON}" -m torch.distributed.run --standalone --nproc-per-node ${np}
                   ${PROJECT_SOURCE_DIR}/python/tests/test_fsdp.py)
  set_tests_properties(fsdp2.torchrun${np} PROPERTIES FIXTURES_REQUIRED cgx_torch2 LABELS "python;torch2"
                       PROCESSORS ${np} ENVIRONMENT "${_fsdp_env}" TIMEOUT 600
                       PASS_REGULAR_EXPRESSION "test_fsdp: PASS" FAIL_REGULAR_EXPRESSION "test_fsdp: FAIL")
endforeach()
