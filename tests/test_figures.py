"""One source for every figure: the README and the documentation's pages hold no
measured number that is not read from its results file.

- The README's headline table is the one `docs/hooks/figures.py` makes from
  `benchmarks/results/` (`python docs/hooks/figures.py` writes it again), and the
  README holds no other figure.
- The pages write `{{ name }}` for a figure, which the MkDocs hook
  `docs/hooks/figure_hook.py` fills in at build time; every name is known and
  every figure reads from its file. No page's source holds a hand-typed ratio,
  time or percentage, a commit hash, or a phrase that tells history.
- The README's example is `docs/examples/first_solve.py`, which
  `tests/test_examples.py` runs and whose output the Getting started page shows
  (run when the site is built).

JSON and text only: no JAX, a second or so.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def _load_figures():
    # The hooks import their modules by name, as MkDocs loads them: from their folder
    # (last on the path: `docs/hooks/benchmarks.py` must not hide `benchmarks/`).
    if str(DOCS / "hooks") not in sys.path:
        sys.path.append(str(DOCS / "hooks"))
    path = DOCS / "hooks" / "figures.py"
    spec = importlib.util.spec_from_file_location("docs_figures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _load_figures()

# A measured figure as prose writes it: a ratio (1.02x, 315x; not 64x64), a time
# (4.9 ms, 12 us, 0.36 s) or a percentage.
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?x(?![\w])"
    r"|(?<![\w.])\d+(?:\.\d+)? ?(?:ms|us|µs|ns|s)\b"
    r"|(?<![\w.])\d+(?:\.\d+)? ?%"
)
# A commit hash (seven or more hex digits with a letter and a digit), and phrases
# that tell how the code came to be rather than what it does.
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
HISTORY = re.compile(
    r"this session|this turn|last session|session before|earlier session"
    r"|until this|the run before|the previous run|an earlier run|was made leaner",
    re.IGNORECASE,
)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """`text` without code blocks, inline code, placeholders and link targets."""
    text = FENCE.sub("", text)
    text = INLINE_CODE.sub("", text)
    text = figures.PLACEHOLDER.sub("", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def _readme_parts() -> tuple[str, str]:
    """The README's headline table, and the rest of it."""
    text = README.read_text()
    head, begin, rest = text.partition(figures.BEGIN)
    table, end, tail = rest.partition(figures.END)
    assert begin and end, "README.md has lost its headline figures' markers"
    return table.strip(), head + tail


def test_every_figure_reads_from_its_results_file():
    assert len(figures.FIGURES) > 50
    for name, (source, _) in figures.FIGURES.items():
        assert (figures.RESULTS / f"{source}.json").is_file(), (name, source)
        text = figures.value(name)
        assert text and "nan" not in text, (name, text)


def test_readme_headline_table_is_its_results_files():
    table, _ = _readme_parts()
    assert table == figures.headline_table(), (
        "README.md's headline table differs from benchmarks/results/: run "
        "`python docs/hooks/figures.py` to write it again"
    )
    # Each row names the backend its results file was measured on.
    for _, source, _, _ in figures.HEADLINES:
        assert figures.backend(source) in table, source


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    # `.ci/run` runs the README's test command.
    assert "make test" in text and "make demo" in text and "pip install ." in text
    assert "make test\n" in (ROOT / ".ci" / "run").read_text()
    _, rest = _readme_parts()
    assert not FIGURE.findall(_prose(rest)), FIGURE.findall(_prose(rest))


def test_readme_example_is_first_solve():
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    assert blocks, "README.md has no example"
    script = DOCS / "examples" / "first_solve.py"
    assert blocks[0] == script.read_text(), (
        "README.md's example differs from docs/examples/first_solve.py"
    )
    page = (DOCS / "getting_started.md").read_text()
    assert '--8<-- "docs/examples/first_solve.py"' in page
    assert "<!-- output docs/examples/first_solve.py -->" in page


def test_every_placeholder_names_a_figure():
    unknown = [
        f"{page.relative_to(ROOT)}: {name}"
        for page in PAGES
        for name in figures.PLACEHOLDER.findall(page.read_text())
        if name not in figures.FIGURES
    ]
    assert not unknown, f"no such figure in docs/hooks/figures.py: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_no_hand_typed_figure_or_history(page):
    text = page.read_text()
    prose = _prose(text)
    found = FIGURE.findall(prose)
    assert not found, (
        f"{page.name} types figures by hand (write `{{{{ name }}}}` with the figure "
        f"in docs/hooks/figures.py): {found}"
    )
    hashes = HASH.findall(FENCE.sub("", text))
    assert not hashes, f"{page.name} names commits: {hashes}"
    history = HISTORY.findall(text)
    assert not history, f"{page.name} tells history: {history}"


def test_readme_tells_no_history():
    text = README.read_text()
    assert not HASH.findall(FENCE.sub("", text))
    assert not HISTORY.findall(text)
