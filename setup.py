"""Build hook for cai_mpi's one C extension; the project metadata lives in pyproject.toml.

``_bufexport`` gives ``cai_mpi.Array`` the buffer protocol on Python < 3.12. It is
optional: without a C compiler the install still succeeds and ``cai_mpi`` falls back
to a pure-Python base class (buffer export then needs Python >= 3.12).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cai_mpi._src._bufexport",
            ["cai_mpi/_src/_bufexport.c"],
            optional=True,
        )
    ]
)
