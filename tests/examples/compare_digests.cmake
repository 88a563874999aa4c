# Runs an example under sim, under threads and under mpirun with --spmd-backend=mpi and checks that
# all print the same `digest: <hex>` line. Invoked by spmd_example_digest_test (tests/examples/CMakeLists.txt)
# as `cmake -DPROGRAM=... -DNPROCS=... -DMPIEXEC=... -DNUMPROC_FLAG=... [-DARGS=a|b] -P` with the
# OpenMPI environment already set.
string(REPLACE "|" ";" args "${ARGS}")

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
run_digest(threads "threads" ${PROGRAM} ${args} --spmd-backend=threads --spmd-world-size=${NPROCS})
if(NOT sim STREQUAL threads)
  message(FATAL_ERROR "digests differ: sim ${sim}, threads ${threads}")
endif()
if(NOT MPIEXEC)
  message(STATUS "sim ${sim} (no MPI backend in this build)")
  return()
endif()
run_digest(mpi "mpirun -n ${NPROCS}" ${MPIEXEC} ${NUMPROC_FLAG} ${NPROCS} ${PROGRAM} ${args}
           --spmd-backend=mpi)
if(NOT sim STREQUAL mpi)
  message(FATAL_ERROR "digests differ: sim ${sim}, mpirun -n ${NPROCS} ${mpi}")
endif()
message(STATUS "sim, threads and mpirun -n ${NPROCS} agree: ${sim}")
