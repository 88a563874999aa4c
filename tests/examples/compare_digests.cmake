# Runs an example under sim, under threads and under mpirun with --spmd-backend=mpi and checks that
# all print the same `digest: <hex>` line. Invoked by spmd_example_digest_test (tests/examples/CMakeLists.txt)
# as `cmake -DPROGRAM=... -DNPROCS=... -DMPIEXEC=... -DNUMPROC_FLAG=... [-DARGS=a|b] -P` with the
# OpenMPI environment already set.
string(REPLACE "|" ";" args "${ARGS}")

include("${CMAKE_CURRENT_LIST_DIR}/run_digest.cmake")

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
