"""MkDocs hook: the Benchmarks pages, built from `benchmarks/results/` at build time.

- `on_files`: every PNG under `benchmarks/results/` is published as
  `benchmark-results/<path>`, so the pages show the plots `make bench` last wrote
  without copying them into `docs/`.
- `on_page_markdown`: in the pages of `PAGES`, a line `<!-- bench NAME -->` (NAME
  the path of a JSON file under `benchmarks/results/`, without `.json`) becomes its
  plot, its tables and the machine and versions it came from; `<!-- bench
  environments -->` becomes a table of the environment of every results file (named
  on any of the pages or not). Results that no page names (a new benchmark) are
  shown at the end of the first page, `benchmarks.md`.

A missing results file or one whose format is not understood logs a warning, so
`mkdocs build --strict` fails rather than publishing an empty or stale table.

The tables of each results file are in `benchmark_tables*.py`, beside this file.
"""

import datetime
import json
import logging
import re
import subprocess
from pathlib import Path

# A module beside this hook: MkDocs puts the hook's directory on `sys.path` while it
# loads the hook.
from benchmark_tables import _table, TABLES as CALLS_AND_SOLVERS
from benchmark_tables_auto import TABLES as AUTO
from benchmark_tables_compile import TABLES as COMPILE
from benchmark_tables_programs import TABLES as PROGRAMS
from mkdocs.structure.files import File


log = logging.getLogger("mkdocs.hooks.benchmarks")

TABLES = {**CALLS_AND_SOLVERS, **PROGRAMS, **COMPILE, **AUTO}
TABLES["callsites-dependent"] = TABLES["callsites"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SITE_DIR = "benchmark-results"
# The Benchmarks pages: the first holds the results that no page names.
PAGES = (
    "benchmarks.md",
    "benchmarks_auto.md",
    "benchmarks_programs.md",
    "benchmarks_tpu.md",
)
MARKER = re.compile(r"^<!-- bench (\S+) -->$", re.MULTILINE)
ENV_KEYS = (
    "machine",
    "cpu_count",
    "platform",
    "jax_backend",
    "jax_devices",
    "OPENBLAS_NUM_THREADS",
    "python",
    "jax",
    "jaxlib",
    "lineax",
    "equinox",
    "lineax_dispatch",
)
ENV_COLUMNS = (
    ("machine", "machine"),
    ("jax_backend", "backend"),
    ("OPENBLAS_NUM_THREADS", "OpenBLAS threads"),
    ("python", "Python"),
    ("jax", "jax / jaxlib"),
    ("lineax", "lineax"),
    ("equinox", "equinox"),
    ("lineax_dispatch", "lineax-dispatch"),
)


# ------------------------------------------------------------------ helpers


def _recorded(path: Path) -> str:
    """Date of the last commit of `path`, or of the file if it has changes since."""
    mtime = datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()
    try:

        def git(*args):
            return subprocess.run(
                ("git", *args), cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()

        if git("status", "--porcelain", "--", str(path)):
            return f"{mtime} (not committed)"
        return git("log", "-1", "--format=%cs", "--", str(path)) or mtime
    except (OSError, subprocess.CalledProcessError):
        return mtime


def _environment(data: dict, path: Path) -> dict:
    """The results file's environment, with "?" for what it does not record."""
    env = {key: "?" for key in ENV_KEYS}
    env.update(data.get("environment") or {})
    env["recorded"] = _recorded(path)
    if isinstance(env["jax_devices"], list):
        env["jax_devices"] = ", ".join(env["jax_devices"])
    return env


def _environment_line(env: dict, data: dict) -> str:
    took = data.get("total_seconds")
    took = "" if took is None else f"; the benchmark took {took:.0f} s"
    return (
        f"*Recorded {env['recorded']} on {env['machine']}, {env['cpu_count']} CPUs, "
        f"{env['platform']}; JAX backend {env['jax_backend']}, "
        f"`OPENBLAS_NUM_THREADS={env['OPENBLAS_NUM_THREADS']}`; Python "
        f"{env['python']}, jax {env['jax']}, jaxlib {env['jaxlib']}, lineax "
        f"{env['lineax']}, equinox {env['equinox']}, lineax-dispatch "
        f"{env['lineax_dispatch']}{took}.*"
    )


def _config(config: dict) -> str:
    rows = [(f"`{k}`", f"`{json.dumps(v, default=str)}`") for k, v in config.items()]
    body = _table(("setting", "value"), rows).replace("\n", "\n    ")
    return '??? note "Configuration"\n\n    ' + body


# ------------------------------------------------------------------ rendering


def _section(name: str, page_dir: str, required: bool = True) -> str:
    """Plot, environment, tables and configuration of `<name>.json`/`.png`; a
    missing JSON file is a warning when `required` (named on the page)."""
    path, png = RESULTS / f"{name}.json", RESULTS / f"{name}.png"
    parts = []
    # A results file written without matplotlib (an accelerator's) has no plot.
    if png.is_file():
        parts.append(f"![{name}]({page_dir}{SITE_DIR}/{name}.png)")
    if not path.is_file():
        if required:
            log.warning(f"Benchmarks page: {path} is missing (run `make bench`).")
        return "\n\n".join(parts + [f"*No results file `{name}.json`.*"])
    try:
        data = json.loads(path.read_text())
        parts.append(_environment_line(_environment(data, path), data))
        if Path(name).name in TABLES:
            parts.append(TABLES[Path(name).name](data))
        if isinstance(data.get("config"), dict):
            parts.append(_config(data["config"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as e:
        log.warning(f"Benchmarks page: cannot read {path} ({type(e).__name__}: {e}).")
        parts.append(f"*Could not read `benchmarks/results/{name}.json`.*")
    return "\n\n".join(parts)


def _results_names() -> list[str]:
    """Every results file (JSON or PNG) under `benchmarks/results/`, as a name."""
    paths = [*RESULTS.rglob("*.json"), *RESULTS.rglob("*.png")]
    return sorted({p.relative_to(RESULTS).with_suffix("").as_posix() for p in paths})


def _environments(names: list[str]) -> str:
    """One row per distinct environment, naming the results measured in it."""
    groups: dict[tuple, list[str]] = {}
    platforms = set()
    for name in names:
        path = RESULTS / f"{name}.json"
        if not path.is_file():
            continue
        try:
            env = _environment(json.loads(path.read_text()), path)
        except (TypeError, ValueError) as e:
            log.warning(f"Benchmarks page: cannot read {path} ({e}).")
            continue
        env["machine"] = f"{env['machine']}, {env['cpu_count']} CPUs"
        env["jax"] = f"{env['jax']} / {env['jaxlib']}"
        platforms.add(str(env["platform"]))
        row = tuple(str(env[key]) for key, _ in ENV_COLUMNS)
        groups.setdefault(row, []).append(f"`{name}`")
    table = _table(
        ["results"] + [label for _, label in ENV_COLUMNS],
        [[", ".join(names), *row] for row, names in groups.items()],
    )
    platforms.discard("?")
    return f"{table}\n\nPlatform: {', '.join(sorted(platforms)) or '?'}."


def on_files(files, config, **kwargs):
    for png in sorted(RESULTS.rglob("*.png")):
        uri = f"{SITE_DIR}/{png.relative_to(RESULTS).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(png)))
    return files


def _named(config) -> list[str]:
    """The results that a marker on any of the Benchmarks pages names."""
    named = []
    for name in PAGES:
        path = Path(config["docs_dir"]) / name
        if not path.is_file():
            log.warning(f"Benchmarks pages: {path} is missing (see PAGES).")
            continue
        named += [n for n in MARKER.findall(path.read_text()) if n != "environments"]
    return named


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri not in PAGES:
        return markdown
    page_dir = "../" * page.file.src_uri.count("/")
    named = _named(config)
    # Results that no marker names (a new benchmark) are shown at the end of the
    # first page.
    others = [n for n in _results_names() if n not in named]
    if others and page.file.src_uri == PAGES[0]:
        markdown += "\n\n## Other results\n"
        for name in others:
            markdown += f"\n### `{name}`\n\n" + _section(name, page_dir, False)

    def render(match):
        name = match.group(1)
        if name == "environments":
            return _environments(named + others)
        return _section(name, page_dir)

    return MARKER.sub(render, markdown)
