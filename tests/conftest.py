import gc
import os
import shutil
import subprocess
import sys
import tempfile


# The tests' programs are small and most are compiled once, so the suite's time is
# mostly XLA:CPU compiling them. Two compiler settings change how the CPU code is
# generated, not what it computes: `--xla_backend_optimization_level=0` (no LLVM
# optimisation of the generated code) and `--xla_cpu_use_fusion_emitters=false`
# (XLA's elemental emitters for fusions, much quicker to compile than its MLIR
# fusion emitters; the compiled HLO then groups element-wise code into fusions
# differently, while the dot products the tests count stay as they are, and where
# a test compares HLO with lineax's both are compiled so). pytest on two cores on
# this machine: 775 s as is, 521 s with the first, 322 s with both. Set before jax
# starts its CPU backend; the example and sharding subprocesses inherit them. A
# setting the caller gave wins.
#
# An XLA that does not know a flag stops at start-up naming it (jax 0.12's XLA has
# no `xla_cpu_use_fusion_emitters`), so each flag is first tried in a subprocess,
# once per run: the controller tries them and its xdist workers inherit the answer.
# `Auto` and `AutoSolver` without a cost model of the user's calibrate the machine
# at first use (`policies/decision/_calibration.py`); the tests check decisions made
# with the fitted defaults, the same on every machine
# (tests/policies/test_calibration.py turns it on where it checks it).
os.environ["LINEAX_DISPATCH_CALIBRATION"] = "off"

_FLAGS = ("xla_backend_optimization_level=0", "xla_cpu_use_fusion_emitters=false")
_ACCEPTED = "LINEAX_DISPATCH_TEST_XLA_FLAGS"


def _accepted(flag: str) -> bool:
    """Whether this Python's XLA starts with `--flag` in XLA_FLAGS."""
    env = dict(os.environ, XLA_FLAGS=f"--{flag}", JAX_PLATFORMS="cpu")
    probe = "import jax; jax.devices()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


if _ACCEPTED not in os.environ:
    os.environ[_ACCEPTED] = " ".join(f for f in _FLAGS if _accepted(f))
_given = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_given]
    + [f"--{f}" for f in os.environ[_ACCEPTED].split() if f.split("=")[0] not in _given]
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402


# float64 cases need x64; float32 cases create float32 arrays explicitly.
jax.config.update("jax_enable_x64", True)

# One compilation cache for the run, shared by the xdist workers: many tests compile
# the same program (plain lineax's references in each worker; the policies that
# apply `mv` inline compile to the same HLO), and XLA compiles each once. Keyed by
# the program and the compile options, so it changes no result; programs with host
# callbacks are not cached. Removed at the end of the run.
# The controller makes the folder when it imports this file; the workers it starts
# inherit the variable.
_CACHE = os.environ.setdefault(
    "LINEAX_DISPATCH_TEST_CACHE", tempfile.mkdtemp(prefix="lineax-dispatch-tests-")
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):  # the controller, not a worker
        shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture
def strict_promotion():
    """lineax's own test settings: no implicit dtype promotion between kinds, no
    implicit rank promotion. Modules that set `pytestmark =
    pytest.mark.usefixtures("strict_promotion")` run every test under them."""
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


@pytest.fixture(autouse=True)
def _gc_scans_only_this_test():
    """`jax.checking_leaks` runs a full `gc.collect()` after each trace it checks,
    whose cost grows with all that the session keeps alive (compiled functions,
    caches): most of the leak-checked tests' time, late in a session. Freezing that
    for the test leaves the collections, and the leak checker's search for
    tracers, to the objects the test creates (among them any leaked tracer)."""
    gc.freeze()
    yield
    gc.unfreeze()
