"""The accelerator check: on whatever backend JAX sees, the parity zoo
(`benchmarks/parity.py`: every operator kind x policy x solver in float32 against
plain lineax and a float64 host reference), then the headline benchmarks in small
configurations, each in its own process, into one folder; a summary at the end.

    python -m benchmarks.accelerator                     # benchmarks/results/<backend>
    python -m benchmarks.accelerator --quick --out /tmp/check   # small sizes (CPU)
    python -m benchmarks.accelerator --skip-benchmarks   # the parity zoo only

Every step runs in a child process, one at a time (one process holds an
accelerator), and this process never starts a JAX backend. A benchmark that fails
or runs past `--bench-timeout` is recorded and the others still run. The exit
status is 1 where a parity row is `FAIL` (or the zoo itself did not finish), else
0. Results: `<out>/parity.json` and each benchmark's own files, with this run's
summary in `<out>/accelerator.json`. How to run it on a machine without internet,
and what it measured on a TPU: docs/accelerators.md.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
BENCH_TIMEOUT_S = 300.0
# The headline benchmarks and the flags of each run here: each benchmark's own
# `--quick` sizes (a few minutes in all on one TPU v5e chip), with more cut off
# where the benchmark has a flag for it.
BENCHMARKS = {
    "callsites": ["--quick", "--repeats", "1"],
    "program": ["--quick"],
    "solvers": ["--quick", "--solvers", "cg"],
    "fixed_cost": ["--quick"],
    "eager": ["--quick"],
    "families": ["--quick", "--half", "held_out"],
    "dependent_sites": ["--quick"],
    "trace_gap": ["--quick"],
    "first_call": ["--quick"],
}
# Added under `--quick` (meant for a CPU, where `families` alone took 4 minutes).
QUICK_FLAGS = {
    "families": ["--families", "stencil"],
    "first_call": ["--families", "stencil"],
}
PROBE = (
    "import json, jax; print(json.dumps(dict(backend=jax.default_backend(), "
    "devices=[str(d) for d in jax.devices()], jax=jax.__version__)))"
)


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def probe(timeout: float) -> dict:
    """The backend, devices and jax version a fresh process sees (it exits, so the
    device is free again)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"jax could not start:\n{_tail(done.stderr)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_step(name: str, command: list[str], timeout: float) -> dict:
    """Runs `command` in the repository root, its output shown as it comes, for
    at most `timeout` seconds (then its process group is ended).

    **Arguments:**

    - `name`: the step's name, for the output.
    - `command`: the command line.
    - `timeout`: seconds.

    **Returns:**

    A dict of the command, its exit status (None if ended), whether it timed out,
    its wall time and its last lines of output.
    """
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    lines: list[str] = []
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            print(line, end="", flush=True)
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status, timed_out = process.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status, timed_out = None, True
        print(f"--- {name}: no end in {timeout:.0f} s, process ended", flush=True)
    reader.join(timeout=10)
    return dict(
        command=" ".join(command),
        exit_status=status,
        timed_out=timed_out,
        seconds=time.perf_counter() - start,
        output_tail=_tail("".join(lines), 20),
    )


def run_parity(args: argparse.Namespace, out: Path) -> dict:
    """The parity zoo's step, with its summary read from `<out>/parity.json`."""
    if args.skip_parity:
        return dict(skipped=True, exit_status=None, timed_out=False, seconds=0.0)
    command = [sys.executable, "-m", "benchmarks.parity", "--out", str(out)]
    command += ["--quick"] * args.quick + (["--n", str(args.n)] if args.n else [])
    if args.case_timeout:
        command += ["--case-timeout", str(args.case_timeout)]
    parity = run_step("parity", command, timeout=3600)
    try:
        data = json.loads((out / "parity.json").read_text())
        parity.update(data["summary"], parity_json=str(out / "parity.json"))
    except (OSError, ValueError, KeyError):
        parity["counts"] = None
    return parity


def summary_table(parity: dict, benchmarks: dict) -> str:
    """The steps, their status and time."""
    from benchmarks import output

    def status(step: dict) -> str:
        if step.get("not_run"):
            return "not run"
        if step["timed_out"]:
            return "timed out"
        return "ok" if step["exit_status"] == 0 else f"exit {step['exit_status']}"

    counts = parity.get("counts") or {}
    verdicts = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "-"
    parity_status = {0: "ok", 1: "FAIL rows"}.get(parity["exit_status"], status(parity))
    rows = [("parity", parity_status, f"{parity['seconds']:.0f} s", verdicts)]
    if parity.get("skipped"):
        rows = []
    for name, step in benchmarks.items():
        written = ", ".join(step.get("files", [])) or "-"
        rows.append((name, status(step), f"{step['seconds']:.0f} s", written))
    return output.table(("step", "status", "time", "verdicts / files"), rows)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.accelerator", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default benchmarks/results/<jax.default_backend()>)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the parity zoo at its --quick size (n=64) and `families` on one "
        "family (for a CPU)",
    )
    parser.add_argument("--n", type=int, help="the parity zoo's size (default 256)")
    parser.add_argument("--skip-benchmarks", action="store_true",
                        help="run the parity zoo only")  # fmt: skip
    parser.add_argument("--skip-parity", action="store_true",
                        help="run the benchmarks only")  # fmt: skip
    parser.add_argument(
        "--benchmarks",
        default=",".join(BENCHMARKS),
        help=f"comma-separated among {','.join(BENCHMARKS)} (default all)",
    )
    parser.add_argument("--bench-timeout", type=float, default=BENCH_TIMEOUT_S,
                        help="seconds for each benchmark (default %(default)s)")  # fmt: skip
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the benchmarks together; each gets at "
                        "most what is left, and those left are not run")  # fmt: skip
    parser.add_argument("--case-timeout", type=float, default=None,
                        help="seconds for each parity case (parity's default)")  # fmt: skip
    args = parser.parse_args(argv)
    args.benchmarks = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    if bad := [b for b in args.benchmarks if b not in BENCHMARKS]:
        parser.error(f"unknown benchmarks {bad}; choose from {list(BENCHMARKS)}")
    return args


def main(argv=None) -> int:
    """Runs the check; returns 1 where a parity row is `FAIL`, else 0."""
    args = parse_args(argv)
    start = time.perf_counter()
    seen = probe(timeout=600)
    print(f"jax {seen['jax']}, backend {seen['backend']}: {seen['devices']}")
    out = (args.out or RESULTS_DIR / seen["backend"]).resolve()
    out.mkdir(parents=True, exist_ok=True)

    parity = run_parity(args, out)

    benchmarks: dict = {}
    end = time.monotonic() + (args.budget or float("inf"))
    for name in [] if args.skip_benchmarks else args.benchmarks:
        left = end - time.monotonic()
        if left < 10:
            benchmarks[name] = dict(exit_status=None, timed_out=False, seconds=0.0,
                                    not_run="the --budget was spent")  # fmt: skip
            continue
        before = {p: p.stat().st_mtime for p in out.iterdir() if p.is_file()}
        command = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out)]
        command += BENCHMARKS[name] + QUICK_FLAGS.get(name, []) * args.quick
        step = run_step(name, command, min(args.bench_timeout, left))
        step["files"] = sorted(
            p.name
            for p in out.iterdir()
            if p.is_file() and before.get(p) != p.stat().st_mtime
        )
        benchmarks[name] = step

    from benchmarks import output

    table = summary_table(parity, benchmarks)
    print(f"\n=== summary ({seen['backend']}: {', '.join(seen['devices'])})")
    print(table)
    failed = not args.skip_parity and (
        parity["exit_status"] != 0 or parity.get("counts") is None
    )
    payload = dict(
        environment=dict(
            jax=seen["jax"], jax_backend=seen["backend"], jax_devices=seen["devices"]
        ),  # fmt: skip
        config=dict(
            quick=args.quick,
            n=args.n,
            benchmarks=args.benchmarks,
            flags={b: BENCHMARKS[b] for b in args.benchmarks},
            bench_timeout_s=args.bench_timeout,
        ),  # fmt: skip
        parity=parity,
        benchmarks=benchmarks,
        total_seconds=time.perf_counter() - start,
    )
    output.write_results(out, "accelerator", payload, plot=None)
    verdict = "parity FAILED" if failed else "parity passed"
    verdict = "parity skipped" if args.skip_parity else verdict
    print(f"total {payload['total_seconds']:.0f} s; {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
