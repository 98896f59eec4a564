"""Memory: sizes, budgets and the guard.

- Sizes and bytes: the dtype and itemsize of an operator's dense matrix, the
    bytes of arrays, of the matrix and of building it. Every budget check and cost
    estimate reads them here.
- Budgets: parsing `"2GB"`-style values (once, by every policy and solver that
    takes one) and finding free memory.
- The guard: every path that builds a dense matrix (`Materialise`'s `mv`,
    `as_matrix` for lineax's direct solvers, `lx.materialise` and
    `lxd.materialise`, `lx.diagonal` where only the whole matrix gives it,
    `lxd.dense_matrix`, `batch_mv` and `batch_solve`) checks it against the budget
    of the policy in force, and raises the same `ValueError` at trace time when it
    does not fit."""

import contextlib
import contextvars
import math
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree

from .._explicit_axes import parts_of
from .._validate import as_real


def promoted_dtype(*dtypes: Any) -> Any:
    """The promotion of `dtypes` under JAX's standard rules, whatever
    `jax_numpy_dtype_promotion` says (an operator whose input and output dtypes
    differ is legal under strict promotion too); `float32` for none."""
    if not dtypes:
        return jnp.dtype(jnp.float32)
    first = jnp.dtype(dtypes[0])
    if all(jnp.dtype(d) == first for d in dtypes[1:]):
        # One dtype: its canonical form, as `result_type` gives it (without
        # entering the configuration's context, which costs more than the rest).
        return jnp.dtype(jax.dtypes.canonicalize_dtype(first))
    with jax.numpy_dtype_promotion("standard"):
        return jnp.dtype(jnp.result_type(*dtypes))


def structures_dtype(*structures: PyTree[Any]) -> Any:
    """The promotion of the dtypes of every leaf of `structures`."""
    return promoted_dtype(*[x.dtype for x in jtu.tree_leaves(structures)])


def operator_dtype(operator: lx.AbstractLinearOperator) -> Any:
    """The dtype of the dense matrix of `operator`: the promotion of the dtypes of
    its input and output structures."""
    return structures_dtype(operator.in_structure(), operator.out_structure())


def itemsize(operator: lx.AbstractLinearOperator) -> int:
    """Bytes per entry of the dense matrix of `operator`."""
    return operator_dtype(operator).itemsize


def structure_size(structure: PyTree[Any]) -> int:
    """Entries of every leaf of `structure` (arrays or `jax.ShapeDtypeStruct`s)."""
    return sum(math.prod(x.shape) for x in jtu.tree_leaves(structure))


def array_bytes(x: Any) -> int:
    """Bytes of an array, `jax.ShapeDtypeStruct` or abstract value; 0 for one
    without a dtype (such as a token)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return 0
    size = dtype.itemsize if hasattr(dtype, "itemsize") else jnp.dtype(dtype).itemsize
    return math.prod(x.shape) * size


def vector_bytes(size: int, itemsize: int) -> int:
    """Bytes of `size` entries of `itemsize` bytes each: a flat vector, or several
    laid end to end (an input and an output, the bands of a matrix)."""
    return size * itemsize


def matrix_bytes(out_size: int, in_size: int, itemsize: int) -> int:
    """Bytes of a dense `out_size x in_size` matrix of `itemsize`-byte entries."""
    return out_size * in_size * itemsize


def build_bytes(
    out_size: int, in_size: int, itemsize: int, chunk: int, parts: tuple = (1, 1)
) -> int:
    """Bytes on one device of a dense matrix plus the peak of building it `chunk`
    columns at a time: each chunk's basis and output columns. `parts`: the
    devices the output and the input are split over (see `parts_of`); the matrix
    is built, and held, with its rows split as the output."""
    rows, entries = -(-out_size // parts[0]), -(-in_size // parts[1])
    return itemsize * (rows * in_size + chunk * (entries + rows))


def dense_bytes(operator: lx.AbstractLinearOperator) -> int:
    """Bytes of the dense matrix of `operator` on one device (its rows split as
    its output is: see `build_bytes`)."""
    return build_bytes(
        operator.out_size(),
        operator.in_size(),
        itemsize(operator),
        0,
        (parts_of(operator.out_structure()), 1),
    )


def operator_build_bytes(
    operator: lx.AbstractLinearOperator, batch_size: int | None
) -> int:
    """Bytes on one device of a materialised matrix of `operator` plus the peak of
    building it `batch_size` columns at a time (all columns when `None`)."""
    n_in, n_out = operator.in_size(), operator.out_size()
    chunk = n_in if batch_size is None else min(batch_size, n_in)
    parts = (parts_of(operator.out_structure()), parts_of(operator.in_structure()))
    return build_bytes(n_out, n_in, itemsize(operator), chunk, parts)


def diagonal_build_bytes(out_size: int, in_size: int, itemsize: int, chunk: int) -> int:
    """Bytes of building the diagonal of an `out_size x in_size` matrix-free
    operator `chunk` basis vectors at a time: each chunk's basis vectors and their
    images, and the diagonal (counted twice: the chunks' pieces and their join)."""
    return itemsize * (chunk * (in_size + out_size) + 2 * min(out_size, in_size))


def diagonal_chunk(out_size: int, in_size: int, itemsize: int, budget: int) -> int:
    """The most basis vectors that building the diagonal may take together within
    `budget` bytes (see `diagonal_build_bytes`), at most `in_size`; 0 where not even
    one fits."""
    free = budget // itemsize - 2 * min(out_size, in_size)
    return max(0, min(in_size, free // max(in_size + 2 * out_size, 1)))


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


# The share of free memory that Auto allows itself by default.
DEFAULT_FRACTION = 0.5


def parse_memory_budget(value: int | float | str) -> int:
    """Reads a memory budget given in bytes or as a string such as `"2GB"`,
    `"512 MiB"` or `"1.5e9"`.

    **Arguments:**

    - `value`: a positive number of bytes, or a string of a number and an optional
        unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; case-insensitive).

    **Returns:**

    The budget in bytes, as an int.

    **Raises:**

    `ValueError` naming `memory_budget` when the value is not positive or cannot be
    read.

    !!! Example

        ```python
        assert lxd.parse_memory_budget("2GB") == 2 * 10**9
        assert lxd.parse_memory_budget("512 MiB") == 512 * 2**20
        policy = lxd.Auto(memory_budget="512 MiB")  # read the same way
        ```
    """
    number: float | None
    if isinstance(value, str):
        match = re.fullmatch(
            r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", value
        )
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                "`memory_budget` must be a number of bytes or a string like '2GB', "
                f"'512MiB'; could not read {value!r}."
            )
        number = float(match.group(1)) * _UNITS[unit]
    else:
        number = as_real(value)
        if number is None:
            raise ValueError(
                "`memory_budget` must be a number of bytes or a string like '2GB'; "
                f"got {value!r} of type {type(value).__name__}."
            )
    if not number >= 1 or number == float("inf"):
        raise ValueError(
            "`memory_budget` must be finite and at least one byte; got "
            f"{value!r} ({number:g} bytes)."
        )
    return int(number)


def optional_budget(value: int | float | str | None) -> int | None:
    """`parse_memory_budget(value)`, or `None` for `None`: the converter of every
    `memory_budget` field, so that a budget is read once, when its policy or solver
    is made, and budgets compare by value (`"2GB"` equals `2 * 10**9`).

    **Arguments:**

    - `value`: a budget as [`lineax_dispatch.parse_memory_budget`][] reads it, or
        `None`.

    **Returns:**

    The budget in bytes, or `None`.
    """
    return None if value is None else parse_memory_budget(value)


def free_memory(
    device: jax.Device | None = None,  # pyright: ignore[reportInvalidTypeForm]
) -> int:
    """Free memory of `device` (the default device when `None`), in bytes: from
    `device.memory_stats()` where the device reports it, else the host's available
    memory."""
    chosen = jax.devices()[0] if device is None else device
    try:
        stats = chosen.memory_stats()
    except Exception:  # pragma: no cover - backends without memory_stats
        stats = None
    if stats and "bytes_limit" in stats:
        return max(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), 0)
    return _host_available()


def _host_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    try:  # pragma: no cover - not Linux
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 2**32


def default_memory_budget(
    device: jax.Device | None = None,  # pyright: ignore[reportInvalidTypeForm]
) -> int:
    """`DEFAULT_FRACTION` of the free memory of `device`."""
    return int(DEFAULT_FRACTION * free_memory(device))


def resolve_budget(memory_budget: int | None) -> int:
    """A parsed `memory_budget` in bytes, or, for `None`, `DEFAULT_FRACTION` of the
    free memory of the default device, read now (shared by `Auto` and
    `Materialise`)."""
    return default_memory_budget() if memory_budget is None else memory_budget


def format_bytes(n: float) -> str:
    """`1536000` -> `'1.5 MB'`."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


# The policies a batch path (`batch_solve`, `batch_mv`) applies on behalf of an
# operator whose own policy it has replaced by an inline one, or a composite
# operator whose operands are being materialised: their budgets still guard any
# dense matrix built meanwhile (a direct solver's `as_matrix`, an operand's). A
# context variable: lineax calls `as_matrix` with no argument to carry the budgets.
_IN_FORCE: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "lineax_dispatch_policy_in_force", default=()
)


@contextlib.contextmanager
def policy_in_force(policy: Any) -> Iterator[None]:
    """Within this context, dense matrices are also checked against `policy`'s
    budget (as well as against those of enclosing contexts)."""
    token = _IN_FORCE.set((*_IN_FORCE.get(), policy))
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def policy_budget(policy: Any) -> int | None:
    """The memory budget (bytes) a policy sets for a dense matrix: that of `Auto`
    and `Materialise` (their `memory_budget`, else half of the free memory), `None`
    for policies without one."""
    budget: Callable[[], int] | None = getattr(policy, "budget", None)
    return budget() if callable(budget) else None


def budget_in_force(policy: Any) -> tuple[Any, int] | None:
    """The smallest budget among `policy`'s and those of the policies in force (see
    `policy_in_force`), with the policy setting it; `None` where none sets one.

    **Arguments:**

    - `policy`: the policy deciding for an operator (or `None`).

    **Returns:**

    A pair `(owner, budget in bytes)`, or `None`.
    """
    candidates = [(p, policy_budget(p)) for p in (policy, *_IN_FORCE.get())]
    candidates = [(p, b) for p, b in candidates if b is not None]
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[1])


def check_bytes(
    operator: lx.AbstractLinearOperator,
    policy: Any,
    needed: int,
    *,
    what: str,
    detail: str,
) -> None:
    """Raises the budget's `ValueError` if `needed` bytes, to be spent on `operator`,
    exceed the budget of `policy` or of a policy in force.

    **Arguments:**

    - `operator`: the operator the bytes are spent on.
    - `policy`: the policy deciding for it.
    - `needed`: the bytes needed.
    - `what`: the operation, for the message.
    - `detail`: what the bytes are, for the message.

    **Returns:**

    Nothing.
    """
    found = budget_in_force(policy)
    if found is None:
        return
    owner, budget = found
    if needed > budget:
        raise ValueError(
            f"{what} of `operator`, a {type(operator).__name__} "
            f"({operator.out_size()}x{operator.in_size()}), needs {format_bytes(needed)} "
            f"({needed} bytes: {detail}), over the memory budget of its "
            f"`{type(owner).__name__}` policy: {format_bytes(budget)} ({budget} "
            "bytes). Use an iterative solver (such as `lxd.AutoSolver`) or a policy "
            "that does not build the matrix, a smaller `batch_size`, or a larger "
            "`memory_budget`."
        )


def check_dense_budget(
    operator: lx.AbstractLinearOperator,
    policy: Any,
    *,
    what: str = "`as_matrix()`",
    batch_size: int | None = None,
    with_build: bool = False,
) -> None:
    """Raises a `ValueError` if the dense matrix of `operator` exceeds the budget of
    `policy` or of the policies in force (see `policy_in_force`), whichever is
    smallest; policies without a budget (`Lazy`, `Outline`...) set none.

    **Arguments:**

    - `operator`: the operator about to be turned into a dense matrix.
    - `policy`: the policy deciding for it (its own, or a per-call override).
    - `what`: the operation, for the message.
    - `batch_size`: the columns built together, when `with_build`.
    - `with_build`: count the peak of building the matrix too, not only the
        matrix.

    **Returns:**

    Nothing.
    """
    if with_build:
        needed = operator_build_bytes(operator, batch_size)
        detail = "the matrix and the build's peak"
    else:
        needed = dense_bytes(operator)
        detail = "the dense matrix alone"
    parts = parts_of(operator.out_structure())
    if parts > 1:
        detail += f", on each of the {parts} devices its rows are split over"
    check_bytes(operator, policy, needed, what=what, detail=detail)
