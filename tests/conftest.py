import gc

import jax
import pytest


# float64 cases need x64; float32 cases create float32 arrays explicitly.
jax.config.update("jax_enable_x64", True)


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
