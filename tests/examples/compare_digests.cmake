# Runs an example under sim, under threads and under mpirun with --spmd-backend=mpi and checks that
# all print the same `digest: <hex>` line. Invoked by spmd_example_digest_test (tests/examples/CMakeLists.txt)
# as `cmake -DPROGRAM=... -DNPROCS=... -DMPIEXEC=... -DNUMPROC_FLAG=... [-DARGS=a|b] -P` with the
# OpenMPI environment already set.
#
# With -DSPMD_CLI=<spmd> -DTRACE_DIR=<folder> every run also writes its trace (--spmd-trace) and
# `spmd trace diff` must find the threads and mpi traces equal to sim's, record for record: a
# correct program issues the same collectives under every backend.
#
# Every backend runs the example a second time with --spmd-debug=all,types (the checks that backend
# supports, docs/debugging.md, and the SPMD type rules, which `all` includes only under sim): a
# correct program gets no report and the same digest.
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" debug_args "${DEBUG_ARGS}")

include("${CMAKE_CURRENT_LIST_DIR}/run_digest.cmake")

set(sim_trace "")
set(threads_trace "")
set(mpi_trace "")
if(SPMD_CLI)
  file(REMOVE_RECURSE "${TRACE_DIR}")
  file(MAKE_DIRECTORY "${TRACE_DIR}")
  set(sim_trace "--spmd-trace=${TRACE_DIR}/sim.json")
  set(threads_trace "--spmd-trace=${TRACE_DIR}/threads.json")
  set(mpi_trace "--spmd-trace=${TRACE_DIR}/mpi.json")  # mpi.rank0.json, mpi.rank1.json, ...
endif()

# trace_diff(LABEL PATH): `spmd trace diff` of sim's trace and PATH must report no difference.
function(trace_diff label path)
  execute_process(COMMAND ${SPMD_CLI} trace diff "${TRACE_DIR}/sim.json" "${path}"
                  RESULT_VARIABLE code OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "the ${label} trace differs from sim's (spmd trace diff exit ${code}):\n"
                        "${stdout}${stderr}")
  endif()
endfunction()

run_digest(sim "sim" ${PROGRAM} ${args} --spmd-backend=sim --spmd-world-size=${NPROCS} ${sim_trace})
run_digest(threads "threads" ${PROGRAM} ${args} --spmd-backend=threads --spmd-world-size=${NPROCS}
           ${threads_trace})
if(NOT sim STREQUAL threads)
  message(FATAL_ERROR "digests differ: sim ${sim}, threads ${threads}")
endif()
if(SPMD_CLI)
  trace_diff("threads" "${TRACE_DIR}/threads.json")
endif()
# The digest the --spmd-debug=all,types runs must print: sim's, or with DEBUG_ARGS a plain sim run's.
set(reference "${sim}")
if(debug_args)
  run_digest(reference "sim ${debug_args}" ${PROGRAM} ${args} ${debug_args} --spmd-backend=sim
             --spmd-world-size=${NPROCS})
endif()
foreach(backend sim threads)
  run_digest(checked "${backend} --spmd-debug=all,types" ${PROGRAM} ${args} ${debug_args}
             --spmd-backend=${backend} --spmd-world-size=${NPROCS} --spmd-debug=all,types)
  if(NOT reference STREQUAL checked)
    message(FATAL_ERROR "digests differ: sim ${debug_args} ${reference}, ${backend} "
                        "--spmd-debug=all,types ${checked}")
  endif()
endforeach()
if(NOT MPIEXEC)
  message(STATUS "sim ${sim} (no MPI backend in this build)")
  return()
endif()
run_digest(mpi "mpirun -n ${NPROCS}" ${MPIEXEC} ${NUMPROC_FLAG} ${NPROCS} ${PROGRAM} ${args}
           --spmd-backend=mpi ${mpi_trace})
if(NOT sim STREQUAL mpi)
  message(FATAL_ERROR "digests differ: sim ${sim}, mpirun -n ${NPROCS} ${mpi}")
endif()
if(SPMD_CLI)
  trace_diff("mpirun -n ${NPROCS}" "${TRACE_DIR}/mpi.json")
endif()
run_digest(checked "mpirun -n ${NPROCS} --spmd-debug=all,types" ${MPIEXEC} ${NUMPROC_FLAG}
           ${NPROCS} ${PROGRAM} ${args} ${debug_args} --spmd-backend=mpi --spmd-debug=all,types)
if(NOT reference STREQUAL checked)
  message(FATAL_ERROR "digests differ: sim ${debug_args} ${reference}, mpirun -n ${NPROCS} "
                      "--spmd-debug=all,types ${checked}")
endif()
message(STATUS
        "sim, threads and mpirun -n ${NPROCS}, with and without --spmd-debug=all,types, agree: ${sim}")
