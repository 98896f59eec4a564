"""Solves across two processes (`jax.distributed` on 127.0.0.1, CPU collectives
over gloo, 4 host devices each): CG, GMRES, `batch_solve` and `lxd.jit` + Auto on
a row-sharded operator (a matrix, and a matrix-free one holding the matrix in a
closure cell), on meshes with Explicit and with Auto axes (on the Explicit one also
with no mesh set), equal the one-process solve on every process."""

import os
import socket
import subprocess
import sys


_WORKER = r"""
import os, sys
pid, port = int(sys.argv[1]), sys.argv[2]
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid, initialization_timeout=60)
import jax.numpy as jnp, lineax as lx, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils
import lineax_dispatch as lxd
jax.config.update("jax_enable_x64", True)
assert jax.device_count() == 8 and jax.local_device_count() == 4
rng = np.random.default_rng(0)
n = 64
m = rng.standard_normal((n, n)); a_np = m @ m.T / n + np.eye(n); b_np = rng.standard_normal(n)
bs_np = rng.standard_normal((5, n))
tag = lx.positive_semidefinite_tag
out = {}
for kind in (AxisType.Explicit, AxisType.Auto):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(kind,))
  put = lambda x, spec: jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])
  a, b = put(a_np, P("x")), put(b_np, P("x"))
  bs = put(bs_np, P())
  with jax.set_mesh(mesh):
    for name, solver in (("CG", lxd.CG(1e-10, 1e-10)), ("GMRES", lxd.GMRES(1e-10, 1e-10))):
        f = jax.jit(lambda a, b: lx.linear_solve(lxd.MatrixLinearOperator(a, tag), b, solver, throw=False).value)
        out[kind, name] = f(a, b)
    g = lxd.jit(lambda a, b: lx.linear_solve(lxd.MatrixLinearOperator(a, tag, policy=lxd.Auto()), b, lxd.CG(1e-10, 1e-10), throw=False).value)
    out[kind, "lxd.jit + Auto"] = g(a, b)
    h = jax.jit(lambda a, bs: lxd.batch_solve(lxd.MatrixLinearOperator(a, tag), bs, lxd.CG(1e-10, 1e-10)).value)
    out[kind, "batch_solve"] = h(a, bs)
for k, v in out.items():
    full = multihost_utils.process_allgather(v, tiled=True)
    exp = np.linalg.solve(a_np, b_np) if k[1] != "batch_solve" else np.linalg.solve(a_np, bs_np.T).T
    err = np.abs(np.asarray(full) - exp).max()
    print(pid, k, "err", err, flush=True)
    assert err < 1e-8, (k, err)
# `lxd.jit` + Auto + CG with 128 unknowns (16 a device, 64 a process), one
# `lxd.jit` function for both meshes, on a matrix operator and on a matrix-free one
# holding the matrix in a closure cell, against the one-process solve (the same
# solver on one local device).
n = 128
m = rng.standard_normal((n, n)); a_np = m @ m.T / n + np.eye(n); b_np = rng.standard_normal(n)
cg = lxd.CG(1e-10, 1e-10)
one = jax.local_devices()[0]
single = jax.jit(lambda a, b: lx.linear_solve(lxd.MatrixLinearOperator(a, tag), b, cg).value)
exp = np.asarray(single(jax.device_put(a_np, one), jax.device_put(b_np, one)))
assert np.abs(exp - np.linalg.solve(a_np, b_np)).max() < 1e-8
def solve(a, b, operator):
  if operator == "matrix":
    op = lxd.MatrixLinearOperator(a, tag, policy=lxd.Auto())
  else:
    typed = jax.typeof(b).sharding  # P("x") on Explicit axes, P(None) on Auto ones
    rows = typed if any(typed.spec) else None
    structure = jax.ShapeDtypeStruct(b.shape, b.dtype, sharding=rows)
    op = lxd.FunctionLinearOperator(lambda y: a @ y, structure, tag, policy=lxd.Auto())
  return lx.linear_solve(op, b, cg, throw=False).value
g = lxd.jit(solve, static_argnums=2)
done = 0
for kind in (AxisType.Explicit, AxisType.Auto):
  mesh = jax.make_mesh((8,), ("x",), axis_types=(kind,))
  put = lambda x, spec: jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])
  a, b = put(a_np, P("x")), put(b_np, P("x"))
  with jax.set_mesh(mesh):
    for operator in ("matrix", "closure cell"):
      full = multihost_utils.process_allgather(g(a, b, operator), tiled=True)
      err = np.abs(np.asarray(full) - exp).max()
      print(pid, kind, operator, "lxd.jit + Auto, n=128, err", err, flush=True)
      assert err < 1e-10, (kind, operator, err)
      done += 1
# The same on the Explicit mesh with no mesh set (a fresh `lxd.jit` function, so
# that the program is traced there).
mesh = jax.make_mesh((8,), ("x",))
put = lambda x, spec: jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])
a, b = put(a_np, P("x")), put(b_np, P("x"))
g = lxd.jit(solve, static_argnums=2)
for operator in ("matrix", "closure cell"):
  full = multihost_utils.process_allgather(g(a, b, operator), tiled=True)
  err = np.abs(np.asarray(full) - exp).max()
  print(pid, "no mesh set", operator, "lxd.jit + Auto, n=128, err", err, flush=True)
  assert err < 1e-10, (operator, err)
  done += 1
print(pid, "OK", len(out) + done, flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_solve_as_one():
    flags = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )
    env = dict(os.environ, XLA_FLAGS=flags.strip())
    env.pop("JAX_PLATFORMS", None)
    port = str(_free_port())
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(i), port],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for w in workers:
            out, err = w.communicate(timeout=300)
            outputs.append((w.returncode, out, err))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    for i, (code, out, err) in enumerate(outputs):
        assert code == 0 and f"{i} OK 14" in out, out + err[-3000:]
