"""Checks of user-given numbers and operators, shared by policies and solvers:
each raises at construction or trace time, naming the argument, what was expected
and what was given."""

import math
import numbers
from typing import Any

import jax
import lineax as lx
import numpy as np

from ._compat import is_tracer


def _describe(value: Any) -> str:
    return f"{value!r} of type {type(value).__name__}"


def _as_number(value: Any, numbers_of: type, dtypes: tuple, convert: Any) -> Any:
    # `convert(value)` for a Python or NumPy number of `numbers_of`, or a 0-d
    # array (not traced) of one of `dtypes`; never a bool; else `None`.
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers_of):
        return convert(value)
    if isinstance(value, (np.ndarray, jax.Array)) and not is_tracer(value):
        if value.shape == () and any(np.issubdtype(value.dtype, d) for d in dtypes):
            return convert(value)
    return None


def as_int(value: Any) -> int | None:
    """`value` as a Python int if it is an integer (Python, NumPy or a 0-d integer
    array; not a bool), else `None`."""
    return _as_number(value, numbers.Integral, (np.integer,), int)


def as_real(value: Any) -> float | None:
    """`value` as a Python float if it is a real number (Python, NumPy or a 0-d real
    array; not a bool), else `None`."""
    return _as_number(value, numbers.Real, (np.integer, np.floating), float)


def check_positive_int(value: Any, name: str, *, allow_none: bool = False) -> Any:
    """A positive integer (NumPy integers accepted, returned as `int`), or `None`
    where allowed; otherwise a `ValueError` naming `name`."""
    if value is None and allow_none:
        return None
    number = as_int(value)
    if number is None or number < 1:
        expected = "None or a positive int" if allow_none else "a positive int"
        raise ValueError(f"`{name}` must be {expected}; got {_describe(value)}.")
    return number


def check_tolerance(value: Any, name: str) -> Any:
    """A finite non-negative real number (or a traced scalar, which cannot be
    checked here); otherwise a `ValueError` naming `name`."""
    if is_tracer(value):
        return value
    number = as_real(value)
    if number is None:
        raise ValueError(
            f"`{name}` must be a finite non-negative real number; got "
            f"{_describe(value)}."
        )
    if not math.isfinite(number) or number < 0:
        raise ValueError(
            f"`{name}` must be a finite non-negative real number; got {value!r}."
        )
    return value


def check_positive_real(value: Any, name: str) -> float:
    """A finite positive real number, as a float; otherwise a `ValueError`."""
    number = as_real(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise ValueError(
            f"`{name}` must be a finite positive real number; got {_describe(value)}."
        )
    return number


def check_square(operator: lx.AbstractLinearOperator, name: str) -> None:
    """Raises unless `operator` is square (equal input and output structures)."""
    if operator.in_structure() != operator.out_structure():
        raise ValueError(
            f"`{name}` needs a square operator (equal input and output structures); "
            f"got in_structure={operator.in_structure()} and "
            f"out_structure={operator.out_structure()}."
        )
