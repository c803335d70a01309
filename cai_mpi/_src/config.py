"""Environment variables cai_mpi reads: one place, two tables: the user settings (docs/environment.md) and the
test hooks (docs/testing.md). The launcher's and MPI vendors' own variables (``SLURM_LOCALID``,
``CUDA_VISIBLE_DEVICES``, ``MV2_USE_CUDA``...) are read by name from ``environment()``."""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Mapping

__all__ = [
    "ENV_VARS", "TEST_HOOKS", "Config", "bind_device_setting", "config", "cuda_aware_setting", "device_setting",
    "env_flag", "environment", "local_rank_setting", "nonnegative_int", "reload_config", "cuda_driver_hook",
]

#: name -> one-line meaning (read-only); docs/environment.md holds the full table.
ENV_VARS: Mapping[str, str] = types.MappingProxyType({
    "CAI_MPI_SYNC": "0 turns off stream synchronization globally (the CAI v3 consumer opt-out); device: exporters "
                    "that name no stream get a whole-device synchronization; default 1 (the legacy default stream)",
    "CAI_MPI_RUNTIME": "force the device runtime: cuda or host; default: cuda if usable, else host",
    "CAI_MPI_CUDA_AWARE": "1/0 overrides CUDA-awareness detection of the MPI library",
    "CAI_MPI_DEVICE": "force the GPU ordinal this rank uses (default: local rank modulo visible GPUs)",
    "CAI_MPI_LOCAL_RANK": "override the node-local rank used to pick a GPU",
    "CAI_MPI_CHUNK_BYTES": "staging chunk size for device buffers through host memory; default 4 MiB",
    "CAI_MPI_MAX_MESSAGE_BYTES": "largest single MPI message; bigger payloads are split; default 1 GiB",
    "CAI_MPI_INLINE_BYTES": "payloads up to this size travel inside the header message; default 8192",
    "CAI_MPI_MAX_PAYLOAD_BYTES": "receiver refuses headers announcing more; default 1 TiB",
    "CAI_MPI_DEVICE_DATATYPES": "1: strided device arrays use MPI derived datatypes when CUDA-aware (else packed)",
    "CAI_MPI_MEMO_ENTRIES": "most entries each cache of message descriptions keeps (header templates, decoded "
                            "headers, collective plans); default 1024",
    "CAI_MPI_HOST_DATATYPE_BYTES": "largest strided host payload MPI reads or writes in place through a derived "
                                   "datatype (larger ones are packed by numpy); default by library: 4096 on MPICH, "
                                   "unlimited elsewhere",
    "CAI_MPI_BIND_DEVICE": "1: make this rank's GPU current when cai_mpi is imported, before MPI is initialized",
    "CAI_MPI_TIMEOUT": "seconds any cai_mpi wait may last before it raises cai_mpi.TimeoutError; default off",
    "CAI_MPI_POOL_BYTES": "most idle bytes the pool of host receive buffers keeps per process; default 1 GiB",
    "CAI_MPI_PINNED_POOL_BYTES": "most idle bytes of pinned staging memory kept per process and GPU; default 256 MiB",
})

#: Test hooks: read by the library, set only by its test suite and scripts (docs/testing.md), never a user setting.
#: One is needed before anything else runs (at import, before MPI is initialized), so it cannot be a set_runtime().
TEST_HOOKS: Mapping[str, str] = types.MappingProxyType({
    "CAI_MPI_TEST_CUDA_DRIVER": "module:factory whose factory() replaces cuda-python's driver module (a CUDA driver "
                                "double), read when the driver is first loaded",
})


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip().replace("_", ""), 0)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer number of bytes, e.g. {name}={default}") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r}: must be at least {minimum}")
    return value


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    """``_int``'s value, or None when unset (the library chooses)."""
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else _int(env, name, 0)


def env_flag(env: Mapping[str, str], name: str, default: bool, expected: str = "1 or 0") -> bool:
    """The on/off setting ``name`` of ``env`` (1, true, yes, on or 0, false, no, off; unset or blank: ``default``).

    Raises:
        ValueError: any other value (the message says ``expected``).
    """
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected {expected}")


def nonnegative_int(env: Mapping[str, str], name: str) -> int | None:
    """The integer >= 0 that variable ``name`` of ``env`` holds (unset or blank: None); ValueError otherwise."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected a non-negative integer, e.g. {name}=0")
    return value


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip().lower() in ("", "off", "none"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name}={raw!r}: expected a positive number of seconds (or off), e.g. {name}=60")
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    sync: bool
    runtime: str | None
    chunk_bytes: int
    max_message_bytes: int
    inline_bytes: int
    max_payload_bytes: int
    device_datatypes: bool
    timeout: float | None = None
    pool_bytes: int = 1 << 30
    pinned_pool_bytes: int = 256 << 20
    #: CAI_MPI_SYNC=device: a producer that names no stream gets a whole-device synchronization (cuCtxSynchronize)
    #: instead of the legacy default stream's order.
    sync_device: bool = False
    #: None: chosen by the MPI library (``transport.datatypes.host_datatype_bytes``).
    host_datatype_bytes: int | None = None
    memo_entries: int = 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        runtime = env.get("CAI_MPI_RUNTIME", "").strip().lower() or None
        if runtime not in (None, "cuda", "host"):
            hint = (" (the simulated GPU is a tool for tests and for trying things, not a runtime setting: "
                    "python -m cai_mpi run --simulated-gpu)" if runtime == "simulated" else "")
            raise ValueError(f"CAI_MPI_RUNTIME={runtime!r}: expected cuda or host{hint}")
        sync_device = env.get("CAI_MPI_SYNC", "").strip().lower() == "device"
        return cls(
            sync=sync_device or env_flag(env, "CAI_MPI_SYNC", True, "1, 0 or device"),
            sync_device=sync_device,
            runtime=runtime,
            chunk_bytes=min(_int(env, "CAI_MPI_CHUNK_BYTES", 4 << 20, minimum=1), 2**31 - 1),
            max_message_bytes=min(_int(env, "CAI_MPI_MAX_MESSAGE_BYTES", 1 << 30, minimum=1), 2**31 - 1),
            inline_bytes=min(_int(env, "CAI_MPI_INLINE_BYTES", 8192), 1 << 16),
            max_payload_bytes=_int(env, "CAI_MPI_MAX_PAYLOAD_BYTES", 1 << 40),
            device_datatypes=env_flag(env, "CAI_MPI_DEVICE_DATATYPES", False),
            timeout=_seconds(env, "CAI_MPI_TIMEOUT"),
            pool_bytes=_int(env, "CAI_MPI_POOL_BYTES", 1 << 30),
            pinned_pool_bytes=_int(env, "CAI_MPI_PINNED_POOL_BYTES", 256 << 20),
            host_datatype_bytes=_optional_int(env, "CAI_MPI_HOST_DATATYPE_BYTES"),
            memo_entries=_int(env, "CAI_MPI_MEMO_ENTRIES", 1024, minimum=1),
        )


_config = Config.from_env(os.environ)


def config() -> Config:
    return _config


def environment() -> Mapping[str, str]:
    """The process environment: every module that reads a variable gets it here (the settings below, the
    launcher's local rank, ``CUDA_VISIBLE_DEVICES``, the MPI vendors' switches), so this is the one reader."""
    return os.environ


# Settings read where they are used, from a mapping the caller may give (device choice and CUDA-awareness take
# ``env=`` so that a launcher's environment can be examined without being this process's).


def cuda_aware_setting(env: Mapping[str, str]) -> bool | None:
    """``CAI_MPI_CUDA_AWARE``: True or False overrides detection; None (unset or blank) detects.

    Raises:
        ValueError: a value that is not one of 1, true, yes, on, 0, false, no, off.
    """
    raw = env.get("CAI_MPI_CUDA_AWARE")
    if raw is None or raw.strip() == "":
        return None
    try:
        return env_flag(env, "CAI_MPI_CUDA_AWARE", False)
    except ValueError:
        raise ValueError(
            f"CAI_MPI_CUDA_AWARE={raw!r} is not understood: use 1, true, yes or on (the MPI library is CUDA-aware), "
            "0, false, no or off (it is not), or unset CAI_MPI_CUDA_AWARE to detect it"
        ) from None


def device_setting(env: Mapping[str, str]) -> int | None:
    """``CAI_MPI_DEVICE``: the GPU ordinal forced for this rank, or None to choose by local rank.

    Raises:
        ValueError: not a non-negative integer.
    """
    return nonnegative_int(env, "CAI_MPI_DEVICE")


def local_rank_setting(env: Mapping[str, str]) -> int | None:
    """``CAI_MPI_LOCAL_RANK``: the node-local rank that overrides the launcher's, or None.

    Raises:
        ValueError: not a non-negative integer.
    """
    return nonnegative_int(env, "CAI_MPI_LOCAL_RANK")


def bind_device_setting(env: Mapping[str, str]) -> bool:
    """``CAI_MPI_BIND_DEVICE``: make this rank's GPU current when cai_mpi is imported (default off).

    Raises:
        ValueError: a value that is not on or off.
    """
    return env_flag(env, "CAI_MPI_BIND_DEVICE", False)


def cuda_driver_hook() -> str:
    """The test hook ``CAI_MPI_TEST_CUDA_DRIVER`` (``module:factory``), or "" when unset.

    Raises:
        ValueError: a value without ``module:factory``'s colon or with either part empty.
    """
    raw = os.environ.get("CAI_MPI_TEST_CUDA_DRIVER", "").strip()
    module, colon, factory = raw.partition(":")
    if raw and not (colon and module.strip() and factory.strip()):
        raise ValueError(
            f"CAI_MPI_TEST_CUDA_DRIVER={raw!r}: expected module:factory, "
            "the factory named after the colon, e.g. tests.doubles:make_driver"
        )
    return raw


def reload_config(env: Mapping[str, str] | None = None) -> Config:
    """Re-read the environment (tests, or after changing os.environ)."""
    global _config
    _config = Config.from_env(os.environ if env is None else env)
    return _config
