"""Build hook for cai_mpi's C extensions; the project metadata lives in pyproject.toml.

``_bufexport`` gives ``cai_mpi.Array`` the buffer protocol on Python < 3.12 and builds
received Arrays in one call; ``_wirefast`` checks a received header against the last one in
one call. Both are optional: without a C compiler the install still succeeds and ``cai_mpi``
falls back to pure Python (slower per message; buffer export then needs Python >= 3.12).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("cai_mpi._src._bufexport", ["cai_mpi/_src/_bufexport.c"], optional=True),
        Extension("cai_mpi._src._wirefast", ["cai_mpi/_src/_wirefast.c"], optional=True),
    ]
)
