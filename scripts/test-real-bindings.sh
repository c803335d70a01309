#!/usr/bin/env bash
# The GPU tests that need no CuPy through the real cuda-bindings wheel, over a stand-in for libcuda.so.1 built here
# with gcc (scripts/cuda-stub/libcuda_stub.c: host memory for device memory, streams done in order at once). The
# driver double (scripts/test.sh's previous stage) checks what cai_mpi asks of the driver; this checks how it asks:
# every call goes through the bindings' argument types, return tuples and error mapping, as on a GPU.
#
#   bash scripts/test-real-bindings.sh [pytest args]      # PYTHON=.venv-test-openmpi/bin/python by default
#
# cuda-bindings comes with cai_mpi[test] (scripts/test.sh installs it); the bindings load libcuda.so.1 by its name,
# so the stub's folder goes first on LD_LIBRARY_PATH. Runs at 1 rank (the stub showing two GPUs) and at 2 ranks
# under mpiexec, each with CAI_MPI_CUDA_AWARE=1: the stub's device memory is host memory, so the direct route works
# with any MPI, and the tests' staged variants still set CAI_MPI_CUDA_AWARE=0 for themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv-test-openmpi/bin/python}
say() { printf '== %s\n' "$*"; }
command -v gcc >/dev/null || { echo "test-real-bindings.sh: no gcc here: the libcuda stub cannot be built" >&2; exit 2; }
"$PY" -c 'import cuda.bindings.driver' 2>/dev/null \
  || { echo "test-real-bindings.sh: $PY has no cuda-bindings: install cai_mpi[test]" >&2; exit 2; }

stub=$(mktemp -d "${TMPDIR:-/tmp}/cai-mpi-cuda-stub.XXXXXX")
trap 'rm -rf "$stub"' EXIT
gcc -shared -fPIC -O1 -Wall -Wextra -Werror -o "$stub/libcuda.so.1" -Wl,-soname,libcuda.so.1 \
  scripts/cuda-stub/libcuda_stub.c -lpthread
unset CAI_MPI_TEST_CUDA_DRIVER
export LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CAI_MPI_CUDA_AWARE=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Without this check a stub the bindings cannot use would only make every test skip as "no usable CUDA GPU".
"$PY" - <<'EOF'
from cai_mpi._src.runtime import cudadriver
drv = cudadriver.load_driver()
usable, reason = cudadriver.probe()
assert drv.__name__ == "cuda.bindings.driver", f"the driver module is {drv!r}, not cuda-bindings'"
assert usable, f"cuda-bindings over the libcuda stub: {reason}"
print(f"== cuda-bindings {cudadriver.bindings_version(drv)} over the libcuda stub: {reason}")
EOF

status=0
pytest_args=(-m pytest -m gpu tests/gpu -q -p no:cacheprovider --timeout=40)
say "1 rank, the stub showing two GPUs"
CUDA_STUB_DEVICES=2 timeout 120 "$PY" "${pytest_args[@]}" "$@" || status=1
mpiexec=$(dirname "$PY")/mpiexec
launch=("$mpiexec")
case "$("$mpiexec" --version 2>&1 || true)" in *"Open MPI"*) launch+=(--oversubscribe) ;; esac
say "2 ranks under $mpiexec"
timeout 120 "${launch[@]}" -n 2 "$PY" "${pytest_args[@]}" "$@" || status=1
exit $status
