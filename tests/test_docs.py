"""The documentation cannot rot: its marked code blocks run, and the site builds with warnings as errors.

A page marks a block to run with an HTML comment on the line before its fence (invisible on GitHub and on
the site):

    <!-- runs -->                                        one process, this interpreter
    <!-- runs: mpiexec -n 3 -->                          three ranks, under this venv's mpiexec
    <!-- runs: CAI_MPI_SYNC=0 mpiexec -n 2 -->           NAME=value words set environment variables
    <!-- runs: mpiexec -n 2 --simulated-gpu -->          python -m cai_mpi run --simulated-gpu runs it, on the
                                                         simulated GPU, as the tutorial tells its reader to

More lines inside the comment are Python run before the block, hidden from the reader: the set-up that a
fragment of the guide leaves out. A block fails its test when it exits non-zero (an ``assert`` in it
failed, or it raised), on any rank.

In the guide, a block that does not run says so with ``<!-- fragment -->`` on the line before its fence (a
synopsis, or code that needs a GPU): every fence with a language carries one marker or the other. Fences
without a language hold program output, not code.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch import ROOT, run_ranks

DOCS = ROOT / "docs"
# The one command that builds the site, as README.md, docs/index.md and docs/conf.py give it; the test below adds
# only -q and a doctree folder of its own.
SPHINX_COMMAND = "python -m sphinx -W --keep-going -n -b html docs docs/_build/html"
PAGES_WITH_RUNNING_BLOCKS = ("tutorial.md", "guide.md")
PAGES_WITH_EVERY_BLOCK_MARKED = ("guide.md",)  # each code block runs or is marked a fragment
PUBLIC_MODULES = ("cai_mpi", "cai_mpi.testing")

_MARKED_BLOCK = re.compile(
    r"^<!-- runs(?::(?P<how>[^\n]*?))?[ \t]*(?P<setup>\n.*?)?-->\n```python\n(?P<code>.*?)^```$", re.M | re.S
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    ranks: int  # 0: one process without mpiexec
    env: dict[str, str]
    simulated_gpu: bool
    setup: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def marked_blocks(page: str, text: str) -> list[Block]:
    """The blocks of ``text`` marked to run; a marker that is not followed by a ```python block raises."""
    blocks = []
    for match in _MARKED_BLOCK.finditer(text):
        words = shlex.split(match["how"] or "")
        env = {}
        while words and "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        simulated_gpu = bool(words) and words[-1] == "--simulated-gpu"
        if simulated_gpu:
            words.pop()
        ranks = 0
        if words:
            if words[:2] != ["mpiexec", "-n"] or len(words) != 3 or not words[2].isdigit():
                raise ValueError(f"{page}: cannot read <!-- runs:{match['how']} -->: expected [NAME=value...] "
                                 "[mpiexec -n N] [--simulated-gpu]")
            ranks = int(words[2])
        line = text.count("\n", 0, match.start("code")) + 1
        blocks.append(Block(page, line, ranks, env, simulated_gpu, (match["setup"] or "").strip("\n"), match["code"]))
    markers = len(re.findall(r"^<!-- runs\b", text, re.M))
    if markers != len(blocks):
        raise ValueError(f"{page}: {markers} `<!-- runs` markers but {len(blocks)} marked ```python blocks: "
                         "each marker must end with --> on the line right before the ```python fence")
    return blocks


BLOCKS = [block for page in PAGES_WITH_RUNNING_BLOCKS for block in marked_blocks(page, (DOCS / page).read_text())]


def test_the_tutorial_runs_every_program_that_needs_no_gpu() -> None:
    """The tutorial's promise ("every program on this page is run by the test suite"): only CuPy's are not."""
    text = (DOCS / "tutorial.md").read_text()
    marked = {block.code for block in BLOCKS if block.page == "tutorial.md"}
    unmarked = [code for code in re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S) if code not in marked]
    assert marked and all("import cupy" in code for code in unmarked), unmarked


def unmarked_code_blocks(text: str) -> list[int]:
    """The lines of the fences with a language that are marked neither ``<!-- runs... -->`` nor
    ``<!-- fragment -->`` on the line before; a ``<!-- fragment -->`` on no fence counts too."""
    lines = text.split("\n")
    unmarked, inside = [], False
    for number, line in enumerate(lines):
        if inside:
            inside = not line.startswith("```")
            continue
        if line.startswith("```"):
            inside = True
            marker = text_of_comment_ending(lines, number - 1)
            if line != "```" and not re.match(r"<!-- (runs\b|fragment -->$)", marker):
                unmarked.append(number + 1)
        elif line == "<!-- fragment -->" and not (number + 1 < len(lines) and lines[number + 1].startswith("```")):
            unmarked.append(number + 1)
    return unmarked


def text_of_comment_ending(lines: list[str], number: int) -> str:
    """The HTML comment that ends on line ``number`` (0-based), from its first line; "" if none ends there."""
    if number < 0 or not lines[number].endswith("-->"):
        return ""
    start = number
    while start > 0 and not lines[start].startswith("<!--"):
        start -= 1
    return "\n".join(lines[start:number + 1])


@pytest.mark.one_wheel
def test_unmarked_code_blocks_finds_blocks_without_a_marker() -> None:
    page = ("<!-- fragment -->\n```python\nf(x)\n```\n\n```python\ng()\n```\n\n```\noutput\n```\n"
            "<!-- runs: mpiexec -n 2\nimport os\n-->\n```python\nprint(1)\n```\n<!-- fragment -->\n\n```sh\nls\n```\n")
    assert unmarked_code_blocks(page) == [6, 19, 21]


@pytest.mark.one_wheel
@pytest.mark.parametrize("page", PAGES_WITH_EVERY_BLOCK_MARKED)
def test_every_code_block_runs_or_is_marked_a_fragment(page: str) -> None:
    lines = unmarked_code_blocks((DOCS / page).read_text())
    assert not lines, (f"docs/{page}: the code blocks at lines {lines} neither run (<!-- runs -->, see this file's "
                       "docstring) nor say they are fragments (<!-- fragment --> on the line before the fence)")


@pytest.mark.one_wheel
def test_a_marker_must_sit_on_a_python_block() -> None:
    with pytest.raises(ValueError, match="markers"):
        marked_blocks("page.md", "<!-- runs -->\n\n```python\nprint(1)\n```\n")
    with pytest.raises(ValueError, match="cannot read"):
        marked_blocks("page.md", "<!-- runs: srun -n 2 -->\n```python\nprint(1)\n```\n")
    (block,) = marked_blocks("page.md", "x\n<!-- runs: A=1 mpiexec -n 3\nimport os\n-->\n```python\nprint(1)\n```\n")
    assert (block.line, block.ranks, block.env, block.simulated_gpu) == (6, 3, {"A": "1"}, False)
    assert (block.setup, block.code) == ("import os", "print(1)\n")
    (block,) = marked_blocks("page.md", "<!-- runs: mpiexec -n 2 --simulated-gpu -->\n```python\nprint(1)\n```\n")
    assert (block.ranks, block.env, block.simulated_gpu) == (2, {}, True)
    (block,) = marked_blocks("page.md", "<!-- runs: --simulated-gpu -->\n```python\nprint(1)\n```\n")
    assert (block.ranks, block.simulated_gpu) == (0, True)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_marked_block_runs(block: Block, tmp_path: Path) -> None:
    program = tmp_path / "block.py"
    program.write_text(f"{block.setup}\n{block.code}" if block.setup else block.code)
    # python -m cai_mpi run (as -m mpi4py): an exception on one rank aborts them all, instead of leaving the others
    # waiting; --simulated-gpu puts the program on the test package's simulated GPU, as the tutorial's reader does.
    runner = ["-m", "cai_mpi", "run", "--simulated-gpu"] if block.simulated_gpu else ["-m", "mpi4py"]
    if block.ranks:
        done = run_ranks(block.ranks, [*runner, str(program)], timeout=120, env=block.env)
        returncode, output = done.returncode, done.output
    else:
        proc = subprocess.run([sys.executable, *runner, str(program)], cwd=tmp_path, env={**os.environ, **block.env},
                              capture_output=True, text=True, timeout=120)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    assert returncode == 0, f"the block at {block} failed:\n{output}"


# --- Links to the API reference. A public name that a page mentions in backticks (`send_array`,
# `cai_mpi.Array`, `Array.numpy()`, `cai_mpi.testing.FakeCudaArray`) is a link to its entry,
# [`send_array`](api.md#cai_mpi.send_array): on GitHub that opens the reference page, on the site docs/conf.py
# makes it a cross-reference, which fails the strict build when the entry does not exist. Calls with arguments
# (`recv_array(0, out=buf)`) are code, not names, and headings carry no links.
PAGES_THAT_LINK_API_NAMES = ("guide.md", "tutorial.md", "collectives.md")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\n]*)\)")
_API_NAME = re.compile(r"(?:cai_mpi\.(?P<testing>testing\.)?)?(?P<name>\w+)(?:\.(?P<member>\w+))?(?:\(\))?")


def api_entry(span: str) -> str | None:
    """The reference entry a code span names (``Array.numpy()`` -> ``cai_mpi.Array.numpy``), or None."""
    import cai_mpi.testing

    match = _API_NAME.fullmatch(span)
    if not match:
        return None
    modules = [cai_mpi.testing] if match["testing"] else [cai_mpi] if span.startswith("cai_mpi.") else \
        [cai_mpi, cai_mpi.testing]
    for module in modules:
        if match["name"] in module.__all__:
            entry = f"{module.__name__}.{match['name']}"
            if match["member"] is None:
                return entry
            obj = getattr(module, match["name"])
            return f"{entry}.{match['member']}" if inspect.isclass(obj) and match["member"] in public_members(obj) \
                else None
    return None


def link_api_names(text: str) -> tuple[str, list[str]]:
    """``text`` with each unlinked public name in backticks made a link to its entry, and what was wrong: the
    names that were not linked, and links to the wrong entry. Code blocks, HTML comments and headings are left as
    they are."""
    out, problems, fence, comment = [], [], False, False
    for number, line in enumerate(text.split("\n"), 1):
        skip = fence or comment or line.startswith(("```", "#", "<!--"))
        fence = fence != line.startswith("```")
        comment = (comment or line.startswith("<!--")) and not line.rstrip().endswith("-->")
        if skip:
            out.append(line)
            continue
        links = [(m.start(), m.end(), m[1], m[2]) for m in _LINK.finditer(line)]
        for _, _, label, target in links:
            entry = api_entry(label[1:-1]) if _CODE_SPAN.fullmatch(label) else None
            if entry and target != f"api.md#{entry}":
                problems.append(f"line {number}: [{label}]({target}) should link to api.md#{entry}")

        def link(span: re.Match[str], links: list[tuple[int, int, str, str]] = links, number: int = number) -> str:
            entry = api_entry(span[1])
            if entry is None or any(start <= span.start() < end for start, end, _, _ in links):
                return span[0]
            problems.append(f"line {number}: {span[0]} is not a link to api.md#{entry}")
            return f"[{span[0]}](api.md#{entry})"

        out.append(_CODE_SPAN.sub(link, line))
    return "\n".join(out), problems


@pytest.mark.one_wheel
def test_link_api_names_links_names_but_not_code() -> None:
    text = ("Use `send_array` or [`recv_array`](api.md#cai_mpi.recv_array), `Array.numpy()`, `recv_array(0)`,\n"
            "`cai_mpi.testing.FakeCudaArray`, `Array.nothing`, `numpy.asarray`, [`waitall`](api.md#cai_mpi.waitany)\n"
            "## `Array`\n```python\n`Array`\n```\n<!-- runs:\n`Array`\n-->\n")
    linked, problems = link_api_names(text)
    assert linked.split("\n")[:2] == [
        "Use [`send_array`](api.md#cai_mpi.send_array) or [`recv_array`](api.md#cai_mpi.recv_array), "
        "[`Array.numpy()`](api.md#cai_mpi.Array.numpy), `recv_array(0)`,",
        "[`cai_mpi.testing.FakeCudaArray`](api.md#cai_mpi.testing.FakeCudaArray), `Array.nothing`, `numpy.asarray`, "
        "[`waitall`](api.md#cai_mpi.waitany)"]
    assert linked.split("\n")[2:] == text.split("\n")[2:]
    assert len(problems) == 4 and any("should link to api.md#cai_mpi.waitall" in p for p in problems), problems


@pytest.mark.one_wheel
@pytest.mark.parametrize("page", PAGES_THAT_LINK_API_NAMES)
def test_public_names_link_to_the_api_reference(page: str) -> None:
    _, problems = link_api_names((DOCS / page).read_text())
    assert not problems, (f"docs/{page}: public names in backticks must link to their API entry "
                          "(`python tests/test_docs.py` links them):\n" + "\n".join(problems))


def documented_python_names(objects_inv: Path) -> set[str]:
    """The Python objects a Sphinx inventory (objects.inv, version 2) lists."""
    with objects_inv.open("rb") as f:
        header = [f.readline() for _ in range(4)]
        assert header[0].startswith(b"# Sphinx inventory version 2"), header[0]
        entries = zlib.decompress(f.read()).decode().splitlines()
    names = set()
    for entry in entries:
        name, role = entry.split(" ", 2)[:2]
        if role.startswith("py:"):
            names.add(name)
    return names


def class_definition(cls: type) -> ast.ClassDef:
    """The class statement of ``cls``, found in the private module that defines it (public classes report
    ``cai_mpi`` as their ``__module__``, so inspect.getsource cannot find them)."""
    for name, mod in sorted(sys.modules.items()):
        if name.startswith("cai_mpi") and vars(mod).get(cls.__name__) is cls and getattr(mod, "__file__", None):
            for node in ast.walk(ast.parse(Path(mod.__file__).read_text())):
                if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
                    return node
    raise LookupError(f"no module of cai_mpi defines {cls!r}")


def public_members(cls: type) -> set[str]:
    """A class's public attributes and methods: its own and its cai_mpi bases' (not object's, tuple's or
    Exception's), dataclass fields, and attributes its methods assign (``self.first = ...``)."""
    names = {name for name in dir(cls) if not name.startswith("_")
             and any(name in vars(k) for k in cls.__mro__ if k.__module__.startswith("cai_mpi"))}
    if dataclasses.is_dataclass(cls):
        names |= {field.name for field in dataclasses.fields(cls) if not field.name.startswith("_")}
    for k in cls.__mro__:
        if k.__module__.startswith("cai_mpi"):
            for node in ast.walk(class_definition(k)):
                targets = node.targets if isinstance(node, ast.Assign) else []
                targets += [node.target] if isinstance(node, ast.AnnAssign) else []
                for target in targets:
                    for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            names.add(t.attr)
    return {name for name in names if not name.startswith("_")}


@pytest.mark.one_wheel
def test_public_members_finds_properties_fields_and_instance_attributes() -> None:
    import cai_mpi

    assert {"shape", "dtype", "numpy", "source", "meta", "device"} <= public_members(cai_mpi.Array)
    assert {"first", "last", "stage", "depth", "send", "recv", "close"} <= public_members(cai_mpi.Pipeline)
    assert {"close", "send", "isend", "dest"} <= public_members(cai_mpi.SendChannel)
    assert {"aware", "detail"} <= public_members(cai_mpi.CudaAwareness)
    assert public_members(cai_mpi.TimeoutError) == {"seconds", "cancelled"}  # not BaseException's args


def documented_parameters(doc: str) -> dict[str, str]:
    """The entries of a Google-style "Args:" section: parameter name -> its description ("a, b: ..." is one entry
    named "a, b", which napoleon renders as one description repeated under each name)."""
    section = re.search(r"^Args:\n((?:    .*\n|\n)*)", doc + "\n", re.MULTILINE)
    if not section:
        return {}
    entries = re.findall(r"^    (\S[^:\n]*?)(?: \([^)]*\))?: (.*(?:\n        .*)*)", section[1], re.MULTILINE)
    return {name: " ".join(description.split()) for name, description in entries}


@pytest.mark.one_wheel
def test_every_public_function_documents_each_parameter_in_its_own_words() -> None:
    """The reference renders each parameter with what it means, not "as in reduce_array": the reader of one entry
    should not have to open another. (cai_mpi.testing's helpers are for tests and are not held to it.)"""
    problems = []
    for module in ("cai_mpi",):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            fn = getattr(mod, name)
            if not inspect.isfunction(fn):
                continue
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            documented = documented_parameters(inspect.getdoc(fn) or "")
            for entry, description in documented.items():
                if "," in entry:
                    problems.append(f"{module}.{name}: `{entry}` share one description; give each its own")
                elif re.match(r"(as in|see)\b", description, re.IGNORECASE):
                    problems.append(f"{module}.{name}: `{entry}` is described only by reference: {description!r}")
            problems += [f"{module}.{name}: parameter `{p.name}` is not in its Args: section"
                         for p in params if p.name not in documented and not any(
                             p.name in entry.split(", ") for entry in documented)]
    assert not problems, "\n".join(problems)


@pytest.mark.one_wheel
def test_documented_parameters_reads_google_args() -> None:
    doc = "Do it.\n\nArgs:\n    a: the first\n        and more.\n    b, c: as in f.\n    d (int): four.\n\nReturns: x"
    assert documented_parameters(doc) == {"a": "the first and more.", "b, c": "as in f.", "d": "four."}


@pytest.mark.one_wheel
def test_site_builds_without_warnings_and_documents_every_public_name(tmp_path: Path) -> None:
    """The site (docs/conf.py) builds with -W -n: a broken link, cross-reference or docstring fails here."""
    for module in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(module, reason="the docs extra is not installed here: pip install -e '.[docs]' "
                                           "(scripts/test.sh installs it in the Open MPI venv, which builds the site)")
    html = tmp_path / "html"
    documented_cmd = shlex.split(SPHINX_COMMAND)
    assert documented_cmd[:3] == ["python", "-m", "sphinx"] and documented_cmd[-2:] == ["docs", "docs/_build/html"]
    cmd = [sys.executable, *documented_cmd[1:-2], "-q", "-d", str(tmp_path / "doctrees"), str(DOCS), str(html)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"`{shlex.join(cmd)}` failed:\n{done.stdout}{done.stderr}"
    documented = documented_python_names(html / "objects.inv")
    missing = [f"{module}.{name}" for module in PUBLIC_MODULES
               for name in importlib.import_module(module).__all__ if f"{module}.{name}" not in documented]
    assert not missing, f"public names missing from the API reference (docs/api.md): {missing}"
    # Every attribute and method of cai_mpi's classes too (Array.shape, Pipeline.first, Request.done, ...).
    import cai_mpi

    classes = {name: obj for name in cai_mpi.__all__ if inspect.isclass(obj := getattr(cai_mpi, name))}
    entries = [f"cai_mpi.{name}.{member}" for name, obj in classes.items() for member in sorted(public_members(obj))]
    missing = [entry for entry in entries if entry not in documented]
    assert not missing, f"public attributes missing from the API reference (docs/conf.py, docstrings): {missing}"
    # Users construct only these; the reference shows no constructor (internal arguments) for the other classes.
    api_html = (html / "api.html").read_text()
    headers = re.findall(r'<dt class="sig sig-object py" id="cai_mpi\.(\w+)">(.*?)</dt>', api_html, re.S)
    with_constructor = {name for name, header in headers if name in classes and "sig-paren" in header}
    assert with_constructor == {"Pipeline", "CAIDescriptor"}, with_constructor


@pytest.mark.one_wheel
def test_one_sphinx_command_everywhere() -> None:
    """README.md, the docs and the scripts give the same command to build the site (the one the test above runs)."""
    scripts = sorted(p for p in (ROOT / "scripts").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), DOCS / "conf.py", *scripts]
    found = {}
    for path in files:
        for command in re.findall(r"(?:python3? -m sphinx|sphinx-build)\b[^`\n(]*", path.read_text()):
            found.setdefault(command.strip().rstrip(").;"), []).append(str(path.relative_to(ROOT)))
    readme_and_index = {f for files_ in found.values() for f in files_} & {"README.md", "docs/index.md"}
    assert readme_and_index == {"README.md", "docs/index.md"}, found
    assert list(found) == [SPHINX_COMMAND], f"expected only `{SPHINX_COMMAND}`, found {found}"


# --- docs/api.md, readable where Sphinx has not run (issue 46): between `<!-- public-api: MODULE -->` and
# `<!-- /public-api -->` the page holds a plain reference, generated from the code: each public name with its
# signature (defaults as written) and the first paragraph of its docstring, and an anchor per name and member so that
# the pages' links (api.md#cai_mpi.send_array) open it on GitHub. The site replaces it with the full entries
# (docs/conf.py); the test below keeps it current.
_PUBLIC_API = re.compile(r"^(<!-- public-api: ([\w.]+) -->\n).*?^(<!-- /public-api -->)$", re.M | re.S)


def _first_paragraph(obj: object) -> str:
    return " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())


def _signature(fn: object) -> str:
    """``fn``'s parameters as its source writes them (``source=ANY_SOURCE``, not -1), without annotations."""
    try:
        source = inspect.getsource(fn)  # type: ignore[arg-type]
    except OSError:  # made at run time (a dataclass's __init__): its signature, without annotations
        sig = inspect.signature(fn)  # type: ignore[arg-type]
        params = [q.replace(annotation=q.empty) for q in sig.parameters.values() if q.name != "self"]
        return str(sig.replace(parameters=params, return_annotation=sig.empty))
    node = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(node, ast.FunctionDef), node
    args = node.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            arg.annotation = None
    if args.args and args.args[0].arg == "self":
        args.args.pop(0)
    return f"({ast.unparse(args)})"


def plain_reference(module: str) -> str:
    """The plain Markdown reference of ``module.__all__``, in its order (see above)."""
    from mpi4py import MPI

    mod = importlib.import_module(module)
    made_by_users = {"Pipeline", "CAIDescriptor"} if module == "cai_mpi" else set(mod.__all__)
    lines = [f"Generated from the docstrings of `{module}` by `python tests/test_docs.py` (the built site has each "
             "entry whole).", ""]
    for name in mod.__all__:
        obj, anchor = getattr(mod, name), f'<a id="{module}.{name}"></a>'
        if inspect.isfunction(obj):
            lines.append(f"- {anchor}`{name}{_signature(obj)}`: {_first_paragraph(obj)}")
        elif inspect.isclass(obj):
            init = _signature(obj.__init__) if name in made_by_users and "__init__" in vars(obj) else ""
            kind = "exception" if issubclass(obj, BaseException) else "class"
            lines.append(f"- {anchor}{kind} `{name}{init}`: {_first_paragraph(obj)}")
            members = sorted(public_members(obj)) if module == "cai_mpi" else []
            if members:
                links = ", ".join(f'<a id="{module}.{name}.{m}"></a>`{m}`' for m in members)
                lines.append(f"  Members: {links}.")
        elif isinstance(obj, int):
            mpi = getattr(MPI, name, None) == obj
            lines.append(f"- {anchor}`{name} = {obj!r}`" + (f": mpi4py's `MPI.{name}`" if mpi else ""))
        else:
            lines.append(f"- {anchor}`{name}`: a {type(obj).__name__} ({len(obj)} entries)" if hasattr(obj, "__len__")
                         else f"- {anchor}`{name}`")
    return "\n".join(lines) + "\n"


def with_plain_reference(text: str) -> str:
    return _PUBLIC_API.sub(lambda m: m[1] + plain_reference(m[2]) + m[3], text)


@pytest.mark.one_wheel
def test_the_api_page_is_readable_without_sphinx_and_current() -> None:
    """docs/api.md lists every public name with its signature and docstring's first paragraph, as the code has
    them now (`python tests/test_docs.py` rewrites it), and has an anchor for every link the pages make to it."""
    text = (DOCS / "api.md").read_text()
    assert text == with_plain_reference(text), "docs/api.md is stale: run `python tests/test_docs.py`"
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            assert f'<a id="{module}.{name}"></a>' in text, name
    assert "`send_array(obj, dest, tag=0, comm=None, *, sync=None, meta=None, timeout=None)`" in text
    links = {target for page in PAGES_THAT_LINK_API_NAMES
             for target in re.findall(r"\]\(api\.md#([\w.]+)\)", (DOCS / page).read_text())}
    assert links and not [t for t in links if f'<a id="{t}"></a>' not in text]




@pytest.mark.one_wheel
def test_one_recipe_builds_mpi4py_against_the_cluster_s_mpi() -> None:
    """docs/installation.md holds the one command that builds mpi4py against a site's MPI; every other page that
    tells how links to it rather than giving a command of its own (they had drifted apart, issue 34)."""
    recipe = "MPI4PY_BUILD_MPICC=\"$(command -v mpicc)\" python -m pip install --force-reinstall --no-cache-dir " \
             "--no-binary=mpi4py mpi4py"
    assert recipe in (DOCS / "installation.md").read_text()
    pages = [ROOT / "README.md", ROOT / "slurm" / "README.md", ROOT / "slurm" / "cai_mpi.sbatch",
             *sorted(DOCS.glob("*.md"))]
    for page in pages:
        text = page.read_text()
        if page.name != "installation.md":
            assert "--no-binary=mpi4py" not in text, f"{page}: link to installation.md's recipe instead"
    for page in (ROOT / "slurm" / "README.md", DOCS / "gpu-and-mpi.md"):
        assert "installation.md#building-mpi4py-against-the-clusters-mpi" in page.read_text(), page


@pytest.mark.one_wheel
def test_install_commands_install_from_the_clone_with_extras_that_exist() -> None:
    """cai_mpi is on no package index yet (issue 46): the pages install it from the clone, `pip install -e
    ".[extra]"` with extras pyproject.toml defines, and give the index form only as the one for when it is
    published."""
    tomllib = pytest.importorskip("tomllib")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    pages = [ROOT / "README.md", ROOT / "slurm" / "README.md", *sorted(DOCS.glob("*.md"))]
    problems, commands = [], 0
    for page in pages:
        for number, line in enumerate(page.read_text().split("\n"), 1):
            where = f"{page.relative_to(ROOT)}:{number}"
            if re.search(r"pip install (?:-\S+ )*[\"']?cai_mpi\b", line) and "published" not in line:
                problems.append(f"{where}: installs from a package index cai_mpi is not on: {line.strip()}")
            for named in re.findall(r"pip install -e [\"']?\.\[([\w,]+)\]", line):
                commands += 1
                problems += [f"{where}: no extra {e!r} in pyproject.toml" for e in named.split(",") if e not in extras]
    assert commands >= 5 and not problems, "\n".join(problems)


@pytest.mark.one_wheel
def test_the_benchmarks_page_is_user_sized() -> None:
    """Issue 46: docs/benchmarks.md holds today's figures, each with its command, and what to choose when, in at most
    700 lines; how the figures came to be is docs/benchmarks-history.md. Its PASS and FAIL are verdicts only where
    `bench --check-targets` gives one: no 8-byte or pickle ratio is called either (they depend on the machine)."""
    text = (DOCS / "benchmarks.md").read_text()
    assert len(text.split("\n")) <= 700
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[:2] == ["Figures of this release's engine work", "What to choose when"], headings
    assert "(benchmarks-history.md)" in text
    rows = [line for line in text.split("\n") if line.startswith("|") and re.search(r"\b(PASS|FAIL)\b", line)]
    machine_dependent = [row for row in rows if re.search(r"8 B|pickle", row.split("|")[1])]
    assert rows and not machine_dependent, machine_dependent


@pytest.mark.one_wheel
@pytest.mark.parametrize("page", ["README.md", "docs/collectives.md", "docs/benchmarks.md"])
def test_the_gradient_averaging_advice_says_where_it_does_not_hold(page: str) -> None:
    """Issue 46: "the fastest way to average gradients" is not, for large buffers on Open MPI without an MCA setting;
    each page that recommends it links the guide's advice for Open MPI."""
    text = (ROOT / page).read_text()
    assert "guide.md#persistent-collectives-the-same-collective-every-step" in text and "Open MPI" in text


if __name__ == "__main__":  # python tests/test_docs.py: link the public names of the pages (see link_api_names)
    for page in PAGES_THAT_LINK_API_NAMES:  # and write docs/api.md's plain reference (see plain_reference)
        path = DOCS / page
        linked, problems = link_api_names(path.read_text())
        path.write_text(linked)
        print(f"docs/{page}: {len(problems)} fixed or to fix by hand", *problems, sep="\n  ")
    (DOCS / "api.md").write_text(with_plain_reference((DOCS / "api.md").read_text()))
    print("docs/api.md: the plain reference written")
