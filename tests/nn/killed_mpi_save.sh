#!/usr/bin/env bash
# A save by 8 mpirun processes killed with -9 part way leaves a checkpoint that loads: the previous
# one or the new one (Note [Checkpoint format] in spmd/nn/checkpoint.h: DIR.tmp, a barrier, a
# rename). Runs checkpoint_test's three DISABLED_KillDriver tests: the old checkpoint under sim,
# the endless save under mpirun (killed after each delay), the load under sim.
# Usage: killed_mpi_save.sh CHECKPOINT_TEST MPIEXEC DIR
set -u
test_bin=$1 mpiexec=$2 dir=$3
export SPMD_KILLED_CKPT_DIR=$dir
run() { "$test_bin" --gtest_also_run_disabled_tests --gtest_filter="$1" "${@:2}"; }
rm -rf "$dir" "$dir.tmp"
run 'Checkpoint.DISABLED_KillDriverSavesTheOld' > /dev/null || exit 1
reached=0
for delay in 0.3 0.8 1.5 2.5; do
  setsid "$mpiexec" -n 8 "$test_bin" --gtest_also_run_disabled_tests \
    --gtest_filter='Checkpoint.DISABLED_KillDriverSavesForever' --spmd-backend=mpi \
    > /dev/null 2>&1 &
  job=$!
  sleep "$delay"
  # kill -9 every process of the job at once: the ranks mid-save and mpirun (the ranks may sit in
  # process groups of their own: every descendant is named).
  pids=$job
  frontier=$job
  while [ -n "$frontier" ]; do
    frontier=$(for p in $frontier; do ps -o pid= --ppid "$p"; done | tr -s ' \n' ' ')
    pids="$pids $frontier"
  done
  kill -9 $pids 2> /dev/null
  kill -9 -- -"$job" 2> /dev/null
  wait "$job" 2> /dev/null
  for _ in $(seq 50); do  # until none is left (a rank still writing would race the load)
    alive=0
    for p in $pids; do kill -0 "$p" 2> /dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  out=$(run 'Checkpoint.DISABLED_KillDriverLoadsOneOfThem') || {
    echo "after a kill at ${delay}s the checkpoint does not load:"
    echo "$out"
    exit 1
  }
  if grep -q "loaded the new" <<< "$out" || [ -e "$dir.tmp" ]; then reached=$((reached + 1)); fi
  mid=""
  [ -e "$dir.tmp" ] && mid=" (a save was under way: $dir.tmp was left)"
  echo "killed after ${delay}s: $(grep -o 'loaded the [a-z]* checkpoint' <<< "$out")$mid"
  run 'Checkpoint.DISABLED_KillDriverSavesTheOld' > /dev/null || exit 1
done
if [ "$reached" -eq 0 ]; then
  echo "no kill came during or after an mpi save (the processes never started saving?)"
  exit 1
fi
echo "every killed mpi save left a checkpoint that loads ($reached of 4 kills during or after a save)"
