# run_digest(OUT LABEL COMMAND...): runs COMMAND, fails unless it exits 0 and prints exactly one
# `digest: <hex>` line, and sets OUT to that line and OUT_output to everything it printed.
# Included by compare_digests.cmake and compare_digests_nccl.cmake.
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
  set(${out}_output "${stdout}" PARENT_SCOPE)
endfunction()
