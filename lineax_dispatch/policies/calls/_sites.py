"""Source sites: the user's line a call was made from, or an equation was traced
at (the innermost frame outside lineax-dispatch, lineax, equinox and jax)."""

import linecache
import os
import sys
from collections.abc import Iterable
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


def _innermost_user(frames: Iterable[tuple[str, int]]) -> tuple[str, int]:
    """The first of `frames` (innermost first) outside lineax-dispatch, lineax,
    equinox, jax and Python's frozen modules, its file as an absolute path."""
    for filename, line in frames:
        path = os.path.abspath(filename)
        if not path.startswith(_SKIP_DIRS) and "<frozen" not in path:
            return path, line
    return "<unknown>", 0


def user_site() -> tuple[str, int]:
    """The user's source line this call was made from."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return _innermost_user(frames)


def equation_site(eqn: Any) -> tuple[str, int]:
    """The user's source line an equation was traced at (from its traceback), as
    `user_site` finds it."""
    return _innermost_user(reversed(traceback_frames(eqn)))


def site_text(site: tuple[str, int]) -> str:
    filename, line = site
    source = linecache.getline(filename, line).strip()
    short = os.path.basename(filename)
    return f"{short}:{line}" + (f" ({source})" if source else "")
