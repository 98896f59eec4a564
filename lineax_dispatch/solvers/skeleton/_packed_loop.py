"""`lax.while_loop` with the loop state's scalars carried in one array per width.

XLA:CPU compiles every array a loop body returns as the output of a kernel of
its own, a scalar as much as a vector, and each kernel costs compile time
(about 10 ms on a 2-core x86-64). A solver whose loop carries half a dozen
scalars (step count, mode, `gamma`, ...) compiles half a dozen scalar kernels
for them. Carried as one array, they are one output: XLA fuses the scalar
computations that produce it into one kernel (a concatenation of their values),
and reads each scalar back by slicing, which fuses into the kernels that read
it. Scalars of one width (32 or 64 bits: `float32`, `int32` and booleans
together) share one array of signed integers, each stored by its bits
(`lax.bitcast_convert_type`; a boolean as 0 or 1): a move of integers changes
no bit, where a float32 array holding an integer's bits might meet a flush of
subnormals or a canonical NaN. Other scalars (complex, 16-bit) are grouped by
their dtype.

The packing is XLA:CPU's alone (`on_xla_cpu`). On a TPU v5e our CG ran longer
after the change that packed its loop than before it: in the families' held-out
stencil cases (the same steps), 1.4-1.9x lineax's CG's run where it had run in
0.90-0.97x of it (`benchmarks/results/tpu/families-held-out-fresh-heap` against
`families-held-out`), and `benchmarks.realistic`'s `implicit_cg` (three solves
of our CG) from 6.2 ms to 7.7 ms. Elsewhere the loop carries its state as it
is."""

from collections.abc import Callable
from typing import TypeVar

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array


_Carry = TypeVar("_Carry")


def _carrier(dtype: np.dtype) -> np.dtype:
    """The dtype of the array that carries a scalar of `dtype`: the signed integer
    of its width for a real or integer dtype of 32 or 64 bits and for a boolean
    (32 bits), else `dtype` itself."""
    if dtype == np.bool_:
        return np.dtype(np.int32)
    if dtype.kind in "fiu" and dtype.itemsize in (4, 8):
        return np.dtype(f"int{8 * dtype.itemsize}")
    return dtype


def _to_carrier(leaf: Array, carrier: np.dtype) -> Array:
    if leaf.dtype == carrier:
        return leaf
    if leaf.dtype == np.bool_:
        return lax.convert_element_type(leaf, carrier)
    return lax.bitcast_convert_type(leaf, carrier)


def _from_carrier(value: Array, dtype: np.dtype) -> Array:
    if value.dtype == dtype:
        return value
    if dtype == np.bool_:
        return lax.ne(value, lax.full_like(value, 0))
    return lax.bitcast_convert_type(value, dtype)


class _Packing:
    """Where each leaf of a loop state goes: the scalars into one stacked array
    per carrier (`_carrier`, in the order first seen) where it has more than
    one, every other leaf as it is."""

    def __init__(self, state):
        leaves, self.treedef = jtu.tree_flatten(state)
        self.dtypes = [np.dtype(jnp.result_type(leaf)) for leaf in leaves]
        groups: dict = {}
        for i, leaf in enumerate(leaves):
            if jnp.ndim(leaf) == 0:
                groups.setdefault(_carrier(self.dtypes[i]), []).append(i)
        # (A carrier of one scalar gains nothing from packing.)
        self.groups = {d: where for d, where in groups.items() if len(where) > 1}
        chosen = {i for where in self.groups.values() for i in where}
        # Whether each leaf is carried packed.
        self.packed = [i in chosen for i in range(len(leaves))]

    def pack(self, state) -> tuple[list[Array], list]:
        leaves = self.treedef.flatten_up_to(state)
        packs = [
            jnp.stack(
                [
                    _to_carrier(jnp.asarray(leaves[i], self.dtypes[i]), carrier)
                    for i in where
                ]
            )
            for carrier, where in self.groups.items()
        ]
        rest = [leaf for leaf, p in zip(leaves, self.packed) if not p]
        return packs, rest

    def unpack(self, packed: tuple[list[Array], list]):
        packs, rest = packed
        leaves: list = [None] * len(self.packed)
        for pack, where in zip(packs, self.groups.values()):
            for k, i in enumerate(where):
                leaves[i] = _from_carrier(pack[k], self.dtypes[i])
        others = iter(rest)
        for i, p in enumerate(self.packed):
            if not p:
                leaves[i] = next(others)
        return jtu.tree_unflatten(self.treedef, leaves)


def on_xla_cpu() -> bool:
    """Whether the backend in use is XLA:CPU, where the devices for its compile
    (this packing, `_flat_vectors.computed_once`) are used; elsewhere the loop is
    written as it reads (see the module's docstring)."""
    return jax.default_backend() == "cpu"


def packed_while_loop(
    cond_fun: Callable[[_Carry], Array],
    body_fun: Callable[[_Carry], _Carry],
    init_val: _Carry,
) -> _Carry:
    """`lax.while_loop(cond_fun, body_fun, init_val)`, the same values, with the
    state's scalars carried packed on the CPU (see the module's docstring). The functions
    see the state as `init_val` is structured; each scalar keeps the dtype it has
    in `init_val` (a weakly typed one comes back strongly typed).

    **Arguments:** as for `lax.while_loop`.

    **Returns:**

    The final state, structured as `init_val`.
    """
    packing = _Packing(init_val)
    if len(packing.groups) == 0 or not on_xla_cpu():
        return lax.while_loop(cond_fun, body_fun, init_val)
    packed = lax.while_loop(
        lambda c: cond_fun(packing.unpack(c)),
        lambda c: packing.pack(body_fun(packing.unpack(c))),
        packing.pack(init_val),
    )
    return packing.unpack(packed)
