"""What a compile race costs: the `Lazy` and `Roll` programs of realistic programs
(`benchmarks/realistic_cases.py`) compiled one after the other and side by side in
two threads, as `lxd.jit` races them (`Auto(race=...)`). Where XLA compiles in
parallel, each compile takes about as long side by side as alone, and the race's
first finisher arrives in the time of the faster compile.

How to run
----------

    python -m benchmarks.compile_race                 # six programs
    python -m benchmarks.compile_race --quick         # two programs

Results: `<out>/compile_race.json` and `.png`.
"""

import threading
import time

import jax
import jax.numpy as jnp

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.realistic_cases import operator, PROGRAMS


FULL = dict(
    programs=(
        "power_iteration",
        "rk4_stencil",
        "small_dense_sum",
        "implicit_cg",
        "arnoldi",
        "stencil_1d_steps",
    )
)
QUICK = dict(programs=("small_dense_sum", "stencil_1d_steps"))
POLICIES = {"Lazy": lxd.Lazy, "Roll": lxd.Roll}


def lowered(name: str, policy) -> tuple:
    """A fresh program's `lxd.jit(...).lower(...)` and the seconds it took."""
    fn, n, spd, program = PROGRAMS[name](1.0)
    op = operator(fn, n, policy(), spd)
    x = jax.random.normal(jax.random.key(7), (n,), jnp.float32)
    body = lambda op, x: program(op, x)
    start = time.perf_counter()
    low = lxd.jit(body).lower(op, x)
    return low, time.perf_counter() - start


def measure(name: str) -> dict:
    """Both programs compiled in turn, then fresh ones side by side."""
    alone = {}
    for policy_name, policy in POLICIES.items():
        low, _ = lowered(name, policy)
        start = time.perf_counter()
        low.compile()
        alone[policy_name] = time.perf_counter() - start
    fresh = {p: lowered(name, policy)[0] for p, policy in POLICIES.items()}
    side_by_side: dict = {}

    def compile_one(key):
        start = time.perf_counter()
        fresh[key].compile()
        side_by_side[key] = time.perf_counter() - start

    start = time.perf_counter()
    threads = [threading.Thread(target=compile_one, args=(k,)) for k in fresh]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return dict(
        alone_s=alone,
        side_by_side_s=side_by_side,
        side_by_side_wall_s=wall,
        first_finish_over_fastest_alone=min(side_by_side.values())
        / min(alone.values()),
    )


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--programs", type=harness.name_list(list(PROGRAMS)))
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    env = harness.environment()
    harness.print_setup(env, dict(programs=args.programs))
    results = {}
    for name in args.programs:
        results[name] = measure(name)
        print(name, results[name], flush=True)
    rows = [
        (
            name,
            *(f"{r['alone_s'][p]:.3f} s" for p in POLICIES),
            *(f"{r['side_by_side_s'][p]:.3f} s" for p in POLICIES),
            f"{r['first_finish_over_fastest_alone']:.2f}x",
        )
        for name, r in results.items()
    ]
    headers = (
        "program",
        *(f"{p} alone" for p in POLICIES),
        *(f"{p} side by side" for p in POLICIES),
        "first finish / fastest alone",
    )
    print(harness.table(headers, rows))
    payload = dict(environment=env, backend=jax.default_backend(), results=results)
    harness.write_results(args.out, "compile_race", payload, _plot(results))


def _plot(results: dict):
    def draw(path):
        plt = harness.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = list(results)
        ax.bar(names, [r["first_finish_over_fastest_alone"] for r in results.values()])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("first finish side by side / fastest alone")
        ax.set_title(f"compile race, {harness.jax_label()}")
        ax.tick_params(axis="x", labelrotation=20)
        harness.save(fig, path)

    return draw


if __name__ == "__main__":
    main()
