"""Dependent call sites measured as a user meets them: the first call (trace,
compile and one run of a fresh program) and the run per `mv`, of k dependent `mv`
sites of a dense-layer chain (the weights as the operator's arrays, arguments of
the program), for `lxd.jit` with `Auto` (raced where it races), `Roll` and `Lazy`,
against plain lineax under `eqx.filter_jit` and the same program rolled by hand
(a `lax.fori_loop`, also unrolled 2, 4 and 8 times: what unrolling the loop
trades between compile and run), in one process.

For each program it also sums, from the optimised HLO of its first round, the
bytes the compiler copies into on-chip memory ahead of their use (`copy-start`
and `slice-start` into memory space `S(1)`: a TPU's; none on XLA:CPU), those in
a loop's body (copied again at every trip) apart from the others (once per run).
A program written out brings the operator's arrays in once for all its sites; a
loop brings them in again at every trip.

The programs are `benchmarks.program`'s dependent pattern: `x = op.mv(x); x = x *
(c_i / |x|)` k times. Targets (the accelerator issue's): 16 sites compile in at
most 1.3x one site, and run within 1.10x of inline per `mv`.

How to run
----------

    python -m benchmarks.dependent_sites              # n = 1024, 32 layers, 2 rounds
    python -m benchmarks.dependent_sites --quick      # n = 128, 8 layers, 1 round

Results: `<out>/dependent_sites.json` and `.png`.
"""

import math
import re
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.program import _operator, BY_HAND, PATTERNS


FULL = dict(n=1024, layers=32, rounds=2)
QUICK = dict(n=128, layers=8, rounds=1)
KS = (1, 16)
VARIANTS = {
    "lineax": None,
    "by hand (lineax)": None,
    "by hand, unroll=2": None,
    "by hand, unroll=4": None,
    "by hand, unroll=8": None,
    "lxd.jit + Auto": lxd.Auto,
    "lxd.jit + Roll": lxd.Roll,
    "lxd.jit + Lazy": lxd.Lazy,
}
RUNS = 20


_CALLED = re.compile(r"(?:body|condition|calls|to_apply)=(%[\w.\-]+)")


def _onchip_bytes(result_type: str) -> int:
    """The bytes of the arrays of an HLO result type (`(f32[1024,1024]{1,0:T(8,128)
    S(1)}, ...)`) that are in memory space `S(1)`: an element type's bits are the
    number in its name (`f32`, `bf16`, `c64`, `f8e4m3fn`), `pred` one byte."""
    total = 0
    for element, dims in re.findall(r"(\w+)\[([\d,]*)\]\{[^}]*S\(1\)\}", result_type):
        bits = 8 if element == "pred" else int(re.match(r"[a-z]+(\d+)", element)[1])
        total += max(bits // 8, 1) * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _run_per_trip(loops: set[str], called: dict[str, set[str]]) -> set[str]:
    """The computations run at every trip of a `while` loop: its bodies and
    conditions (`loops`), and whatever they call (`called`: each computation's
    callees)."""
    found, pending = set(loops), list(loops)
    while pending:
        for callee in called.get(pending.pop(), ()):
            if callee not in found:
                found.add(callee)
                pending.append(callee)
    return found


def copies_started(compiled) -> dict:
    """The bytes a compiled program copies into on-chip memory (memory space
    `S(1)`: a TPU's), from its optimised HLO (its `as_text()`; `equinox.filter_jit`'s
    compiled program holds JAX's as `compiled`): by its `copy-start`s and
    `slice-start`s run at every trip of a `while` loop (in its body or condition,
    or a computation they call) and by the others (once per run)."""
    compiled = getattr(compiled, "compiled", compiled)
    loops: set[str] = set()
    called: dict[str, set[str]] = {}
    sizes: list[tuple[str | None, int]] = []
    computation = None
    for line in compiled.as_text().splitlines():
        header = re.match(r"^(?:ENTRY )?(%[\w.\-]+) .*\{$", line)
        if header:
            computation = header.group(1)
            continue
        if " while(" in line:
            loops |= set(re.findall(r"(?:body|condition)=(%[\w.\-]+)", line))
        names = set(_CALLED.findall(line))
        for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
            names |= {b.strip() for b in branches.split(",")}
        called.setdefault(computation, set()).update(names)
        copy = re.match(r"^\s*%\S+ = (.*) (?:copy|slice)-start\(", line)
        if copy:
            sizes.append((computation, _onchip_bytes(copy.group(1))))
    per_trip = _run_per_trip(loops, called)
    counts = {"in_loops": 0, "outside": 0}
    for computation, size in sizes:
        counts["in_loops" if computation in per_trip else "outside"] += size
    return counts


def measure(variant: str, layers, n: int, k: int, count_copies: bool = False) -> dict:
    """One fresh program: its first call and the median of `RUNS` further calls;
    where `count_copies`, then the `copy-start`s of its optimised HLO (compiled
    again, after the timings)."""
    weights, scales = layers
    policy = VARIANTS[variant]
    op = _operator(weights, scales, n, None if policy is None else policy())
    xs = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
    xs = jax.block_until_ready(xs)
    if variant.startswith("by hand"):
        unroll = int(variant.split("=")[1]) if "unroll=" in variant else 1
        body = lambda op, xs: BY_HAND["dependent"](op, xs, unroll=unroll)
    else:
        body = lambda op, xs: PATTERNS["dependent"](op, xs)
    f = eqx.filter_jit(body) if policy is None else lxd.jit(body)
    start = time.perf_counter()
    jax.block_until_ready(f(op, xs))
    first = time.perf_counter() - start
    runs = harness.call_times(lambda: jax.block_until_ready(f(op, xs)), RUNS)
    record = dict(first_call_s=first, run_per_mv_s=statistics.median(runs) / k)
    if count_copies:
        record["copies_started"] = copies_started(f.lower(op, xs).compile())
    if policy is lxd.Auto:
        record["kept"] = [
            dict(strategy=d.strategy, reason=d.reasons[-1])
            for d in f.decisions(op, xs).values()
        ]
    return record


def run(n: int, depth: int, rounds: int) -> dict:
    """Every (variant, k) in each round, interleaved; the faster first call and
    run per `mv` of the rounds, and the ratios."""
    layers = harness.chain_layers(n, depth)
    found: dict = {}
    for r in range(rounds):
        for k in KS:
            for variant in VARIANTS:
                record = measure(variant, layers, n, k, count_copies=r == 0)
                found.setdefault(variant, {}).setdefault(k, []).append(record)
                print(r, variant, k, record, flush=True)
    results = {}
    for variant, by_k in found.items():
        best = {
            k: dict(
                first_call_s=min(m["first_call_s"] for m in ms),
                run_per_mv_s=min(m["run_per_mv_s"] for m in ms),
            )
            for k, ms in by_k.items()
        }
        one, many = best[KS[0]], best[KS[-1]]
        inline = min(m["run_per_mv_s"] for m in found["lineax"][KS[-1]])
        results[variant] = dict(
            rounds=by_k,
            first_call_ratio=many["first_call_s"] / one["first_call_s"],
            run_per_mv_over_inline=many["run_per_mv_s"] / inline,
        )
    return results


def _copies(record: dict) -> str:
    counts = record.get("copies_started")
    if counts is None:
        return "-"
    return f"{counts['in_loops'] / 2**20:.0f} / {counts['outside'] / 2**20:.0f}"


def report(results: dict) -> str:
    rows = [
        (
            variant,
            f"{r['first_call_ratio']:.2f}x",
            f"{min(m['run_per_mv_s'] for m in r['rounds'][KS[-1]]) * 1e6:.0f} us",
            f"{r['run_per_mv_over_inline']:.2f}x",
            _copies(r["rounds"][KS[-1]][0]),
        )
        for variant, r in results.items()
    ]
    headers = (
        "variant",
        f"first call k={KS[-1]} / k={KS[0]}",
        "run per mv",
        "vs lineax (inline)",
        f"MiB copied on chip (k={KS[-1]}): per trip / once",
    )
    return harness.table(headers, rows)


def _plot(results: dict):
    def draw(path):
        plt = harness.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = list(results)
        ax.bar(names, [results[v]["first_call_ratio"] for v in names])
        ax.axhline(1.3, color="k", lw=0.8, ls="--", label="target 1.3x")
        ax.set_ylabel(f"first call, k={KS[-1]} / k={KS[0]}")
        ax.set_title(f"{KS[-1]} dependent sites, {harness.jax_label()}")
        ax.tick_params(axis="x", labelrotation=20)
        ax.legend(fontsize=8)
        harness.save(fig, path)

    return draw


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    env = harness.environment()
    harness.print_setup(env, dict(n=args.n, layers=args.layers, rounds=args.rounds))
    results = run(args.n, args.layers, args.rounds)
    print(report(results))
    payload = dict(
        environment=env,
        backend=jax.default_backend(),
        n=args.n,
        layers=args.layers,
        ks=list(KS),
        results=results,
    )
    harness.write_results(args.out, "dependent_sites", payload, _plot(results))


if __name__ == "__main__":
    main()
