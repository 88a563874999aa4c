# Runs an example under sim and under `spmdrun -n N ... --spmd-backend=nccl` (every rank on the
# machine's one GPU, SPMD_NCCL_SHARE_GPU=1 in the test's environment) and checks that both print
# the same `digest: <hex>` line. Invoked by spmd_example_digest_test as
# `cmake -DPROGRAM=... -DNPROCS=... -DSPMDRUN=... -DGPU_PROBE=... [-DARGS=a|b] -P`; prints
# "SKIPPED: no usable GPU" (the test's SKIP_REGULAR_EXPRESSION) when gpu_probe finds none.
string(REPLACE "|" ";" args "${ARGS}")

execute_process(COMMAND ${GPU_PROBE} RESULT_VARIABLE probe OUTPUT_VARIABLE probe_output)
if(probe EQUAL 77)
  message(STATUS "SKIPPED: no usable GPU: ${probe_output}")
  return()
endif()

function(run_digest out label)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE stdout
                  ERROR_VARIABLE stderr)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${label} run failed (exit ${code}):\n${stdout}\n${stderr}")
  endif()
  string(REGEX MATCHALL "digest: [0-9a-f]+" digests "${stdout}")
  list(LENGTH digests count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "${label} run printed ${count} digest lines, expected 1:\n${stdout}")
  endif()
  set(${out} "${digests}" PARENT_SCOPE)
endfunction()

run_digest(sim "sim" ${PROGRAM} ${args} --spmd-backend=sim --spmd-world-size=${NPROCS})
run_digest(nccl "spmdrun -n ${NPROCS} (nccl)" ${SPMDRUN} -n ${NPROCS} -- ${PROGRAM} ${args}
           --spmd-backend=nccl)
if(NOT sim STREQUAL nccl)
  message(FATAL_ERROR "digests differ: sim ${sim}, nccl on ${NPROCS} ranks ${nccl}")
endif()
message(STATUS "sim and nccl on ${NPROCS} ranks agree: ${sim}")
