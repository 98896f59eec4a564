"""Runtime errors under `lxd.jit` raised as `equinox.filter_jit` raises them.

`equinox.error_if` (which lineax's `throw=True` uses) fails at run time from a
`jax.pure_callback`, which JAX reports as a `JaxRuntimeError` carrying a long and
unhelpful message. `equinox.filter_jit` catches that error and raises an
`equinox.EquinoxRuntimeError` with the message given to `error_if` and the stack
in the traced function that reached it; `lxd.jit` does the same, with equinox's
own (private) machinery, read here only: `equinox._jit.last_error_info` (the
message and the trace-time stack of the last error, set by the callback),
`_on_error_msg` (the message's layout), `JaxRuntimeError` and `_FilterCallback`
(which silences JAX's log of the failed callback); and `equinox._errors._old_jit`
(see `unpatched_jit`).

The trace-time stack is cut, as equinox does, at the frame of the call holding
the local `__equinox_jit_id__`; the frames of `lxd.jit`'s own machinery in it are
left out, as equinox leaves out its own and JAX's."""

import contextlib
import logging
import os
from collections.abc import Callable, Iterator

import equinox as eqx
import equinox._errors as _eqx_errors
import equinox._jit as _eqx_jit
import jax


_JaxRuntimeError = getattr(_eqx_jit, "JaxRuntimeError", jax.errors.JaxRuntimeError)


_MESSAGE = getattr(_eqx_jit, "_on_error_msg", "{stack}\n{msg}")


_MARK = "_EquinoxRuntimeError: "


def new_jit_id() -> bytes:
    """A fresh identity for one call of `lxd.jit`, to be held by its frame as the
    local `__equinox_jit_id__` (what `equinox.error_if` records in its stack).

    **Returns:**

    16 random bytes.
    """
    return os.urandom(16)


def _stack(pieces: list, jit_id: bytes, hidden: tuple[str, ...]) -> str:
    """The recorded trace-time stack up to the call `jit_id`, outermost first,
    without the frames of the files `hidden`."""
    kept: list[str] = []
    for piece in pieces:
        if type(piece) is str:
            if not any(piece.startswith(f'  File "{path}"') for path in hidden):
                kept.append(piece)
        elif piece == jit_id:
            break
    return "".join(reversed(kept))


@contextlib.contextmanager
def readable_errors(jit_id: bytes, hidden: tuple[str, ...] = ()) -> Iterator[None]:
    """Within it, a run-time error of `equinox.error_if` is raised as
    `equinox.filter_jit` raises it: an `equinox.EquinoxRuntimeError` with its
    message, the `JaxRuntimeError` hidden. Other errors pass as they are.

    **Arguments:**

    - `jit_id`: the identity of the call (see `new_jit_id`), a local
        `__equinox_jit_id__` of a frame enclosing this context.
    - `hidden`: paths of files whose frames are left out of the stack shown.

    **Returns:**

    A context manager.
    """
    silence = getattr(_eqx_jit, "_FilterCallback", logging.Filter)()
    logger = logging.getLogger("jax._src.callback")
    logger.addFilter(silence)
    try:
        yield
    except (_JaxRuntimeError, ValueError) as e:
        info = getattr(_eqx_jit, "last_error_info", None)
        if info is None or _MARK not in str(e):
            raise
        msg, pieces = info
        stack = _stack(pieces, jit_id, hidden)
        raise eqx.EquinoxRuntimeError(_MESSAGE.format(msg=msg, stack=stack)) from None
    finally:
        logger.removeFilter(silence)


def unpatched_jit() -> Callable:
    """`jax.jit` as JAX defines it. With `EQX_ON_ERROR=breakpoint` set, equinox
    replaces `jax.jit` by a wrapper that calls the function inline under a trace
    (around JAX issue #16732) and has no `trace` nor `lower`; `lxd.jit` traces
    and lowers its programs itself, so uses the original, as `equinox.filter_jit`
    ends up doing (its outermost `jax.jit` call is the original's).

    **Returns:**

    The function `jax.jit`.
    """
    return getattr(_eqx_errors, "_old_jit", jax.jit)
