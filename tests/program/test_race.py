"""`Auto(race=True)`: where the choice between `Roll` and `Lazy` is within the cost
model's margin, `lxd.jit` compiles both programs side by side at the first call
and keeps the one of least compile plus estimated runs (`_compiled.race`). The
results are `jax.jit`'s whichever is kept, under jit, grad and vmap; the decisions
say what was raced and what was kept."""

import time

import jax
import jax.numpy as jnp
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies import _auto
from lineax_dispatch.program._compiled import race

from ..helpers.roll_programs import _close, _operators, lazy_reference, ZOO, ZOO_X


# Rolling estimated cheaper than inlining, but by less than the margin: Auto keeps
# `Lazy` and races `Roll` against it.
UNCERTAIN = lxd.CostModel(
    compile_per_dot=10.0, materialise_fixed=1e3, outline_site=1e3, departure_margin=1e9
)
# Rolling estimated cheaper well beyond the margin: Auto rolls and races `Lazy`.
ROLLS = lxd.CostModel(compile_per_dot=10.0, materialise_fixed=1e3, outline_site=1e3)


@pytest.mark.parametrize("model", [UNCERTAIN, ROLLS], ids=["lazy-first", "roll-first"])
@pytest.mark.parametrize("name", ["dependent", "independent", "mixed"])
def test_a_raced_program_gives_jax_jit_results(name, model):
    ops = _operators(lxd.Auto(cost_model=model, race=True))
    compiled = lxd.jit(lambda x: ZOO[name](ops, x))
    (before,) = compiled.decisions(ZOO_X).values()
    planned = "Lazy" if model is UNCERTAIN else "Roll"
    assert before.strategy == planned
    assert "Raced against" in before.reasons[-1]
    with jax.checking_leaks():
        out = compiled(ZOO_X)
    _close(out, lazy_reference(name))
    (after,) = compiled.decisions(ZOO_X).values()
    assert after.strategy in ("Lazy", "Roll")
    assert after.reasons[-1].startswith("Raced at the first call")
    assert f"{after.strategy} kept" in after.reasons[-1]
    _close(compiled(ZOO_X), out)  # the kept program, called again


def test_no_race_under_a_transformation_or_when_off():
    raced = _operators(lxd.Auto(cost_model=UNCERTAIN, race=True))
    f = lambda x: jnp.sum(ZOO["dependent"](raced, x))
    lazy = _operators(lxd.Lazy())
    g = lambda x: jnp.sum(ZOO["dependent"](lazy, x))
    compiled = lxd.jit(f)
    _close(jax.grad(compiled)(ZOO_X), jax.jit(jax.grad(g))(ZOO_X))
    _close(jax.vmap(compiled)(ZOO_X[None]), jax.jit(jax.vmap(g))(ZOO_X[None]))
    off = _operators(lxd.Auto(cost_model=UNCERTAIN, race=False))
    plain = lxd.jit(lambda x: ZOO["dependent"](off, x))
    _close(plain(ZOO_X), lazy_reference("dependent"))
    (decision,) = plain.decisions(ZOO_X).values()
    assert decision.strategy == "Lazy"
    assert not any("aced" in r for r in decision.reasons)


class _Lowered:
    """A stand-in for a `jax.stages.Lowered` whose compile takes `seconds`."""

    def __init__(self, name, seconds, fails=False):
        self.name, self.seconds, self.fails = name, seconds, fails

    def compile(self):
        time.sleep(self.seconds)
        if self.fails:
            raise ValueError(f"{self.name} failed")
        return self.name


def test_race_keeps_least_compile_plus_penalty():
    fast, slow = _Lowered("fast", 0.0), _Lowered("slow", 0.3)
    # The first compiled, where the other's penalty is no smaller.
    index, out, seconds = race([lambda: slow, lambda: fast], [0.0, 0.0])
    assert (index, out) == (1, "fast") and seconds[1] is not None
    # A later one whose penalty is smaller by more than the wait.
    index, out, _ = race([lambda: fast, lambda: slow], [5.0, 0.0])
    assert (index, out) == (1, "slow")
    # Not waited for beyond the difference of the penalties.
    start = time.perf_counter()
    index, out, seconds = race([lambda: fast, lambda: _Lowered("x", 2.0)], [0.05, 0.0])
    assert (index, out) == (0, "fast") and seconds[1] is None
    assert time.perf_counter() - start < 1.5


def test_race_drops_failures_and_raises_the_first_error():
    def broken():
        raise RuntimeError("lowering broke")

    index, out, _ = race([broken, lambda: _Lowered("ok", 0.0)], [0.0, 0.0])
    assert (index, out) == (1, "ok")
    index, out, _ = race(
        [lambda: _Lowered("bad", 0.0, fails=True), lambda: _Lowered("ok", 0.1)],
        [0.0, 0.0],
    )
    assert (index, out) == (1, "ok")
    with pytest.raises(RuntimeError, match="lowering broke"):
        race([broken, lambda: _Lowered("bad", 0.0, fails=True)], [0.0, 0.0])


def test_race_argument_is_checked():
    with pytest.raises(TypeError, match="race"):
        lxd.Auto(race="yes")  # pyright: ignore[reportArgumentType]
    assert lxd.Auto(race=True).races() and not lxd.Auto(race=False).races()


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_default_races_with_cores_to_spare_except_on_a_tpu(monkeypatch, backend):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(_auto, "usable_cores", lambda: _auto.RACE_CORES)
    assert lxd.Auto().races() == (backend != "tpu")
    assert lxd.Auto(race=True).races()  # a race asked for runs on every backend
    monkeypatch.setattr(_auto, "usable_cores", lambda: _auto.RACE_CORES - 1)
    assert not lxd.Auto().races()
