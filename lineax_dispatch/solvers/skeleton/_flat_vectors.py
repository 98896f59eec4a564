"""Flat views of operators and vectors, so each solver is written on 1-D arrays.

Every solver of this package works on the ravelled vector (one 1-D array in the
promoted dtype of the leaves). The operator is wrapped as a function of flat
vectors that calls `operator.mv` exactly once per call: wherever a solver calls
it once in its loop body, the user's `mv` appears once in the traced program."""

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
from jax.custom_batching import custom_vmap
from jax.sharding import NamedSharding
from jaxtyping import Array, Float, PyTree, Shaped

from ..._reductions import LIBRARY_REDUCTION_SIZE
from ...operators import AbstractDispatchOperator, conj as lxd_conj, linearise
from ...operators._sharding import explicit_sharding, replicated_like, stacked_like
from ...operators._vector_structure import structures_match
from ...policies._memory import promoted_dtype, structure_size
from ...policies.calls._recorder import user_code
from ._packed_loop import on_xla_cpu


# From this many entries a dot product is padded to a library kernel's length
# (`_library_length`): below it the padded one runs measurably slower.
PADDED_DOT_FROM = 1024


class Flattener(eqx.Module):
    """Ravels a PyTree of a fixed structure to a 1-D array and back.

    Where the structure's leaves hold an explicit sharding (a mesh with Explicit
    axes: the sharding is part of the type every vector of a solver's loop must
    keep), every flat vector it gives is typed as a ravelled vector of the
    structure (`sharding`), and every PyTree it gives as the structure: a vector
    that reaches it in another sharding is resharded. lineax evaluates a solve
    abstractly with its right-hand side's and its operator's arrays as shapes and
    dtypes alone, so there they reach the solver unsharded where the operator's
    structure states a sharding. Elsewhere nothing is resharded, and no equation
    is added.
    """

    structure: PyTree[jax.ShapeDtypeStruct] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    sharding: NamedSharding | None = eqx.field(static=True)

    def __init__(self, structure: PyTree[jax.ShapeDtypeStruct], dtype: Any):
        leaves, treedef = jtu.tree_flatten(structure)
        self.structure = (tuple(leaves), treedef)
        self.dtype = jnp.dtype(dtype)
        self.sharding = None
        if any(explicit_sharding(x) is not None for x in leaves):
            flat = jax.eval_shape(self._concatenate, structure)
            self.sharding = explicit_sharding(flat)

    @property
    def size(self) -> int:
        return structure_size(self.structure[0])

    def zeros(self) -> Shaped[Array, " size"]:
        """A flat vector of zeros, typed as `ravel` types its vectors."""
        return jnp.zeros(self.size, self.dtype, out_sharding=self.sharding)

    def ravel(self, tree: PyTree[Array]) -> Shaped[Array, " size"]:
        return _typed(self._concatenate(tree), self.sharding)

    def _concatenate(self, tree: PyTree[Array]) -> Shaped[Array, " size"]:
        leaves = jtu.tree_leaves(tree)
        if not leaves:
            return jnp.zeros((0,), self.dtype)
        return jnp.concatenate([jnp.ravel(x).astype(self.dtype) for x in leaves])

    def unravel(self, flat: Shaped[Array, " size"]) -> PyTree[Array]:
        leaves, treedef = self.structure
        if len(leaves) == 1:
            # One leaf: no split to trace (an equation and a `jnp.split` call at
            # each of a solver's unravels, traced again at lowering).
            pieces = [flat]
        else:
            sizes = np.cumsum([math.prod(x.shape) for x in leaves[:-1]]).tolist()
            pieces = jnp.split(flat, sizes) if leaves else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex -> real casts of a real leaf
            out = [p.reshape(s.shape).astype(s.dtype) for p, s in zip(pieces, leaves)]
        if self.sharding is not None:
            out = [_typed(x, explicit_sharding(s)) for x, s in zip(out, leaves)]
        return jtu.tree_unflatten(treedef, out)


def _typed(x: Array, sharding: NamedSharding | None) -> Array:
    """`x` resharded to `sharding` where that is given and `x`'s type has another
    (see `Flattener`); `x` itself otherwise."""
    if sharding is None:
        return x
    ndim = jnp.ndim(x)
    if _padded(jax.typeof(x).sharding.spec, ndim) == _padded(sharding.spec, ndim):
        return x
    return jax.sharding.reshard(x, sharding)


def _padded(spec: Any, ndim: int) -> tuple:
    return tuple(spec) + (None,) * (ndim - len(spec))


def result_dtype(*trees: PyTree[Any]) -> Any:
    """The dtype in which a solver works: the promotion of every leaf's dtype."""
    leaves = [x for t in trees for x in jtu.tree_leaves(t)]
    dtype = promoted_dtype(*[x.dtype for x in leaves])
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = promoted_dtype(dtype, jnp.float32)
    return dtype


def keep_linearise(operator: lx.AbstractLinearOperator) -> lx.AbstractLinearOperator:
    """`linearise`, keeping an operator of ours ours and a lineax one lineax's."""
    if isinstance(operator, AbstractDispatchOperator):
        return linearise(operator)
    return lx.linearise(operator)


def keep_conj(operator: lx.AbstractLinearOperator) -> lx.AbstractLinearOperator:
    """`conj`, keeping an operator of ours ours and a lineax one lineax's.

    lineax conjugates a matrix-free operator by wrapping its `mv` in a new function
    and tracing it: the user's code, so traced in the trace's jit-cache context
    (`user_code`), where the solver's own `mv` finds that trace again."""
    with user_code():
        if isinstance(operator, AbstractDispatchOperator):
            return lxd_conj(operator)
        return lx.conj(operator)


def transpose_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options of the transposed solve: the transposed preconditioner."""
    if options.get("preconditioner") is None:
        return {}
    return {"preconditioner": options["preconditioner"].transpose()}


def conj_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options of the conjugate solve: the conjugate preconditioner."""
    if options.get("preconditioner") is None:
        return {}
    return {"preconditioner": keep_conj(options["preconditioner"])}


@contextlib.contextmanager
def structure_mesh(operator: lx.AbstractLinearOperator) -> Iterator[None]:
    """Runs a solve of `operator` on the mesh its input or output structure is
    sharded over (an Explicit mesh axis), as an abstract mesh, where no mesh is set
    (`jax.jit` outside `jax.set_mesh`): there, on jax 0.12, `jax.numpy`'s
    functions that create an array (`jnp.zeros_like` of a sharded vector, or
    `jnp.zeros(..., out_sharding=...)`) give it unsharded, and a solver's loop
    would carry vectors of two shardings. Where a mesh is set, or the structures
    name no Explicit axis, it does nothing."""
    if jax.sharding.get_abstract_mesh().empty:
        structures = (operator.in_structure(), operator.out_structure())
        for leaf in jtu.tree_leaves(structures):
            sharding = explicit_sharding(leaf)
            if sharding is not None:
                mesh = sharding.mesh
                if isinstance(mesh, jax.sharding.Mesh):
                    mesh = mesh.abstract_mesh
                with jax.sharding.use_abstract_mesh(mesh):
                    yield
                return
    yield


def flat_mv(operator: lx.AbstractLinearOperator, source: Flattener, dest: Flattener):
    """`x -> ravel(operator.mv(unravel(x)))`: one `mv` per call."""

    def mv(x: Shaped[Array, " n"]) -> Shaped[Array, " m"]:
        with user_code():
            out = operator.mv(source.unravel(x))
        return dest.ravel(out)

    return mv


def dot(a: Shaped[Array, " n"], b: Shaped[Array, " n"]) -> Shaped[Array, ""]:
    """`<a, b>` with `a` conjugated, as lineax's `tree_dot`: at the highest
    precision (on an accelerator a default-precision `float32` dot may round its
    inputs to fewer bits, which a Krylov solver's inner products cannot afford)."""
    a, b = _library_length(a), _library_length(b)
    # Vectors sharded on an Explicit mesh axis: JAX asks where the sum goes.
    return jnp.dot(
        jnp.conj(a), b, precision=lax.Precision.HIGHEST, out_sharding=replicated_like(a)
    )


def _library_length(x: Shaped[Array, " n"]) -> Shaped[Array, " n"]:
    """`x` padded with zeros to `LIBRARY_REDUCTION_SIZE` entries where XLA:CPU
    would otherwise generate code for a reduction of it: from `PADDED_DOT_FROM`
    entries of a real, unsharded vector. Its dot product is then a library kernel
    (the padding fused into it), compiled in about a fifth of the time
    (`benchmarks.reduction_compile`: 7 against 34 ms at 1,024 entries). Its run:
    jax 0.10.2, 0.52 against 0.48 us a product at 1,024 entries and 0.60 against
    0.95 at 2,048; jax 0.12.1, 0.53 against 0.27 and 0.55 against 0.52. At 256
    entries it took 0.45 us against 0.17 (0.10): hence `PADDED_DOT_FROM`. A solve
    run so often that its products' extra microseconds outweigh the kernels'
    compile (tens of thousands of products, on jax 0.12.1 below 2,048 entries)
    pays for it."""
    n = x.shape[0]
    if (
        not on_xla_cpu()
        or not PADDED_DOT_FROM <= n < LIBRARY_REDUCTION_SIZE
        or not jnp.issubdtype(x.dtype, jnp.floating)
        or explicit_sharding(x) is not None
    ):
        return x
    return jnp.pad(x, (0, LIBRARY_REDUCTION_SIZE - n))


def stacked_zeros(count: int, like: Array) -> Array:
    """Zeros of shape `(count, *like.shape)` and `like`'s dtype, each row sharded as
    `like` is where its type holds an explicit sharding (a Krylov basis)."""
    shape = (count,) + tuple(like.shape)
    return jnp.zeros(shape, like.dtype, out_sharding=stacked_like(like))


def project(basis: Array, w: Array) -> Array:
    """`basis.conj() @ w`: the coefficients of `w` on the rows of `basis`,
    replicated where `w` is sharded on an Explicit mesh axis."""
    return jnp.matmul(basis.conj(), w, out_sharding=replicated_like(w, basis.ndim - 1))


def select(pred: Array, on_true: Any, on_false: Any) -> Array:
    """`jnp.where(pred, on_true, on_false)` for a scalar `pred` and operands of one
    shape (a Python or NumPy number takes the dtype of the other operand, as a
    NumPy constant: `jnp.asarray` would make an array of it at each use while
    tracing), as `lax.select`: `jnp.where` is a jitted function, a call of its own
    to trace and lower at each use, and a solver's loop body selects a dozen times
    (traced twice: by the solve and by its lowering)."""
    if not isinstance(on_true, jax.Array):
        on_true = np.asarray(on_true, on_false.dtype)
    if not isinstance(on_false, jax.Array):
        on_false = np.asarray(on_false, on_true.dtype)
    return lax.select(pred, on_true, on_false)


def constant(value: Any, like: Array) -> np.ndarray:
    """`value` as a NumPy constant of `like`'s dtype, for the `lax` functions a
    solver's loop calls on its scalars (`lax.gt`, `lax.mul`...: operands of one
    dtype, no promotion). Each operator of a traced array (`x > 0`, `a & b`) goes
    through `jax.numpy`'s jitted function of it, slower to trace than the `lax`
    function; a solver's loop is traced twice per solve (by the
    solve and by its lowering), and its scalar logic is most of its equations."""
    return np.asarray(value, like.dtype)


def real_part(x: Array) -> Array:
    """`jnp.real(x)`: `x` itself where it is real, with no equation."""
    return lax.real(x) if jnp.iscomplexobj(x) else x


def quotient(a: Array, b: Array) -> Array:
    """`a / b`, as `lax.div` where both have one dtype (see `constant`), else as
    `jax.numpy` promotes."""
    if a.dtype == b.dtype:
        return lax.div(a, b)
    with jax.numpy_dtype_promotion("standard"):
        return a / b


def computed_once(value: Array, count: Array) -> Array:
    """`value`, an integer scalar, divided by `count >= 0` as an integer (1, for
    any non-negative `count` such as a step count): XLA cannot fold the division
    away, and counts it expensive. XLA:CPU fuses cheap scalar logic into each
    vector kernel that reads its result, once per kernel, where an expensive one
    is computed once in a kernel of its own; a loop whose vector updates read a
    decision made of a few dozen scalar operations (CG's next pass) then
    compiles that decision once rather than in every update. On another backend
    `value` as it is (the duplication measured is XLA:CPU's; see
    `_packed_loop.on_xla_cpu`).

    **Arguments:**

    - `value`: an integer scalar (or a batch of them under `vmap`).
    - `count`: a non-negative integer of `value`'s dtype that XLA cannot
        prove non-negative.

    **Returns:**

    `value`.
    """
    if not on_xla_cpu():
        return value
    one = lax.convert_element_type(lax.ge(count, constant(0, count)), value.dtype)
    return lax.div(value, one)


def both(a: Array, b: Array) -> Array:
    """`a & b` of booleans, as `lax.bitwise_and` (see `constant`)."""
    return lax.bitwise_and(a, b)


def either(a: Array, b: Array) -> Array:
    """`a | b` of booleans, as `lax.bitwise_or` (see `constant`)."""
    return lax.bitwise_or(a, b)


def negated(a: Array) -> Array:
    """`~a` of a boolean, as `lax.bitwise_not` (see `constant`)."""
    return lax.bitwise_not(a)


@custom_vmap
def branch_select(pred: Array, on_true: Array, on_false: Array) -> Array:
    """`select(pred, on_true, on_false)` in a `lax.cond` branch that runs only
    where `pred` holds for some vector of a batch (its predicate
    `nonbatchable(unvmap_any(pred))`): unbatched, `pred` holds wherever the branch
    runs, so this is `on_true`; under `vmap` (a batched `pred`), the select, each
    vector keeping its own operand.

    XLA:CPU cannot know the unbatched select is `on_true`: in CG's inline layout
    a `cond` reading the residual through it ran 4-5% slower a solve (2-D
    stencil, 16384 unknowns, 75 steps), though the branch ran a tenth of them."""
    del pred, on_false
    return on_true


@branch_select.def_vmap
def _branch_select_batched(
    axis_size: int, in_batched: list[bool], pred, on_true, on_false
) -> tuple[Array, bool]:
    del axis_size
    pred_batched, true_batched, false_batched = in_batched
    if not pred_batched:
        return on_true, true_batched
    axes = (0, 0 if true_batched else None, 0 if false_batched else None)
    return jax.vmap(select, in_axes=axes)(pred, on_true, on_false), True


def binary_scale(x: Shaped[Array, " n"]) -> Shaped[Array, ""]:
    """The power of two `2^e` with `max |x|` in `[2^e, 2^(e+1))`, as a real
    scalar; 1 where `x` is zero or subnormal, or its largest entry is infinite.
    (Where `x` holds a NaN it may be 1 or the scale of the other entries: from
    `LIBRARY_REDUCTION_SIZE` entries XLA:CPU's maximum drops a NaN in jax 0.10.2.
    Whether `x` is finite is `all_finite`'s to say.) Dividing by it is exact
    (away from overflow and subnormals).

    `2^e` is `max |x|` with its mantissa bits cleared: a few scalar operations,
    which XLA fuses into each kernel that reads the scale. On a TPU a float64's
    bits are not at hand (XLA:TPU emulates float64: its `frexp` and bit shifts do
    not compile), and there it is built by arithmetic (`_power_of_two_below`)."""
    real = jnp.finfo(x.dtype).dtype
    if x.size == 0:
        return jnp.ones((), real)
    return binary_scale_of_largest(jnp.max(jnp.abs(x)).astype(real))


def binary_scale_of_largest(largest: Float[Array, ""]) -> Float[Array, ""]:
    """`binary_scale` of a vector whose largest magnitude is `largest` (real)."""
    if largest.dtype == jnp.float64:
        return lax.platform_dependent(
            largest, tpu=_power_of_two_by_arithmetic, default=_power_of_two_by_bits
        )
    return _power_of_two_by_bits(largest)


def _power_of_two_by_bits(value: Float[Array, ""]) -> Float[Array, ""]:
    """`binary_scale` of a vector whose largest magnitude is `value`: `value`
    with its mantissa bits cleared; 1 where its exponent bits are all clear (zero
    or subnormal) or all set (not finite)."""
    info = jnp.finfo(value.dtype)
    integer = jnp.dtype(f"int{info.bits}")
    exponent_bits = np.array(((1 << info.nexp) - 1) << info.nmant, integer)
    top = lax.bitwise_and(lax.bitcast_convert_type(value, integer), exponent_bits)
    usable = lax.bitwise_and(
        lax.gt(top, np.array(0, integer)), lax.lt(top, exponent_bits)
    )
    one = constant(1.0, value)
    return lax.select(usable, lax.bitcast_convert_type(top, value.dtype), one)


def _power_of_two_by_arithmetic(value: Float[Array, ""]) -> Float[Array, ""]:
    """`binary_scale` of a float64 vector whose largest magnitude is `value`, by
    arithmetic alone."""
    one = constant(1.0, value)
    usable = lax.bitwise_and(
        lax.ge(value, constant(jnp.finfo(value.dtype).smallest_normal, value)),
        lax.is_finite(value),
    )
    unit = _power_of_two_below(lax.select(usable, value, one))
    return lax.select(usable, unit, one)


def _power_of_two_below(value: Float[Array, ""]) -> Float[Array, ""]:
    """The power of two `2^e` with `value` in `[2^e, 2^(e+1))`, for a positive
    finite float64 `value`, by arithmetic alone: `e` from `log2`, `2^e` as a
    product of the exact powers `2^(+-2^b)`, then one step of correction either
    way (`log2` may round across an integer). Written in `lax` primitives: this
    is traced on every backend (`lax.platform_dependent` traces each branch), and
    `jnp`'s wrappers would make it a hundred equations."""
    guess = lax.floor(lax.div(lax.log(value), constant(np.log(2.0), value)))
    negative = lax.lt(guess, constant(0.0, value))
    left = lax.abs(guess)
    unit = constant(1.0, value)
    for bit in reversed(range(11)):  # |e| < 2^11 for a float64
        step = constant(float(2**bit), value)
        take = lax.ge(left, step)
        # (2^1024 is not a float64: a positive e < 1024 never takes that bit.)
        up = constant(2.0 ** min(2**bit, 1023), value)
        factor = lax.select(negative, constant(2.0 ** -(2**bit), value), up)
        unit = lax.select(take, lax.mul(unit, factor), unit)
        left = lax.select(take, lax.sub(left, step), left)
    two = constant(2.0, value)
    unit = lax.select(lax.gt(unit, value), lax.div(unit, two), unit)
    twice = lax.mul(two, unit)
    return lax.select(lax.le(twice, value), twice, unit)


def two_norm(x: Shaped[Array, " n"]) -> Shaped[Array, ""]:
    return jnp.sqrt(jnp.sum(jnp.abs(x) ** 2))


def scaled_norm(
    x: Shaped[Array, " n"], unit: Shaped[Array, ""] | None = None
) -> Shaped[Array, ""]:
    """`two_norm(x)` taken on `x` divided by a power of two near its largest
    entry (`binary_scale`, or `unit` where given), then multiplied back: the
    squares of float32 entries overflow from about 1e19 and underflow below about
    1e-19. A `unit` given must be the scale of a vector no smaller than `x`."""
    if unit is None:
        unit = binary_scale(x)
    return two_norm(x / unit.astype(x.dtype)) * unit


def preconditioner_and_y0(
    operator: lx.AbstractLinearOperator,
    vector: PyTree[Array],
    options: dict[str, Any],
    *,
    allow_preconditioner: bool = True,
    solver_name: str,
) -> tuple[lx.AbstractLinearOperator | None, PyTree[Array] | None]:
    """Reads `options["preconditioner"]` and `options["y0"]`, checking them.

    **Returns:**

    `(preconditioner, y0)`, each `None` where not given.
    """
    preconditioner = options.get("preconditioner")
    if preconditioner is not None:
        if not allow_preconditioner:
            raise ValueError(
                f"`{solver_name}` does not accept `options['preconditioner']`."
            )
        if not isinstance(preconditioner, lx.AbstractLinearOperator):
            raise ValueError(
                f"`options['preconditioner']` of `{solver_name}` must be a lineax "
                f"linear operator, got {type(preconditioner).__name__}."
            )
        structure = operator.in_structure()
        for which in ("in_structure", "out_structure"):
            got = getattr(preconditioner, which)()
            if not structures_match(got, structure):
                raise ValueError(
                    f"`options['preconditioner']` of `{solver_name}`: its `{which}()` "
                    f"must equal the operator's `in_structure()`: expected "
                    f"{structure}, got {got}."
                )
        preconditioner = keep_linearise(preconditioner)
    y0 = options.get("y0")
    if y0 is not None:
        expected = operator.in_structure()
        got = jax.eval_shape(lambda: y0)
        if not structures_match(got, expected):
            raise ValueError(
                f"`options['y0']` of `{solver_name}` must match the operator's "
                f"`in_structure()`: expected {expected}, got {got}."
            )
    return preconditioner, y0
