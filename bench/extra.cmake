# Benchmarks with their own main() (bench/CMakeLists.txt includes this file).

# sim_vs_mpi: a tensor-parallel MLP step under sim vs under mpirun -n 8 --spmd-backend=mpi.
# `cmake --build <build> --target bench_sim_vs_mpi` runs both and prints `mpi_over_sim: <ratio>`.
add_executable(sim_vs_mpi "${CMAKE_CURRENT_SOURCE_DIR}/sim_vs_mpi.cpp")
target_link_libraries(sim_vs_mpi PRIVATE spmd::spmd)
if(SPMD_HAVE_MPI)
  add_custom_target(bench_sim_vs_mpi
    COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/run_sim_vs_mpi.sh" $<TARGET_FILE:sim_vs_mpi>
            "${MPIEXEC_EXECUTABLE}"
    DEPENDS sim_vs_mpi USES_TERMINAL
    COMMENT "sim_vs_mpi under sim and under mpirun -n 8")
endif()

# nccl_bench: the nccl backend at world size 1 (host overhead per call, algbw/busbw); exits 77
# without a GPU. Built with the NCCL backend only.
if(SPMD_HAVE_NCCL)
  add_executable(nccl_bench "${CMAKE_CURRENT_SOURCE_DIR}/nccl.cpp")
  target_link_libraries(nccl_bench PRIVATE spmd::spmd spmd::nccl)
endif()

# dryrun_scale: a 7B-class GPT step as a shape-only dry run from 8 to 16384 ranks (Google
# Benchmark; docs/dry-run.md).
add_executable(dryrun_scale "${CMAKE_CURRENT_SOURCE_DIR}/dryrun_scale.cpp")
target_link_libraries(dryrun_scale PRIVATE spmd::spmd benchmark::benchmark
                      benchmark::benchmark_main)
target_include_directories(dryrun_scale PRIVATE "${PROJECT_SOURCE_DIR}")
