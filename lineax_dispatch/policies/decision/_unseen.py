"""The decision for a call site of a program that is not read: an `Auto` operator
under a plain `jax.jit`. One pure function, as `decide` is."""

from .._lazy import Lazy
from .._outline import Outline
from ._formulas import mv_compile
from ._model import CostModel
from ._observation import Observation
from ._records import Decision


def decide_unseen(o: Observation, model: CostModel = CostModel()) -> Decision:
    """The decision for one call site of a program that is not read (an `Auto`
    operator under a plain `jax.jit`, where its sites are traced one by one and
    never counted): `Outline` where it is native and a second site of the program
    would then save more compile time than a site costs
    (`(1 - outline_clone) x` one copy of `mv` above `compile_per_site`), else
    `Lazy` (lineax's behaviour).

    **Arguments:**

    - `o`: an [`lineax_dispatch.Observation`][] of the operator (its `call_sites`
        are not read).
    - `model`: the machine constants.

    **Returns:**

    A [`lineax_dispatch.Decision`][], `Outline()` or `Lazy()`.
    """
    copy = mv_compile(o, model)
    saved = (1.0 - model.outline_clone) * copy
    if not model.outline_native:
        why = "this JAX has no native out-of-line call (jax.Inline.XLA_LATE)"
        return Decision(Lazy(), (f"Lazy: {why}; apply it as lineax does.",))
    if o.mv_effects:
        return Decision(Lazy(), ("Lazy: mv has effects; apply it where it is.",))
    if saved > model.compile_per_site:
        return Decision(
            Outline(),
            (
                f"Outline: one copy of mv compiles in ~{copy:.3g} s; each further "
                f"call site out of line saves ~{saved:.3g} s (outline_clone="
                f"{model.outline_clone:g}), more than a site costs.",
            ),
        )
    return Decision(
        Lazy(),
        (
            f"Lazy: a further call site out of line would save ~{saved:.3g} s "
            f"(one copy ~{copy:.3g} s, outline_clone={model.outline_clone:g}), no "
            f"more than a site costs ({model.compile_per_site:g} s).",
        ),
    )
