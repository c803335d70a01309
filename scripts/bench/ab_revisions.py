"""Two revisions of cai_mpi side by side: alternate their benchmark runs and print each mode's median ratio to raw.

    python benchmarks/ab_revisions.py OLD_VENV NEW_VENV OUTDIR TEST SIZES MODES ROUNDS [bench options...]
    python benchmarks/ab_revisions.py /tmp/venv-old .venv out/ab latency 8 raw,cai,cai-out,channel 3 --samples 7

Each venv holds one revision of cai_mpi with the same MPI wheel. The runs alternate (old, new, old, new...), so
drift on a shared machine hits both alike; each run's ratio to its own ``raw`` is what is compared, and the
median over the rounds is printed with every round's figure. The JSON of every run is kept in OUTDIR.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 7:
        sys.exit(__doc__)
    old, new, outdir, test, sizes, modes, rounds, *extra = argv
    os.makedirs(outdir, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ratios: dict[tuple[str, int, str], list[float]] = {}
    for r in range(int(rounds)):
        for name, venv in (("old", old), ("new", new)):
            out = f"{outdir}/{name}-{test}-{r}.json"
            subprocess.run([f"{venv}/bin/mpiexec", "-n", "2", f"{venv}/bin/python", "-m", "cai_mpi", "bench", test,
                            "--sizes", sizes, "--modes", modes, "--json", out, "--quiet", "--no-progress", *extra],
                           env=env, check=True, capture_output=True)
            with open(out) as f:
                results = json.load(f)["results"]
            for mode, rows in results.items():
                for size, row in rows.items():
                    ratio = row["median_us"] / results["raw"][size]["median_us"]
                    ratios.setdefault((mode, int(size), name), []).append(ratio)
    for (mode, size, name), values in sorted(ratios.items()):
        if mode != "raw":
            each = " ".join(f"{x:.3f}" for x in values)
            print(f"{mode:12s} {size:>9d} {name}: median {statistics.median(values):.3f}  runs {each}")


if __name__ == "__main__":
    main(sys.argv[1:])
