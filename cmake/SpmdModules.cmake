# SpmdModules: the modules of spmdsim as link targets, and the rule between them.
#
# Every module is one library, spmd_<name> (installed as spmd::<name>), built from its folder(s).
# The list below is ordered lowest first, and it is the only place that order is written: a
# module includes and links only modules before it (tests/layering checks both), and it links the
# nearest module before it that is not a backend, so a new module slots in with one line here
# plus its folder's CMakeLists.txt (which adds its sources to spmd_<name>).
#
#   spmd_module(NAME FOLDER... [BACKEND name] [IF var] [OPTION var] [USES module...] [SEPARATE])
#
#   FOLDER    source folders, relative to the repository root; headers install under
#             <prefix>/include/<FOLDER minus its leading "spmd/"> as <spmd/...>
#   BACKEND   the module is the driver and backend named `name` (world/backend_driver.h). Nothing
#             includes or links a backend but the modules naming it in USES: programs get
#             backends through spmd::spmd or, for SEPARATE ones, their own target. Linking a
#             backend keeps its driver (LINKER:-u,spmd_backend_driver_<name>).
#   IF        built only when this variable is true when spmd_add_modules() runs (a backend whose
#             dependencies were found)
#   OPTION    the cache option that builds it, named in "this build has no X backend" errors
#   USES      modules before it, besides the layer below, that it includes and links
#   SEPARATE  not part of the umbrella spmd::spmd; a program links spmd::<name> to get it
#
# A file belongs to the module whose folder is the longest prefix of its path (spmd/tensor/cuda is
# nccl's, not tensor's); spmd/<name>.h beside the folders is module <name>'s one-include header
# (spmd/testing.h), as spmd/spmd.h is the umbrella's.
set(SPMD_MODULES)

function(spmd_module name)
  cmake_parse_arguments(M "SEPARATE" "BACKEND;IF;OPTION" "USES" ${ARGN})
  if(NOT M_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "spmd_module(${name}): no folder given")
  endif()
  foreach(used IN LISTS M_USES)
    if(NOT used IN_LIST SPMD_MODULES)
      message(FATAL_ERROR "spmd_module(${name}): USES ${used}, which is not a module before it")
    endif()
  endforeach()
  set(SPMD_MODULES ${SPMD_MODULES} ${name} PARENT_SCOPE)
  set(SPMD_MODULE_${name}_FOLDERS "${M_UNPARSED_ARGUMENTS}" PARENT_SCOPE)
  set(SPMD_MODULE_${name}_BACKEND "${M_BACKEND}" PARENT_SCOPE)
  set(SPMD_MODULE_${name}_OPTION "${M_OPTION}" PARENT_SCOPE)
  set(SPMD_MODULE_${name}_USES "${M_USES}" PARENT_SCOPE)
  set(SPMD_MODULE_${name}_SEPARATE ${M_SEPARATE} PARENT_SCOPE)
  set(SPMD_MODULE_${name}_IF "${M_IF}" PARENT_SCOPE)
endfunction()

# ---- the modules, lowest first ---------------------------------------------------------------
spmd_module(core            spmd/core)
spmd_module(tensor          spmd/tensor)
spmd_module(ops             spmd/ops)
spmd_module(world           spmd/world spmd/sim)
spmd_module(mesh            spmd/mesh)
spmd_module(collectives     spmd/collectives)
spmd_module(backend_sim     spmd/backends/sim     BACKEND sim)
spmd_module(backend_threads spmd/backends/threads BACKEND threads)
spmd_module(backend_mpi     spmd/backends/mpi     BACKEND mpi
            IF SPMD_HAVE_MPI OPTION SPMD_WITH_MPI)
spmd_module(nccl            spmd/backends/nccl spmd/tensor/cuda BACKEND nccl
            IF SPMD_HAVE_NCCL OPTION SPMD_WITH_NCCL USES backend_mpi SEPARATE)
spmd_module(dtensor         spmd/dtensor)
spmd_module(nn              spmd/nn)
spmd_module(pipeline        spmd/pipeline)
spmd_module(debug           spmd/debug)
spmd_module(runtime         spmd/runtime)
spmd_module(testing         spmd/testing          IF SPMD_HAVE_GTEST SEPARATE)

# spmd_add_modules(): creates spmd_<name> for every built module, in order, links it to the
# layer below and its USES, then adds its folders (whose CMakeLists.txt add the sources). Also
# sets SPMD_MODULE_<name>_BUILT, SPMD_BUILT_MODULES and SPMD_BACKEND_CATALOG (the backend list of
# spmd/config.h) in the caller's scope.
macro(spmd_add_modules)
  foreach(_m IN LISTS SPMD_MODULES)
    set(SPMD_MODULE_${_m}_BUILT TRUE)
    if(SPMD_MODULE_${_m}_IF AND NOT ${SPMD_MODULE_${_m}_IF})
      set(SPMD_MODULE_${_m}_BUILT FALSE)
    endif()
  endforeach()
  set(SPMD_BUILT_MODULES)
  set(SPMD_BACKEND_CATALOG)
  set(_spmd_layer "")
  foreach(_m IN LISTS SPMD_MODULES)
    if(SPMD_MODULE_${_m}_BACKEND)
      set(_spmd_users_target spmd::spmd)
      if(SPMD_MODULE_${_m}_SEPARATE)
        set(_spmd_users_target spmd::${_m})
      endif()
      if(SPMD_MODULE_${_m}_BUILT)
        set(_spmd_built 1)
      else()
        set(_spmd_built 0)
      endif()
      string(APPEND SPMD_BACKEND_CATALOG
             " X(\"${SPMD_MODULE_${_m}_BACKEND}\", \"${_spmd_users_target}\", "
             "\"${SPMD_MODULE_${_m}_OPTION}\", ${_spmd_built})")
    endif()
    if(NOT SPMD_MODULE_${_m}_BUILT)
      continue()
    endif()
    list(APPEND SPMD_BUILT_MODULES ${_m})
    add_library(spmd_${_m})
    add_library(spmd::${_m} ALIAS spmd_${_m})
    set_target_properties(spmd_${_m} PROPERTIES EXPORT_NAME ${_m} POSITION_INDEPENDENT_CODE ON)
    target_compile_options(spmd_${_m} PRIVATE
      "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wno-unused-parameter>")
    if(_spmd_layer)
      target_link_libraries(spmd_${_m} PUBLIC spmd_${_spmd_layer})
    endif()
    foreach(_used IN LISTS SPMD_MODULE_${_m}_USES)
      if(SPMD_MODULE_${_used}_BUILT)
        target_link_libraries(spmd_${_m} PUBLIC spmd_${_used})
      endif()
    endforeach()
    if(SPMD_MODULE_${_m}_BACKEND)
      # Note [Backend drivers] (world/backend_driver.h): keeps the driver's object file.
      target_link_options(spmd_${_m} INTERFACE
        "LINKER:-u,spmd_backend_driver_${SPMD_MODULE_${_m}_BACKEND}")
    else()
      set(_spmd_layer ${_m})
    endif()
    foreach(_folder IN LISTS SPMD_MODULE_${_m}_FOLDERS)
      add_subdirectory(${_folder})
    endforeach()
  endforeach()
endmacro()

# spmd_install_module_headers(): installs every module's headers under include/spmd/..., each
# folder without the subfolders that belong to another module, and a module's spmd/<name>.h.
function(spmd_install_module_headers)
  set(all_folders)
  foreach(m IN LISTS SPMD_MODULES)
    list(APPEND all_folders ${SPMD_MODULE_${m}_FOLDERS})
  endforeach()
  foreach(m IN LISTS SPMD_BUILT_MODULES)
    foreach(folder IN LISTS SPMD_MODULE_${m}_FOLDERS)
      set(excludes)
      foreach(other IN LISTS all_folders)
        string(FIND "${other}" "${folder}/" at)
        if(at EQUAL 0)
          list(APPEND excludes REGEX "/${other}$" EXCLUDE)
        endif()
      endforeach()
      string(REGEX REPLACE "^spmd/" "" installed "${folder}")
      install(DIRECTORY ${folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/spmd/${installed}
              FILES_MATCHING PATTERN "*.h" ${excludes})
    endforeach()
    if(EXISTS "${PROJECT_SOURCE_DIR}/spmd/${m}.h")
      install(FILES spmd/${m}.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/spmd)
    endif()
  endforeach()
endfunction()

# spmd_write_layering_file(FILE): the module list, folders and rules, and each module target's
# link libraries as configured, for tests/layering/check_layering.py; beside it
# <FILE stem>_libraries.txt, each built module's library file. Called at the end of the top-level
# CMakeLists.txt, after every folder could have added links.
function(spmd_write_layering_file file)
  set(json "{\n  \"modules\": [")
  set(sep "")
  foreach(m IN LISTS SPMD_MODULES)
    set(links "")
    if(SPMD_MODULE_${m}_BUILT)
      get_target_property(direct spmd_${m} LINK_LIBRARIES)
      get_target_property(interface spmd_${m} INTERFACE_LINK_LIBRARIES)
      foreach(list_name direct interface)
        if(${list_name})
          list(APPEND links ${${list_name}})
        endif()
      endforeach()
    endif()
    string(APPEND json "${sep}\n    {\"name\": \"${m}\", \"target\": \"spmd_${m}\", "
           "\"folders\": [")
    set(fsep "")
    foreach(folder IN LISTS SPMD_MODULE_${m}_FOLDERS)
      string(APPEND json "${fsep}\"${folder}\"")
      set(fsep ", ")
    endforeach()
    set(is_backend false)
    if(SPMD_MODULE_${m}_BACKEND)
      set(is_backend true)
    endif()
    set(separate false)
    if(SPMD_MODULE_${m}_SEPARATE)
      set(separate true)
    endif()
    set(built false)
    if(SPMD_MODULE_${m}_BUILT)
      set(built true)
    endif()
    string(APPEND json "], \"backend\": ${is_backend}, \"separate\": ${separate}, "
           "\"built\": ${built}, \"uses\": [")
    set(usep "")
    foreach(used IN LISTS SPMD_MODULE_${m}_USES)
      string(APPEND json "${usep}\"${used}\"")
      set(usep ", ")
    endforeach()
    string(APPEND json "], \"links\": [")
    set(lsep "")
    foreach(link IN LISTS links)
      string(REPLACE "\\" "\\\\" link "${link}")
      string(REPLACE "\"" "\\\"" link "${link}")
      string(APPEND json "${lsep}\"${link}\"")
      set(lsep ", ")
    endforeach()
    string(APPEND json "]}")
    set(sep ",")
  endforeach()
  get_target_property(umbrella spmd INTERFACE_LINK_LIBRARIES)
  string(APPEND json "\n  ],\n  \"umbrella\": {\"target\": \"spmd\", \"links\": [")
  set(lsep "")
  foreach(link IN LISTS umbrella)
    string(REPLACE "\"" "\\\"" link "${link}")
    string(APPEND json "${lsep}\"${link}\"")
    set(lsep ", ")
  endforeach()
  string(APPEND json "]}\n}\n")
  file(WRITE "${file}" "${json}")
  # The built library of each module, for the symbol check (known only at generate time).
  set(libraries "")
  foreach(m IN LISTS SPMD_BUILT_MODULES)
    string(APPEND libraries "${m}=$<TARGET_FILE:spmd_${m}>\n")
  endforeach()
  get_filename_component(dir "${file}" DIRECTORY)
  get_filename_component(stem "${file}" NAME_WE)
  file(GENERATE OUTPUT "${dir}/${stem}_libraries.txt" CONTENT "${libraries}")
endfunction()
