"""MkDocs hook: cross-references to lineax resolve to lineax's own documentation.

Docstrings here write [`lineax.CG`][] and the like. There is no network at build
time to fetch lineax's object inventory, so this registers each public name of
`lineax` with the page of lineax's documentation that describes it (operators,
solvers, `linear_solve`, solution, tags, functions). Names this site documents
itself (`lineax_dispatch.*`) are unaffected: autorefs prefers its own pages.
"""

import inspect

import lineax as lx


LINEAX_DOCS = "https://docs.kidger.site/lineax/api/"


def _page(name: str, obj) -> str | None:
    if inspect.isclass(obj) and issubclass(obj, lx.AbstractLinearOperator):
        return "operators"
    if inspect.isclass(obj) and issubclass(obj, lx.AbstractLinearSolver):
        return "solvers"
    if name == "linear_solve":
        return "linear_solve"
    if name in ("Solution", "RESULTS"):
        return "solution"
    if name.endswith("_tag"):
        return "tags"
    if inspect.isfunction(obj) or callable(obj):
        return "functions"
    return None


def lineax_urls() -> dict[str, str]:
    """`{"lineax.CG": "https://.../api/solvers/#lineax.CG", ...}`."""
    urls = {}
    for name in dir(lx):
        if name.startswith("_") or inspect.ismodule(getattr(lx, name)):
            continue
        page = _page(name, getattr(lx, name))
        if page is not None:
            urls[f"lineax.{name}"] = f"{LINEAX_DOCS}{page}/#lineax.{name}"
    return urls


def on_config(config, **kwargs):
    autorefs = config.plugins["autorefs"]
    for identifier, url in lineax_urls().items():
        autorefs.register_url(identifier, url)
    return config
