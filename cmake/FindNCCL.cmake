# FindNCCL: locates the NCCL library and header and provides the imported target NCCL::nccl.
#
# Hints (CMake or environment variables): NCCL_ROOT, NCCL_INCLUDE_DIR, NCCL_LIB_DIR. The CUDA
# toolkit folders and a pip wheel's site-packages/nvidia/nccl are searched as well.
# Sets NCCL_FOUND, NCCL_VERSION (parsed from nccl.h, no run step), NCCL_INCLUDE_DIRS,
# NCCL_LIBRARIES.
find_package(NCCL CONFIG QUIET)  # NCCL >= 2.29.7 installs NCCLConfig.cmake
if(TARGET NCCL::nccl)
  set(NCCL_FOUND TRUE)
  return()
endif()

set(_nccl_hints)
foreach(var NCCL_ROOT NCCL_INCLUDE_DIR NCCL_LIB_DIR)
  if(DEFINED ${var})
    list(APPEND _nccl_hints "${${var}}")
  endif()
  if(DEFINED ENV{${var}})
    list(APPEND _nccl_hints "$ENV{${var}}")
  endif()
endforeach()
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR})
endif()
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_EXECUTABLE)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -c
                          "import nvidia.nccl as m; print(list(m.__path__)[0])"
                  OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_nccl_wheel)
    list(APPEND _nccl_hints "${_nccl_wheel}")
  endif()
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH +[0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)" "\\1" _nccl_major "${_nccl_major}")
  string(REGEX REPLACE ".* ([0-9]+)" "\\1" _nccl_minor "${_nccl_minor}")
  string(REGEX REPLACE ".* ([0-9]+)" "\\1" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
  set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
