"""Coverage-guided fuzzing of the header decoder with atheris (libFuzzer), checking the property of
tests/hostile_headers.py on every input. tests/unit/test_header_fuzz.py runs it for CAI_MPI_FUZZ_SECONDS; by hand:

    python tests/fuzz_header.py -max_total_time=600 -dict=tests/fuzz_header.dict CORPUS_DIR

An input that breaks the property ends the run with its traceback and a ``crash-*`` file holding the input.
"""

from __future__ import annotations

import sys
import tracemalloc
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wire_format_alone() -> None:
    """Make ``cai_mpi._src.core.header`` importable without cai_mpi's package init, which initializes MPI: libFuzzer
    ends the process with exit(), which would leave MPI unfinalized (and its startup would dominate short runs)."""
    for name, path in (("cai_mpi", ROOT / "cai_mpi"), ("cai_mpi._src", ROOT / "cai_mpi" / "_src")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package


def main() -> None:
    _wire_format_alone()
    sys.path.insert(0, str(ROOT / "tests"))
    import atheris

    with atheris.instrument_imports(include=["cai_mpi._src.core.header"]):
        import hostile_headers
    tracemalloc.start()

    def one_input(data: bytes) -> None:
        hostile_headers.check_decoder(data, measure=True)

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
