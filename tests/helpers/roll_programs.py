"""The zoo of programs of tests/program/ (test_roll.py, test_auto_programs.py and
others): chains of dense layers as `lxd` operators under a given policy, programs
applying them at several call sites (dependent, independent, mixed, in loops and
branches, with effects, with a solve), `jax.jit` of each on `Lazy` operators as the
reference, the cost models under which `Auto` picks each rewrite, and grad, jvp and
vmap of a program compiled together."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd


N, LAYERS = 6, 3
_KEYS = jax.random.split(jax.random.key(0), LAYERS)
_WEIGHTS = [
    jnp.eye(N) + 0.3 * jax.random.normal(k, (N, N), jnp.float64) / N for k in _KEYS
]


def _chain(x):
    for w in _WEIGHTS:
        x = w @ x
    return x


def _operators(policy, counter=None):
    def fn(x):
        if counter is not None:
            counter.append(1)
        return _chain(x)

    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    op = lxd.FunctionLinearOperator(fn, structure, closure_convert=False, policy=policy)
    if counter is not None:
        # The shape evaluation at construction (lineax's, for a tagged operator,
        # or ours, for any): the counter counts the traces of the call sites.
        counter.clear()
    other = lxd.MatrixLinearOperator(
        jnp.arange(N * N, dtype=jnp.float64).reshape(N, N) / N**2, policy=policy
    )
    tree = lxd.FunctionLinearOperator(
        lambda t: {"a": _chain(t["a"]) + t["b"][:N], "b": 2 * t["b"]},
        {
            "a": jax.ShapeDtypeStruct((N,), jnp.float64),
            "b": jax.ShapeDtypeStruct((N + 1,), jnp.float64),
        },
        policy=policy,
    )
    return op, other, tree


def _dependent(ops, x):
    op = ops[0]
    for i in range(5):
        x = op.mv(x * (1.0 + 0.1 * i))
    return x


def _independent(ops, x):
    op = ops[0]
    return sum(op.mv(jnp.sin(x) * i) for i in range(4))


def _mixed(ops, x):
    op = ops[0]
    a = op.mv(x)
    b = op.mv(jnp.cos(x))
    c = op.mv(a * b)
    d = jnp.tanh(c) + a
    return op.mv(d) - b, c


def _two_operators(ops, x):
    op, other = ops[0], ops[1]
    for _ in range(3):
        x = other.mv(op.mv(x)) + 0.5 * x
    return x


def _pytree(ops, x):
    tree = ops[2]
    t = {"a": x, "b": jnp.concatenate([x, x[:1]])}
    for _ in range(3):
        t = tree.mv(t)
    return t["a"].sum() * x + t["b"][:N]


def _in_scan_and_cond(ops, x):
    op = ops[0]
    y = op.mv(x)

    def step(carry, _):
        return op.mv(carry) * 0.5, None

    z, _ = jax.lax.scan(step, y, None, length=3)
    w = jax.lax.cond(z.sum() > 0, lambda v: op.mv(v), lambda v: -v, z)
    return op.mv(w) + y


def _with_effects(ops, x):
    op = ops[0]
    y = op.mv(x)
    jax.debug.print("between calls {}", y.sum())
    y = eqx.error_if(y, ~jnp.all(jnp.isfinite(y)), "not finite")
    return op.mv(y) + op.mv(2 * y)


def _with_solve(ops, x):
    op = ops[0]
    b = op.mv(x)
    dense = lxd.MatrixLinearOperator(
        jnp.eye(N) * 3 + 0.1, lx.positive_semidefinite_tag, policy=lxd.Lazy()
    )
    y = lx.linear_solve(dense, b, lxd.CG(1e-10, 1e-10)).value
    return op.mv(y) + op.mv(b)


def _runge_kutta(ops, x):
    """Three steps of classic RK4: the four stages keep one to four values each
    across a call (the slots that hold nothing at a stage are left as they are)."""
    op, dt = ops[0], 0.1
    for _ in range(3):
        k1 = -op.mv(x)
        k2 = -op.mv(x + 0.5 * dt * k1)
        k3 = -op.mv(x + 0.5 * dt * k2)
        k4 = -op.mv(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x


def _shifting_slots(ops, x):
    """Calls that keep one, two, three, two and one values: as the oldest values
    die, the others move to lower slots, and values computed at the first calls
    are read only after the last."""
    op = ops[0]
    a = op.mv(x)
    b = op.mv(a * 0.5)
    c = op.mv(jnp.sin(b))
    d = op.mv(c + a)
    e = op.mv(d - b)
    return e + c, jnp.sum(e)


def _mixed_types(ops, x):
    """Calls that keep a vector and a scalar at one position, two vectors at
    another: one slot per value for the whole loop."""
    op = ops[0]
    for _ in range(2):
        y = op.mv(x)
        s = jnp.sum(y)
        z = op.mv(y * s)
        w = op.mv(z + y)
        x = w * s + z
    return x


ZOO_X = jnp.linspace(0.1, 1.0, N)
ZOO = {
    "dependent": _dependent,
    "independent": _independent,
    "mixed": _mixed,
    "two-operators": _two_operators,
    "pytree": _pytree,
    "in-scan-and-cond": _in_scan_and_cond,
    "effects": _with_effects,
    "solve": _with_solve,
    "runge-kutta": _runge_kutta,
    "shifting-slots": _shifting_slots,
    "mixed-types": _mixed_types,
}


def _pair(name):
    rolled_ops = _operators(lxd.Roll())
    lazy_ops = _operators(lxd.Lazy())
    program = ZOO[name]
    return (
        lambda x: program(rolled_ops, x),
        lambda x: program(lazy_ops, x),
    )


def _close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


# `jax.jit` of these programs fails inside jax's leak report too (an IndexError
# there, from `eqx.error_if`, which lineax's `throw` uses): no leak check.
NO_LEAK_CHECK = ("effects", "solve")


@ft.cache
def lazy_reference(name):
    """`jax.jit` of the zoo's program `name` on `Lazy` operators, at `ZOO_X`
    (leak-checked where it can be): the reference of every rewrite of it in
    program/test_roll.py and program/test_auto_programs.py, so computed once."""
    lazy_ops = _operators(lxd.Lazy())
    f = jax.jit(lambda x: ZOO[name](lazy_ops, x))
    if name in NO_LEAK_CHECK:
        return f(ZOO_X)
    with jax.checking_leaks():
        return f(ZOO_X)


# A cost model under which Auto rolls whenever it can (for tests).
ROLL_MODEL = lxd.CostModel(
    compile_per_dot=10.0, materialise_fixed=1e3, outline_site=1e3
)


# Cost models under which each rewrite is the cheapest where it applies.
_MODELS = {
    "roll": ROLL_MODEL,
    "materialise": lxd.CostModel(
        compile_per_dot=10.0, outline_site=1e3, roll_fixed=1e3
    ),
}


@jax.jit
def user_function(x):
    """A `jax.jit` function of the user's with a substantial body (40 steps), which
    `lxd.jit` rolls where it is called at several sites."""
    for i in range(40):
        x = jnp.sin(x) * (1.0 + 0.001 * i)
    return x


def nested_dependent(x):
    """`user_function` at 6 dependent sites."""
    for i in range(6):
        x = user_function(x) + 0.1 * i
    return x


def _loop(op, x, sites):
    for i in range(sites):
        x = op.mv(x) * (1.0 + 0.01 * i)
    return x


def _sum(op, x, sites):
    return sum(op.mv(jnp.sin(x) * (i + 1)) for i in range(sites))


def _scalar(f):
    return lambda x: sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(f(x)))


def _transformed(f, jit):
    """grad, jvp and vmap of `jit(f)`, compiled together (each `lxd.jit` traces,
    decides and rewrites its program inside the outer trace)."""

    def run(x, tangent, xs):
        return (
            jax.grad(jit(_scalar(f)))(x),
            jax.jvp(jit(f), (x,), (tangent,)),
            jax.vmap(jit(f))(xs),
        )

    return run


def _transformed_args(x):
    return x, jnp.cos(x), jnp.stack([x, 2 * x, -x])
