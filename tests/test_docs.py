"""The documentation site: every public name of `lineax_dispatch` has an entry in
the API pages, and `mkdocs build --strict` passes (no warning: unresolved
cross-references, broken links or anchors, a missing example or benchmark result
all fail it).

The build is skipped only where mkdocs or mkdocstrings is not installed, and fails
instead in this repository's own `.venv` (what `make test` runs in, with the
`tests` extra that brings them).
"""

import ast
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lineax_dispatch as lxd


ROOT = Path(__file__).resolve().parents[1]
API_PAGES = ROOT / "docs" / "api"
RESULTS = ROOT / "benchmarks" / "results"
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
DIRECTIVE = re.compile(r"^::: lineax_dispatch\.(\w+)\s*$", re.MULTILINE)
# A directive and its indented options; the `members:` list in them.
BLOCK = re.compile(r"^::: lineax_dispatch\.([\w.]+)\n((?:    .*\n)*)", re.MULTILINE)
MEMBER = re.compile(r"^ +- (\w+)\s*$", re.MULTILINE)


def _reexports() -> set[str]:
    """The `from ... import X as X` names of `lineax_dispatch/__init__.py`."""
    tree = ast.parse((ROOT / "lineax_dispatch" / "__init__.py").read_text())
    return {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname is not None and alias.asname == alias.name
    }


def public_names() -> set[str]:
    """`lxd.__all__` if defined, else the `X as X` re-exports; plus any other
    public non-module attribute of the package."""
    names = set(getattr(lxd, "__all__", None) or _reexports())
    names |= {
        name
        for name in dir(lxd)
        if not name.startswith("_") and not inspect.ismodule(getattr(lxd, name))
    }
    return names


def documented_names() -> set[str]:
    names = set()
    for page in API_PAGES.glob("*.md"):
        names |= set(DIRECTIVE.findall(page.read_text()))
    return names


def test_every_public_name_in_api_pages():
    names = public_names()
    assert len(names) > 40  # the parsing found the re-exports
    missing = sorted(names - documented_names())
    assert not missing, (
        f"public names of lineax_dispatch with no `::: lineax_dispatch.NAME` entry "
        f"in docs/api/*.md: {missing}"
    )
    unknown = sorted(n for n in documented_names() if not hasattr(lxd, n))
    assert not unknown, f"docs/api/*.md documents names lxd does not have: {unknown}"


def test_api_members_exist():
    """mkdocstrings skips a listed member that does not exist, silently."""
    missing = []
    for page in API_PAGES.glob("*.md"):
        for path, options in BLOCK.findall(page.read_text()):
            obj = lxd
            for part in path.split("."):
                obj = getattr(obj, part)
            missing += [
                f"{path}.{m} ({page.name})"
                for m in MEMBER.findall(options)
                if not hasattr(obj, m)
            ]
    assert not missing, f"docs/api lists members that do not exist: {missing}"


def _require_docs_tools() -> None:
    missing = []
    for module in DOCS_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(module)
    if not missing:
        return
    message = (
        f"{', '.join(missing)} not installed: install the `docs` or `tests` extra "
        '(`pip install -e ".[tests]"`) to build the documentation'
    )
    own_venv = (ROOT / ".venv").resolve()
    if Path(sys.prefix).resolve() == own_venv:
        pytest.fail(f"{message}; `make test` must install it in .venv.")
    pytest.skip(message)


def test_docs_build_strict(tmp_path):
    _require_docs_tools()
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, output

    # mkdocstrings resolved every public name (each has its heading's anchor).
    api_html = "".join(p.read_text() for p in (site / "api").rglob("*.html"))
    unresolved = sorted(
        name
        for name in public_names()
        if f'id="lineax_dispatch.{name}"' not in api_html
    )
    assert not unresolved, f"no rendered API entry for: {unresolved}"

    # The benchmarks pages show every plot in benchmarks/results/.
    page = "".join(
        (site / name / "index.html").read_text()
        for name in (
            "benchmarks",
            "benchmarks_auto",
            "benchmarks_programs",
            "benchmarks_tpu",
        )
    )
    for png in RESULTS.rglob("*.png"):
        uri = f"benchmark-results/{png.relative_to(RESULTS).as_posix()}"
        assert (site / uri).is_file(), uri
        assert uri in page, f"{uri} not shown on the benchmarks pages"
