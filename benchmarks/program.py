"""Program-level dispatch: compile and run time of k call sites of an expensive
operator under `lxd.jit` with the `Roll` policy (dependent sites rolled into one
loop body, independent ones stacked into one call) and with `Auto` (deciding from
the traced program) against plain lineax under `jax.jit`, measured in the same
process; a reused `jax.jit` function; and eager `mv`.

What is measured
----------------

The operator is the dense-layer chain of `harness` (`L` layers `n x n`,
float32) as a `FunctionLinearOperator` over an `eqx.Partial` holding the weights
(`closure_convert=False`, so the weights are the operator's arrays). The program
takes the operator and the inputs as arguments (`lxd.jit` reads them as
`equinox.filter_jit` does; plain lineax runs under `equinox.filter_jit`) and is,
for k call sites,

- independent: `sum(op.mv(xs[i]) for i in range(k))`;
- dependent: `x = op.mv(x); x = x * (c_i / |x|)` k times (each call fed the
  previous output, `c_i` a per-site literal).

For each (case, pattern, k, variant) a fresh operator is built (a new function
object, so no cache carries over), and the time of lowering (the trace and, for
`lxd.jit`, the rewrite), compiling and the first call are measured; "compile
total" = lower + compile + (first call - run), "run" the median of further calls,
"run per mv" = run / k. Each is measured `--repeats` times: the repeat with the
median compile total is kept, with the median run over all repeats. The repeats
are interleaved (each round measures every variant at every k once), so that a
slow spell of the machine falls on all of them rather than on whichever ran
during it. Ratios: against the same variant at k=1 (the targets: 16 sites within
1.15x of 1 site; the median of each round's own ratio, the k=16 program over the
k=1 one measured just before it, as the repeats' compile totals of one program
spread by 10-20% on a 2-core machine; the ratio of the medians is kept too) and
against plain lineax at the same k (run per mv within 1.10x of inline). The
programs that compile in under a second are measured in `--small-repeats` rounds
(15), plain lineax's unrolled k=16 programs (seconds each) in `--repeats` (5).

The same programs written by hand as a user would roll them (plain lineax under
`jax.jit`: a `lax.fori_loop` over the dependent sites, one `vmap`ped call for the
independent ones) are measured alongside: the floor of a rewrite, XLA's own cost
of the loop (on XLA:CPU each scalar op of the loop, its counter's increment and
its condition, is a kernel of its own, compiled apart). Ours are also reported
against it at the same k.

Eager `mv`: the second and later calls of `op.mv(v)` outside any trace, for plain
lineax (op-by-op dispatch) and for operators of ours under `Lazy` and `Auto` (one
compiled `mv`, compiled once per operator kind and signature), against a jitted
`mv` (targets: within 1.5x of the jitted `mv`, and 10x faster than lineax at 24
layers n=256). The variants' later calls are interleaved (21 rounds, each calling
every variant once) and their median kept.

How to run
----------

    python -m benchmarks.program            # (1024, 32) and (256, 24)
    python -m benchmarks.program --quick    # (128, 8), k = 1, 4
    python -m benchmarks.program --cases 1024x32 --repeats 2 --small-repeats 3

Results: `benchmarks/results/program.json` and `benchmarks/results/program.png`.
"""

import statistics
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.harness import timed
from benchmarks.program_report import plot, report


FULL = dict(cases=[(1024, 32), (256, 24)], ks=[1, 16])
QUICK = dict(cases=[(128, 8)], ks=[1, 4], repeats=1, small_repeats=1)


# ------------------------------------------------------------------ cases


def _operator(weights, scales, n: int, policy, closure_convert: bool = False):
    """The chain as a fresh operator: plain lineax for policy None, else ours
    (`closure_convert=True`, lineax's default, only for plain lineax)."""
    fn = eqx.Partial(lambda w, s, x: harness.apply_chain(w, s, x), weights, scales)
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    if policy is None:
        return lx.FunctionLinearOperator(fn, structure, closure_convert=closure_convert)
    return lxd.FunctionLinearOperator(
        fn, structure, closure_convert=False, policy=policy
    )


def independent(op, xs):
    """`k` independent call sites."""
    return sum(op.mv(xs[i]) for i in range(xs.shape[0]))


def dependent(op, xs):
    """`k` call sites, each fed the previous output."""
    x = xs[0]
    for i in range(xs.shape[0]):
        x = op.mv(x)
        x = x * ((1.0 + 0.01 * i) / jnp.sqrt(jnp.vdot(x, x)))
    return x


def independent_by_hand(op, xs):
    """`independent` as a user would write it by hand: one `vmap`ped call."""
    return jnp.sum(jax.vmap(op.mv)(xs), axis=0)


def dependent_by_hand(op, xs, unroll: int = 1):
    """`dependent` as a user would write it by hand: a `lax.fori_loop` (its body
    repeated `unroll` times)."""

    def step(i, x):
        x = op.mv(x)
        return x * ((1.0 + 0.01 * i) / jnp.sqrt(jnp.vdot(x, x)))

    return jax.lax.fori_loop(0, xs.shape[0], step, xs[0], unroll=unroll)


PATTERNS = {"independent": independent, "dependent": dependent}
BY_HAND = {"independent": independent_by_hand, "dependent": dependent_by_hand}
# Plain lineax under `jax.jit`: the program as written, and rewritten by hand (the
# floor a rewrite can reach: XLA's own cost of the loop); then ours, under `lxd.jit`.
HAND = "by hand (lineax)"
VARIANTS = {
    "lineax": None,
    HAND: None,
    "lxd.jit + Roll": lxd.Roll(),
    "lxd.jit + Auto": lxd.Auto(),
}
OURS = [v for v in VARIANTS if VARIANTS[v] is not None]


# ------------------------------------------------------------------ measure


def time_lowered(lower: Callable, caller: Callable) -> tuple[dict, object]:
    """Times `lower()` (the trace, and for `lxd.jit` the rewrite), the compile of
    what it returns and the first call of `caller(compiled)`, then the median of
    5 further calls; "compile total" = lower + compile + (first call - run)."""
    lowered, lower_s = timed(lower)
    compiled, compile_s = timed(lowered.compile)
    call = caller(compiled)
    out, first_s = timed(lambda: jax.block_until_ready(call()))
    run_s = harness.median_call_time(call, 5)
    return dict(
        lower_s=lower_s,
        compile_s=compile_s,
        first_call_s=first_s,
        compile_total_s=lower_s + compile_s + max(first_s - run_s, 0.0),
        run_s=run_s,
    ), out


def measure(variant: str, pattern: str, layers, n: int, k: int):
    """One (pattern, variant, k) with a fresh operator."""
    weights, scales = layers
    op = _operator(weights, scales, n, VARIANTS[variant])
    xs = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
    program = (BY_HAND if variant == HAND else PATTERNS)[pattern]
    plain = VARIANTS[variant] is None
    jitted = (eqx.filter_jit if plain else lxd.jit)(program)
    # Both compiled wrappers are called with the arguments they were lowered with.
    timings, out = time_lowered(
        lambda: jitted.lower(op, xs), lambda compiled: lambda: compiled(op, xs)
    )
    return dict(timings, run_per_mv_s=timings["run_s"] / k), np.asarray(out)


def eager(layers, n: int, rounds: int = 21) -> dict:
    """The first call of `op.mv` outside any trace for each variant (plain lineax
    as the other variants are built, with `closure_convert=False`; plain lineax
    built with its defaults, whose eager `mv` evaluates the closure-converted
    function's jaxpr one operation at a time; ours under `Lazy` and `Auto`), then
    `rounds` later calls of each and of a jitted `mv`, interleaved (each round
    calls every variant once, so that a slow spell of the machine falls on all of
    them): the median of the later calls."""
    weights, scales = layers
    v = jnp.ones(n, jnp.float32)
    calls = {}
    out: dict = {}
    for variant, policy, convert in (
        ("lineax", None, False),
        ("lineax default", None, True),
        ("lxd Lazy", lxd.Lazy(), False),
        ("lxd Auto", lxd.Auto(), False),
    ):
        op = _operator(weights, scales, n, policy, convert)
        calls[variant] = lambda op=op: op.mv(v)
        out[variant] = dict(first_s=harness.call_times(calls[variant], 1)[0])
    jitted = eqx.filter_jit(lambda o, v: o.mv(v))
    op = _operator(weights, scales, n, None)
    jax.block_until_ready(jitted(op, v))
    calls["jitted mv"] = lambda: jitted(op, v)
    out["jitted mv"] = {}
    later: dict = {variant: [] for variant in calls}
    for _ in range(rounds):
        for variant, call in calls.items():
            later[variant] += harness.call_times(call, 1)
    for variant, times in later.items():
        out[variant]["later_s"] = statistics.median(times)
    return out


def nested(ks, repeats: int) -> dict:
    """A `jax.jit` function reused at k sites (JAX's known case:
    `jit(lambda x: sum(i * x for i in range(256)))`), under `jax.jit` and
    `lxd.jit`."""
    variants = ("jax.jit", "lxd.jit")
    trials: dict = {(variant, k): [] for variant in variants for k in ks}
    for _ in range(repeats):
        for variant, k in trials:
            # A new inner function each time: nothing cached carries over.
            inner = jax.jit(lambda x: sum(i * x for i in range(256)))

            def program(x, inner=inner, k=k):
                return sum(inner(x + j) for j in range(k))

            x = jnp.ones(64, jnp.float32)
            jitted = (jax.jit if variant == "jax.jit" else lxd.jit)(program)
            timings, _ = time_lowered(
                lambda: jitted.lower(x), lambda compiled: lambda: compiled(x)
            )
            keep = ("compile_total_s", "run_s")
            trials[variant, k].append(({key: timings[key] for key in keep}, None))
    rows = {}
    for (variant, k), found in trials.items():
        timings, _ = harness.median_trial(found, "compile_total_s")
        timings["all_compile_totals_s"] = [t["compile_total_s"] for t, _ in found]
        rows[f"{variant} k={k}"] = timings
        print("nested jit", variant, k, timings, flush=True)
    for variant in variants:
        base = rows[f"{variant} k={ks[0]}"]["compile_total_s"]
        for k in ks:
            rows[f"{variant} k={k}"]["compile_vs_k1"] = (
                rows[f"{variant} k={k}"]["compile_total_s"] / base
            )
    return rows


def paired_ratios(found: list, base: list) -> list[float]:
    """Per round, the compile total of `found` over that of `base` (the same
    variant at the first k, measured just before it in the same round)."""
    return [
        t["compile_total_s"] / b["compile_total_s"]
        for (t, _), (b, _) in zip(found, base)
    ]


def run(cases, ks, repeats: int, small_repeats: int) -> dict:
    """The nested-jit case, then per (n, layers) eager `mv` and both patterns.
    Each round measures every (variant, k) once; plain lineax's unrolled
    programs beyond the first k (seconds each) are left out of the rounds after
    `repeats`, the others measured in `small_repeats` rounds."""
    results = {"nested jit": nested(ks, repeats)}
    for n, depth in cases:
        layers = harness.chain_layers(n, depth)
        case = f"{depth} layers, n={n}"
        results[case] = {"eager": eager(layers, n)}
        for pattern in PATTERNS:
            trials: dict = {(v, k): [] for v in VARIANTS for k in ks}
            for round_ in range(max(repeats, small_repeats)):
                for variant, k in trials:
                    if round_ >= repeats and variant == "lineax" and k != ks[0]:
                        continue
                    trials[variant, k].append(measure(variant, pattern, layers, n, k))
            rows = {}
            for (variant, k), found in trials.items():
                timings, out = harness.median_trial(found, "compile_total_s")
                timings["all_compile_totals_s"] = [
                    t["compile_total_s"] for t, _ in found
                ]
                # Run time: the median over every repeat (not only the one kept).
                timings["run_s"] = statistics.median(t["run_s"] for t, _ in found)
                timings["run_per_mv_s"] = timings["run_s"] / k
                rows[f"{variant} k={k}"] = timings
                rows[f"{variant} k={k}"]["out"] = out
                print(
                    case,
                    pattern,
                    variant,
                    k,
                    {
                        a: round(b, 4)
                        for a, b in timings.items()
                        if isinstance(b, float)
                    },
                    flush=True,
                )
            for k in ks:
                theirs = rows[f"lineax k={k}"]
                reference = theirs.pop("out")
                by_hand = rows[f"{HAND} k={k}"]
                by_hand["max_abs_difference_vs_lineax"] = float(
                    np.max(np.abs(by_hand.pop("out") - reference))
                )
                for variant in OURS:
                    ours = rows[f"{variant} k={k}"]
                    ours["max_abs_difference_vs_lineax"] = float(
                        np.max(np.abs(ours.pop("out") - reference))
                    )
                    ours["compile_vs_lineax"] = (
                        ours["compile_total_s"] / theirs["compile_total_s"]
                    )
                    ours["compile_vs_by_hand"] = (
                        ours["compile_total_s"] / by_hand["compile_total_s"]
                    )
                    ours["run_per_mv_vs_lineax"] = (
                        ours["run_per_mv_s"] / theirs["run_per_mv_s"]
                    )
                for variant in VARIANTS:
                    row = rows[f"{variant} k={k}"]
                    base = rows[f"{variant} k={ks[0]}"]["compile_total_s"]
                    row["compile_median_vs_k1"] = row["compile_total_s"] / base
                    # The target's figure: the median of the rounds' own ratios
                    # (a slow spell of the machine falls on both of a round's).
                    ratios = paired_ratios(trials[variant, k], trials[variant, ks[0]])
                    row["compile_vs_k1_by_round"] = ratios
                    row["compile_vs_k1"] = statistics.median(ratios)
            results[case][pattern] = rows
    return results


# ------------------------------------------------------------------ main


def _cases(text: str) -> list[tuple[int, int]]:
    """`"1024x32,256x24"` as `[(1024, 32), (256, 24)]`."""
    return [
        (int(n), int(layers))
        for n, layers in (c.strip().split("x") for c in text.split(","))
    ]


def main(argv=None) -> None:
    """Measure, print the report, write `program.json` and `program.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--small-repeats",
        type=int,
        default=15,
        help="rounds of the programs that compile in under a second",
    )
    parser.add_argument(
        "--cases",
        type=_cases,
        help="n x layers cases, e.g. 1024x32,256x24 (default: both)",
    )
    args = parser.parse_args(argv)
    settings = (
        QUICK
        if args.quick
        else dict(FULL, repeats=args.repeats, small_repeats=args.small_repeats)
    )
    cases, ks, repeats = settings["cases"], settings["ks"], settings["repeats"]
    cases = args.cases or cases
    env = harness.environment(load_average=True)
    results = run(cases, ks, repeats, settings["small_repeats"])
    report(results, ks, PATTERNS)
    payload = dict(
        environment=env, cases=[list(c) for c in cases], ks=ks, results=results
    )
    harness.write_results(
        args.out, "program", payload, lambda p: plot(results, ks, VARIANTS, p)
    )


if __name__ == "__main__":
    main()
