"""Small linear systems for the solver tests, and which solvers apply to each."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd


N = 12
TOL = {jnp.float32: 1e-5, jnp.float64: 1e-10, jnp.complex128: 1e-10}
CHECK = {jnp.float32: 2e-3, jnp.float64: 1e-7, jnp.complex128: 1e-7}


def matrix(kind: str, dtype) -> np.ndarray:
    """A well-conditioned matrix of the given kind (`psd`, `nonsym`, `indefinite`,
    `tall`, `wide`), complex where `dtype` is."""
    rng = np.random.default_rng(1)
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)

    def gauss(*shape):
        out = rng.standard_normal(shape)
        if complex_:
            out = out + 1j * rng.standard_normal(shape)
        return out

    if kind == "psd":
        m = gauss(N, N)
        return m @ m.conj().T / N + np.eye(N)
    if kind == "nonsym":
        return 2 * np.eye(N) + gauss(N, N) / np.sqrt(N)
    if kind == "indefinite":
        q, _ = np.linalg.qr(gauss(N, N))
        eigs = np.linspace(0.5, 2.0, N) * np.where(np.arange(N) % 2, 1, -1)
        return (q * eigs) @ q.conj().T
    if kind == "tall":
        return gauss(N + 4, N) + np.eye(N + 4, N)
    if kind == "wide":
        return gauss(N, N + 4) + np.eye(N, N + 4)
    raise ValueError(kind)


TAGS = {
    "psd": (lx.positive_semidefinite_tag, lx.symmetric_tag),
    "indefinite": (lx.symmetric_tag,),
    "nonsym": (),
    "tall": (),
    "wide": (),
}


def rhs(kind: str, dtype) -> np.ndarray:
    rng = np.random.default_rng(2)
    rows = matrix(kind, jnp.float64).shape[0]
    out = rng.standard_normal(rows)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        out = out + 1j * rng.standard_normal(rows)
    return np.asarray(out, dtype)


class Counter:
    """Counts calls of the user's function (hashable by identity, so it can sit in
    a static field)."""

    def __init__(self):
        self.n = 0
        self.active = True


class ScaledMatmul(eqx.Module):
    """`x -> theta * (a @ x)`: a callable PyTree, so `theta` can be differentiated
    without closure conversion and calls can be counted."""

    a: jax.Array
    theta: jax.Array
    counter: Counter = eqx.field(static=True)

    def __call__(self, x):
        if self.counter.active:
            self.counter.n += 1
        return self.theta * (self.a @ x)


def function_operator(
    kind: str, dtype, theta=1.0, counter=None, dispatch=True, policy=None
):
    """A FunctionLinearOperator for `theta * matrix(kind)`, of lineax-dispatch (with
    `policy`) or plain lineax."""
    a = jnp.asarray(matrix(kind, dtype), dtype)
    fn = ScaledMatmul(
        a, jnp.asarray(theta, dtype), Counter() if counter is None else counter
    )
    structure = jax.ShapeDtypeStruct((a.shape[1],), dtype)
    if dispatch:
        kwargs = {} if policy is None else {"policy": policy}
        return lxd.FunctionLinearOperator(
            fn, structure, TAGS[kind], closure_convert=False, **kwargs
        )
    return lx.FunctionLinearOperator(fn, structure, TAGS[kind], closure_convert=False)


def reference(kind: str, dtype) -> np.ndarray:
    """The pseudoinverse solution in float64/complex128."""
    wide = jnp.complex128 if jnp.issubdtype(dtype, jnp.complexfloating) else jnp.float64
    a = matrix(kind, wide)
    return np.linalg.lstsq(a, rhs(kind, wide), rcond=None)[0]


# name -> (our solver factory, lineax's counterpart factory or None, problem kinds)
def _pair(ours, theirs, **kw):
    return (lambda tol: ours(rtol=tol, atol=tol, **kw)), (
        None if theirs is None else (lambda tol: theirs(rtol=tol, atol=tol, **kw))
    )


SOLVERS = {
    "cg": (*_pair(lxd.CG, lx.CG), ("psd",)),
    # CG's inline layout (`mv` where lineax's CG writes it), whatever the cost.
    "cg-inline": (
        lambda tol: lxd.CG(rtol=tol, atol=tol, layout="inline"),
        lambda tol: lx.CG(rtol=tol, atol=tol),
        ("psd",),
    ),
    "bicgstab": (*_pair(lxd.BiCGStab, lx.BiCGStab), ("psd", "nonsym")),
    "gmres": (*_pair(lxd.GMRES, lx.GMRES, restart=5), ("psd", "nonsym")),
    "normal-cg": (
        lambda tol: lxd.Normal(lxd.CG(rtol=tol, atol=tol)),
        lambda tol: lx.Normal(lx.CG(rtol=tol, atol=tol)),
        ("nonsym", "tall", "wide"),
    ),
}
if hasattr(lxd, "MINRES"):
    SOLVERS["minres"] = (*_pair(lxd.MINRES, None), ("psd", "indefinite"))
if hasattr(lxd, "LSMR"):
    SOLVERS["lsmr"] = (*_pair(lxd.LSMR, lx.LSMR), ("nonsym", "tall", "wide"))
