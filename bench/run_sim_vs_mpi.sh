#!/usr/bin/env bash
# bench/run_sim_vs_mpi.sh SIM_VS_MPI [MPIEXEC] [ARGS...]: runs bench/sim_vs_mpi under sim and
# under `MPIEXEC -n 8 ... --spmd-backend=mpi` on this machine, prints each run's whole-process
# wall time and per-step time, and ends with `mpi_over_sim: <mpi per-step / sim per-step>`.
# (Built programs are at build/bench/sim_vs_mpi; `cmake --build build --target bench_sim_vs_mpi`
# runs this.)
set -euo pipefail
exe=${1:?usage: run_sim_vs_mpi.sh path/to/sim_vs_mpi [mpiexec] [args...]}
mpiexec=${2:-mpirun}
shift $(( $# >= 2 ? 2 : 1 ))
# OpenMPI as root, 8 ranks on fewer cores, container-safe shared memory (notes §5).
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}

run() {  # run LABEL COMMAND...: prints the program's output and `LABEL wall_s: ...`
  local label=$1
  shift
  local t0 t1 out
  t0=$(date +%s.%N)
  out=$("$@")
  t1=$(date +%s.%N)
  echo "$out" | sed "s/^/[$label] /"
  echo "$label wall_s: $(echo "$t1 - $t0" | bc -l | sed 's/^\./0./')"
  step=$(echo "$out" | sed -n 's/^per_step_ms: //p')
}

run sim "$exe" --spmd-backend=sim --spmd-world-size=8 "$@"
sim_step=$step
run mpi "$mpiexec" -n 8 "$exe" --spmd-backend=mpi "$@"
mpi_step=$step
echo "sim per_step_ms: $sim_step"
echo "mpi per_step_ms: $mpi_step"
printf 'mpi_over_sim: %.2f\n' "$(echo "$mpi_step / $sim_step" | bc -l)"
