"""Config: the environment variables cai_mpi reads, parsed strictly."""

from __future__ import annotations

import dataclasses

import pytest

from cai_mpi._src import config as config_mod
from cai_mpi._src.config import ENV_VARS, Config, reload_config

# =============================================================================================
# Config

DEFAULTS = Config(
    sync=True,
    runtime=None,
    chunk_bytes=4 << 20,
    max_message_bytes=1 << 30,
    inline_bytes=8192,
    max_payload_bytes=1 << 40,
    device_datatypes=False,
)


def test_config_defaults() -> None:
    assert Config.from_env({}) == DEFAULTS
    assert Config.from_env({"UNRELATED": "1", "CAI_MPI_SYNC": "", "CAI_MPI_CHUNK_BYTES": "  "}) == DEFAULTS


@pytest.mark.parametrize(
    ("name", "field"),
    [("CAI_MPI_SYNC", "sync"), ("CAI_MPI_DEVICE_DATATYPES", "device_datatypes")],
)
@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        (" 1 ", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("OFF", False),
        ("\t0\n", False),
    ],
)
def test_config_bools(name: str, field: str, raw: str, value: bool) -> None:
    assert getattr(Config.from_env({name: raw}), field) is value


@pytest.mark.parametrize("name", ["CAI_MPI_SYNC", "CAI_MPI_DEVICE_DATATYPES"])
@pytest.mark.parametrize("raw", ["2", "maybe", "y", "-1", "01", "truee"])
def test_config_bad_bools(name: str, raw: str) -> None:
    expected = "1, 0 or device" if name == "CAI_MPI_SYNC" else "1 or 0"
    with pytest.raises(ValueError, match=f"^{name}={raw!r}: expected {expected}$"):
        Config.from_env({name: raw})


@pytest.mark.parametrize("raw", ["device", " Device "])
def test_cai_mpi_sync_device_opts_in_to_whole_device_synchronization(raw: str) -> None:
    c = Config.from_env({"CAI_MPI_SYNC": raw})
    assert c.sync and c.sync_device
    assert not Config.from_env({"CAI_MPI_SYNC": "1"}).sync_device and not Config.from_env({}).sync_device


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("cuda", "cuda"),
        ("host", "host"),
        (" Host ", "host"),
        ("", None),
        ("   ", None),
    ],
)
def test_config_runtime(raw: str, value: str | None) -> None:
    assert Config.from_env({"CAI_MPI_RUNTIME": raw}).runtime == value


@pytest.mark.parametrize("raw", ["gpu", "cpu", "sim", "cuda12"])
def test_config_bad_runtime(raw: str) -> None:
    with pytest.raises(ValueError, match=f"^CAI_MPI_RUNTIME={raw!r}: expected cuda or host$"):
        Config.from_env({"CAI_MPI_RUNTIME": raw})


INT_VARS = [
    ("CAI_MPI_CHUNK_BYTES", "chunk_bytes", 1),
    ("CAI_MPI_MAX_MESSAGE_BYTES", "max_message_bytes", 1),
    ("CAI_MPI_INLINE_BYTES", "inline_bytes", 0),
    ("CAI_MPI_MAX_PAYLOAD_BYTES", "max_payload_bytes", 0),
    ("CAI_MPI_POOL_BYTES", "pool_bytes", 0),
    ("CAI_MPI_PINNED_POOL_BYTES", "pinned_pool_bytes", 0),
]


@pytest.mark.parametrize(("name", "field", "minimum"), INT_VARS)
@pytest.mark.parametrize(("raw", "value"), [("1024", 1024), ("0x100", 256), ("1_000", 1000), (" 77 ", 77)])
def test_config_ints(name: str, field: str, minimum: int, raw: str, value: int) -> None:
    assert getattr(Config.from_env({name: raw}), field) == value


@pytest.mark.parametrize(("name", "field", "minimum"), INT_VARS)
def test_config_int_minimum(name: str, field: str, minimum: int) -> None:
    assert getattr(Config.from_env({name: str(minimum)}), field) == minimum
    with pytest.raises(ValueError, match=f"^{name}='{minimum - 1}': must be at least {minimum}$"):
        Config.from_env({name: str(minimum - 1)})


@pytest.mark.parametrize(("name", "field", "minimum"), INT_VARS)
@pytest.mark.parametrize("raw", ["4MiB", "1.5", "1e6", "ten", "0x", "12 34"])
def test_config_bad_ints(name: str, field: str, minimum: int, raw: str) -> None:
    with pytest.raises(
        ValueError, match=f"^{name}={raw!r}: expected an integer number of bytes, e.g. {name}="
    ):
        Config.from_env({name: raw})


def test_config_caps() -> None:
    c = Config.from_env({"CAI_MPI_MAX_MESSAGE_BYTES": str(3 << 30), "CAI_MPI_INLINE_BYTES": "100000",
                         "CAI_MPI_CHUNK_BYTES": str(3 << 30)})
    assert (c.max_message_bytes, c.inline_bytes, c.chunk_bytes) == (2**31 - 1, 1 << 16, 2**31 - 1)
    c = Config.from_env({"CAI_MPI_MAX_MESSAGE_BYTES": str(2**31 - 2), "CAI_MPI_INLINE_BYTES": "65535",
                         "CAI_MPI_CHUNK_BYTES": str(2**31 - 2)})
    assert (c.max_message_bytes, c.inline_bytes, c.chunk_bytes) == (2**31 - 2, 65535, 2**31 - 2)
    assert Config.from_env({"CAI_MPI_MAX_PAYLOAD_BYTES": str(1 << 50)}).max_payload_bytes == 1 << 50


def test_config_is_frozen_and_documented() -> None:
    c = Config.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.sync = False  # type: ignore[misc]
    for name in [
        "CAI_MPI_SYNC",
        "CAI_MPI_RUNTIME",
        "CAI_MPI_CHUNK_BYTES",
        "CAI_MPI_MAX_MESSAGE_BYTES",
        "CAI_MPI_INLINE_BYTES",
        "CAI_MPI_MAX_PAYLOAD_BYTES",
        "CAI_MPI_DEVICE_DATATYPES",
    ]:
        assert name in ENV_VARS


def test_reload_config_with_a_dict() -> None:
    c = reload_config({"CAI_MPI_CHUNK_BYTES": "123", "CAI_MPI_SYNC": "0"})
    assert config_mod.config() is c
    assert (c.chunk_bytes, c.sync) == (123, False)



@pytest.mark.parametrize(("raw", "value"), [("0.5", 0.5), ("60", 60.0), (" 2.5 ", 2.5), ("1e-3", 1e-3),
                                            ("", None), ("off", None), ("OFF", None), ("none", None)])
def test_config_timeout(raw: str, value: float | None) -> None:
    assert Config.from_env({"CAI_MPI_TIMEOUT": raw}).timeout == value
    assert Config.from_env({}).timeout is None  # off unless set


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "soon", "1s", "0x10"])
def test_config_bad_timeout(raw: str) -> None:
    with pytest.raises(ValueError, match=f"^CAI_MPI_TIMEOUT={raw!r}: expected a positive number of seconds"):
        Config.from_env({"CAI_MPI_TIMEOUT": raw})


# =============================================================================================
# Settings read where they are used (device choice, CUDA-awareness, binding, the driver hook)


@pytest.mark.parametrize("name", ["CAI_MPI_DEVICE", "CAI_MPI_LOCAL_RANK"])
@pytest.mark.parametrize("raw", ["-1", "one", "1.5"])
def test_bad_ordinal_settings_name_the_variable(name: str, raw: str) -> None:
    from cai_mpi._src.runtime.device import choose_device

    with pytest.raises(ValueError, match=f"{name}={raw!r}: expected a non-negative integer"):
        choose_device({name: raw, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})


def test_device_and_local_rank_settings_reach_the_choice() -> None:
    from cai_mpi._src.runtime.device import choose_device

    visible = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_LOCALID": "1"}
    assert choose_device(visible).ordinal == 1
    assert choose_device({**visible, "CAI_MPI_LOCAL_RANK": "6"}).ordinal == 2
    assert choose_device({**visible, "CAI_MPI_DEVICE": "3"}).ordinal == 3


@pytest.mark.parametrize("raw", ["0", " 0 ", "00"])
def test_zero_is_a_valid_device_and_local_rank(raw: str) -> None:
    """GPU 0 and local rank 0 are the commonest settings of all: zero is a value, not 'unset'."""
    from cai_mpi._src.config import device_setting, local_rank_setting
    from cai_mpi._src.runtime.device import choose_device

    assert device_setting({"CAI_MPI_DEVICE": raw}) == 0
    assert local_rank_setting({"CAI_MPI_LOCAL_RANK": raw}) == 0
    visible = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_LOCALID": "3"}
    assert choose_device({**visible, "CAI_MPI_DEVICE": raw}).ordinal == 0
    assert choose_device({**visible, "CAI_MPI_LOCAL_RANK": raw}).ordinal == 0


def test_the_process_environment_reaches_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from cai_mpi._src.runtime.device import choose_device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    monkeypatch.setenv("CAI_MPI_LOCAL_RANK", "5")
    monkeypatch.delenv("CAI_MPI_DEVICE", raising=False)
    assert choose_device().ordinal == 2


@pytest.mark.parametrize("raw", ["2", "maybe", "yes please"])
def test_a_bad_cuda_aware_setting_is_refused(raw: str) -> None:
    from cai_mpi._src.transport.detect import detect_local

    with pytest.raises(ValueError, match=f"CAI_MPI_CUDA_AWARE={raw!r} is not understood"):
        detect_local(env={"CAI_MPI_CUDA_AWARE": raw})


@pytest.mark.parametrize(("raw", "aware"), [("1", True), ("on", True), ("0", False), ("no", False)])
def test_the_cuda_aware_setting_decides(raw: str, aware: bool) -> None:
    from cai_mpi._src.transport.detect import SOURCE_ENV, detect_local

    answer = detect_local(env={"CAI_MPI_CUDA_AWARE": raw})
    assert (answer.aware, answer.source) == (aware, SOURCE_ENV)


def test_a_bad_bind_device_setting_is_refused() -> None:
    from cai_mpi._src.runtime.bind import bind_device_early

    with pytest.raises(ValueError, match="CAI_MPI_BIND_DEVICE='2': expected 1 or 0"):
        bind_device_early({"CAI_MPI_BIND_DEVICE": "2"})
    assert bind_device_early({"CAI_MPI_BIND_DEVICE": "0"}) is None


@pytest.mark.parametrize("raw", ["cai_mpi.testing.cuda_driver", ":CudaDriverDouble", "cai_mpi.testing.cuda_driver:"])
def test_a_bad_driver_hook_is_refused_when_the_driver_loads(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from cai_mpi._src.runtime.cudadriver import load_driver

    monkeypatch.setenv("CAI_MPI_TEST_CUDA_DRIVER", raw)
    with pytest.raises(ValueError, match=r"CAI_MPI_TEST_CUDA_DRIVER=.*expected module:factory"):
        load_driver()


def test_the_driver_hook_reaches_the_driver_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    from cai_mpi._src.runtime.cudadriver import load_cupy, load_driver
    from cai_mpi.testing.cuda_driver import CudaDriverDouble

    monkeypatch.setenv("CAI_MPI_TEST_CUDA_DRIVER", "cai_mpi.testing.cuda_driver:CudaDriverDouble")
    assert isinstance(load_driver(), CudaDriverDouble)
    assert load_cupy() is None


def test_only_config_reads_the_process_environment() -> None:
    import pathlib
    import re

    import cai_mpi

    src = pathlib.Path(cai_mpi.__file__).parent / "_src"
    readers = sorted(
        str(path.relative_to(src)) for path in src.rglob("*.py")
        if path.parts[len(src.parts)] != "cli" and re.search(r"os\.environ|getenv", path.read_text())
    )
    assert readers == ["config.py"]


def test_every_description_memo_keeps_at_most_the_setting_then_starts_again() -> None:
    """CAI_MPI_MEMO_ENTRIES bounds each cache of descriptions (header templates, decodings, collective plans)."""
    import numpy as np

    from cai_mpi._src.core import header
    from cai_mpi._src.core.memo import Memo

    reload_config({"CAI_MPI_MEMO_ENTRIES": "3"})
    try:
        memo: Memo[int, str] = Memo()
        for k in range(3):
            assert memo.remember(k, str(k)) == str(k)
        assert dict(memo) == {0: "0", 1: "1", 2: "2"}
        memo.remember(3, "3")
        assert dict(memo) == {3: "3"}  # full: forgotten whole, then the new one kept
        header._templates.clear()
        for n in range(1, 8):  # distinct shapes, sent with a payload tag (not inline)
            header.encode_header(np.dtype(np.float32), (n,), fortran=False, payload_tag=5)
            assert 1 <= len(header._templates) <= 3
        with pytest.raises(ValueError, match="CAI_MPI_MEMO_ENTRIES"):
            reload_config({"CAI_MPI_MEMO_ENTRIES": "0"})
    finally:
        reload_config()
