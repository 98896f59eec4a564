"""MkDocs hook: the figures and outputs of every page, made when the site is built.

- `{{ name }}` becomes the figure `name` of `figures.py` (beside this file), read
  from its results file under `benchmarks/results/`;
- a line `<!-- headline figures -->` becomes the headline table (README.md holds
  the same table);
- a line `<!-- output docs/examples/NAME.py -->` becomes what that script prints,
  run from its folder with this Python: the output a page shows is the code's, on
  the machine that builds the site.

An unknown name, a results file that is missing or not understood, and a script
that fails each log a warning, so `mkdocs build --strict` fails rather than
publishing a figure no file holds.
"""

import logging
import os
import subprocess
import sys

# A module beside this hook: MkDocs puts the hook's directory on `sys.path` while it
# loads the hook.
from figures import FIGURES, headline_table, PLACEHOLDER, ROOT, value


log = logging.getLogger("mkdocs.hooks.figures")

HEADLINE = "<!-- headline figures -->"
OUTPUT = "<!-- output "
_outputs: dict[str, str] = {}


def _figure(name: str, page: str) -> str:
    if name not in FIGURES:
        log.warning(f"{page}: no figure `{name}` in docs/hooks/figures.py.")
        return "?"
    try:
        return value(name)
    except (OSError, KeyError, TypeError, ValueError, IndexError) as e:
        source = FIGURES[name][0]
        log.warning(
            f"{page}: figure `{name}` cannot be read from "
            f"benchmarks/results/{source}.json ({type(e).__name__}: {e})."
        )
        return "?"


def _output(script: str, page: str) -> str:
    """What `script` (a path from the repository root) prints, in a text block."""
    if script not in _outputs:
        path = ROOT / script
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        done = subprocess.run(
            [sys.executable, path.name],
            cwd=path.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            log.warning(f"{page}: `python {script}` failed:\n{done.stderr}")
        _outputs[script] = done.stdout.rstrip()
    return f"```text\n{_outputs[script]}\n```"


def on_page_markdown(markdown, page, config, files, **kwargs):
    where = page.file.src_uri
    lines = []
    for line in markdown.split("\n"):
        if line.strip() == HEADLINE:
            line = headline_table()
        elif line.startswith(OUTPUT) and line.rstrip().endswith("-->"):
            script = line.rstrip()[len(OUTPUT) : -3].strip()
            line = _output(script, where)
        lines.append(line)
    markdown = "\n".join(lines)
    return PLACEHOLDER.sub(lambda m: _figure(m.group(1), where), markdown)
