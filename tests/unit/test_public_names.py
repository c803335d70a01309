"""Public types print as public names (``cai_mpi.PipelineError``, not a private module's path) and errors survive
pickling with their attributes."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import pytest

import cai_mpi

PUBLIC_TYPES = [name for name in cai_mpi.__all__ if isinstance(getattr(cai_mpi, name), type)]


def test_every_public_type_reports_cai_mpi_as_its_module() -> None:
    assert {"Array", "Request", "Pipeline", "SendChannel", "RecvChannel", "PipelineError"} <= set(PUBLIC_TYPES)
    wrong = {n: getattr(cai_mpi, n).__module__ for n in PUBLIC_TYPES if getattr(cai_mpi, n).__module__ != "cai_mpi"}
    assert not wrong


def test_a_traceback_names_the_public_class() -> None:
    err = cai_mpi.PipelineError("Pipeline: stage 1 failed: KeyError: 'x'", 1)
    assert traceback.format_exception_only(type(err), err)[-1].startswith("cai_mpi.PipelineError: Pipeline: stage 1")
    assert repr(cai_mpi.TimeoutError("late", 1.0, True)).startswith("TimeoutError(")  # (repr: the bare name)


ERRORS: list[Any] = [
    cai_mpi.CaiMpiError("base"),
    cai_mpi.CAIError("bad shape"),
    cai_mpi.ProtocolError("bad magic"),
    cai_mpi.RecvMismatchError("too big"),
    cai_mpi.SenderFailedError("sender failed", 2, 7, "CudaError: sticky"),
    cai_mpi.StreamError("bad stream"),
    cai_mpi.RuntimeUnavailableError("no CUDA"),
    cai_mpi.CudaError("cuMemAlloc failed", "cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY"),
    cai_mpi.CollectiveMismatchError("ranks disagree"),
    cai_mpi.PipelineError("Pipeline: stage 1 failed: KeyError: 'x'", 1, {"i": 2}, error_type="KeyError",
                          error_message="'x'", error_traceback="Traceback ...\nKeyError: 'x'\n"),
    cai_mpi.TimeoutError("waited 1 s", 1.0, False),
]


@pytest.mark.parametrize("err", ERRORS, ids=[type(e).__name__ for e in ERRORS])
def test_errors_pickle_with_their_message_and_attributes(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.args == err.args
    assert vars(back) == vars(err)


BUILTIN_BASES = [
    (cai_mpi.CAIError, BufferError),
    (cai_mpi.RecvMismatchError, ValueError),
    (cai_mpi.CudaError, RuntimeError),
    (cai_mpi.CollectiveMismatchError, ValueError),
    (cai_mpi.PipelineError, RuntimeError),
    (cai_mpi.TimeoutError, TimeoutError),
]


@pytest.mark.parametrize("cls, builtin", BUILTIN_BASES, ids=[c.__name__ for c, _ in BUILTIN_BASES])
def test_errors_a_python_user_would_catch_have_the_builtin_base(cls: type, builtin: type) -> None:
    """``except ValueError`` catches a collective's mismatch as it catches a receive's; ``except RuntimeError`` a
    failed Pipeline stage as a CUDA error (issue 34); each stays a CaiMpiError."""
    assert issubclass(cls, builtin) and issubclass(cls, cai_mpi.CaiMpiError)
