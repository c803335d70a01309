"""The `python -m cai_mpi bench` command line: parse, check the world, run the plan, report on rank 0."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import socket
import sys
import time
from typing import Any, NoReturn

from mpi4py import MPI

from .buffers import BUFFER_KINDS, BufferUnavailable, make_buffer_kind
from .kernels import TESTS, Plan, mode_table, run_plan
from .modes import DEFAULT_MODES, MODES, Context
from .multirank import (
    COLLECTIVE_DEFAULTS,
    COLLECTIVE_MODES,
    COLLECTIVE_TESTS,
    DEFAULT_COLLECTIVE_MODES,
    PIPELINE_MODES,
)
from .preflight import abort_job, output_problems
from .progress import Progress
from .report import SCHEMA, check_targets, plot, render_markdown, render_targets, render_text, results_json

__all__ = ["main", "parse_size", "parser", "size_list"]

_DEFAULT_ITERS = {"latency": 1000, "bw": 20, "bibw": 20, "pipeline": 500, "halo": 1000,
                  **dict.fromkeys(COLLECTIVE_TESTS, 1000)}
#: The halo exchange compares nonblocking receives posted before the sends (the other modes' receives are blocking).
_HALO_MODES = ("raw", "cai-out-irecv", "cai-irecv", "channel")
_UNITS = {"": 0, "K": 10, "M": 20, "G": 30}


def parse_size(text: str) -> int:
    """'8', '1K', '64M', '1G' (also '4KiB', '2MB'): binary multiples."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 0, 8, 1K, 64M)")
    return int(m.group(1)) << _UNITS[m.group(2)]


def size_list(lo: int, hi: int) -> list[int]:
    """Powers of two from ``lo`` to ``hi``; 0 and non-power-of-two ends are kept as given."""
    if hi < lo:
        raise ValueError(f"--max-size {hi} is below --min-size {lo}")
    sizes = [0] if lo == 0 else [lo]
    p = 1
    while p <= hi:
        if p > sizes[-1]:
            sizes.append(p)
        p <<= 1
    if sizes[-1] != hi:
        sizes.append(hi)
    return sizes


def _modes(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {**MODES, **PIPELINE_MODES, **COLLECTIVE_MODES}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {bad}: choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _nonneg(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


class _Parser(argparse.ArgumentParser):
    """Only rank 0 prints usage, help and errors; every rank exits the same way."""

    rank = 0

    def _print_message(self, message: str, file: Any = None) -> None:
        if _Parser.rank == 0:
            super()._print_message(message, file)

    def error(self, message: str) -> NoReturn:
        if _Parser.rank == 0:
            super().error(message)
        raise SystemExit(2)


_MODE_HELP = "\n".join(f"  {name:<13} {spec.description}" for name, spec in {**MODES, **PIPELINE_MODES}.items())
_COLLECTIVE_MODE_HELP = "\n".join(f"  {name:<13} {spec.description}" for name, spec in COLLECTIVE_MODES.items())
_EPILOG = f"""modes (latency, bw, bibw, pipeline, halo):
{_MODE_HELP}

modes (bcast, allreduce, allgather):
{_COLLECTIVE_MODE_HELP}

Run under mpiexec: latency, bw and bibw need an even number of ranks (pairs 0-1, 2-3, ...;
rank 0's pair is reported); pipeline, halo and the collectives need at least 2. Every rank runs; rank 0 prints.
"""
# One example per command, each checked by the tests to parse as written.
_EXAMPLES = {
    "latency": "mpiexec -n 2 python -m cai_mpi bench latency --max-size 1M --json lat.json --check-targets",
    "bw": "mpiexec -n 2 python -m cai_mpi bench bw --sizes 8,64K,1M,16M --modes raw,cai,cai-out --json bw.json",
    "bibw": "mpiexec -n 2 python -m cai_mpi bench bibw --max-size 16M --plot bibw.png",
    "pipeline": "mpiexec -n 4 python -m cai_mpi bench pipeline --sizes 8,1M --modes raw,cai-pipeline",
    "halo": "mpiexec -n 2 python -m cai_mpi bench halo --sizes 8K,1M --json halo.json --check-targets",
    **{test: f"mpiexec -n 4 python -m cai_mpi bench {test} --sizes 8,1M,16M --check-targets"
       for test in COLLECTIVE_TESTS},
    "report": "python -m cai_mpi bench report lat.json bw.json --markdown --rows 8,4K,1M",
}


def _examples(*commands: str) -> str:
    return "examples:\n" + "\n".join(f"  {_EXAMPLES[c]}" for c in commands) + "\n"


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m cai_mpi bench", epilog=_EPILOG + "\n" + _examples("latency", "allreduce", "report"),
                description="cai_mpi benchmarks, side by side with raw mpi4py.",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="test", required=True, metavar="{" + ",".join([*TESTS, "report"]) + "}")
    for test, what in TESTS.items():
        s = sub.add_parser(test, help=what, description=f"{test}: {what}", epilog=_EPILOG + "\n" + _examples(test),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        defaults = {**dict.fromkeys(COLLECTIVE_TESTS, DEFAULT_COLLECTIVE_MODES), **COLLECTIVE_DEFAULTS,
                    "pipeline": (*DEFAULT_MODES, "cai-pipeline"), "halo": _HALO_MODES}.get(test, DEFAULT_MODES)
        s.add_argument("--modes", type=_modes, default=list(defaults),
                       help=f"comma-separated modes (default {','.join(defaults)})")
        s.add_argument("--buffer", choices=list(BUFFER_KINDS), default="host",
                       help="array kind to send (default host numpy)")
        s.add_argument("--min-size", type=parse_size, default=1,
                       help="smallest message, e.g. 0, 1, 8 (default 1)")
        s.add_argument("--max-size", type=parse_size, default=64 << 20, help="largest message (default 64M)")
        s.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",") if x.strip()],
                       help="explicit comma-separated sizes instead of the power-of-two range, e.g. 8,1M,16M")
        s.add_argument("--iters", type=_positive, default=_DEFAULT_ITERS[test],
                       help=f"iterations per sample up to 16K per message (default {_DEFAULT_ITERS[test]}; "
                       "bw/bibw: windows); fewer for larger messages")
        s.add_argument("--warmup", type=_nonneg,
                       help="untimed iterations before the samples (default iters/10)")
        s.add_argument("--samples", type=_positive, default=5,
                       help="timed samples per size and mode (default 5)")
        s.add_argument("--window", type=_positive, default=64,
                       help="bw/bibw: messages in flight (default 64)")
        _output_args(s)
        s.add_argument("--progress", action=argparse.BooleanOptionalAction,
                       help="draw a progress bar on stderr (rank 0), or never; by default only when stderr is a "
                       "terminal, which under mpiexec it seldom is")
    r = sub.add_parser("report", help="re-render saved --json files (tables, --check-targets, --plot)",
                       epilog=_examples("report"), formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("files", nargs="+", help="JSON files written by --json")
    r.add_argument("--markdown", action="store_true",
                   help="print each file's modes side by side as a Markdown table (as in docs/benchmarks.md)")
    r.add_argument("--rows", type=lambda t: [parse_size(x) for x in t.split(",") if x.strip()],
                   help="with --markdown: only these sizes, e.g. 8,4K,1M,16M")
    _output_args(r)
    return p


def _output_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--json", metavar="FILE", help="write every figure and the environment as JSON")
    s.add_argument("--plot", metavar="FILE.png", help="draw latency and bandwidth curves (needs matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no tables on stdout")
    s.add_argument("--full", action="store_true", help="tables with p10/p90 and iteration counts")
    s.add_argument("--check-targets", action="store_true",
                   help="judge the performance targets this run has figures for: PASS/FAIL, or info for a "
                   "machine-dependent ratio (reported, not judged)")
    s.add_argument("--strict", action="store_true", help="with --check-targets: exit 1 if a judged target fails")


def _world_problem(test: str, nranks: int) -> str | None:
    if test in ("pipeline", "halo") or test in COLLECTIVE_TESTS:
        return None if nranks >= 2 else f"{test} needs at least 2 ranks (mpiexec -n 4 ...)"
    if nranks < 2 or nranks % 2:
        return (f"{test} needs exactly 2 ranks, or an even number (pairs); this run has {nranks}: "
                f"mpiexec -n 2 python -m cai_mpi bench {test} ...")
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _machine_busy_seconds() -> float | None:
    """CPU seconds this machine has spent busy since boot (all processes), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _source_revision() -> str | None:
    """``git describe`` of the cai_mpi checkout being benchmarked (``-dirty`` when edited), if it is one."""
    import subprocess

    import cai_mpi

    where = os.path.dirname(os.path.abspath(cai_mpi.__file__))
    try:
        out = subprocess.run(["git", "-C", where, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _environment(ctx: Context, buffer: str) -> dict[str, Any]:
    from ..info import collect

    info = collect(MPI.COMM_WORLD)
    import cai_mpi

    aware = cai_mpi.cuda_aware()
    versions = dict(info["versions"])
    for name in ("matplotlib", "cupy", "torch", "numba"):
        if name in sys.modules or name == "matplotlib":
            try:
                versions[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                pass
    hosts = MPI.COMM_WORLD.gather(socket.gethostname(), root=0)
    return {
        "mpi_library": info["mpi_library"].replace("\x00", "").strip(),
        "mpi_library_version": MPI.Get_library_version().replace("\x00", "").strip(),
        "mpi_version": info["mpi_version"],
        "thread_level": info["thread_level"],
        "cuda_aware": {"aware": aware.aware, "source": aware.source, "library": aware.library,
                       "detail": aware.detail},
        "runtime": info["runtime"],
        "gpus_visible": info["gpus_visible"],
        "device": info["device"],
        "python": info["python"],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "host": info["host"],
        "rank_hosts": hosts,
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "versions": versions,
        "env": info["env"],
        "buffer": buffer,
        "cai_mpi_path": os.path.dirname(os.path.abspath(cai_mpi.__file__)),
        "cai_mpi_revision": _source_revision() if MPI.COMM_WORLD.Get_rank() == 0 else None,
        "loadavg_start": list(os.getloadavg()),
    }


def _emit(docs: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """Tables, target verdicts and the plot for ``docs`` (rank 0); the exit code."""
    if not args.quiet:
        for d in docs:
            print(render_text(d, full=args.full), flush=True)
    code = 0
    if args.check_targets:
        verdicts = check_targets(docs)
        for d in docs:
            d["targets"] = [v.as_json() for v in verdicts]
        print(("" if args.quiet else "\n") + render_targets(verdicts), flush=True)
        if args.strict and any(v.status == "FAIL" for v in verdicts):
            code = 1
    if args.plot:
        plot(docs, args.plot)
    return code


def _report(args: argparse.Namespace) -> int:
    problems = output_problems(args)
    for why in problems:
        print(f"python -m cai_mpi bench: error: {why}", file=sys.stderr)
    if problems:
        return 2
    docs = []
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("schema") != SCHEMA:
            print(f"{path}: not a cai_mpi bench file (schema {doc.get('schema')!r})", file=sys.stderr)
            return 2
        docs.append(doc)
    if args.markdown:
        for d in docs:
            print(render_markdown(d, args.rows), end="\n\n", flush=True)
        args.quiet = True
    code = _emit(docs, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(docs, f, indent=1)
    return code


def main(argv: list[str]) -> int:
    world = MPI.COMM_WORLD
    rank, nranks = world.Get_rank(), world.Get_size()
    _Parser.rank = rank
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) or exc.code is None else 2
    if args.test == "report":
        return _report(args) if rank == 0 else 0

    problem = _world_problem(args.test, nranks)
    if problem is None and args.sizes is None and args.max_size < args.min_size:
        problem = f"--max-size {args.max_size} is below --min-size {args.min_size}"
    if problem is not None:
        if rank == 0:
            print(f"python -m cai_mpi bench: error: {problem}", file=sys.stderr)
        return 2

    # Everything else that can fail is checked now, and the ranks agree on it before they exchange anything else:
    # the files rank 0 will write, and each rank's buffers.
    problems = output_problems(args) if rank == 0 else []
    kind = make_buffer_kind(args.buffer)
    ready = False
    try:
        kind.setup()
        ready = True
    except BufferUnavailable as exc:
        problems.append(str(exc))
    every = world.allgather(problems)
    if any(every):
        if rank == 0:
            for r, whys in enumerate(every):
                for why in whys:
                    print(f"python -m cai_mpi bench: error: rank {r}: {why}", file=sys.stderr)
        if ready:
            kind.teardown()
        return 2
    try:
        return _run(args, kind, rank, nranks, argv)
    except BaseException:
        abort_job(rank)  # the other ranks may be waiting for this one in MPI
    finally:
        kind.teardown()


def _run(args: argparse.Namespace, kind: Any, rank: int, nranks: int, argv: list[str]) -> int:
    import cai_mpi

    world = MPI.COMM_WORLD
    comm = world.Dup()
    comm.Set_name("cai_mpi-bench")
    ctx = Context(comm=comm, kind=kind, aware=cai_mpi.cuda_aware().aware, test=args.test)
    table = mode_table(args.test)
    skipped = {}
    modes = []
    for name in args.modes:
        why = table[name].unavailable(ctx) if name in table else f"not a mode of the {args.test} test"
        if why is None:
            modes.append(name)
        else:
            skipped[name] = why
    sizes = sorted(set(args.sizes)) if args.sizes else size_list(args.min_size, args.max_size)
    warmup = args.warmup if args.warmup is not None else max(1, args.iters // 10)
    plan = Plan(test=args.test, sizes=sizes, modes=modes, samples=args.samples, iters=args.iters,
                warmup=warmup, window=args.window)
    progress = Progress(args.progress if rank == 0 else False)  # None: only on a terminal
    env = _environment(ctx, args.buffer)
    started = datetime.datetime.now(datetime.timezone.utc)
    world.Barrier()
    busy0, own0 = _machine_busy_seconds(), _own_cpu_seconds()
    t0 = time.perf_counter()
    try:
        results = run_plan(plan, ctx, progress) if modes else {}
    finally:
        progress.close()
    duration = time.perf_counter() - t0
    busy1, own = _machine_busy_seconds(), world.allreduce(_own_cpu_seconds() - own0)
    env["loadavg_end"] = list(os.getloadavg())
    same_host = len(set(env["rank_hosts"] or [])) == 1
    env["other_cpu_fraction"] = (
        max(0.0, (busy1 - busy0 - own) / (duration * (os.cpu_count() or 1)))
        if same_host and busy0 is not None and busy1 is not None and duration > 0 else None
    )
    code = 0
    if rank == 0:
        doc = {
            "schema": SCHEMA,
            "environment": env,
            "benchmark": {
                "test": args.test,
                "description": TESTS[args.test],
                "buffer": args.buffer,
                "ranks": nranks,
                "pairs": nranks // 2 if args.test in ("latency", "bw", "bibw") else None,
                "modes": modes,
                "mode_descriptions": {m: table[m].description for m in args.modes if m in table},
                "sizes": sizes,
                "samples": plan.samples,
                "iters": plan.iters,
                "warmup": plan.warmup,
                "window": plan.window,
                "window_bytes": plan.window_bytes,
                "ref_bytes": plan.ref_bytes,
                "unit": "median_us/p10/p90: microseconds per one-way message (pipeline: per item), over "
                        "samples; bandwidth_MBps = size / median_us (10^6 bytes/s)",
                "command": "python -m cai_mpi bench " + shlex.join(argv),
                "started_utc": started.isoformat(timespec="seconds"),
                "duration_s": round(duration, 3),
            },
            "results": results_json(args.test, results),
            "skipped": skipped,
        }
        code = _emit([doc], args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
    comm.Free()
    code = int(world.bcast(code, root=0))
    return code
