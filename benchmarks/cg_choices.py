"""CG's layout and residual update, each pair forced, against lineax's CG and
against what `layout="auto"` / `residual_update="auto"` take on this backend: one
solve of the families' 2-D stencil (`benchmarks/families_cases.py`, float32,
rtol = atol = 1e-5, 200 steps at most) under `jax.jit`, its lowering, its compile
and its steady run, measured in the same process.

The pairs: the one-site loop or the inline layout (`mv` where lineax's CG writes
it, the refresh and check in a `lax.cond` of the step), each with the residual
update as one expression (`"select"`) or in a `lax.cond` reading `A p` as
computed (`"cond"`). `"auto"` weighs them with the cost model on the CPU, and
takes one site and one expression elsewhere (`solvers/cg/_layout_choice.py`).
Reported per size: each variant's lowering and compile (the least of `--rounds`
fresh programs, interleaved) and run (the least of ten calls of each), and its
compile and run over lineax's.

How to run
----------

    python -m benchmarks.cg_choices                # n = 4096 and 16384, 3 rounds
    python -m benchmarks.cg_choices --quick        # n = 4096, 1 round

Results: `<out>/cg_choices.json` and `.png`.
"""

import time

import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import families_cases as fc, harness


FULL = dict(sizes=(4096, 16384), rounds=3)
QUICK = dict(sizes=(4096,), rounds=1)
VARIANTS = {
    "lineax": None,
    "auto": {},
    "one_site, select": dict(layout="one_site", residual_update="select"),
    "one_site, cond": dict(layout="one_site", residual_update="cond"),
    "inline, select": dict(layout="inline", residual_update="select"),
    "inline, cond": dict(layout="inline", residual_update="cond"),
}
CALLS = 10


def program(n: int, arrays: tuple, settings: dict | None):
    """A fresh `jax.jit` program of one stencil solve: lineax's CG where
    `settings` is `None`, else ours (`Lazy`: `mv` inline as lineax's) with them."""
    policy = None if settings is None else lxd.Lazy()
    op, solver = fc.make_operator("stencil", arrays, n, policy)
    if settings is not None:
        solver = lxd.CG(rtol=fc.RTOL, atol=fc.ATOL, max_steps=fc.MAX_STEPS, **settings)
    return jax.jit(lambda x: lx.linear_solve(op, x, solver, throw=False).value)


def measure(n: int, rounds: int) -> dict:
    """Every variant at `n`: the least lowering, compile and run over the rounds."""
    arrays = fc.family_arrays("stencil", n)
    x = jax.random.normal(jax.random.key(harness.SEED), (n,), jnp.float32)
    found: dict = {v: dict(lower_s=[], compile_s=[], run_s=[]) for v in VARIANTS}
    for _ in range(rounds):
        for name, settings in VARIANTS.items():
            f = program(n, arrays, settings)
            harness.fresh_heap()
            lowered, lower_s = harness.timed(lambda: f.lower(x))
            compiled, compile_s = harness.timed(lowered.compile)
            jax.block_until_ready(compiled(x))
            run_s = min(harness.call_times(lambda: compiled(x), CALLS))
            for key, value in (("lower_s", lower_s), ("compile_s", compile_s)):
                found[name][key].append(value)
            found[name]["run_s"].append(run_s)
    out = {name: {k: min(v) for k, v in d.items()} for name, d in found.items()}
    op, solver = fc.make_operator("stencil", arrays, n, lxd.Lazy())
    layout, update = solver.init(op, {})[2].value[:2]
    out["auto"]["took"] = f"{layout}, {update}"
    base = out["lineax"]
    for d in out.values():
        d["compile_over_lineax"] = d["compile_s"] / base["compile_s"]
        d["run_over_lineax"] = d["run_s"] / base["run_s"]
    return out


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--sizes", type=harness.int_list, help="unknowns")
    parser.add_argument("--rounds", type=int, help="fresh programs per variant")
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    env = harness.environment(load_average=True)
    harness.print_setup(env, dict(sizes=args.sizes, rounds=args.rounds))
    start = time.perf_counter()
    results = {str(n): measure(n, args.rounds) for n in args.sizes}
    rows = [
        (
            f"n={n}",
            name if name != "auto" else f"auto ({d['took']})",
            f"{d['lower_s']:.3f} s",
            f"{d['compile_s']:.3f} s ({d['compile_over_lineax']:.2f}x)",
            f"{d['run_s'] * 1e3:.3f} ms ({d['run_over_lineax']:.2f}x)",
        )
        for n, by_variant in results.items()
        for name, d in by_variant.items()
    ]
    print(harness.table(("size", "variant", "lower", "compile", "run"), rows))
    payload = dict(
        environment=env,
        config=dict(sizes=list(args.sizes), rounds=args.rounds, calls=CALLS),
        results=results,
        total_seconds=time.perf_counter() - start,
    )
    harness.write_results(args.out, "cg_choices", payload, _plot(results))


def _plot(results: dict):
    def draw(path):
        plt = harness.pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        names = list(VARIANTS)
        width = 0.8 / max(len(results), 1)
        for i, (n, by_variant) in enumerate(results.items()):
            xs = [j + i * width for j in range(len(names))]
            for ax, key in zip(axes, ("compile_over_lineax", "run_over_lineax")):
                ax.bar(xs, [by_variant[v][key] for v in names], width, label=f"n={n}")
        for ax, title in zip(axes, ("compile / lineax's", "run / lineax's")):
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xticks([j + width / 2 for j in range(len(names))], names)
            ax.tick_params(axis="x", labelrotation=30, labelsize=7)
            ax.set_title(title, fontsize=9)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"CG's layout and update, {harness.jax_label()}", fontsize=9)
        fig.tight_layout()
        harness.save(fig, path)

    return draw


if __name__ == "__main__":
    main()
