#!/usr/bin/env bash
# A copy of this checkout's committed tree in DIR with the modules on the hot paths of a point-to-point pair and a
# one-shot collective compiled by Cython as they are (not one line changed, no types added): what compiling
# cai_mpi's per-call Python would buy before any rewrite (docs/benchmarks-history.md, "A compiled core, counted").
#   usage: scripts/bench/compiled_tree.sh DIR     (from the repository root; PY: the venv's python, default
#          .venv-test-mpich/bin/python; Cython and setuptools are installed into DIR/.build, nothing else is touched)
#   then:  python scripts/bench/instructions.py pair allgather bcast arrays --trees .,DIR
set -euo pipefail
out=$1
py=${PY:-.venv-test-mpich/bin/python}
case $py in /*) ;; *) py=$PWD/$py ;; esac  # (used from inside DIR below; not resolved: a venv's python is a link)
mkdir -p "$out"
git archive HEAD | tar -x -C "$out"
"$py" -m pip install -q --target "$out/.build" cython setuptools
modules=(
  progress/requests progress/posted progress/driving progress/waits progress/deadlines
  transport/post transport/receive transport/send transport/plans transport/agreement transport/contiguous
  transport/engine transport/signature transport/pool transport/pieces transport/privcomm
  api/p2p api/completion api/validation api/gathers api/collective_call
  core/header core/memo arrays/array arrays/operands
)
cd "$out"
PYTHONPATH=.build "$py" - "${modules[@]}" <<'EOF'
import sys
from Cython.Build import cythonize
from setuptools import Extension, setup

modules = sys.argv[1:]
sys.argv = [sys.argv[0], "build_ext", "--inplace", "-q"]
setup(name="compiled-tree", ext_modules=cythonize(
    [Extension("cai_mpi._src." + m.replace("/", "."), [f"cai_mpi/_src/{m}.py"]) for m in modules],
    compiler_directives={"language_level": 3, "binding": True, "annotation_typing": False}, quiet=True))
EOF
echo "compiled ${#modules[@]} modules in $out"
