"""The soak's figures: memory over the run summarized per rank, the text table, the JSON, a plot."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

__all__ = ["SCHEMA", "Sample", "markdown_table", "memory_allowance", "memory_failures", "memory_summary", "plot",
           "render"]

SCHEMA = "cai_mpi.soak/1"

#: (seconds since the start, resident MiB, MiB idle in cai_mpi's pools, objects the garbage collector tracks)
Sample = tuple[float, float, float, int]


def memory_summary(samples: list[Sample], warmup: float) -> dict[str, Any]:
    """Resident memory right after the warm-up and at the end (medians of a tenth of the run each, so a large
    message in flight at one sample does not count), its peak, and its growth in between: in all, and outside
    the pools' idle blocks, which fill up to their budgets as message sizes recur (reuse, not a leak)."""
    end = samples[-1][0]
    warm = [s for s in samples if warmup * end <= s[0] <= (warmup + 0.1) * end] or samples[-1:]
    last = [s for s in samples if s[0] >= 0.9 * end] or samples[-1:]

    def median(window: list[Sample], value: Callable[[Sample], float]) -> float:
        return float(statistics.median(value(s) for s in window))

    def rss(s: Sample) -> float:
        return s[1]

    def unpooled(s: Sample) -> float:
        return s[1] - s[2]

    return {
        "rss_start_mib": round(samples[0][1], 1), "rss_after_warmup_mib": round(median(warm, rss), 1),
        "rss_end_mib": round(median(last, rss), 1), "rss_peak_mib": round(max(s[1] for s in samples), 1),
        "rss_growth_after_warmup_mib": round(median(last, rss) - median(warm, rss), 1),
        "pooled_end_mib": round(median(last, lambda s: s[2]), 1),
        "unpooled_growth_after_warmup_mib": round(median(last, unpooled) - median(warm, unpooled), 1),
        "objects_growth_after_warmup": round(median(last, lambda s: s[3]) - median(warm, lambda s: s[3])),
        "samples": len(samples),
    }


def memory_allowance(max_bytes: int, threads: int) -> dict[str, float]:
    """How much a rank may grow after the warm-up without being called a leak. Outside the pools, memory moves by
    what is in flight or just freed to the allocator: a few of the largest messages per thread (each thread has a
    round's sends and receives under way), plus the allocator's own slack. Python objects move by a few hundred as
    caches fill and threads switch; a leak of one per message adds thousands."""
    return {"unpooled_mib": 64 + 4 * threads * max_bytes / 2**20, "objects": 2000}


def memory_failures(memory: dict[str, Any], allowance: dict[str, float]) -> list[str]:
    """Why a rank's memory (``memory_summary``) is not flat after the warm-up; empty if it is."""
    found = []
    grown, allowed = memory["unpooled_growth_after_warmup_mib"], allowance["unpooled_mib"]
    if grown > allowed:
        found.append(f"memory outside the pools grew by {grown:.0f} MiB after the warm-up (at most {allowed:.0f} MiB "
                     "is in flight or allocator slack): a leak")
    objects, allowed_objects = memory["objects_growth_after_warmup"], allowance["objects"]
    if objects > allowed_objects:
        found.append(f"{objects:,} more Python objects after the warm-up than just after it (at most "
                     f"{allowed_objects:,.0f} is noise): a leak")
    return found


def render(result: dict[str, Any]) -> str:
    gib = 2**30
    allowance = result["memory_allowance"]
    lines = [
        f"cai_mpi soak: {result['ranks']} ranks x {result['threads']} thread(s), runtime {result['runtime']}, "
        f"{result['mpi_library_version']}",
        "",
        f"{'kind':<12}{'messages':>10}{'GiB':>10}",
    ]
    for kind, row in result["by_kind"].items():
        lines.append(f"{kind:<12}{row['messages']:>10,}{row['bytes'] / gib:>10.2f}")
    lines.append(f"{'total':<12}{result['messages']:>10,}{result['bytes'] / gib:>10.2f}")
    lines += ["", f"failures: {result['failures']}   time: {result['seconds']:.1f} s", "",
              "resident memory per rank, MiB (warm: just after the warm-up, end: the last tenth of the run, medians)",
              f"flat after the warm-up: outside the pools within +{allowance['unpooled_mib']:.0f} MiB, "
              f"Python objects within +{allowance['objects']:,.0f}",
              f"{'':8}{'start':>8}{'warm':>8}{'end':>8}{'peak':>8}{'growth':>8}{'pooled':>8}{'unpooled':>10}"
              f"{'objects':>9}",
              f"{'':8}{'':>8}{'':>8}{'':>8}{'':>8}{'':>8}{'at end':>8}{'growth':>10}{'growth':>9}"]
    for r, m in enumerate(result["memory_per_rank"]):
        lines.append(f"  rank {r}{m['rss_start_mib']:8.1f}{m['rss_after_warmup_mib']:8.1f}{m['rss_end_mib']:8.1f}"
                     f"{m['rss_peak_mib']:8.1f}{m['rss_growth_after_warmup_mib']:+8.1f}{m['pooled_end_mib']:8.1f}"
                     f"{m['unpooled_growth_after_warmup_mib']:+10.1f}{m['objects_growth_after_warmup']:+9d}")
    lines += [f"  FAILED: {f}" for f in result["failure_details"]]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Resident memory of every rank over the run, and the part outside the pools' idle blocks."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'cai_mpi[bench]'") from None
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for rank, series in enumerate(result["rss_series_mib"]):
        times = [t for t, _rss, _pooled in series]
        line, = ax.plot(times, [rss for _t, rss, _pooled in series], linewidth=1, label=f"rank {rank}: resident")
        ax.plot(times, [rss - pooled for _t, rss, pooled in series], linewidth=1, linestyle="--",
                color=line.get_color(), label=f"rank {rank}: outside the pools")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(f"cai_mpi soak: {result['messages']:,} messages, {result['ranks']} ranks x {result['threads']} "
                 f"threads, {result['mpi_library_version']}", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """docs/reliability.md's table of soak runs: one row per ``(name, result)``."""

    def spread(key: str, memory: list[dict[str, Any]]) -> str:
        values = [m[key] for m in memory]
        low, high = min(values), max(values)
        return f"{low:+.0f}" if low == high else f"{low:+.0f} to {high:+.0f}"

    lines = [
        "| MPI | ranks x threads | messages (exchange / wildcard / channel / collective) | GiB | seconds | failures "
        "| peak RSS, MiB | RSS growth after warm-up, MiB | pools' idle blocks at end, MiB | growth outside the pools, "
        "MiB | Python objects growth |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results:
        memory = r["memory_per_rank"]
        kinds = " / ".join(f"{r['by_kind'][k]['messages']:,}" for k in r["by_kind"])
        pooled = [m["pooled_end_mib"] for m in memory]
        mpi = " ".join(r["mpi_library_version"].split())
        lines.append(
            f"| {name} ({mpi}) | {r['ranks']} x {r['threads']} | {r['messages']:,} ({kinds}) "
            f"| {r['bytes'] / 2**30:.1f} | {r['seconds']:.0f} | {r['failures']} "
            f"| {max(m['rss_peak_mib'] for m in memory):.0f} | {spread('rss_growth_after_warmup_mib', memory)} "
            f"| {min(pooled):.0f} to {max(pooled):.0f} | {spread('unpooled_growth_after_warmup_mib', memory)} "
            f"| {spread('objects_growth_after_warmup', memory)} |"
        )
    return "\n".join(lines) + "\n"
