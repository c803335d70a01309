#!/usr/bin/env bash
# Measure 8 B ping-pong latency at several revisions of cai_mpi, back to back on one machine, so the
# before/after of each optimisation in docs/benchmarks.md is one comparable table.
#   usage: scripts/bench/history_latency.sh VENV OUTDIR [REVISION...]
# Each revision is checked out in a temporary git worktree, its C extension built in place, and
# scripts/bench/history_latency.py (of this checkout: public API only) run with PYTHONPATH pointing there.
set -euo pipefail
venv=$(cd "$1" && pwd); out=$2; shift 2
revs=("$@")
[ ${#revs[@]} -gt 0 ] || revs=(1b0d277 dff45bf 05e2bee 91bc0cb 9e6af8f 26b9420 HEAD)
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"; out=$(cd "$out" && pwd)
mpiexec=("$venv/bin/mpiexec" -n 2)
"$venv/bin/python" -c "from mpi4py import MPI; import sys; sys.exit('Open MPI' not in MPI.Get_library_version())" \
  && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d); trap 'git -C "$here" worktree prune; rm -rf "$tmp"' EXIT
for rev in "${revs[@]}"; do
  short=$(git -C "$here" rev-parse --short=7 "$rev")
  tree="$tmp/$short"
  git -C "$here" worktree add -q --detach "$tree" "$rev"
  (cd "$tree" && "$venv/bin/python" setup.py -q build_ext --inplace >/dev/null 2>&1) \
    || echo "note: $short: C extension not built (pure-Python fallback)" >&2
  printf '%s  ' "$short"
  PYTHONPATH="$tree" "${mpiexec[@]}" "$venv/bin/python" "$here/scripts/bench/history_latency.py" \
    --json "$out/history-$short.json"
  git -C "$here" worktree remove --force "$tree"
done
