"""Binding this rank's GPU before MPI is initialized (``CAI_MPI_BIND_DEVICE=1``).

Some transports (Open MPI's smcuda, PSM2, some UCX set-ups) create CUDA resources inside ``MPI_Init``, on the
device current at that moment: GPU 0 unless something chose before. Importing cai_mpi initializes MPI, so this
runs first, from the package's ``__init__``, and imports nothing that initializes MPI.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import bind_device_setting, environment
from ..errors import RuntimeUnavailableError
from .device import choose_device

__all__ = ["bind_device_early"]


def bind_device_early(env: Mapping[str, str] | None = None) -> int | None:
    """With ``CAI_MPI_BIND_DEVICE=1``: make this rank's GPU current on the calling thread (its primary context,
    as ``cudaSetDevice`` does) and return its ordinal; otherwise do nothing and return None.

    The GPU is the one cai_mpi uses later (``choose_device``: the node-local rank from the launcher's
    environment, modulo the visible GPUs, or ``CAI_MPI_DEVICE``).

    Raises:
        RuntimeUnavailableError: binding was asked for but CUDA is not usable here.
        ValueError: a malformed ``CAI_MPI_BIND_DEVICE``, ``CAI_MPI_DEVICE`` or ``CAI_MPI_LOCAL_RANK``.
    """
    env = environment() if env is None else env
    if not bind_device_setting(env):
        return None
    from .cudacontexts import Driver
    from .cudadriver import load_driver, probe, visible_device_count

    usable, reason = probe()
    if not usable:
        raise RuntimeUnavailableError(f"CAI_MPI_BIND_DEVICE=1, but CUDA is not usable here: {reason}")
    choice = choose_device(env, visible_count=visible_device_count())
    ordinal = choice.ordinal or 0
    driver = Driver(load_driver())
    driver.check("cuCtxSetCurrent", driver.primary(ordinal))
    return ordinal
