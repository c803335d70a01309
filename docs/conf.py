"""Sphinx configuration of cai_mpi's documentation site.

Build: python -m sphinx -W --keep-going -n -b html docs docs/_build/html (tests/test_docs.py does, with the
docs extra installed). Importing cai_mpi initializes MPI; a single process (an MPI singleton) is enough.

Why Sphinx + MyST rather than MkDocs: the pages stay plain Markdown that a code-hosting site renders as it
is (MyST reads GitHub's syntax; its relative ``page.md#heading`` links become cross-references, so a broken
one is a warning, and with -W an error); autodoc + napoleon read the Google-style docstrings the code already
has, as mpi4py, CuPy and mpi4jax document theirs; -n (nitpicky) checks every type in every signature.
Furo: a readable theme from PyPI with no configuration, light and dark.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from typing import Any

from mpi4py import MPI
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer

import cai_mpi

project = "cai_mpi"
author = "the cai_mpi developers"
copyright = "the cai_mpi developers"
release = version = cai_mpi.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "bench-results"]

highlight_language = "text"  # fences without a language (program output) stay plain, as on GitHub
html_theme = "furo"
html_title = f"cai_mpi {release}"

# GitHub's heading slugs, so links such as guide.md#the-stream-policy resolve (and fail the build when stale).
myst_heading_anchors = 4

autodoc_member_order = "bysource"
autodoc_preserve_defaults = True  # show `comm=None`, `op="sum"` as written, not MPI's integer values
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The project writes "Returns:" as Google's style guide does, a sentence ("A Request: wait() returns the Array"),
# with the type in the annotation. Napoleon would read the words before a colon as a type; a plain section
# keeps the sentence whole.
napoleon_custom_sections = ["Returns"]

# -n: every type named in a signature or a docstring must resolve. The site is built offline (no intersphinx),
# so the types of numpy, mpi4py and collections.abc that signatures name cannot; only those are excused.
nitpicky = True
# (np.dtype: the public classes report cai_mpi as their module, whose namespace has no np in which autodoc could
# evaluate a string annotation of theirs.)
nitpick_ignore_regex = [("py:class", r"(numpy|np|mpi4py\.MPI|collections\.abc)\.\w+")]
# Internal types named in public signatures, not documented on purpose: a Request's constructor arguments
# (cai_mpi makes Requests, users do not) and the runtime interface that cai_mpi.testing.SimulatedRuntime implements.
nitpick_ignore = [
    ("py:class", f"cai_mpi._src.{name}")
    for name in (
        "progress.waits.Waitable", "progress.requests.T", "progress.deadlines.Awaited",
        "runtime.base.Runtime", "runtime.base.DeviceBuffer", "runtime.base.Stream", "runtime.base.Event",
        "runtime.base.Location",
    )
]

# --- The API reference: every name of cai_mpi.__all__ and cai_mpi.testing.__all__, grouped by the module that
# defines it, so that a new public name is documented without anyone listing it. In docs/api.md, what GitHub
# shows between `<!-- public-api: MODULE -->` and `<!-- /public-api -->` (a pointer to the source) is
# replaced here by the reference when the site is built.

_SECTIONS = {  # defining module -> section title, in page order; unknown modules go to "Other names"
    "cai_mpi._src.api.p2p": "Point-to-point",
    "cai_mpi._src.progress.requests": "Point-to-point",
    "cai_mpi._src.api.completion": "Point-to-point",
    "cai_mpi._src.api.channel": "Persistent channels",
    "cai_mpi._src.api.collectives": "Collectives",
    "cai_mpi._src.api.reductions": "Collectives",
    "cai_mpi._src.api.persistent_init": "Persistent collectives",
    "cai_mpi._src.api.persistent": "Persistent collectives",
    "cai_mpi._src.api.bucketed": "Persistent collectives",
    "cai_mpi._src.api.pipeline": "Pipelines",
    "cai_mpi._src.arrays.array": "Arrays and descriptors",
    "cai_mpi._src.core.descriptor": "Arrays and descriptors",
    "cai_mpi._src.transport.privcomm": "MPI and GPUs",
    "cai_mpi._src.transport.detect": "MPI and GPUs",
    "cai_mpi._src.runtime.device": "MPI and GPUs",
    "cai_mpi._src.errors": "Errors",
}
_PLACEHOLDER = re.compile(r"^<!-- public-api: ([\w.]+) -->\n.*?^<!-- /public-api -->$", re.MULTILINE | re.DOTALL)


def _data_doc(name: str, value: Any) -> list[str]:
    """The ``#:`` comment above the definition of a public constant, or what it is when it is MPI's."""
    for modname in sorted(m for m in sys.modules if m.startswith("cai_mpi._src.")):
        try:
            doc = ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", name))
        except PycodeError:
            continue
        if doc and getattr(sys.modules[modname], name, None) is value:
            return list(doc)
    if isinstance(value, int) and getattr(MPI, name, None) == value:
        return [f"mpi4py's ``MPI.{name}``, here so that ``import cai_mpi`` is enough."]
    return []


def _attributes_section(cls: type) -> set[str]:
    """The names a Google-style "Attributes:" section of ``cls``'s docstring documents."""
    section = re.search(r"^Attributes:\n((?:    .*\n|\n)*)", (inspect.getdoc(cls) or "") + "\n", re.MULTILINE)
    return set(re.findall(r"^    (\w+)\b[^\n]*:", section[1], re.MULTILINE)) if section else set()


def _directive(module: str, name: str, obj: Any) -> str:
    """The reStructuredText that documents one public name (autodoc writes reStructuredText, hence eval-rst)."""
    target = f"{module}.{name}"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        rst = f".. autoexception:: {target}\n   :members:\n   :show-inheritance:"
    elif inspect.isclass(obj) and module == "cai_mpi":
        # Every attribute and method, documented or not, and those of private base classes (a channel's close()),
        # but not a second, bare time what the class docstring's "Attributes:" section documents.
        rst = f".. autoclass:: {target}\n   :members:\n   :undoc-members:\n   :inherited-members:"
        if documented := _attributes_section(obj):
            rst += f"\n   :exclude-members: {', '.join(sorted(documented))}"
    elif inspect.isclass(obj):
        rst = f".. autoclass:: {target}\n   :members:"
    elif callable(obj):
        rst = f".. autofunction:: {target}"
    else:  # constants: the value of an int, the doc comment of the definition (autodoc would show int's docstring)
        value = f"\n   :value: {obj!r}" if isinstance(obj, int) else ""
        rst = f".. py:data:: {target}{value}\n\n" + "\n".join(f"   {line}" for line in _data_doc(name, obj))
    return f"```{{eval-rst}}\n{rst}\n```"


# cai_mpi makes these, users do not: their reference shows no constructor, whose arguments are internal (an Array's
# owner, a Request's generator, an exception's fields). Every other public class of cai_mpi is one of them unless
# listed here; cai_mpi.testing's classes are all made by users.
_MADE_BY_USERS = {"cai_mpi.Pipeline", "cai_mpi.CAIDescriptor"}


def _hide_internal_constructors(app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None,
                                return_annotation: str | None) -> tuple[str, str | None] | None:
    if signature and what in ("class", "exception") and name.startswith("cai_mpi.") \
            and not name.startswith("cai_mpi.testing.") and name not in _MADE_BY_USERS:
        return "", return_annotation
    return None


def _definition(name: str, obj: Any) -> tuple[str | None, int]:
    """The private module that defines a public class or function, and the line of its definition. Not read from
    ``__module__``: the public classes report ``cai_mpi`` there (what tracebacks should show)."""
    for modname, mod in sorted(sys.modules.items()):
        if modname.startswith("cai_mpi._src.") and vars(mod).get(name) is obj and getattr(mod, "__file__", None):
            with open(mod.__file__, encoding="utf-8") as f:
                found = re.search(rf"^(?:class|def) {name}\b", f.read(), re.MULTILINE)
            if found:
                return modname, found.string.count("\n", 0, found.start()) + 1
    return None, 0


def public_api(module: str) -> str:
    """MyST text documenting every name of ``module.__all__``, in sections by defining module when there are
    several."""
    mod = importlib.import_module(module)
    order = list(dict.fromkeys(_SECTIONS.values()))
    groups: dict[str, list[tuple[int, int, str]]] = {}
    for position, name in enumerate(mod.__all__):
        obj = getattr(mod, name)
        defined_in, line = _definition(name, obj) if inspect.isclass(obj) or inspect.isfunction(obj) else (None, 0)
        title = "Constants" if defined_in is None else _SECTIONS.get(defined_in, "Other names")
        # Known modules in page order, each in source order; anything else in the order of __all__.
        key = (list(_SECTIONS).index(defined_in), line) if defined_in in _SECTIONS else (99, position)
        groups.setdefault(title, []).append((*key, _directive(module, name, obj)))
    titles = sorted(groups, key=lambda t: order.index(t) if t in order else len(order) + (t == "Other names"))
    text = {title: "\n\n".join(d for _, _, d in sorted(groups[title])) for title in titles}
    if len(titles) == 1:
        return text[titles[0]]
    return "\n\n".join(f"### {title}\n\n{text[title]}" for title in titles)


def _expand_public_api(app: Any, docname: str, source: list[str]) -> None:
    source[0] = _PLACEHOLDER.sub(lambda m: public_api(m.group(1)), source[0])


# Files from elsewhere in the repository that the site shows as pages (docs/slurm.md includes the Slurm guide):
# the pages link to the file, which works on GitHub; on the site such a link goes to the page.
_REPOSITORY_PAGES = {"../slurm/README.md": "slurm.md"}


def _link_repository_pages(app: Any, docname: str, source: list[str]) -> None:
    for path, page in _REPOSITORY_PAGES.items():
        source[0] = source[0].replace(f"]({path})", f"]({page})").replace(f"]({path}#", f"]({page}#")


# The pages link a public name to its API entry as [`send_array`](api.md#cai_mpi.send_array), which opens the
# reference page on GitHub. On the site the entry is an object, not a heading: the link becomes a cross-reference
# to it (MyST resolves "#cai_mpi.send_array" through the Python domain), so a stale name fails the strict build.
_API_LINK = re.compile(r"\]\(api\.md#(cai_mpi\.[\w.]+)\)")


def _link_api_entries(app: Any, docname: str, source: list[str]) -> None:
    source[0] = _API_LINK.sub(r"](#\1)", source[0])


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _expand_public_api)
    app.connect("source-read", _link_repository_pages)
    app.connect("source-read", _link_api_entries)
    app.connect("autodoc-process-signature", _hide_internal_constructors)
    return {"parallel_read_safe": True}
