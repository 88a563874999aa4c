# Installs the build tree into a fresh prefix, then configures, builds and runs the consumer
# project against it (which loads the installed machine file from SPMDSIM_MACHINES_DIR), and
# checks what its programs link (ldd): `consumer` (spmd::spmd) no CUDA,
# cuBLAS or NCCL; in builds with NCCL, `consumer_nccl` (spmd::nccl too) all three, and its nccl
# driver registered. Then the user test project of docs/testing.md, written from the page's code
# blocks as they stand: find_package(spmdsim COMPONENTS testing), spmd::testing and
# spmd_add_tests; its own ctest must pass every test, 12 per backend (3 SPMD_TESTs x world sizes
# 1, 2, 4, 8) under sim, threads and, in builds with MPI, mpi. Invoked by CTest with
# -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DHAVE_NCCL=0|1 -DHAVE_MPI=0|1.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# The libraries of CUDA, cuBLAS and NCCL that `program` needs at run time, per ldd.
function(gpu_libraries program out)
  execute_process(COMMAND ldd "${program}" RESULT_VARIABLE rc OUTPUT_VARIABLE text)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldd ${program} failed (${rc})")
  endif()
  string(REGEX MATCHALL "lib(cudart|cublas|nccl)[.]so[^ \t]*" found "${text}")
  list(REMOVE_DUPLICATES found)
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

step("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/install/consumer" -B "${WORK_DIR}/build"
     "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release)
step("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")

step("${WORK_DIR}/build/consumer")
if(NOT step_output MATCHES "machine file: H100 SXM5 80GB")
  message(FATAL_ERROR "consumer did not load the installed machines/h100_sxm.device.json:\n${step_output}")
endif()
if(step_output MATCHES "nccl")
  message(FATAL_ERROR "consumer links only spmd::spmd, yet its backends include nccl:\n${step_output}")
endif()
gpu_libraries("${WORK_DIR}/build/consumer" found)
if(found)
  message(FATAL_ERROR "consumer links only spmd::spmd, yet needs ${found} (ldd)")
endif()
message(STATUS "consumer (spmd::spmd): no libcudart, libcublas or libnccl (ldd)")

if(HAVE_NCCL)
  if(NOT EXISTS "${WORK_DIR}/build/consumer_nccl")
    message(FATAL_ERROR "the build has NCCL, but the installed package gave the consumer no spmd::nccl")
  endif()
  step("${WORK_DIR}/build/consumer_nccl")
  if(NOT step_output MATCHES "backends linked: [^\n]*nccl")
    message(FATAL_ERROR "consumer_nccl links spmd::nccl, yet its nccl driver is missing:\n${step_output}")
  endif()
  gpu_libraries("${WORK_DIR}/build/consumer_nccl" found)
  foreach(lib cudart cublas nccl)
    if(NOT found MATCHES "lib${lib}")
      message(FATAL_ERROR "consumer_nccl links spmd::nccl, yet does not need lib${lib} (ldd: ${found})")
    endif()
  endforeach()
  message(STATUS "consumer_nccl (spmd::nccl): ${found} (ldd)")
endif()

# ---- a user's tests: docs/testing.md's example project -------------------------------------------
set(doc "${SOURCE_DIR}/docs/testing.md")
include("${CMAKE_CURRENT_LIST_DIR}/doc_block.cmake")
doc_block(layer "${doc}" cpp "// column_parallel[.]h:[^`]*")
doc_block(tests "${doc}" cpp "// column_parallel_test[.]cpp:[^`]*")
doc_block(lists "${doc}" cmake "cmake_minimum_required[^\n]*\nproject[(]column_parallel [^`]*")
set(project "${WORK_DIR}/column_parallel")
file(WRITE "${project}/column_parallel.h" "${layer}")
file(WRITE "${project}/column_parallel_test.cpp" "${tests}")
file(WRITE "${project}/CMakeLists.txt" "${lists}")
step("${CMAKE_COMMAND}" -S "${project}" -B "${project}/build"
     "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release)
step("${CMAKE_COMMAND}" --build "${project}/build")
execute_process(COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${project}/build" -j 2
                        --output-on-failure
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "ctest of the docs/testing.md project:\n${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "100% tests passed, 0 tests failed out of")
  message(FATAL_ERROR "the docs/testing.md project's tests failed (ctest exit ${rc})")
endif()
set(backends sim threads)
if(HAVE_MPI)
  list(APPEND backends mpi)
endif()
foreach(backend IN LISTS backends)
  if(NOT out MATCHES "\n${backend} +=[^\n]*[(]12 tests[)]")
    message(FATAL_ERROR "the docs/testing.md project ran no 12 tests with label ${backend}")
  endif()
endforeach()
if(NOT HAVE_MPI AND out MATCHES "\nmpi +=")
  message(FATAL_ERROR "this build has no MPI backend, yet the project has mpi tests")
endif()
string(REPLACE ";" ", " backends "${backends}")
message(STATUS "consumer tests ok: 12 per backend (${backends})")
