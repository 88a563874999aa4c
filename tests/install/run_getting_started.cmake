# Follows docs/getting-started.md for a project of one's own, step by step as written: its install
# command (with build/release replaced by the build tree under test and $HOME a fresh folder),
# its CMakeLists.txt and first program, then its configure-and-build commands, and runs the
# program. Invoked by CTest with -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=...
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/home" "${WORK_DIR}/train")
set(ENV{HOME} "${WORK_DIR}/home")
set(doc "${SOURCE_DIR}/docs/getting-started.md")
include("${CMAKE_CURRENT_LIST_DIR}/doc_block.cmake")

function(step dir script)
  execute_process(COMMAND sh -ec "${script}" WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "following ${doc} failed (exit ${rc}) at:\n${script}\n${out}\n${err}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

doc_block(install "${doc}" sh "[^`]*cmake --install [^`]*")
string(REPLACE "build/release" "${BUILD_DIR}" install "${install}")
step("${SOURCE_DIR}" "${install}")

doc_block(program "${doc}" cpp "[^`]*int main[^`]*")
doc_block(lists "${doc}" cmake "[^`]*find_package\\(spmdsim[^`]*")
file(WRITE "${WORK_DIR}/train/train.cpp" "${program}")
file(WRITE "${WORK_DIR}/train/CMakeLists.txt" "${lists}")
doc_block(build "${doc}" sh "[^`]*cmake -S [^`]*")
step("${WORK_DIR}/train" "${build}\n./train --spmd-world-size=8\n")
if(NOT output MATCHES "DTensor \\[8, 32\\] f32, S\\(0\\),R")
  message(FATAL_ERROR "the first program of ${doc} printed:\n${output}")
endif()
message(STATUS "getting started ok")
