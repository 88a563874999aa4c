# Runs an example under --spmd-debug=parity (Note [Parity run] in spmd/debug/parity.h) and requires
# no report: every DTensor it makes agrees with the same program's on one rank, and the run prints
# its summary. Then, with the spmd tool, the value dumps of a sim run and a threads run
# (--spmd-dump-values, Note [Value dumps]) held against each other by `spmd parity` agree too.
# Invoked by spmd_example_parity_test (tests/examples/CMakeLists.txt) as `cmake -DPROGRAM=...
# -DNPROCS=... [-DSPMD_CLI=...] -DDUMP_DIR=... [-DARGS=a|b] -P`.
string(REPLACE "|" ";" args "${ARGS}")

include("${CMAKE_CURRENT_LIST_DIR}/run_digest.cmake")

execute_process(COMMAND ${PROGRAM} ${args} --spmd-world-size=${NPROCS} --spmd-debug=parity
                RESULT_VARIABLE code OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "the parity run failed (exit ${code}):\n${stdout}\n${stderr}")
endif()
if(NOT stderr MATCHES "spmd: parity: [0-9]+ DTensors compared")
  message(FATAL_ERROR "the parity run printed no summary:\n${stderr}")
endif()
string(REGEX MATCH "spmd: parity: [^\n]*" summary "${stderr}")
message(STATUS "${summary}")

if(SPMD_CLI)
  file(REMOVE_RECURSE "${DUMP_DIR}")
  run_digest(sim "sim" ${PROGRAM} ${args} --spmd-world-size=${NPROCS}
             --spmd-dump-values=${DUMP_DIR}/sim)
  run_digest(threads "threads" ${PROGRAM} ${args} --spmd-backend=threads
             --spmd-world-size=${NPROCS} --spmd-dump-values=${DUMP_DIR}/threads)
  execute_process(COMMAND ${SPMD_CLI} parity "${DUMP_DIR}/threads" "${DUMP_DIR}/sim"
                  RESULT_VARIABLE code OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "spmd parity threads sim (exit ${code}):\n${stdout}${stderr}")
  endif()
  message(STATUS "${stdout}")
endif()
