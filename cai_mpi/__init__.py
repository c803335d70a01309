"""cai_mpi: send any CUDA Array Interface object between MPI ranks, stream-safe and self-describing.

    >>> import cai_mpi
    >>> cai_mpi.send_array(x, dest=1)          # doctest: +SKIP  (any CAI object, Array or host array)
    >>> y = cai_mpi.recv_array(source=0)       # doctest: +SKIP  (no shape or dtype needed)

Importing cai_mpi initializes MPI (through mpi4py) and duplicates COMM_WORLD
for cai_mpi's private traffic, so every rank should import it.
"""

from __future__ import annotations

from importlib.metadata import version as _package_version

from ._src.runtime.bind import bind_device_early as _bind_device_early

_bind_device_early()  # CAI_MPI_BIND_DEVICE=1: this rank's GPU is made current before MPI is initialized

from ._src.api.abort import abort_on_error
from ._src.api.bucketed import BucketedAllreduce, allreduce_arrays
from ._src.api.channel import RecvChannel, SendChannel, recv_channel, send_channel
from ._src.api.collectives import bcast_array
from ._src.api.completion import testall, waitall, waitany
from ._src.api.gathers import allgather_array, gather_array
from ._src.api.p2p import irecv_array, isend_array, recv_array, send_array, sendrecv_array
from ._src.api.persistent import PersistentCollective
from ._src.api.persistent_init import allgather_init, allreduce_init, bcast_init, reduce_init
from ._src.api.pipeline import Pipeline
from ._src.api.reductions import allreduce_array, reduce_array
from ._src.api.scatters import alltoall_array, scatter_array
from ._src.api.validation import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._src.arrays.array import Array
from ._src.config import ENV_VARS
from ._src.core.descriptor import CAIDescriptor, describe
from ._src.errors import (
    CAIError,
    CaiMpiError,
    CollectiveMismatchError,
    CudaError,
    PipelineError,
    ProtocolError,
    RecvMismatchError,
    RuntimeUnavailableError,
    SenderFailedError,
    StreamError,
    TimeoutError,
)
from ._src.progress.requests import Request
from ._src.runtime.device import DeviceChoice, choose_device
from ._src.transport.detect import CudaAwareness
from ._src.transport.privcomm import cuda_aware, init_world

try:  # one place for the version: pyproject.toml, read back from the installed package's metadata
    __version__ = _package_version("cai_mpi")
except ModuleNotFoundError:  # importlib.metadata.PackageNotFoundError: a source tree on sys.path, never installed
    __version__ = "0+unknown"

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "BucketedAllreduce",
    "ENV_VARS",
    "PROC_NULL",
    "Array",
    "CAIDescriptor",
    "CAIError",
    "CaiMpiError",
    "CollectiveMismatchError",
    "CudaAwareness",
    "CudaError",
    "DeviceChoice",
    "PersistentCollective",
    "Pipeline",
    "PipelineError",
    "ProtocolError",
    "RecvChannel",
    "RecvMismatchError",
    "Request",
    "RuntimeUnavailableError",
    "SendChannel",
    "SenderFailedError",
    "StreamError",
    "TimeoutError",
    "abort_on_error",
    "allgather_array",
    "allgather_init",
    "allreduce_array",
    "allreduce_arrays",
    "allreduce_init",
    "alltoall_array",
    "bcast_array",
    "bcast_init",
    "choose_device",
    "cuda_aware",
    "describe",
    "gather_array",
    "irecv_array",
    "isend_array",
    "recv_array",
    "recv_channel",
    "reduce_array",
    "reduce_init",
    "scatter_array",
    "send_array",
    "send_channel",
    "sendrecv_array",
    "testall",
    "waitall",
    "waitany",
]

# Public types print as public names (cai_mpi.PipelineError in a traceback, not its private module's path), and
# pickle by them.
for _public in __all__:
    if isinstance(globals()[_public], type):
        globals()[_public].__module__ = __name__
del _public

# Every rank imports cai_mpi, so duplicating COMM_WORLD here cannot block a rank that never
# calls cai_mpi later (a lazy, first-use duplicate would).
init_world()
