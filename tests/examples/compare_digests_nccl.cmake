# Runs an example under sim and under `spmdrun -n N ... --spmd-backend=nccl` (every rank on the
# machine's one GPU, SPMD_NCCL_SHARE_GPU=1 in the test's environment) and checks that both print
# the same `digest: <hex>` line or, with -DCHECK_LINE=ON, that the nccl run prints the example's
# own `check: PASS` line (its floating math rounds differently on the GPU: cuBLAS, NCCL's
# bracketing). Invoked by spmd_example_digest_test as `cmake -DPROGRAM=... -DNPROCS=...
# -DSPMDRUN=... -DGPU_PROBE=... [-DARGS=a|b] [-DCHECK_LINE=ON] -P`; prints "SKIPPED: no usable
# GPU" (the test's SKIP_REGULAR_EXPRESSION) when gpu_probe finds none.
string(REPLACE "|" ";" args "${ARGS}")

execute_process(COMMAND ${GPU_PROBE} RESULT_VARIABLE probe OUTPUT_VARIABLE probe_output)
if(probe EQUAL 77)
  message(STATUS "SKIPPED: no usable GPU: ${probe_output}")
  return()
endif()

include("${CMAKE_CURRENT_LIST_DIR}/run_digest.cmake")

run_digest(sim "sim" ${PROGRAM} ${args} --spmd-backend=sim --spmd-world-size=${NPROCS})
run_digest(nccl "spmdrun -n ${NPROCS} (nccl)" ${SPMDRUN} -n ${NPROCS} -- ${PROGRAM} ${args}
           --spmd-backend=nccl)
if(CHECK_LINE)
  if(NOT nccl_output MATCHES "check: PASS")
    message(FATAL_ERROR "nccl on ${NPROCS} ranks did not print `check: PASS`:\n${nccl_output}")
  endif()
  message(STATUS "nccl on ${NPROCS} ranks passes its check (sim ${sim}, nccl ${nccl})")
  return()
endif()
if(NOT sim STREQUAL nccl)
  message(FATAL_ERROR "digests differ: sim ${sim}, nccl on ${NPROCS} ranks ${nccl}")
endif()
message(STATUS "sim and nccl on ${NPROCS} ranks agree: ${sim}")
