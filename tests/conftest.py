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
