# Runs an example under sim and as a shape-only dry run (--spmd-tensors=meta, Note [Shape-only
# tensors] in spmd/tensor/meta.h), both writing their trace, and requires `spmd trace diff` to find
# the two equal record for record: the dry run issues every collective of the real run, over the
# same groups, with the same shapes, dtypes and source lines. Invoked by spmd_example_meta_test
# (tests/examples/CMakeLists.txt) as `cmake -DPROGRAM=... -DNPROCS=... -DSPMD_CLI=...
# -DTRACE_DIR=... [-DARGS=a|b] -P`.
string(REPLACE "|" ";" args "${ARGS}")

include("${CMAKE_CURRENT_LIST_DIR}/run_digest.cmake")

file(REMOVE_RECURSE "${TRACE_DIR}")
file(MAKE_DIRECTORY "${TRACE_DIR}")
run_digest(sim "sim" ${PROGRAM} ${args} --spmd-backend=sim --spmd-world-size=${NPROCS}
           --spmd-trace=${TRACE_DIR}/sim.json)
run_digest(meta "sim --spmd-tensors=meta" ${PROGRAM} ${args} --spmd-backend=sim
           --spmd-world-size=${NPROCS} --spmd-tensors=meta --spmd-trace=${TRACE_DIR}/meta.json)
if(NOT meta_output MATCHES "shape digest: [0-9a-f]+")
  message(FATAL_ERROR "the dry run printed no shape digest:\n${meta_output}")
endif()
execute_process(COMMAND ${SPMD_CLI} trace diff "${TRACE_DIR}/sim.json" "${TRACE_DIR}/meta.json"
                RESULT_VARIABLE code OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "the dry run's trace differs from sim's (spmd trace diff exit ${code}):\n"
                      "${stdout}${stderr}")
endif()
message(STATUS "sim and --spmd-tensors=meta issue the same collectives")
