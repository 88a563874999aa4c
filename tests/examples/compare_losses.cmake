# Two runs of an example agree step by step within a tolerance: its loss table's first loss column
# (the first mesh run's) with ARGS and with ARGS plus OTHER_ARGS, both runs passing their own check
# against one device. Invoked by the gpt.accumulate and llama.accumulate tests (--accumulate 2
# against none: docs/training.md, "Gradient accumulation") as
# `cmake -DPROGRAM=... -DARGS=a|b -DOTHER_ARGS=c|d -DTOLERANCE_E10=10 -P` (the tolerance in units
# of 1e-10, the table's last printed digit).
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" other_args "${OTHER_ARGS}")

# The loss column of a run ("   3      5.0789338745 ...": the step, then the first run's loss).
function(step_losses out label)
  execute_process(COMMAND ${PROGRAM} ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE stdout
                  ERROR_VARIABLE stderr)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${label} failed (exit ${code}):\n${stdout}\n${stderr}")
  endif()
  if(NOT stdout MATCHES "\ncheck: PASS")
    message(FATAL_ERROR "${label} did not pass its own check:\n${stdout}")
  endif()
  string(FIND "${stdout}" "== loss per step" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${label} printed no loss table:\n${stdout}")
  endif()
  string(SUBSTRING "${stdout}" ${at} -1 table)
  string(REGEX MATCHALL "\n +[0-9]+  +[0-9]+\\.[0-9]+" rows "${table}")
  set(values "")
  foreach(row IN LISTS rows)
    string(REGEX REPLACE "\n +[0-9]+  +" "" value "${row}")
    list(APPEND values "${value}")
  endforeach()
  set(${out} "${values}" PARENT_SCOPE)
endfunction()

step_losses(a "${PROGRAM} ${ARGS}" ${args})
step_losses(b "${PROGRAM} ${ARGS} ${OTHER_ARGS}" ${args} ${other_args})
list(LENGTH a n)
list(LENGTH b m)
if(n EQUAL 0 OR NOT n EQUAL m)
  message(FATAL_ERROR "loss tables of ${n} and ${m} steps")
endif()
math(EXPR last "${n} - 1")
set(worst 0)
foreach(i RANGE ${last})
  list(GET a ${i} x)
  list(GET b ${i} y)
  # CMake's math is integer: the table prints 10 decimals, so compare in units of 1e-10.
  string(REPLACE "." "" xi "${x}")
  string(REPLACE "." "" yi "${y}")
  math(EXPR diff "${xi} - ${yi}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  if(diff GREATER worst)
    set(worst ${diff})
  endif()
  if(diff GREATER TOLERANCE_E10)
    message(FATAL_ERROR "step ${i}: loss ${y} with ${OTHER_ARGS}, ${x} without: beyond "
                        "${TOLERANCE_E10}e-10")
  endif()
endforeach()
message(STATUS "${OTHER_ARGS}: every one of ${n} steps' losses within ${TOLERANCE_E10}e-10 of "
               "the run without (largest difference ${worst}e-10): ${b} / ${a}")
