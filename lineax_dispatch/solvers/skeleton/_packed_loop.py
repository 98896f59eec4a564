"""`lax.while_loop` with the loop state's scalars carried in one array.

XLA:CPU compiles every array a loop body returns as the output of a kernel of
its own, a scalar as much as a vector, and each kernel costs compile time
(about 10 ms on a 2-core x86-64). A solver whose loop carries half a dozen
scalars (step count, mode, `gamma`, ...) compiles half a dozen scalar kernels
for them. Carried as one array, they are one output: XLA fuses the scalar
computations that produce it into one kernel (a concatenation of their values),
and reads each scalar back by slicing, which fuses into the kernels that read
it. The real, integer and boolean scalars of 32 and 64 bits share one array
of signed integers of the widest of their widths, each stored by its bits
(`lax.bitcast_convert_type`; a boolean as 0 or 1; a 32-bit value in a 64-bit
array by the sign extension of its bits, which narrowing undoes exactly): a
move of integers changes no bit, where a float32 array holding an integer's
bits might meet a flush of subnormals or a canonical NaN. One array rather than
one per width: a float64 solver's loop carries `int32` counters beside its
`float64` scalars, and each array is a kernel. Other scalars (complex, 16-bit)
are grouped by their dtype.

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


def _width(dtype: np.dtype) -> int | None:
    """The bits of the signed integer that carries a scalar of `dtype` by its
    bits: 32 for a boolean and for a real or integer dtype of 32 bits, 64 for one
    of 64 bits, `None` for any other (complex, 16-bit)."""
    if dtype == np.bool_:
        return 32
    if dtype.kind in "fiu" and dtype.itemsize in (4, 8):
        return 8 * dtype.itemsize
    return None


def _to_carrier(leaf: Array, carrier: np.dtype) -> Array:
    if leaf.dtype == carrier:
        return leaf
    if leaf.dtype == np.bool_:
        return lax.convert_element_type(leaf, carrier)
    own = np.dtype(f"int{8 * leaf.dtype.itemsize}")
    bits = leaf if leaf.dtype == own else lax.bitcast_convert_type(leaf, own)
    return lax.convert_element_type(bits, carrier)  # sign-extended where wider


def _from_carrier(value: Array, dtype: np.dtype) -> Array:
    if value.dtype == dtype:
        return value
    if dtype == np.bool_:
        return lax.ne(value, lax.full_like(value, 0))
    own = np.dtype(f"int{8 * dtype.itemsize}")
    bits = lax.convert_element_type(value, own)  # exact: the bits came in so
    return bits if dtype == own else lax.bitcast_convert_type(bits, dtype)


class _Packing:
    """Where each leaf of a loop state goes: the scalars into one stacked array
    per carrier (the signed integer of the widest `_width` for those that have
    one, else their own dtype; in the order first seen) where it has more than
    one, every other leaf as it is."""

    def __init__(self, state):
        leaves, self.treedef = jtu.tree_flatten(state)
        self.dtypes = [jnp.result_type(leaf) for leaf in leaves]
        # (A key or another extended dtype has no bits to carry: left as it is.)
        scalars = [
            i
            for i, leaf in enumerate(leaves)
            if jnp.ndim(leaf) == 0
            and not jnp.issubdtype(self.dtypes[i], jax.dtypes.extended)
        ]
        widths = {i: _width(np.dtype(self.dtypes[i])) for i in scalars}
        widest = max((w for w in widths.values() if w is not None), default=None)
        groups: dict = {}
        for i in scalars:
            carrier = self.dtypes[i] if widths[i] is None else f"int{widest}"
            groups.setdefault(np.dtype(carrier), []).append(i)
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

    Not for a loop that is differentiated: a scalar carried by its bits carries
    no tangent, so forward-mode differentiation through the loop gives zero
    where `lax.while_loop` gives the derivative. (The solvers' loops run inside
    lineax's `linear_solve`, whose rules differentiate the solve without
    differentiating its loop.)

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
