# The sanitizer flags travel with the installed targets: configures spmdsim with
# SPMD_SANITIZE=address in a fresh folder (no tests, examples, tools or backends beyond the
# in-process ones), builds only spmd_core, and checks that the export file a `cmake --install`
# would write gives spmd::core the compile and link flags, and that spmd_core was compiled with
# them. Invoked by CTest with -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... [-DLAUNCHER=ccache].
file(REMOVE_RECURSE "${WORK_DIR}")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
set(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DSPMD_SANITIZE=address -DSPMD_WITH_MPI=OFF -DSPMD_WITH_NCCL=OFF
    -DSPMD_BUILD_TESTS=OFF -DSPMD_BUILD_EXAMPLES=OFF -DSPMD_BUILD_BENCH=OFF -DSPMD_BUILD_TOOLS=OFF)
if(LAUNCHER)
  list(APPEND configure "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()
step(${configure})
step("${CMAKE_COMMAND}" --build "${WORK_DIR}" --target spmd_core)

file(GLOB exports "${WORK_DIR}/CMakeFiles/Export/*/spmdsimTargets.cmake")
if(NOT exports)
  message(FATAL_ERROR "no spmdsimTargets.cmake under ${WORK_DIR}/CMakeFiles/Export")
endif()
list(GET exports 0 export)
file(READ "${export}" text)
string(FIND "${text}" "set_target_properties(spmd::core PROPERTIES" start)
if(start LESS 0)
  message(FATAL_ERROR "${export} does not set the properties of spmd::core")
endif()
string(SUBSTRING "${text}" ${start} -1 block)
string(FIND "${block}" "\n)" end)
string(SUBSTRING "${block}" 0 ${end} block)
foreach(property INTERFACE_COMPILE_OPTIONS INTERFACE_LINK_OPTIONS)
  if(NOT block MATCHES "${property} \"[^\n]*-fsanitize=address")
    message(FATAL_ERROR "the installed spmd::core lacks -fsanitize=address in ${property}:\n${block}")
  endif()
endforeach()
message(STATUS "installed spmd::core carries the sanitizer:\n${block}")

file(READ "${WORK_DIR}/compile_commands.json" commands)
if(NOT commands MATCHES "-fsanitize=address[^\n]*spmd/core/check.cpp")
  message(FATAL_ERROR "spmd_core was not compiled with -fsanitize=address")
endif()
message(STATUS "sanitizer flags ok")
