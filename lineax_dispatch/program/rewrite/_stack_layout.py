"""The batched evaluation behind a stack: a computation's jaxpr run on inputs that
carry a batch axis (the k stacked calls), with JAX's own batching rule for every
equation but one. For a `dot_general` between an unbatched array (a weight) and a
batched one (the stacked vectors), `jax.vmap` keeps the batch axis where the
surrounding elementwise equations put it (first), so `W @ x` becomes
`X[k, n] . W[m, n]` contracting both last axes: on XLA:CPU a slow kernel at small
k (slower than the inline program's matrix-vector products) and a transposed copy
of the weight at large n. Here the batched operand is laid out so that the
product is a plain matrix-matrix product with the weight in its own layout: the
weight on the left when it is contracted on its last axes (`W @ X`, the batch axis
last), on the right when on its first (`X @ W`, the batch axis first). Only the
batched operand (O(k n)) and the product (O(k m)) are transposed, never the
weight."""

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import jax
import jax.extend.core as jex
import jax.extend.core.primitives as prims
import jax.lax as lax
import jax.numpy as jnp

from ..._compat import bind_equation, call_callee
from ._interpret import eval_eqns, read, read_by


# Calls whose callee is evaluated here, inline (its products batched by the rules
# below too): a nested `jax.jit`.
_CALLS = frozenset({prims.jit_p})


# Equations that act entry by entry on operands of one shape: batched with the
# batch axis where their batched operands have it (JAX's rule puts it first,
# with a transpose that XLA then folds into the neighbouring product).
_ELEMENTWISE = frozenset(
    getattr(prims, f"{name}_p")
    for name in (
        "abs acos acosh add add_jaxvals and asin asinh atan atan2 atanh cbrt ceil "
        "clamp complex conj convert_element_type copy cos cosh digamma div eq erf "
        "erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le "
        "lgamma log log1p logistic lt max min mul ne neg nextafter not or pow real "
        "reduce_precision rem round rsqrt select_n sign sin sinh sqrt square sub "
        "tan tanh xor"
    ).split()
    if hasattr(prims, f"{name}_p")
)


def _batched_index(dim: int, bdim: int) -> int:
    """Where the unbatched array's axis `dim` sits once an axis is inserted at
    `bdim`."""
    return dim if dim < bdim else dim + 1


def _dot(eqn: Any, values: Sequence[Any], bdims: Sequence[Any]) -> Any:
    """The `dot_general` `eqn` with exactly one batched operand, as a plain
    matrix-matrix product with the unbatched operand in its own layout: a pair
    `([output], [output batch axis])`, or `None` where the rule does not apply (both
    or neither operand batched, dot batch dimensions, an unbatched operand
    contracted on middle axes)."""
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params["dimension_numbers"]
    if batch_l or batch_r or (bdims[0] is None) == (bdims[1] is None):
        return None
    b_pos = 0 if bdims[0] is not None else 1
    u_pos = 1 - b_pos
    b_val, u_val = values[b_pos], values[u_pos]
    bdim = bdims[b_pos]
    b_contract = tuple(contract_l if b_pos == 0 else contract_r)
    u_contract = tuple(contract_r if b_pos == 0 else contract_l)
    u_rank = jnp.ndim(u_val)
    b_rank = jnp.ndim(b_val) - 1
    u_free = [d for d in range(u_rank) if d not in u_contract]
    b_free = [d for d in range(b_rank) if d not in b_contract]
    count = len(u_contract)
    if sorted(u_contract) == list(range(u_rank - count, u_rank)):
        u_left = True  # `W @ X`: the weight contracted on its last axes
    elif sorted(u_contract) == list(range(count)):
        u_left = False  # `X @ W`: on its first axes
    else:
        return None
    at = [_batched_index(d, bdim) for d in range(b_rank)]
    if u_left:
        # X laid out as [contracted (in the weight's order), free, batch].
        order = [at[d] for d in b_contract] + [at[d] for d in b_free] + [bdim]
        new_b = tuple(range(count))
    else:
        # X laid out as [batch, free, contracted (in the weight's order)].
        order = [bdim] + [at[d] for d in b_free] + [at[d] for d in b_contract]
        new_b = tuple(range(1 + len(b_free), 1 + len(b_free) + count))
    b_val = lax.transpose(b_val, order)
    params = dict(eqn.params)
    if u_left:
        params["dimension_numbers"] = ((u_contract, new_b), ((), ()))
        operands = (u_val, b_val)
    else:
        params["dimension_numbers"] = ((new_b, u_contract), ((), ()))
        operands = (b_val, u_val)
    (out,) = bind_equation(eqn.replace(params=params), list(operands))
    # `out`'s axes: [weight free, X free, batch] (weight on the left) or
    # [batch, X free, weight free]; the equation's are [lhs free, rhs free].
    n_u, n_b = len(u_free), len(b_free)
    if u_left:
        u_axes, b_axes, batch = list(range(n_u)), list(range(n_u, n_u + n_b)), n_u + n_b
    else:
        batch, b_axes = 0, list(range(1, 1 + n_b))
        u_axes = list(range(1 + n_b, 1 + n_b + n_u))
    wanted = u_axes + b_axes if u_pos == 0 else b_axes + u_axes
    # The batch axis goes where it already is: first or last.
    perm = wanted + [batch] if u_left else [batch] + wanted
    if perm != list(range(len(perm))):
        out = lax.transpose(out, perm)
    return [out], [len(perm) - 1 if u_left else 0]


def _elementwise(eqn: Any, values: Sequence[Any], bdims: Sequence[Any]) -> Any:
    """The elementwise equation `eqn` with its batched operands' batch axis kept
    (the last one's if any has it last, else the first batched operand's): a pair
    `(outputs, their batch axes)`, or `None` where an operand's shape is not the
    output's (a scalar operand: JAX's rule)."""
    shape = tuple(eqn.outvars[0].aval.shape)
    if any(tuple(v.aval.shape) != shape for v in [*eqn.invars, *eqn.outvars]):
        return None
    batched = [d for d in bdims if d is not None]
    target = len(shape) if len(shape) in batched else batched[0]
    size = next(jnp.shape(v)[d] for v, d in zip(values, bdims) if d is not None)
    full = (*shape[:target], size, *shape[target:])
    keep = tuple(i for i in range(len(shape) + 1) if i != target)
    operands = [
        lax.broadcast_in_dim(v, full, keep)
        if d is None
        else (v if d == target else jnp.moveaxis(v, d, target))
        for v, d in zip(values, bdims)
    ]
    outs = bind_equation(eqn, operands)
    return outs, [target] * len(outs)


def _fallback(eqn: Any, values: Sequence[Any], bdims: Sequence[Any]) -> list:
    """The equation under `jax.vmap` (JAX's batching rule), outputs batched on
    their first axis."""
    batched = [i for i, d in enumerate(bdims) if d is not None]

    def one(*args):
        full = list(values)
        for i, a in zip(batched, args):
            full[i] = a
        return bind_equation(eqn, full)

    axes = tuple(bdims[i] for i in batched)
    return jax.vmap(one, in_axes=axes)(*(values[i] for i in batched))


def _call(eqn: Any, values: Sequence[Any], bdims: Sequence[Any]) -> Any:
    """A call (`_CALLS`) without effects, its callee evaluated here: a pair
    `(outputs, their batch axes)`, or `None` where it has effects."""
    if eqn.effects:
        return None
    callee = call_callee(eqn)
    return batched_eval(callee.jaxpr, callee.consts, values, bdims)


# The rules by primitive: each gives `(outputs, their batch axes)`, or `None` where
# it does not apply (then JAX's rule, `_fallback`).
_RULES = MappingProxyType(
    {prims.dot_general_p: _dot}
    | {p: _elementwise for p in _ELEMENTWISE}
    | {p: _call for p in _CALLS}
)


def _batched_equation(eqn: Any, values: Sequence[Any], bdims: Sequence[Any]):
    """The outputs of `eqn` on `values`, batched on the axes `bdims` (`None`: not
    batched), and their batch axes."""
    if all(d is None for d in bdims):
        outs = bind_equation(eqn, list(values))
        return outs, [None] * len(outs)
    rule = _RULES.get(eqn.primitive)
    done = None if rule is None else rule(eqn, values, bdims)
    if done is not None:
        return done
    outs = _fallback(eqn, values, bdims)
    return outs, [0] * len(outs)


def _unbatched(atom: Any) -> tuple:
    return atom.val, None


def batched_eval(
    jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], bdims: Sequence[Any]
) -> tuple[list, list]:
    """Evaluates `jaxpr` on `args`, of which those with an axis in `bdims` carry a
    batch axis there (the others are shared by every element of the batch).

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`.
    - `consts`: values of its constants (unbatched).
    - `args`: values of its inputs.
    - `bdims`: per input, its batch axis or `None`.

    **Returns:**

    The outputs and, per output, its batch axis or `None`.
    """
    # The environment holds `(value, batch axis)` pairs.
    env: dict = {v: (c, None) for v, c in zip(jaxpr.constvars, consts)}
    env.update((v, (a, d)) for v, a, d in zip(jaxpr.invars, args, bdims))

    def rule(i: int, eqn: Any, invals: list) -> list:
        values, dims = zip(*invals) if invals else ((), ())
        outs, out_dims = _batched_equation(eqn, values, dims)
        return list(zip(outs, out_dims))

    literal = lambda i, q, atom: _unbatched(atom)
    keep = read_by((), jaxpr.outvars)
    eval_eqns(jaxpr.eqns, env, literal, rule, keep)
    results = [read(env, v, _unbatched) for v in jaxpr.outvars]
    return [r[0] for r in results], [r[1] for r in results]


def stacked_call(
    call: Any, values: Sequence[Any], varying: Sequence[int], stacked: Sequence[Any]
) -> list:
    """The call equation `call` on k stacked inputs: its inputs at positions
    `varying` replaced by `stacked` (each with the k calls on its first axis), the
    others taken from `values`. Returns its outputs with the k calls on their
    first axis (`None` for a dropped output).

    **Arguments:**

    - `call`: a `jit` equation.
    - `values`: the call's input values (those at `varying` are ignored).
    - `varying`: positions of the stacked inputs.
    - `stacked`: their stacked values.

    **Returns:**

    The list of stacked outputs.
    """
    callee = call_callee(call)
    args = list(values)
    bdims: list[int | None] = [None] * len(values)
    for p, value in zip(varying, stacked):
        args[p], bdims[p] = value, 0
    outs, out_dims = batched_eval(callee.jaxpr, callee.consts, args, bdims)
    k = jnp.shape(stacked[0])[0]
    result = []
    for v, out, d in zip(call.outvars, outs, out_dims):
        if isinstance(v, jex.DropVar):
            result.append(None)
        elif d is None:
            result.append(jnp.broadcast_to(out, (k, *jnp.shape(out))))
        else:
            result.append(jnp.moveaxis(out, d, 0))
    return result
