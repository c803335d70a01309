"""Rank -> GPU choice from the launcher's environment, made before any CUDA context exists."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..config import device_setting, environment, local_rank_setting, nonnegative_int

__all__ = ["LOCAL_RANK_VARS", "DeviceChoice", "choose_device", "parse_visible_devices"]

#: Where the node-local rank comes from, first match wins (but see ``_NESTED_INSIDE_SLURM``).
LOCAL_RANK_VARS: tuple[str, ...] = (
    "CAI_MPI_LOCAL_RANK",  # the user's override
    "SLURM_LOCALID",  # srun (any --mpi plugin, Cray included)
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI mpirun / prterun
    "MPI_LOCALRANKID",  # MPICH Hydra mpiexec
    "PMI_LOCAL_RANK",  # PMI-based launchers (Intel MPI Hydra, some PMIx shims)
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH2 mpirun_rsh
    "PALS_LOCAL_RANKID",  # HPE/Cray PALS (aprun successor under PBS)
)

# An MPI launcher started *inside* a Slurm step (``mpirun`` in an allocation starts its daemons with
# ``srun``, one per node) hands every rank its daemon's SLURM_LOCALID, which is 0 on every node (seen
# with Open MPI 5 and MPICH Hydra under Slurm 22.05). The launcher's own variable is then the truth;
# under srun alone these are unset or agree with SLURM_LOCALID.
_NESTED_INSIDE_SLURM: tuple[str, ...] = LOCAL_RANK_VARS[2:]


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """The GPU this rank should use, and why.

    Attributes:
        ordinal: index *within the visible devices* (what ``cudaSetDevice`` takes), or None when no
            GPU is visible or the number of visible GPUs is unknown (see ``reason``).
        local_rank: this process's rank on its node, or None if no launcher variable was found.
        visible: the ``CUDA_VISIBLE_DEVICES`` entries CUDA will use (it stops at the first invalid
            entry); ``()`` when the variable is set but empty; None when it is unset (all devices).
        reason: one human-readable sentence naming the variables the choice came from.
        local_rank_source: the environment variable that gave ``local_rank`` (None if none did).
        visible_count: the number of visible devices the rule used (None when unknown).
    """

    ordinal: int | None
    local_rank: int | None
    visible: tuple[str, ...] | None
    reason: str
    local_rank_source: str | None = None
    visible_count: int | None = None


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: None if unset, else the entries up to the first invalid one.

    Valid entries are non-negative integers and ``GPU-``/``MIG-`` UUIDs (or their prefixes). Like CUDA, an
    invalid entry (``-1``, ``NoDevFiles``...) hides itself and everything after it.
    """
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        if item.isdigit() or item.upper().startswith(("GPU-", "MIG-")):
            entries.append(item)
        else:
            break
    return tuple(entries)


def _slurm_gpus_on_node(env: Mapping[str, str]) -> int | None:
    raw = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(raw) if raw.isdigit() else None


def _local_rank(env: Mapping[str, str]) -> tuple[int | None, str | None, str]:
    """(local rank, variable it came from, a note for the reason)."""
    override = local_rank_setting(env)
    if override is not None:
        return override, "CAI_MPI_LOCAL_RANK", ""
    found: list[tuple[str, int]] = []
    skipped: list[str] = []
    for name in LOCAL_RANK_VARS[1:]:
        if name in env:
            try:
                value = nonnegative_int(env, name)
            except ValueError:
                skipped.append(f"{name}={env[name]!r}")
                continue
            if value is not None:
                found.append((name, value))
    note = f"; ignored unparsable {', '.join(skipped)}" if skipped else ""
    if not found:
        return None, None, note
    name, value = found[0]
    if name == "SLURM_LOCALID":
        nested = [(n, v) for n, v in found[1:] if n in _NESTED_INSIDE_SLURM]
        if nested and nested[0][1] != value:
            inner, inner_value = nested[0]
            note += (
                f"; SLURM_LOCALID={value} ignored: it belongs to the launcher daemon "
                f"(mpirun inside an allocation), {inner} is this rank's"
            )
            return inner_value, inner, note
    return value, name, note


def choose_device(env: Mapping[str, str] | None = None, visible_count: int | None = None) -> DeviceChoice:
    """Pick this rank's GPU from its node-local rank, without touching CUDA.

    The rule: ``ordinal = local_rank % visible_count``. When Slurm gives each task one GPU
    (``--gpus-per-task=1``) every rank sees a single device and chooses 0; when every rank sees all GPUs
    (``--gpu-bind=none``, ``mpirun``) ranks on a node spread over the devices. ``CAI_MPI_DEVICE=<n>``
    forces ordinal ``n``; ``CAI_MPI_LOCAL_RANK=<n>`` overrides the local rank.

    Call it before anything creates a CUDA context; it only reads environment variables.

    Args:
        env: the environment to read (default: the process environment, ``config.environment()``).
        visible_count: the number of devices this process can see, e.g. the driver's device count; by
            default it is counted from ``CUDA_VISIBLE_DEVICES``; if that is unset, Slurm's
            ``SLURM_GPUS_ON_NODE`` (what ``srun --gpu-bind=none`` leaves) is used; else it is unknown.

    Returns:
        A :class:`DeviceChoice`; ``ordinal`` is None when no GPU is visible, or when the number of visible
        devices is unknown (the reason says which).

    Raises:
        ValueError: ``CAI_MPI_DEVICE`` or ``CAI_MPI_LOCAL_RANK`` is not a non-negative integer, or
            ``CAI_MPI_DEVICE`` names a device beyond the visible ones.

    Example:
        >>> choose_device({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "0,1"}).ordinal
        1
    """
    env = environment() if env is None else env
    cvd_raw = env.get("CUDA_VISIBLE_DEVICES")
    visible = parse_visible_devices(cvd_raw)
    if visible_count is not None:
        if visible_count < 0:
            raise ValueError(f"visible_count={visible_count}: expected a non-negative integer")
        count: int | None = visible_count
        count_from = f"{visible_count} visible device(s) (given)"
    elif visible is not None:
        count = len(visible)
        count_from = f"CUDA_VISIBLE_DEVICES={cvd_raw!r} ({count} visible)"
    elif (slurm_gpus := _slurm_gpus_on_node(env)) is not None:
        # srun --gpu-bind=none unsets CUDA_VISIBLE_DEVICES; the rank then sees the job's GPUs on this node.
        count = slurm_gpus
        count_from = f"CUDA_VISIBLE_DEVICES unset, SLURM_GPUS_ON_NODE={slurm_gpus} (job's GPUs on the node)"
    else:
        count = None
        count_from = "CUDA_VISIBLE_DEVICES unset"

    local_rank, source, note = _local_rank(env)
    rank_from = f"{source}={local_rank}" if source is not None else "no local-rank variable"

    def made(ordinal: int | None, reason: str) -> DeviceChoice:
        return DeviceChoice(ordinal, local_rank, visible, reason + note, source, count)

    forced = device_setting(env)
    if forced is not None:
        if count is not None and forced >= count:
            raise ValueError(
                f"CAI_MPI_DEVICE={forced}: only {count} device(s) visible here ({count_from}); "
                f"use an ordinal below {count} or unset CAI_MPI_DEVICE"
            )
        return made(forced, f"CAI_MPI_DEVICE={forced} forces the ordinal; {count_from}")
    if count == 0:
        return made(None, f"no GPU visible: {count_from}")
    if count is None:
        return made(
            None,
            f"{count_from} and no visible_count given: the number of devices is unknown "
            f"({rank_from}); pass visible_count= (the driver's device count) or set CAI_MPI_DEVICE",
        )
    if local_rank is None:
        return made(
            0,
            f"{rank_from} (single process assumed, set CAI_MPI_LOCAL_RANK if not): device 0 of {count_from}",
        )
    ordinal = local_rank % count
    return made(ordinal, f"{rank_from} % {count} -> {ordinal}; {count_from}")
