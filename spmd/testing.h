// spmd/testing.h: GoogleTest for SPMD code (target spmd::testing). A test body is written once and
// runs under sim, threads and mpi; the assertions compare whole DTensors and say where they differ.
//
//   #include <spmd/spmd.h>
//   #include <spmd/testing.h>
//   using namespace spmd;
//
//   SPMD_TEST(Matmul, ColumnShardedWeight) {      // `world`: the World of this run's backend
//     DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
//     DTensor x = distribute_tensor(randn({8, 16}, 1), mesh, {Replicate{}});
//     DTensor w = distribute_tensor(randn({16, 32}, 2), mesh, {Shard{1}});
//     DTensor y = matmul(x, w);
//     EXPECT_PLACEMENTS(y, "S(1)");
//     EXPECT_DTENSOR_NEAR(y, matmul(randn({8, 16}, 1), randn({16, 32}, 2)), 1e-5);
//   }
//
// In CMake (docs/testing.md has the whole example):
//
//   find_package(spmdsim REQUIRED)
//   add_executable(my_tests my_tests.cpp)
//   target_link_libraries(my_tests PRIVATE spmd::spmd spmd::testing)   # brings main()
//   enable_testing()
//   spmd_add_tests(my_tests BACKENDS sim threads mpi WORLD_SIZES 4 8)  # one CTest test each
//
// spmd/testing/spmd_test.h: SPMD_TEST, the test world, run_all_tests (main).
// spmd/testing/assertions.h: EXPECT_DTENSOR_EQ/NEAR, EXPECT_PLACEMENTS, EXPECT_REPLICATED,
// expect_throws.
#pragma once

#include <spmd/testing/assertions.h>
#include <spmd/testing/spmd_test.h>
