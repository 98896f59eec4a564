"""MkDocs hook: the Benchmarks page, built from `benchmarks/results/` at build time.

- `on_files`: every PNG under `benchmarks/results/` is published as
  `benchmark-results/<path>`, so the page shows the plots `make bench` last wrote
  without copying them into `docs/`.
- `on_page_markdown`: in `benchmarks.md`, a line `<!-- bench NAME -->` (NAME the
  path of a JSON file under `benchmarks/results/`, without `.json`) becomes its
  plot, its tables and the machine and versions it came from; `<!-- bench
  environments -->` becomes a table of every results file's environment.

A missing results file or one whose format is not understood logs a warning, so
`mkdocs build --strict` fails rather than publishing an empty or stale table.
"""

import datetime
import json
import logging
import re
import subprocess
from pathlib import Path

from mkdocs.structure.files import File


log = logging.getLogger("mkdocs.hooks.benchmarks")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SITE_DIR = "benchmark-results"
PAGE = "benchmarks.md"
AUTO_WORST_SHOWN = 6  # per score, the cases of `auto` furthest from the best
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


def _table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


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


# ------------------------------------------------------------------ tables


def _callsites(data: dict) -> str:
    results = data["results"]
    ks = [r["k"] for r in results["lineax"]]
    lineax = {r["k"]: r["compile_total_s"] for r in results["lineax"]}
    headers = ["variant", f"k={ks[0]}"] + [f"k={k}" for k in ks[1:]]
    headers += [f"k={ks[-1]} vs lineax", "run per mv"]
    rows = []
    for name, rs in results.items():
        first = rs[0]["compile_total_s"]
        runs = [r["run_per_mv_s"] for r in rs]
        rows.append(
            [name, f"{first:.3f} s"]
            + [f"{r['compile_total_s'] / first:.2f}x" for r in rs[1:]]
            + [
                f"{rs[-1]['compile_total_s'] / lineax[rs[-1]['k']]:.2f}x",
                f"{_ms(min(runs))} - {_ms(max(runs))}",
            ]
        )
    return f"Compile total at k={ks[0]} call sites, then relative to it:\n\n" + _table(
        headers, rows
    )


def _solvers(data: dict) -> str:
    bare = data["bare_mv"]
    rows = []
    for key, r in data["results"].items():
        lin, ours = r["lineax"], r["ours"]
        per_mv = 2 * r["layers"]

        def steps(t):
            done = t["result"] == "successful"
            return str(t["num_steps"]) + ("" if done else f" ({t['result']})")

        rows.append(
            (
                f"{r['lineax_solver']} / {r['ours_solver']}",
                f"{lin['compile_total_s']:.3f} s",
                f"{ours['compile_total_s']:.3f} s",
                f"{ours['compile_total_s'] / lin['compile_total_s']:.2f}x",
                _ms(lin["run_s"]),
                _ms(ours["run_s"]),
                f"{ours['run_per_step_s'] / lin['run_per_step_s']:.3f}x",
                f"{steps(lin)} / {steps(ours)}",
                f"{lin['matmuls_in_hlo'] / per_mv:g} / {ours['matmuls_in_hlo'] / per_mv:g}",
            )
        )
    headers = (
        "lineax / ours",
        "lineax compile",
        "ours compile",
        "ours/lineax",
        "lineax run",
        "ours run",
        "run per step ours/lineax",
        "steps (lineax / ours)",
        "`mv` copies in HLO",
    )
    out = _table(headers, rows)
    out += (
        f"\n\nOne bare `mv` compiles in {bare['compile_total_s']:.3f} s and runs in "
        f"{_ms(bare['run_s'])}."
    )
    for key, why in {**data.get("skipped", {}), **data.get("failed", {})}.items():
        out += f"\n\nNot measured: {key} ({why})."
    return out


def _auto(data: dict) -> str:
    scores = data["summary"]  # per number of runs: "1", "100"
    summary = _table(
        (
            "score",
            "cases",
            "Auto / best, median",
            "Auto / best, worst",
            "Auto picked the best",
            "lineax / best, median",
            "Auto / lineax where lineax is best, worst (paired by round)",
        ),
        [
            (
                f"compile + {runs} x run",
                s["cases"],
                f"{s['median_auto_over_best']:.2f}x",
                f"{s['worst_auto_over_best']:.2f}x ({s['worst_case']})",
                f"{s['auto_picked_best']} of {s['cases']}",
                f"{s['median_lineax_over_best']:.2f}x",
                _paired_lineax(s),
            )
            for runs, s in scores.items()
        ],
    )
    worst = _table(
        ("score", "case", "best", "Auto chose", "Auto / best"),
        [
            (
                f"{runs} run(s)",
                f"{case['kind']}/{case['workload']} n={case['n']} k={case['k']} "
                f"L={case['layers']}",
                case["scores"][runs]["best"],
                case["scores"][runs]["auto_choice"],
                f"{case['scores'][runs]['auto_over_best']:.2f}x",
            )
            for runs in scores
            for case in sorted(
                data["cases"], key=lambda c: -c["scores"][runs]["auto_over_best"]
            )[:AUTO_WORST_SHOWN]
        ],
    )
    return f"{summary}\n\nThe cases where Auto is furthest from the best:\n\n{worst}"


def _paired_lineax(s: dict) -> str:
    worst = s.get("worst_auto_over_lineax_where_lineax_best")
    paired = s.get("worst_auto_over_lineax_where_lineax_best_paired")
    if worst is None:
        return "(plain lineax never the best)"
    return f"{worst:.2f}x" + ("" if paired is None else f" ({paired:.2f}x)")


def _dispatch(data: dict) -> str:
    variants = [k for k in data["rows"][0] if isinstance(data["rows"][0][k], dict)]
    return _table(
        ("program", *variants),
        [
            (
                row["program"],
                *(
                    f"{row[v]['us']:.1f} us ({row[v]['over_reference']:.2f}x)"
                    for v in variants
                ),
            )
            for row in data["rows"]
        ],
    )


def _batch(data: dict) -> str:
    config, cg, mem = data["config"], data["cg"], data["memory"]
    dense = _table(
        (
            "right-hand sides",
            "`batch_solve`",
            "Python loop",
            "LU limit",
            "`batch_solve` / limit",
            "loop / `batch_solve`",
        ),
        [
            (
                r["batch"],
                _ms(r["batch_solve_s"]),
                _ms(r["loop_s"]),
                _ms(r["limit_s"]),
                f"{r['batch_solve_over_limit']:.2f}x",
                f"{r['loop_over_batch_solve']:.1f}x",
            )
            for r in data["dense"]
        ],
    )
    cg_table = _table(
        ("", "compile total", "run", "total", "steps (max)"),
        [
            (
                label,
                f"{cg[k]['compile_total_s']:.3f} s",
                _ms(cg[k]["run_s"]),
                f"{cg[k]['total_s']:.3f} s",
                cg[k]["steps_max"],
            )
            for k, label in (
                ("auto", "`batch_solve`, Auto"),
                ("lineax", "vmapped lineax CG"),
            )
        ],
    )
    mem_table = _table(
        ("", "peak RSS growth", "run"),
        [
            (label, f"{mem[k]['growth_mb']:.0f} MB", f"{mem[k]['run_s']:.2f} s")
            for k, label in (
                ("auto_chunked", f"Auto: {mem['decision']['policy']}"),
                ("lockstep", "lockstep"),
            )
        ],
    )
    return (
        f"(a) Dense SPD n={config['dense_n']}, `lx.LU()`, run times:\n\n{dense}\n\n"
        f"(b) Matrix-free SPD n={config['n']}, {config['layers']} layers, "
        f"{config['rhs']} right-hand sides, CG; Auto decided "
        f"`{cg['decision']['policy']}`:\n\n{cg_table}\n\n"
        f"(c) {config['mem_rhs']} right-hand sides of n={config['mem_n']} under a "
        f"{mem['budget'] / 2**20:g} MiB budget:\n\n{mem_table}"
    )


TABLES = {
    "callsites": _callsites,
    "solvers": _solvers,
    "auto": _auto,
    "batch": _batch,
    "dispatch": _dispatch,
}


# ------------------------------------------------------------------ rendering


def _section(name: str, page_dir: str, required: bool = True) -> str:
    """Plot, environment, tables and configuration of `<name>.json`/`.png`; what
    is missing is a warning when `required` (named on the page)."""
    path, png = RESULTS / f"{name}.json", RESULTS / f"{name}.png"
    parts = []
    if png.is_file():
        parts.append(f"![{name}]({page_dir}{SITE_DIR}/{name}.png)")
    elif required:
        log.warning(f"Benchmarks page: {png} is missing (run `make bench`).")
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


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri != PAGE:
        return markdown
    page_dir = "../" * PAGE.count("/")
    named = [n for n in MARKER.findall(markdown) if n != "environments"]
    # Results that no marker names (a new benchmark) are shown at the end.
    others = [n for n in _results_names() if n not in named]
    if others:
        markdown += "\n\n## Other results\n"
        for name in others:
            markdown += f"\n### `{name}`\n\n" + _section(name, page_dir, False)

    def render(match):
        name = match.group(1)
        if name == "environments":
            return _environments(named + others)
        return _section(name, page_dir)

    return MARKER.sub(render, markdown)
