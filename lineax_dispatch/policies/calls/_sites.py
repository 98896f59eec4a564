"""Context-local records of the `Auto` operators met while `lxd.jit` traces a
program, and the expected executions that solvers set around their loops.

Everything here lives in context variables: each thread (and each asyncio task)
sees its own registry, and there is no module-level mutable state."""

import linecache
import os
import sys
from typing import Any

import equinox as eqx
import jax
import lineax as lx

from ..._compat import traceback_frames


# The package's folder, lineax_dispatch/ (this file is policies/calls/_sites.py).
_PACKAGE_DIR = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


_SKIP_DIRS = (
    _PACKAGE_DIR,
    os.path.dirname(os.path.abspath(jax.__file__)),
    os.path.dirname(os.path.abspath(eqx.__file__)),
    os.path.dirname(os.path.abspath(lx.__file__)),
)


def user_site() -> tuple[str, int]:
    """The innermost frame outside lineax-dispatch, lineax, equinox and jax."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_SKIP_DIRS) and "<frozen" not in filename:
            return filename, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


def equation_site(eqn: Any) -> tuple[str, int]:
    """The user's source line an equation was traced at: the innermost frame of its
    traceback outside lineax-dispatch, lineax, equinox and jax."""
    for filename, line in reversed(traceback_frames(eqn)):
        path = os.path.abspath(filename)
        if not path.startswith(_SKIP_DIRS) and "<frozen" not in path:
            return filename, line
    return "<unknown>", 0


def site_text(site: tuple[str, int]) -> str:
    filename, line = site
    source = linecache.getline(filename, line).strip()
    short = os.path.basename(filename)
    return f"{short}:{line}" + (f" ({source})" if source else "")
