# A run saved after two steps and resumed for two more on another mesh and backend prints the
# losses of four uninterrupted steps (spmd/nn/checkpoint.h; the example's --save and --load): saved
# under sim on the default mesh, resumed with RESUME_ARGS under sim, under threads, under mpirun
# when MPIEXEC is given, and on one rank (with ONE_ARGS, default --dp 1 --tp 1); saved under threads
# and mpirun, resumed under sim. Invoked by the llama.resume and gpt.resume tests as `cmake
# -DPROGRAM=... -DCKPT_DIR=... -DRESUME_ARGS=a|b [-DONE_ARGS=a|b] [-DMPIEXEC=... -DNUMPROC_FLAG=...]
# -P`.
string(REPLACE "|" ";" resume_args "${RESUME_ARGS}")
if(NOT DEFINED ONE_ARGS)
  set(ONE_ARGS "--dp|1|--tp|1")
endif()
string(REPLACE "|" ";" one_args "${ONE_ARGS}")

# The loss lines of steps 2 and 3 ("   2      5.0789338745 ...": the step and the mesh's loss).
function(losses out label)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE stdout
                  ERROR_VARIABLE stderr)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${label} failed (exit ${code}):\n${stdout}\n${stderr}")
  endif()
  string(REGEX MATCHALL "\n +[23]  +[0-9.]+" lines "${stdout}")
  list(LENGTH lines count)
  if(NOT count EQUAL 2)
    message(FATAL_ERROR "${label} printed ${count} loss lines for steps 2 and 3:\n${stdout}")
  endif()
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${CKPT_DIR}")
losses(whole "four steps" ${PROGRAM} --steps 4)
execute_process(COMMAND ${PROGRAM} --steps 2 --save ${CKPT_DIR} RESULT_VARIABLE code
                OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "the save run failed (exit ${code}):\n${stdout}\n${stderr}")
endif()
set(runs "sim" "threads")
losses(sim "resumed under sim" ${PROGRAM} --steps 2 --load ${CKPT_DIR} ${resume_args})
losses(threads "resumed under threads" ${PROGRAM} --steps 2 --load ${CKPT_DIR} ${resume_args}
       --spmd-backend=threads)
losses(one "resumed on one rank" ${PROGRAM} --steps 2 --load ${CKPT_DIR} ${one_args}
       --spmd-world-size=1)
if(MPIEXEC)
  list(APPEND runs "mpi")
  losses(mpi "resumed under mpirun" ${MPIEXEC} ${NUMPROC_FLAG} 8 ${PROGRAM} --steps 2 --load
         ${CKPT_DIR} ${resume_args} --spmd-backend=mpi)
endif()
list(APPEND runs "one")
# Saved by rank threads (each writing its own files) and, with MPI, by processes; resumed under sim.
foreach(saver IN ITEMS threads mpi)
  if(saver STREQUAL "mpi" AND NOT MPIEXEC)
    continue()
  endif()
  set(dir "${CKPT_DIR}-${saver}")
  file(REMOVE_RECURSE "${dir}")
  if(saver STREQUAL "mpi")
    set(save_command ${MPIEXEC} ${NUMPROC_FLAG} 8 ${PROGRAM} --spmd-backend=mpi)
  else()
    set(save_command ${PROGRAM} --spmd-backend=threads)
  endif()
  execute_process(COMMAND ${save_command} --steps 2 --save ${dir} RESULT_VARIABLE code
                  OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "the save under ${saver} failed (exit ${code}):\n${stdout}\n${stderr}")
  endif()
  losses(from_${saver} "saved under ${saver}, resumed under sim" ${PROGRAM} --steps 2 --load
         ${dir} ${resume_args})
  list(APPEND runs "from_${saver}")
endforeach()
foreach(run IN LISTS runs)
  if(NOT "${${run}}" STREQUAL "${whole}")
    message(FATAL_ERROR "resumed (${run}):${${run}}\nuninterrupted:${whole}")
  endif()
endforeach()
message(STATUS "resumed on ${RESUME_ARGS} (${runs}): the losses of the uninterrupted "
               "run:${whole}")
