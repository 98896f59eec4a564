"""Memory budgets: parsing `"2GB"`-style values (once, by every policy and solver
that takes one) and finding free memory."""

import os
import re

import jax

from .._validate import as_real


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
