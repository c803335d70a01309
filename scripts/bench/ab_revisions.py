"""Revisions of cai_mpi side by side: alternate their benchmark runs and print each mode's median ratio to raw.

    python scripts/bench/ab_revisions.py --venv VENV TREE [TREE...] -- OUTDIR TEST SIZES MODES ROUNDS [bench options...]
    python scripts/bench/ab_revisions.py OLD_VENV NEW_VENV OUTDIR TEST SIZES MODES ROUNDS [bench options...]

The first form (preferred) runs every revision with the SAME venv, so the MPI wheel, mpi4py and numpy are
identical: each TREE is a revision's source tree put first on PYTHONPATH, e.g.

    mkdir -p /tmp/rev-b161dc4 && git archive b161dc4 | tar -x -C /tmp/rev-b161dc4
    python scripts/bench/ab_revisions.py --venv .venv-test-mpich /tmp/rev-b161dc4 /tmp/rev-main . -- \\
        out/ab latency 8,1M raw,cai,cai-out,channel 3 --samples 7

(each revision then runs its own ``python -m cai_mpi bench``; only pure-Python code is used, C extensions of
old revisions are not built). The second form compares two venvs that each hold one installed revision.

The runs alternate (A, B, C, A, B, C...), so drift on a shared machine hits every revision alike; each run's ratio
to its own ``raw`` is what is compared, and the median over the rounds is printed with every round's figure. The
JSON of every run is kept in OUTDIR.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys


def main(argv: list[str]) -> None:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs: list[tuple[str, str, str | None]] = []  # (name, venv, source tree or None)
    if argv[:1] == ["--venv"] and "--" in argv:
        venv, trees, rest = argv[1], argv[2 : argv.index("--")], argv[argv.index("--") + 1 :]
        for tree in trees:
            tree = os.path.abspath(tree)
            runs.append((os.path.basename(tree.rstrip("/")) or tree, venv, tree))
    elif len(argv) >= 7:
        runs = [("old", argv[0], None), ("new", argv[1], None)]
        rest = argv[2:]
    else:
        sys.exit(__doc__)
    if len(rest) < 5 or len(runs) < 2:
        sys.exit(__doc__)
    outdir, test, sizes, modes, rounds, *extra = rest
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    ratios: dict[tuple[str, int, str], list[float]] = {}
    for r in range(int(rounds)):
        for name, venv, tree in runs:
            out = f"{outdir}/{name}-{test}-{r}.json"
            run_env = dict(env) if tree is None else dict(env, PYTHONPATH=tree)
            subprocess.run([f"{venv}/bin/mpiexec", "-n", "2", f"{venv}/bin/python", "-m", "cai_mpi", "bench", test,
                            "--sizes", sizes, "--modes", modes, "--json", out, "--quiet", "--no-progress", *extra],
                           env=run_env, check=True, capture_output=True, cwd=tree or None)
            with open(out) as f:
                results = json.load(f)["results"]
            for mode, rows in results.items():
                for size, row in rows.items():
                    ratio = row["median_us"] / results["raw"][size]["median_us"]
                    ratios.setdefault((mode, int(size), name), []).append(ratio)
                    if mode == "raw" or mode == "cai":
                        ratios.setdefault((f"{mode} us", int(size), name), []).append(row["median_us"])
    order = {name: i for i, (name, _v, _t) in enumerate(runs)}
    for (mode, size, name), values in sorted(ratios.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])):
        if mode != "raw":
            each = " ".join(f"{x:.3f}" for x in values)
            print(f"{mode:12s} {size:>9d} {name:>14s}: median {statistics.median(values):.3f}  runs {each}")


if __name__ == "__main__":
    main(sys.argv[1:])
