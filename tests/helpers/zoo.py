"""Every operator kind, built the same way from lineax and from lineax-dispatch."""

import types

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd


N = 5

POLICIES = {
    "lazy": lxd.Lazy(),
    "outline": lxd.Outline(),
    "materialise": lxd.Materialise(),
    "materialise-chunked": lxd.Materialise(batch_size=2),
}
# The heavy tests (solves, gradients) run these; the all-columns-at-once
# `Materialise()` shares the chunked variant's code path apart from the matrix
# build, which the light tests cover.
SOLVE_POLICIES = ["lazy", "outline", "materialise-chunked"]

# kind -> the tag that makes it solvable by CG/Cholesky (None: not symmetric).
KINDS = {
    "matrix": lx.positive_semidefinite_tag,
    "matrix-nonsymmetric": None,
    "pytree": lx.positive_semidefinite_tag,
    "diagonal": lx.positive_semidefinite_tag,
    "tridiagonal": lx.positive_semidefinite_tag,
    "identity": lx.positive_semidefinite_tag,
    "function": lx.positive_semidefinite_tag,
    "jacobian": lx.positive_semidefinite_tag,
    "tagged": lx.positive_semidefinite_tag,
    "add": lx.positive_semidefinite_tag,
    "mul": lx.positive_semidefinite_tag,
    "div": lx.positive_semidefinite_tag,
    "neg": lx.negative_semidefinite_tag,
    "composed": None,
}


def _arrays(dtype):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((N, N))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        m = m + 1j * rng.standard_normal((N, N))
        spd = m @ m.conj().T / N + N * np.eye(N)
    else:
        spd = m @ m.T / N + N * np.eye(N)
    nonsym = N * np.eye(N) + m
    d = 1.0 + rng.random(N)
    e = 0.5 * rng.standard_normal(N - 1)
    return {
        "spd": jnp.asarray(spd, dtype),
        "nonsym": jnp.asarray(nonsym, dtype),
        "d": jnp.asarray(d, dtype),
        "e": jnp.asarray(e, dtype),
    }


def _library(dispatch: bool, policy):
    """Constructors of either library with one signature."""
    lib = lxd if dispatch else lx
    kw = {"policy": policy} if dispatch else {}

    def make(name):
        cls = getattr(lib, name)
        return lambda *args, **kwargs: cls(*args, **kwargs, **kw)

    names = [
        "MatrixLinearOperator",
        "PyTreeLinearOperator",
        "DiagonalLinearOperator",
        "TridiagonalLinearOperator",
        "IdentityLinearOperator",
        "FunctionLinearOperator",
        "JacobianLinearOperator",
        "TaggedLinearOperator",
    ]
    return types.SimpleNamespace(
        **{n.removesuffix("LinearOperator"): make(n) for n in names}
    )


def build(kind, *, dispatch, policy=None, t=1.0, dtype=jnp.float64):
    """The operator of `kind`, scaled by `t` (which may be traced), from lineax-dispatch
    (`dispatch=True`, with `policy` on every node) or from plain lineax."""
    L = _library(dispatch, policy)
    a = _arrays(dtype)
    struct = jax.ShapeDtypeStruct((N,), dtype)
    spd = t * a["spd"]
    if kind == "matrix":
        return L.Matrix(spd)
    if kind == "matrix-nonsymmetric":
        return L.Matrix(t * a["nonsym"])
    if kind == "pytree":
        blocks = {
            "a": {"a": spd[:2, :2], "b": spd[:2, 2:]},
            "b": {"a": spd[2:, :2], "b": spd[2:, 2:]},
        }
        out = {
            "a": jax.ShapeDtypeStruct((2,), dtype),
            "b": jax.ShapeDtypeStruct((N - 2,), dtype),
        }
        return L.PyTree(blocks, out)
    if kind == "diagonal":
        return L.Diagonal(t * a["d"])
    if kind == "tridiagonal":
        return L.Tridiagonal(t * (a["d"] + 4), t * a["e"], t * a["e"])
    if kind == "identity":
        return L.Identity(struct)
    if kind == "function":
        return L.Function(lambda x: spd @ x, struct)
    if kind == "jacobian":
        x0 = jnp.linspace(0.1, 0.5, N).astype(dtype)
        return L.Jacobian(lambda x, args: args @ x + 0.1 * jnp.sin(x), x0, spd)
    if kind == "tagged":
        return L.Tagged(L.Function(lambda x: spd @ x, struct), lx.symmetric_tag)
    if kind == "add":
        return L.Matrix(spd) + L.Function(lambda x: a["spd"] @ x, struct)
    if kind == "mul":
        return L.Matrix(spd) * jnp.asarray(2.0, dtype)
    if kind == "div":
        return L.Function(lambda x: spd @ x, struct) / jnp.asarray(2.0, dtype)
    if kind == "neg":
        return -L.Matrix(spd)
    if kind == "composed":
        return L.Matrix(t * a["nonsym"]) @ L.Diagonal(a["d"])
    raise ValueError(kind)


def vector(operator, seed=1):
    """A deterministic vector in the input space of `operator`."""
    leaves, treedef = jax.tree_util.tree_flatten(operator.in_structure())
    rng = np.random.default_rng(seed)
    out = []
    for s in leaves:
        v = rng.standard_normal(s.shape)
        if jnp.issubdtype(s.dtype, jnp.complexfloating):
            v = v + 1j * rng.standard_normal(s.shape)
        out.append(jnp.asarray(v, s.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def tolerance(dtype):
    return 2e-4 if jnp.finfo(dtype).bits <= 32 else 1e-9
