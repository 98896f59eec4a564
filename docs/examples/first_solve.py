import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd


n = 256
keys = jax.random.split(jax.random.key(0), 8)
weights = [jnp.eye(n) + 0.1 * jax.random.normal(k, (n, n)) / n**0.5 for k in keys]


def chain(x):  # B x: eight dense layers
    for w in weights:
        x = w @ x
    return x


def normal_map(x):  # B^T B x + 0.1 x: symmetric positive definite, matrix-free
    return jax.linear_transpose(chain, x)(chain(x))[0] + 0.1 * x


structure = jax.ShapeDtypeStruct((n,), jnp.float32)
op = lxd.FunctionLinearOperator(normal_map, structure, lx.positive_semidefinite_tag)
cg = lxd.CG(rtol=1e-5, atol=1e-5)
solve = lxd.jit(lambda op, b: lx.linear_solve(op, b, cg).value)

b = jnp.ones(n)
x = solve(op, b)  # traced once, decided on the traced program, compiled, run
print(lxd.explain(solve, op, b))  # each decision and its reasons
