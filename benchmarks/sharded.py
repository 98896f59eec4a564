"""Solves on a row-sharded operator at 1, 2, 4 and 8 devices: per-device memory,
collectives per CG iteration and compile time, `lxd.CG` on our operator against
`lx.CG` on lineax's (Auto mesh axes, where lineax runs) and against a hand-written
sharded CG, in the same process for each device count. Speed is not reported:
forced host devices share this machine's cores.

What is measured
----------------

A dense SPD `n x n` matrix (float32) sharded by rows over a 1-D mesh (`P("x",
None)`), the right-hand side by rows (`P("x")`), solved by CG(1e-5, 1e-5) in one
`jax.jit` program. Variants:

- `lineax`: `lx.MatrixLinearOperator` and `lx.CG`, Auto axes;
- `ours`: `lxd.MatrixLinearOperator` and `lxd.CG`, Auto axes;
- `ours (Explicit)`: the same on a mesh of Explicit axes (`jax.make_mesh`'s
    default), where lineax's solvers cannot run;
- `by hand`: a plain `lax.while_loop` CG on the same arrays (Auto axes), the fewest
    collectives such a loop needs (one all-gather of the search direction for the
    matrix product, two all-reduces of the inner products).

For each: the compiled program's memory analysis per device (`temp` bytes: the
loop's vectors and workspace; `argument` bytes: the sharded matrix and vector),
the collectives in its `while` body (all-reduce, all-gather, reduce-scatter,
all-to-all, collective-permute), the compile time (lower + compile, the median of
3 fresh programs) and the relative error of the solution. Each device count runs
in a process of its own (`--xla_force_host_platform_device_count`); with
`--platform-devices` the process uses the devices it has instead (a GPU machine:
`python -m benchmarks.sharded --platform-devices --n 8192`).

How to run
----------

    python -m benchmarks.sharded            # n = 2048, 1/2/4/8 devices
    python -m benchmarks.sharded --quick    # n = 256, 1/8 devices

Results: `benchmarks/results/sharded.json` and `.png`.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time

from . import harness


FULL = dict(n=2048, devices=(1, 2, 4, 8))
QUICK = dict(n=256, devices=(1, 8))
VARIANTS = ("lineax", "ours", "ours (Explicit)", "by hand")
COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)


def _while_bodies(hlo: str) -> list[str]:
    """The text of every computation used as a `while` body or condition in
    `hlo`: what runs at each iteration."""
    names = set(re.findall(r"(?:body|condition)=%?([\w.\-]+)", hlo))
    bodies, current, name = [], [], None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
        if head and line.rstrip().endswith("{"):
            name, current = head.group(1), []
        current.append(line)
        if line.startswith("}") and name in names:
            bodies.append("\n".join(current))
    return bodies


def collectives_per_iteration(hlo: str) -> dict[str, int]:
    """Collective operations in the `while` bodies and conditions of an optimised
    HLO module (at most one loop per program here)."""
    text = "\n".join(_while_bodies(hlo))
    counts = {}
    for op in COLLECTIVES:
        found = len(re.findall(rf"\s{op}(?:-start)?\(", text))
        if found:
            counts[op] = found
    return counts


def _by_hand(a, b):
    import jax
    import jax.numpy as jnp

    def body(s):
        x, r, p, gamma, k = s
        ap = a @ p
        alpha = gamma / jnp.vdot(p, ap)
        x, r = x + alpha * p, r - alpha * ap
        new = jnp.vdot(r, r)
        return x, r, r + (new / gamma) * p, new, k + 1

    def cond(s):
        return (jnp.sqrt(s[3]) > 1e-5 * (1 + jnp.linalg.norm(b))) & (s[4] < 10 * b.size)

    x0 = jnp.zeros_like(b)
    s = jax.lax.while_loop(cond, body, (x0, b, b, jnp.vdot(b, b), 0))
    return s[0]


def worker(n: int) -> dict:
    """Every variant on this process's devices."""
    import jax
    import lineax as lx
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import lineax_dispatch as lxd

    devices = len(jax.devices())
    rng = np.random.default_rng(harness.SEED)
    m = rng.standard_normal((n, n)) / np.sqrt(n)
    a_np = (m @ m.T + np.eye(n)).astype(np.float32)
    b_np = rng.standard_normal(n).astype(np.float32)
    expected = np.linalg.solve(a_np.astype(np.float64), b_np)
    tag = lx.positive_semidefinite_tag
    out = {}
    for variant in VARIANTS:
        axis = AxisType.Explicit if "Explicit" in variant else AxisType.Auto
        mesh = jax.make_mesh((devices,), ("x",), axis_types=(axis,))
        a = jax.device_put(a_np, NamedSharding(mesh, P("x", None)))
        b = jax.device_put(b_np, NamedSharding(mesh, P("x")))
        module = lx if variant == "lineax" else lxd

        def fresh(module=module, variant=variant):
            # A new function each time: no trace or executable is reused.
            if variant == "by hand":
                return lambda a, b: _by_hand(a, b)

            def solve(a, b):
                op = module.MatrixLinearOperator(a, tag)
                return lx.linear_solve(op, b, module.CG(1e-5, 1e-5)).value

            return solve

        with jax.sharding.set_mesh(mesh):
            jax.jit(fresh()).lower(a, b).compile()  # JAX's own first-use costs
            times, compiled = [], None
            for _ in range(3):
                start = time.perf_counter()
                compiled = jax.jit(fresh()).lower(a, b).compile()
                times.append(time.perf_counter() - start)
            value = np.asarray(compiled(a, b), np.float64)
        memory = compiled.memory_analysis()
        out[variant] = dict(
            compile_s=statistics.median(times),
            temp_bytes=int(memory.temp_size_in_bytes),
            argument_bytes=int(memory.argument_size_in_bytes),
            collectives=collectives_per_iteration(compiled.as_text()),
            rel_err=float(np.linalg.norm(value - expected) / np.linalg.norm(expected)),
        )
    return dict(devices=devices, n=n, variants=out)


def run_count(n: int, devices: int, platform: bool) -> dict:
    """`worker(n)` in a fresh process with `devices` forced host devices (or the
    platform's own devices)."""
    env = dict(os.environ)
    if not platform:
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
        env["JAX_PLATFORMS"] = "cpu"
    code = f"import json; from benchmarks import sharded; print(json.dumps(sharded.worker({n})))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{devices} devices failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(rows: list[dict]) -> None:
    headers = ["devices", "variant", "temp/device", "args/device", "collectives/iter"]
    headers += ["compile", "rel err"]
    table = []
    for row in rows:
        for variant, r in row["variants"].items():
            coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items()) or "-"
            table.append(
                [
                    row["devices"],
                    variant,
                    f"{r['temp_bytes'] / 1024:.1f} KiB",
                    f"{r['argument_bytes'] / 1024:.1f} KiB",
                    coll,
                    f"{1e3 * r['compile_s']:.0f} ms",
                    f"{r['rel_err']:.1e}",
                ]
            )
    print(harness.table(headers, table))
    for row in rows:
        v = row["variants"]
        print(
            f"{row['devices']} devices: ours / lineax temp "
            f"{v['ours']['temp_bytes'] / max(v['lineax']['temp_bytes'], 1):.2f}, "
            f"compile {v['ours']['compile_s'] / v['lineax']['compile_s']:.2f}"
        )


def plot(rows: list[dict], path) -> None:
    plt = harness.pyplot()
    fig, (mem, comp) = plt.subplots(1, 2, figsize=(9, 3.6))
    counts = [row["devices"] for row in rows]
    for variant in VARIANTS:
        mem.plot(
            counts,
            [row["variants"][variant]["temp_bytes"] / 1024 for row in rows],
            marker="o",
            label=variant,
        )
        comp.plot(
            counts,
            [1e3 * row["variants"][variant]["compile_s"] for row in rows],
            marker="o",
            label=variant,
        )
    for ax in (mem, comp):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("devices")
    mem.set_yscale("log")
    mem.set_ylabel("temp bytes per device (KiB)")
    comp.set_ylabel("compile (ms)")
    mem.legend(fontsize=7)
    fig.suptitle(
        f"CG on a row-sharded matrix, n={rows[0]['n']}; {harness.jax_label()}",
        fontsize=9,
    )
    harness.save(fig, path)


def main(argv=None) -> None:
    """Measure every device count, print the report, write `sharded.json`, `.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--n", type=int, help="unknowns (default 2048)")
    parser.add_argument(
        "--platform-devices",
        action="store_true",
        help="use the platform's devices (a GPU machine) instead of forced host ones",
    )
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    if args.n is not None:
        settings["n"] = args.n
    env = harness.environment(load_average=True)
    harness.print_setup(env, settings)
    if args.platform_devices:
        rows = [run_count(settings["n"], 0, platform=True)]
    else:
        rows = [run_count(settings["n"], d, False) for d in settings["devices"]]
    report(rows)
    payload = dict(environment=env, settings=settings, rows=rows)
    harness.write_results(args.out, "sharded", payload, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
