# SpmdTesting: spmd_add_tests(), which registers the tests of a program linking spmd::testing with
# CTest: every SPMD_TEST once per backend and world size, so `ctest` runs a suite under sim, threads
# and mpi. Installed with the package (spmdsimConfig.cmake includes it); spmdsim's own tests use it
# too (tests/CMakeLists.txt).
#
#   spmd_add_tests(TARGET [BACKENDS sim threads mpi] [WORLD_SIZES 4 8] [ARGS arg...]
#                  [TIMEOUT seconds] [LABELS label...] [ENVIRONMENT VAR=value...]
#                  [TEST_PREFIX prefix] [BATCH])
#
# Each SPMD_TEST Suite.Name of TARGET becomes one CTest test per backend and world size,
# <prefix>Suite.Name/<backend>/<size>, labelled with the backend's name (and LABELS), running
# `TARGET ARGS --gtest_filter=Suite.Name`:
#   sim      with SPMD_BACKEND=sim SPMD_WORLD_SIZE=<size>: one world holding every rank
#   threads  with SPMD_BACKEND=threads SPMD_WORLD_SIZE=<size>: the body once per rank thread
#   mpi      under `mpiexec -n <size>` (FindMPI's MPIEXEC_* variables) with SPMD_BACKEND=mpi,
#            SPMD_WORLD_SIZE=<size> and SPMD_MPI_TEST_ENVIRONMENT, PROCESSORS <size>, and
#            MPIEXEC_TIMEOUT 10 s before TIMEOUT; only where the package has its mpi backend
#            (spmd::backend_mpi) and an mpiexec was found, else left out with a note when
#            configuring
# The program's other tests (TEST, TEST_F, ...) run once each, as <prefix>Suite.Name with
# SPMD_BACKEND=sim and label sim, when BACKENDS has sim. Defaults: BACKENDS sim threads mpi,
# WORLD_SIZES 4, TIMEOUT 300. ENVIRONMENT is added to every test's. A --gtest_filter in ARGS
# selects which tests are registered at all. BATCH: one CTest test per backend and world size,
# <prefix>TARGET/<backend>/<size>, running all of TARGET's SPMD_TESTs in one process (one mpirun
# job instead of one per test: faster for a large suite, coarser when one fails).
#
# Every registered program is a dependency of the aggregate target spmd_tests_<label> of each of
# its labels: `cmake --build . --target spmd_tests_threads && ctest -L threads` builds only what
# those tests run.
#
# The tests are listed when ctest runs, not when the program is built (like
# gtest_discover_tests(... DISCOVERY_MODE PRE_TEST)): ctest runs `TARGET ARGS --spmd-list-tests`
# (run_all_tests in spmd/testing/spmd_test.h) whenever the program is newer than the list. Until
# TARGET is built it is one test, TARGET_NOT_BUILT, with the backends' labels, that fails naming
# the missing program.

# The OpenMPI environment of the mpi tests: mpirun allowed as root (containers), more ranks than
# cores, and shared memory that works in containers. Set it before spmd_add_tests() to change it.
if(NOT DEFINED SPMD_MPI_TEST_ENVIRONMENT)
  set(SPMD_MPI_TEST_ENVIRONMENT
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
      OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader)
endif()
set_property(GLOBAL PROPERTY SPMD_TESTING_DISCOVER_SCRIPT
             "${CMAKE_CURRENT_LIST_DIR}/SpmdTestingDiscover.cmake")

function(spmd_add_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 T "BATCH" "TIMEOUT;TEST_PREFIX"
                        "BACKENDS;WORLD_SIZES;ARGS;LABELS;ENVIRONMENT")
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "spmd_add_tests(${target}): unknown arguments ${T_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "spmd_add_tests(${target}): no target named ${target}")
  endif()
  if(NOT DEFINED T_BACKENDS)
    set(T_BACKENDS sim threads mpi)
  endif()
  if(NOT DEFINED T_WORLD_SIZES)
    set(T_WORLD_SIZES 4)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(backend IN LISTS T_BACKENDS)
    if(NOT backend MATCHES "^(sim|threads|mpi)$")
      message(FATAL_ERROR "spmd_add_tests(${target}): BACKENDS has '${backend}'; the backends are "
                          "sim, threads and mpi")
    endif()
  endforeach()
  foreach(size IN LISTS T_WORLD_SIZES)
    if(NOT size MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "spmd_add_tests(${target}): WORLD_SIZES has '${size}', which is not a "
                          "positive integer")
    endif()
  endforeach()
  if("mpi" IN_LIST T_BACKENDS)
    set(no_mpi "")
    if(NOT TARGET spmd::backend_mpi)
      set(no_mpi "this spmdsim was built without its mpi backend")
    elseif(NOT MPIEXEC_EXECUTABLE)
      set(no_mpi "no mpiexec was found (MPIEXEC_EXECUTABLE)")
    endif()
    if(no_mpi)
      list(REMOVE_ITEM T_BACKENDS mpi)
      message(STATUS "spmd_add_tests(${target}): no mpi tests: ${no_mpi}")
    endif()
  endif()

  # spmd_tests_<label>: one aggregate target per label (each backend, each of LABELS) that builds
  # every program registered with it, so `cmake --build . --target spmd_tests_threads` builds what
  # `ctest -L threads` runs and no more.
  foreach(label IN LISTS T_BACKENDS T_LABELS)
    if(NOT TARGET spmd_tests_${label})
      add_custom_target(spmd_tests_${label})
    endif()
    add_dependencies(spmd_tests_${label} ${target})
  endforeach()

  # One list file per call (a target may be registered several times, e.g. with other ARGS).
  get_property(calls TARGET ${target} PROPERTY SPMD_ADD_TESTS_CALLS)
  if(NOT calls)
    set(calls 0)
  endif()
  math(EXPR calls "${calls} + 1")
  set_property(TARGET ${target} PROPERTY SPMD_ADD_TESTS_CALLS ${calls})
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${target}_spmd_tests_${calls}")
  get_property(script GLOBAL PROPERTY SPMD_TESTING_DISCOVER_SCRIPT)
  math(EXPR mpiexec_timeout "${T_TIMEOUT} - 10")
  if(mpiexec_timeout LESS 1)
    set(mpiexec_timeout 1)
  endif()
  set(not_built_labels ${T_BACKENDS} ${T_LABELS})
  get_property(multi_config GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(multi_config)
    set(list_file "${base}_list-$<CONFIG>.cmake")
  else()
    set(list_file "${base}_list.cmake")
  endif()
  # Bracket arguments keep every value as written; lists stay lists.
  set(content "# Generated by spmd_add_tests(${target}) (SpmdTesting.cmake); included by ctest.
set(_spmd_exe [==[$<TARGET_FILE:${target}>]==])
set(_spmd_list [==[${list_file}]==])
if(NOT EXISTS \"\${_spmd_exe}\")
  add_test([==[${target}_NOT_BUILT]==] \"\${_spmd_exe}\")
  set_tests_properties([==[${target}_NOT_BUILT]==] PROPERTIES LABELS [==[${not_built_labels}]==])
  return()
endif()
if(NOT EXISTS \"\${_spmd_list}\" OR \"\${_spmd_exe}\" IS_NEWER_THAN \"\${_spmd_list}\"
   OR \"\${CMAKE_CURRENT_LIST_FILE}\" IS_NEWER_THAN \"\${_spmd_list}\"
   OR [==[${script}]==] IS_NEWER_THAN \"\${_spmd_list}\")
  include([==[${script}]==])
  set(_spmd_backends [==[${T_BACKENDS}]==])
  set(_spmd_sizes [==[${T_WORLD_SIZES}]==])
  set(_spmd_args [==[${T_ARGS}]==])
  set(_spmd_labels [==[${T_LABELS}]==])
  set(_spmd_env [==[${T_ENVIRONMENT}]==])
  set(_spmd_mpi_env [==[${SPMD_MPI_TEST_ENVIRONMENT}]==])
  set(_spmd_preflags [==[${MPIEXEC_PREFLAGS}]==])
  set(_spmd_postflags [==[${MPIEXEC_POSTFLAGS}]==])
  spmd_testing_discover(TARGET [==[${target}]==] EXECUTABLE \"\${_spmd_exe}\"
    OUTPUT \"\${_spmd_list}\" PREFIX [==[${T_TEST_PREFIX}]==] TIMEOUT ${T_TIMEOUT}
    MPIEXEC [==[${MPIEXEC_EXECUTABLE}]==] NUMPROC_FLAG [==[${MPIEXEC_NUMPROC_FLAG}]==]
    MPIEXEC_TIMEOUT ${mpiexec_timeout} BATCH [==[${T_BATCH}]==]
    BACKENDS \${_spmd_backends} WORLD_SIZES \${_spmd_sizes} ARGS \${_spmd_args}
    LABELS \${_spmd_labels} ENVIRONMENT \${_spmd_env} MPI_ENVIRONMENT \${_spmd_mpi_env}
    PREFLAGS \${_spmd_preflags} POSTFLAGS \${_spmd_postflags})
endif()
include(\"\${_spmd_list}\")
")
  if(multi_config)
    file(GENERATE OUTPUT "${base}_include-$<CONFIG>.cmake" CONTENT "${content}")
    file(WRITE "${base}_include.cmake"
         "include(\"${base}_include-\${CTEST_CONFIGURATION_TYPE}.cmake\")\n")
  else()
    file(GENERATE OUTPUT "${base}_include.cmake" CONTENT "${content}")
  endif()
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${base}_include.cmake")
endfunction()
