"""What every reader of a traced program shares: the kinds of atom in a jaxpr, the
shapes of a computation's inputs and outputs, and which primitives are heavy
work."""

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.extend.core as jex
import jax.extend.core.primitives as prims

from ._compat import linear_solve_p


def is_literal(v: Any) -> bool:
    """Whether the atom `v` of a jaxpr is a literal (its value is `v.val`)."""
    return isinstance(v, jex.Literal)


def defined(v: Any) -> bool:
    """Whether the atom `v` is a variable that holds a value (neither a literal nor
    a dropped output)."""
    return not is_literal(v) and not isinstance(v, jex.DropVar)


def specs_of(atoms: Iterable[Any]) -> list[jax.ShapeDtypeStruct]:
    """The shape and dtype of each of `atoms` (variables or literals), as
    `jax.ShapeDtypeStruct`s."""
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in atoms]


def exact_specs(avals: Iterable[Any]) -> list[jax.ShapeDtypeStruct]:
    """Abstract values as `jax.ShapeDtypeStruct`s that keep all of their type: the
    shape and dtype, the weak type, the sharding (an Explicit mesh axis's) and,
    inside `shard_map`, the manual axes the value varies over. Tracing a function
    at these gives a program with the same input types.

    **Arguments:**

    - `avals`: abstract values (`jax.core.ShapedArray`s).

    **Returns:**

    A list of `jax.ShapeDtypeStruct`s.
    """
    return [
        jax.ShapeDtypeStruct(
            a.shape,
            a.dtype,
            sharding=getattr(a, "sharding", None),
            weak_type=getattr(a, "weak_type", False),
            manual_axis_type=getattr(a, "manual_axis_type", None),
        )
        for a in avals
    ]


def out_leaves(callee: Any) -> list[jax.ShapeDtypeStruct]:
    """The leaves of an operator's output structure, read from its traced `mv`
    (asking the operator may trace its function again), shardings included (a
    memory budget counts one device's part of a sharded matrix)."""
    return exact_specs(v.aval for v in callee.jaxpr.outvars)


# Heavy work: primitives whose cost grows faster than their inputs' size, or that
# run a computation many times: a dot product or a convolution, lineax's linear
# solve (whose solver's loop is not a sub-jaxpr of it), a loop, a factorisation or
# decomposition, an FFT. `lxd.jit` reads it three ways: a repeated function of the
# user's holding such work is worth rolling however short it is
# (`analyse._groups.substantial`); such loop-invariant code of a rolled call runs
# once, before the loop (`analyse._hoist`; cheap invariant code stays in the loop,
# where moving it would only keep its results alive across the loop); and code
# holding it is never run once more than the program runs it, its results unused
# (`analyse._roll_steps.extra_safe`).
HEAVY = frozenset(
    {
        prims.dot_general_p,
        prims.conv_general_dilated_p,
        linear_solve_p,
        prims.while_p,
        prims.scan_p,
        prims.cholesky_p,
        prims.lu_p,
        prims.qr_p,
        prims.eigh_p,
        prims.svd_p,
        prims.triangular_solve_p,
        prims.fft_p,
    }
)


def finds_below(
    find: Callable[[Any], tuple[list[Any], bool]],
    factor: Callable[[Any], float] = lambda eqn: 1.0,
) -> Callable[[Any], list[tuple[Any, float]]]:
    """A function of a jaxpr giving what `find` finds in its equations, at any
    depth, each with how many times it runs per run of the jaxpr; a sub-program
    called at several places (one traced function, one loop body) is read once.

    **Arguments:**

    - `find`: `eqn -> (found, descend)`: what to keep of an equation, and whether
        to look in the jaxprs of its parameters.
    - `factor`: how many times an equation's sub-programs run per run of it (a
        loop's trips).

    **Returns:**

    A function `jaxpr -> [(found item, runs), ...]`, in program order.
    """
    memo: dict[int, list[tuple[Any, float]]] = {}

    def in_jaxpr(sub: Any) -> list[tuple[Any, float]]:
        found = memo.get(id(sub))
        if found is None:
            found = []
            for eqn in sub.eqns:
                items, descend = find(eqn)
                found += [(item, 1.0) for item in items]
                if descend:
                    runs = factor(eqn)
                    for deeper in jex.jaxprs_in_params(eqn.params):
                        found += [(x, runs * n) for x, n in in_jaxpr(deeper)]
            memo[id(sub)] = found
        return found

    return in_jaxpr


def map_equations(
    program: Any, replace: Callable[[Any], Any], memo: dict | None = None
) -> Any:
    """`program` with each equation at any depth for which `replace` gives an
    equation replaced by it (and not looked into); every other equation with the
    programs in its parameters mapped alike. What nothing changes in is returned
    as it is; a sub-program met at several places is mapped once.

    **Arguments:**

    - `program`: a `jax.extend.core.ClosedJaxpr`, `Jaxpr` or `JaxprEqn`.
    - `replace`: `eqn -> new equation`, or `None` to keep `eqn` and look into it.
    - `memo`: the sub-programs mapped so far (a fresh one where `None`).

    **Returns:**

    The same kind of object.
    """
    memo = {} if memo is None else memo
    # (From jax 0.12 a closed jaxpr and its jaxpr are one object of one class.)
    if isinstance(program, jex.ClosedJaxpr) and program.jaxpr is not program:
        inner = map_equations(program.jaxpr, replace, memo)
        return program if inner is program.jaxpr else program.replace(jaxpr=inner)
    if not isinstance(program, (jex.ClosedJaxpr, jex.Jaxpr)):
        new = replace(program)
        if new is not None:
            return new
        params = {k: _map_param(v, replace, memo) for k, v in program.params.items()}
        if all(params[k] is program.params[k] for k in params):
            return program
        return program.replace(params=params)
    jaxpr: Any = program  # an open jaxpr (one class with closed ones on jax 0.12)
    done = memo.get(id(jaxpr))
    if done is None:
        eqns = [map_equations(e, replace, memo) for e in jaxpr.eqns]
        changed = any(a is not b for a, b in zip(eqns, jaxpr.eqns))
        done = jaxpr.replace(eqns=eqns) if changed else jaxpr
        memo[id(jaxpr)] = done
    return done


def _map_param(value: Any, replace: Callable[[Any], Any], memo: dict) -> Any:
    if isinstance(value, (jex.ClosedJaxpr, jex.Jaxpr)):
        return map_equations(value, replace, memo)
    if isinstance(getattr(value, "value", None), jex.ClosedJaxpr):
        # An out-of-line call's callee (`policies._outline`), held by identity.
        inner = map_equations(value.value, replace, memo)
        return value if inner is value.value else type(value)(inner)
    if isinstance(value, tuple):
        items = tuple(_map_param(v, replace, memo) for v in value)
        return value if all(a is b for a, b in zip(items, value)) else items
    return value


# Loops: lineax's linear solve (its solver's loop) and JAX's loops.
LOOPS = frozenset({linear_solve_p, prims.while_p, prims.scan_p})


def heavy(eqn: Any, kinds: frozenset = HEAVY) -> bool:
    """Whether the equation `eqn` is, or holds at any depth, work of `kinds`
    (`HEAVY`, or `LOOPS`)."""
    if eqn.primitive in kinds:
        return True
    return any(
        heavy(e, kinds) for sub in jex.jaxprs_in_params(eqn.params) for e in sub.eqns
    )


def call_name(eqn: Any) -> str | None:
    """The name of a `jit` equation's function (`None` for other equations).

    **Arguments:**

    - `eqn`: a `jax.extend.core.JaxprEqn`.

    **Returns:**

    A str or `None`.
    """
    name = eqn.params.get("name") if eqn.primitive is prims.jit_p else None
    return name if isinstance(name, str) else None


def scan_length(eqn: Any) -> int:
    """How many steps a `scan` equation runs.

    **Arguments:**

    - `eqn`: a `scan` equation.

    **Returns:**

    An int.
    """
    return int(eqn.params["length"])
