"""Bad input is refused at trace time with messages naming the argument."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import lineax_dispatch as lxd


def test_unknown_policy():
    with pytest.raises(
        TypeError, match=r"`policy`.*Lazy\(\).*Materialise\(\).*Outline\(\).*'lazy'"
    ):
        lxd.MatrixLinearOperator(jnp.eye(2), policy="lazy")


def test_unknown_policy_suggests_only_exported_policies():
    with pytest.raises(TypeError) as info:
        lxd.linear_solve(lxd.MatrixLinearOperator(jnp.eye(2)), jnp.ones(2), policy="x")
    message = str(info.value)
    suggested = message.split("one of ")[1].split(";")[0].split(", ")
    names = {name.removesuffix("()") for name in suggested}
    # Every policy of the package a user can make is suggested, and no abstract
    # base (a policy a test defines may be listed too: it is a concrete class).
    for name in ("Auto", "Lazy", "Materialise", "Outline", "Roll", "Scan", "VmapBatch"):
        assert name in names, message
        getattr(lxd, name)()
    assert "Abstract" not in message


@pytest.mark.parametrize("bad", ["yes", 1.5, "True"])
def test_auto_solver_well_posed_is_checked_when_made(bad):
    with pytest.raises(TypeError, match=r"well_posed.*True.*False.*None"):
        lxd.AutoSolver(well_posed=bad)
    for good in (None, True, False):
        assert lxd.AutoSolver(well_posed=good).well_posed is good


def test_policy_class_instead_of_instance():
    with pytest.raises(TypeError, match=r"`policy`.*instantiate it: Outline\(\)"):
        lxd.DiagonalLinearOperator(jnp.ones(2), policy=lxd.Outline)


def test_with_policy_bad_arguments():
    with pytest.raises(TypeError, match="`policy`"):
        lxd.with_policy(lx.MatrixLinearOperator(jnp.eye(2)), 3)
    with pytest.raises(TypeError, match="`operator`.*ndarray|`operator`.*Array"):
        lxd.with_policy(jnp.eye(2), lxd.Lazy())


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_materialise_batch_size(bad):
    with pytest.raises(ValueError, match="`batch_size`"):
        lxd.Materialise(batch_size=bad)


def test_mv_shape_mismatch_shows_both_structures():
    op = lxd.MatrixLinearOperator(jnp.eye(3, dtype=jnp.float32))
    with pytest.raises(
        ValueError, match=r"`vector`.*expected float32\[3\].*got float32\[4\]"
    ):
        op.mv(jnp.ones(4, jnp.float32))
    with pytest.raises(
        ValueError, match=r"`vector`.*expected float32\[3\].*got float64\[3\]"
    ):
        jax.jit(lambda v: op.mv(v))(jnp.ones(3, jnp.float64))


def test_mv_tree_mismatch():
    struct = {"a": jax.ShapeDtypeStruct((2,), jnp.float32)}
    op = lxd.IdentityLinearOperator(struct)
    with pytest.raises(ValueError, match=r"expected \{'a': 'float32\[2\]'\}"):
        op.mv([jnp.ones(2, jnp.float32)])


def test_mv_not_an_array():
    op = lxd.MatrixLinearOperator(jnp.eye(2))
    with pytest.raises(ValueError, match="`vector`"):
        op.mv("hello")


def _sharded(axis_type):
    mesh = jax.make_mesh((1,), ("b",), axis_types=(axis_type,))
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.device_put(jnp.arange(3.0, dtype=jnp.float32), sharding)


@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.Outline(), lxd.Materialise()])
def test_sharding_annotation_alone_is_not_a_mismatch(policy):
    # An explicit-axes sharding is part of the vector's type: our check ignores it.
    x = _sharded(AxisType.Explicit)
    assert jax.eval_shape(lambda: x).sharding is not None
    op = lxd.MatrixLinearOperator(2 * jnp.eye(3, dtype=jnp.float32), policy=policy)
    assert jnp.allclose(op.mv(x), 2 * x)
    assert jnp.allclose(jax.jit(lambda v: op.mv(v))(x), 2 * x)
    # Function operators are closure-converted by equinox, which itself compares
    # shardings; with automatic axes they work under every policy.
    x = _sharded(AxisType.Auto)
    fn_op = lxd.FunctionLinearOperator(
        lambda v: 2 * v, jax.ShapeDtypeStruct((3,), jnp.float32), policy=policy
    )
    assert jnp.allclose(fn_op.mv(x), 2 * x)
    assert jnp.allclose(jax.jit(lambda v: fn_op.mv(v))(x), 2 * x)


def test_scalar_multiplication_needs_a_scalar():
    op = lxd.MatrixLinearOperator(jnp.eye(2))
    with pytest.raises(ValueError, match="scalars"):
        op * jnp.ones(2)


@pytest.mark.parametrize("bad", [lxd.CG, lx.Cholesky, 1e-6, None])
def test_normal_needs_a_solver(bad):
    hint = r".*instantiate it" if isinstance(bad, type) else ""
    with pytest.raises(
        TypeError,
        match=rf"`Normal\(inner_solver=\.\.\.\)`.*AbstractLinearSolver.*got.*{hint}",
    ):
        lxd.Normal(bad)


def test_normal_lsmr_takes_no_preconditioner():
    op = lxd.MatrixLinearOperator(jnp.eye(3, 2))
    options = {"preconditioner": lx.IdentityLinearOperator(op.out_structure())}
    with pytest.raises(ValueError, match=r"Normal\(LSMR.*options\['preconditioner'\]"):
        lx.linear_solve(
            op, jnp.ones(3), lxd.Normal(lxd.LSMR(1e-6, 1e-6)), options=options
        )


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "2"])
def test_dense_matrix_batch_size(bad):
    op = lxd.FunctionLinearOperator(jnp.cumsum, jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(ValueError, match=r"dense_matrix\(batch_size=...\)"):
        lxd.dense_matrix(op, batch_size=bad)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(static_argnums=5), "static_argnums"),
        (dict(static_argnums=-3), "static_argnums"),
        (dict(static_argnames="zz"), "argnames"),
    ],
)
def test_jit_static_arguments_the_function_does_not_take(kwargs, message):
    """Raised when `lxd.jit` is made, as `jax.jit` raises."""
    with pytest.raises(ValueError, match=message):
        lxd.jit(lambda a, b: a, **kwargs)
    assert lxd.jit(lambda a, b: a, static_argnums=1)(1.0, 2.0) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(static_argnums="a"),
        dict(static_argnums=1.5),
        dict(static_argnums=True),
        dict(static_argnums=[0, "b"]),
        dict(static_argnames=3),
        dict(static_argnames=["b", 1]),
    ],
)
def test_jit_static_arguments_of_the_wrong_type(kwargs):
    """A `TypeError` naming the argument and what it must be (`jax.jit` says
    "'str' object cannot be interpreted as an integer")."""
    (name,) = kwargs
    with pytest.raises(TypeError, match=rf"lxd.jit\({name}=...\)` must be"):
        lxd.jit(lambda a, b: a, **kwargs)
    for good in (dict(static_argnums=(1,)), dict(static_argnums=np.int64(1))):
        assert lxd.jit(lambda a, b: a, **good)(1.0, 2.0) == 1.0
    assert lxd.jit(lambda a, b: a, static_argnames=("b",))(1.0, b=2.0) == 1.0


def test_decide_arguments():
    observation = lxd.observe(
        lxd.MatrixLinearOperator(jnp.eye(2)), memory_budget=2**20, with_cost=False
    )
    with pytest.raises(TypeError, match="`o` of `decide`"):
        lxd.decide(3)
    with pytest.raises(TypeError, match="`model` of `decide`"):
        lxd.decide(observation, model={"flops_per_second": 1.0})
    assert lxd.decide(observation).strategy == "Lazy"


def test_outline_refuses_a_vector_sharded_over_an_explicit_axis():
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    rows = NamedSharding(mesh, PartitionSpec("x"))
    structure = jax.ShapeDtypeStruct((4,), jnp.float32, sharding=rows)
    op = lxd.FunctionLinearOperator(lambda v: 2 * v, structure, policy=lxd.Outline())
    x = jax.device_put(jnp.ones(4, jnp.float32), rows)
    with jax.set_mesh(mesh):
        with pytest.raises(ValueError, match="Outline.*Explicit mesh axis.*`vector`"):
            jax.jit(lambda v: op.mv(v))(x)
        # Lazy applies it.
        lazy = lxd.with_policy(op, lxd.Lazy())
        assert jnp.allclose(jax.jit(lambda v: lazy.mv(v))(x), 2.0)
