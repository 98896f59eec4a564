"""The records of a decision: what `decide` estimated for each strategy and what
it chose, with the reasons."""

import equinox as eqx

from ._base import AbstractPolicy


class Estimate(eqx.Module):
    """One strategy's estimated cost, in a [`lineax_dispatch.Decision`][].

    **Arguments:** (each is also the attribute of that name)

    - `policy`: the strategy, a policy (`Lazy()`, `Roll()`, `Outline()` or
        `Materialise(batch_size)`, with the build's chunk of columns).
    - `compile_seconds`: the time to compile the program's copies of `mv`; `None`
        where the strategy is not allowed (over the memory budget).
    - `run_seconds`: the time one run of the program spends in them; `None` where
        not allowed.
    - `seconds`: compile time plus `runs` times the run time; `None` where not
        allowed.
    """

    policy: AbstractPolicy
    compile_seconds: float | None = None
    run_seconds: float | None = None
    seconds: float | None = None

    @property
    def strategy(self) -> str:
        """The name of the strategy's policy class (`"Lazy"`, `"Roll"`...)."""
        return type(self.policy).__name__


class Decision(eqx.Module):
    """What Auto chose for one operator, and why: the result of
    [`lineax_dispatch.decide`][] and of `Auto.decision`, and a row of
    [`lineax_dispatch.explain`][]'s report.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())
        decision = op.policy.decision(op, call_sites=8)
        print(decision.strategy, decision.reasons[-1])
        print({e.strategy: e.seconds for e in decision.estimates})
        ```

    **Arguments:** (each is also the attribute of that name)

    - `policy`: the chosen strategy, a policy (`Lazy()`, `Roll()`, `Outline()`,
        `Materialise(batch_size)`, `VmapBatch(batch_size)` or `Scan()`).
    - `reasons`: sentences explaining the choice.
    - `estimates`: a `lineax_dispatch.policies.Estimate` for each strategy considered
        (its `seconds` `None` if not allowed).
    - `memory_needed`: bytes that materialising would need (matrix plus build
        workspace), 0 where not relevant.
    """

    policy: AbstractPolicy
    reasons: tuple[str, ...]
    estimates: tuple[Estimate, ...] = ()
    memory_needed: int = 0

    @property
    def strategy(self) -> str:
        """The name of the chosen policy's class: `"Lazy"`, `"Roll"`, `"Outline"`,
        `"Materialise"`, `"VmapBatch"` or `"Scan"`."""
        return type(self.policy).__name__
