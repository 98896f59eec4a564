"""The records of a decision: what `decide` estimated for each strategy and what
it chose, with the reasons."""

import equinox as eqx

from .._policy_interface import AbstractPolicy


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

    def with_reason(
        self,
        reason: str,
        policy: AbstractPolicy | None = None,
        memory_needed: int | None = None,
    ) -> "Decision":
        """This decision with `reason` added to its reasons, and where given another
        policy chosen (from the same estimates) and its memory need.

        **Arguments:**

        - `reason`: the sentence to add.
        - `policy`: the policy chosen instead; `None` keeps this one.
        - `memory_needed`: the bytes the new choice needs; `None` keeps this one's.

        **Returns:**

        A new `Decision`.
        """
        return Decision(
            self.policy if policy is None else policy,
            (*self.reasons, reason),
            self.estimates,
            self.memory_needed if memory_needed is None else memory_needed,
        )
