"""What one reduction of a vector costs XLA:CPU to compile, by its form and the
vector's length, in plain JAX: the facts behind `lineax_dispatch/_reductions.py`
(which form every solver and preconditioner uses for its finiteness test and
its extremes).

Forms, each the whole program `f(x)` of a float32 vector `x`:

- `elementwise`: `2 x + 1` (no reduction: the base of the ratios);
- `sum`: `sum x`; `max`: `max x`; `dot`: `x . x`;
- `dot, padded`: `x . x` with `x` padded with zeros to 4,096 entries (as
  `_flat_vectors.dot` pads a solver's inner products from 1,024 entries);
- `finite as a sum`: `isfinite(sum(x * 0))` (`_reductions.all_finite`);
- `finite as booleans`: `all(isfinite(x))` (lineax's test of a solution);
- `max and min`: both in one `lax.reduce` with two outputs
  (`_reductions.largest_and_smallest`).

Each round compiles every form at every length once, a fresh program each
(lowered, then `.compile()` timed), in turn. Reported per form and length: the
median compile time, its median ratio to `elementwise` at that length in the same
round, whether XLA:CPU made the reduction a library kernel (a `__ynn_fusion`
in the optimised HLO), and, for `max`, whether a NaN in `x` comes out as NaN
(XLA's `max` propagates it; the library kernel of jax 0.10.2 drops it). For
`dot` and `dot, padded`, also the run time of one product (`run_us`: a
`fori_loop` of 2,000 of them, compiled once, timed once, per product).

How to run
----------

    python -m benchmarks.reduction_compile            # 4 lengths, 15 rounds
    python -m benchmarks.reduction_compile --quick    # 2 lengths, 3 rounds

Results: `benchmarks/results/reduction_compile.json` and `.png`.
"""

import statistics
import time

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from . import harness


FULL = dict(lengths=(256, 1024, 2048, 4096, 16384), rounds=15)
QUICK = dict(lengths=(1024, 4096), rounds=3)
LIBRARY = 4096


def _max_and_min(a, b):
    return lax.max(a[0], b[0]), lax.min(a[1], b[1])


FORMS = {
    "elementwise": lambda x: 2 * x + 1,
    "sum": jnp.sum,
    "max": jnp.max,
    "dot": lambda x: jnp.dot(x, x),
    "dot, padded": lambda x: jnp.dot(_padded(x), _padded(x)),
    "finite as a sum": lambda x: jnp.isfinite(jnp.sum(x * 0)),
    "finite as booleans": lambda x: jnp.all(jnp.isfinite(x)),
    "max and min": lambda x: lax.reduce((x, x), (-np.inf, np.inf), _max_and_min, (0,)),
}


def _padded(x):
    return jnp.pad(x, (0, max(LIBRARY - x.shape[0], 0)))


def _run_us(form: str, x) -> float:
    """Microseconds per product of `form` in a loop of 2,000 of them."""
    count = 2000

    def body(i, carry):
        v, total = carry
        return v * 0.999 + 1e-3, total + FORMS[form](v)

    loop = jax.jit(lambda v: lax.fori_loop(0, count, body, (v, jnp.zeros((), v.dtype))))
    jax.block_until_ready(loop(x))
    start = time.perf_counter()
    jax.block_until_ready(loop(x))
    return 1e6 * (time.perf_counter() - start) / count


def _compile_s(form: str, x) -> float:
    lowered = jax.jit(lambda v: FORMS[form](v)).lower(x)
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def _facts(form: str, n: int) -> dict:
    """Whether `form` at length `n` is a library kernel; for `max`, whether a
    NaN among the entries comes out."""
    x = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    text = jax.jit(FORMS[form]).lower(x).compile().as_text()
    facts = dict(library=form != "elementwise" and "__ynn_fusion" in text)
    if form == "max":
        found = jax.jit(jnp.max)(x.at[n // 2].set(jnp.nan))
        facts["keeps_nan"] = bool(jnp.isnan(found))
    if form.startswith("dot"):
        facts["run_us"] = _run_us(form, x)
    return facts


def measure(lengths, rounds: int) -> dict:
    vectors = {n: jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32) for n in lengths}
    times = {(f, n): [] for f in FORMS for n in lengths}
    for key in times:  # JAX's own first-use costs
        _compile_s(key[0], vectors[key[1]])
    for round_ in range(rounds):
        order = list(times)[:: -1 if round_ % 2 else 1]
        for form, n in order:
            times[form, n].append(_compile_s(form, vectors[n]))
    results = {}
    for n in lengths:
        base = times["elementwise", n]
        results[n] = {
            form: dict(
                compile_s=statistics.median(times[form, n]),
                over_elementwise=statistics.median(
                    t / b for t, b in zip(times[form, n], base)
                ),
                **_facts(form, n),
            )
            for form in FORMS
        }
    return results


def plot(results: dict, path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    lengths = list(results)
    for form in FORMS:
        ax.plot(
            lengths,
            [1e3 * results[n][form]["compile_s"] for n in lengths],
            marker="o",
            label=form,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("length of the vector")
    ax.set_ylabel("compile, ms (median)")
    ax.legend(fontsize=7)
    fig.suptitle(
        f"One reduction's compile on XLA:CPU; {harness.jax_label()}", fontsize=9
    )
    harness.save(fig, path)


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    env = harness.environment(load_average=True)
    results = measure(settings["lengths"], settings["rounds"])
    rows = []
    for n, forms in results.items():
        for form, r in forms.items():
            nan = {True: "kept", False: "dropped"}.get(r.get("keeps_nan"), "")
            rows.append(
                [
                    str(n),
                    form,
                    f"{1e3 * r['compile_s']:.1f} ms",
                    f"{r['over_elementwise']:.2f}",
                    "yes" if r["library"] else "",
                    nan,
                    f"{r['run_us']:.2f} us" if "run_us" in r else "",
                ]
            )
    header = ["length", "form", "compile", "x elementwise", "library", "NaN", "run"]
    print(harness.table(header, rows))
    payload = dict(environment=env, settings=settings, results=results)
    harness.write_results(
        args.out, "reduction_compile", payload, lambda p: plot(results, p)
    )


if __name__ == "__main__":
    main()
