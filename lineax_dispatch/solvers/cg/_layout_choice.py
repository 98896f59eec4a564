"""What `lxd.CG` decides for a solve, in its `init`, with `layout="auto"` and
`residual_update="auto"`: its layout (`choose_layout`: the one-site loop or the
inline layout of `_inline_layout.py`) and how its loop updates the residual
(`choose_update`: one expression, or a `lax.cond` on `A p` as computed), from the
cost model, the operator's expected runs and the cost of its `mv`."""

import math
from typing import Any

import jax
import jax.tree_util as jtu
import lineax as lx

from ..._compat import is_tracer
from ...operators import AbstractDispatchOperator
from ...policies import Auto, CostModel, machine_cost_model, mv_cost, observe
from ...policies._dense import EXPLICIT_OPERATORS
from ...policies._memory import array_bytes, itemsize, vector_bytes
from ...policies._pinned import _Unkeyed, ChoiceRef
from ...policies.calls._keys import is_leaf_array, operator_key
from ...policies.calls._recorder import (
    current_recorder,
    layout_hint,
    record_solver_choice,
)
from ...policies.calls._sites import user_site
from ...policies.decision._formulas import mv_compile, mv_run, read_rate
from .._prepare import expected_iterations
from ..skeleton._linear_system import UPDATE_IN_COND
from ._loop_rules import CGSettings


def _constant_bytes(operator: lx.AbstractLinearOperator) -> int:
    """Bytes of the arrays `operator` holds that are not traced: constants of the
    program that every copy of its `mv` reads as such."""
    leaves = jtu.tree_leaves(operator, is_leaf=is_leaf_array)
    return sum(array_bytes(x) for x in leaves if is_leaf_array(x) and not is_tracer(x))


def _untagged(operator: lx.AbstractLinearOperator) -> lx.AbstractLinearOperator:
    """`operator` without lineax's own `TaggedLinearOperator` wrappers (ours
    subclass it and are kept)."""
    while isinstance(operator, lx.TaggedLinearOperator) and not isinstance(
        operator, AbstractDispatchOperator
    ):
        operator = operator.operator
    return operator


def _copy_compile(operator: lx.AbstractLinearOperator, model: CostModel) -> float:
    """Seconds to compile one more copy of `operator.mv`: its operations, and the
    constants it holds (its untraced arrays, and those its function closes over);
    infinite where that is not known without tracing a function of the user's
    again (a lineax operator that holds one)."""
    operator = _untagged(operator)
    constants = _constant_bytes(operator)
    if isinstance(operator, (lx.DiagonalLinearOperator, lx.IdentityLinearOperator)):
        ops = model.compile_per_op
    elif isinstance(operator, EXPLICIT_OPERATORS):
        ops = model.matmul_site
    elif not isinstance(operator, AbstractDispatchOperator):
        return math.inf
    else:
        o = observe(operator, memory_budget=0)
        ops = model.matmul_site if o.explicit else mv_compile(o, model)
        constants += 0 if o.explicit else mv_cost(operator).constant_bytes
    return ops + constants * model.compile_per_constant_byte


class LayoutRef(_Unkeyed):
    """What `lxd.jit` needs to decide a CG solve's layout again for the trips of
    the loops around it, carried in the solver's state (equal to every other: no
    part of a jit cache key): the layout taken, the seconds the inline layout
    saves over the runs counted (`saved`) and costs to compile (`compile_s`), and
    the solve's `(user line, operator key)` (`None` outside `lxd.jit`)."""

    __slots__ = ("layout", "saved", "compile_s", "site")

    def __init__(self, layout: str, saved: float, compile_s: float, site: Any):
        self.layout = layout
        self.saved = saved
        self.compile_s = compile_s
        self.site = site


def choose_layout(
    solver: CGSettings,
    operator: lx.AbstractLinearOperator,
    prepared: lx.AbstractLinearOperator,
    preconditioner: lx.AbstractLinearOperator | None,
    executions: float = 1.0,
) -> tuple[str, tuple[str, ...], str, float, float]:
    """CG's layout for a solve of `prepared` (the operator as its loop applies it;
    `operator` as the user gave it, whose `Auto` policy holds the expected runs
    and the cost model): `"inline"` where the passes it saves over `runs` solves
    take longer than its two further copies of `mv` (and of the preconditioner's
    `mv`, one, or two where the stopping test and `gamma` are one reduction and
    taken with each residual) take to compile, else `"one_site"`.

    The passes saved: a refresh every `stabilise_every` of the solve's expected
    steps (`expected_iterations`), and the final check; each costs the one-site
    loop `refresh_pass` plus reading and writing its ten vectors. An operator that
    is not `Auto` is taken to run as many times as `Auto`'s default, and the
    solve `executions` times a run (the trips of the loops around it, where
    `lxd.jit` found them).

    **Returns:**

    `(layout, reasons, source, saved, compile_s)`: `"inline"` or `"one_site"`,
    sentences explaining it, where the cost model's constants came from, and the
    seconds the inline layout saves over the runs and costs to compile (infinite
    where not known or not costed).
    """
    runs, model = _runs_and_model(operator)
    backend = jax.default_backend()
    if backend != "cpu":
        reason = (
            f"On {backend!r} one site: a step of the inline layout runs its "
            "refresh and check in a `lax.cond`, which costs an accelerator more "
            "than the one-site loop's extra passes."
        )
        return "one_site", (reason,), model.source, 0.0, math.inf
    runs = runs * executions
    n = prepared.in_size()
    steps = expected_iterations(solver.max_steps, n)
    passes = int(solver.has_scale)
    if solver.stabilise_every is not None:
        passes += steps // solver.stabilise_every
    vectors = 10 * vector_bytes(n, itemsize(prepared))
    saved = runs * passes * (model.refresh_pass + vectors / read_rate(vectors, model))
    saving = (
        f"The inline layout would save {passes} passes a solve (~{steps} steps "
        f"expected), ~{saved:.3g} s over {runs:g} runs"
    )
    # Costing the copies traces nothing new but takes time: only where the saving
    # may repay them, or where `lxd.jit` may decide again for the loops around.
    fixed = model.inline_compile
    if solver.fused_test(n):
        fixed += model.fused_test_compile
    if saved <= fixed and current_recorder() is None:
        reason = f"{saving}: less than its fixed compile (~{fixed:.3g} s)."
        return "one_site", (reason,), model.source, saved, math.inf
    compile_s = fixed + 2 * _copy_compile(prepared, model)
    if preconditioner is not None:
        copies = 2 if solver.fused_test(n) else 1
        compile_s += copies * _copy_compile(preconditioner, model)
    if not math.isfinite(compile_s):
        reason = (
            f"{saving}; the compile time of its copies is not known without "
            "tracing a function of the user's again (a lineax operator that holds "
            "one): one site."
        )
        return "one_site", (reason,), model.source, saved, compile_s
    layout = "inline" if saved > compile_s else "one_site"
    reason = (
        f"{saving}; its further copies of `mv` cost ~{compile_s:.3g} s to compile: "
        f"{'inline' if layout == 'inline' else 'one site'}."
    )
    return layout, (reason,), model.source, saved, compile_s


def _runs_and_model(operator: lx.AbstractLinearOperator) -> tuple[float, CostModel]:
    """The expected runs and cost model of an `Auto` operator; else `Auto`'s
    defaults and this machine's model."""
    policy = getattr(operator, "policy", None)
    if isinstance(policy, Auto):
        return policy.runs, policy.model()
    return Auto().runs, machine_cost_model()


def _mv_run(operator: lx.AbstractLinearOperator, model: CostModel) -> float:
    """Seconds to run one `mv` of `operator` as the cost model estimates it;
    infinite where that is not known without tracing a function of the user's
    again (a lineax operator that holds one)."""
    operator = _untagged(operator)
    if not isinstance(operator, (AbstractDispatchOperator, *EXPLICIT_OPERATORS)):
        return math.inf
    return mv_run(observe(operator, memory_budget=0), model)


def choose_update(
    solver: CGSettings,
    operator: lx.AbstractLinearOperator,
    prepared: lx.AbstractLinearOperator,
    executions: float = 1.0,
) -> tuple[str, str]:
    """How CG's loop updates the residual `r - alpha A p` for a solve of
    `prepared` (`operator` as `choose_layout` reads it): `"cond"`, in a
    `lax.cond` that reads `A p` as computed, or `"select"`, as one expression.

    From `UPDATE_IN_COND` unknowns on XLA:CPU fuses the operator's own
    elementwise operations into the expression and computes them a second time
    there; the `lax.cond` avoids that but costs `CostModel.
    update_cond_compile` to compile. So `"cond"` where the runs (times
    `executions`) of the solve's expected steps, each costing about one more
    `mv`, take longer than that; below `UPDATE_IN_COND`, `"select"`.

    **Returns:**

    `("cond" or "select", a sentence explaining it)`.
    """
    n = prepared.in_size()
    if n < UPDATE_IN_COND:
        return (
            "select",
            f"Below {UPDATE_IN_COND} unknowns the update is one expression.",
        )
    backend = jax.default_backend()
    if backend != "cpu":
        return (
            "select",
            f"On {backend!r} the update is one expression (the `lax.cond` keeps "
            "XLA:CPU from computing the `mv`'s operations again).",
        )
    runs, model = _runs_and_model(operator)
    runs = runs * executions
    steps = expected_iterations(solver.max_steps, n)
    extra = runs * steps * _mv_run(prepared, model)
    update = "cond" if extra > model.update_cond_compile else "select"
    reason = (
        f"As one expression, the residual update would compute the `mv`'s own "
        f"operations again, ~{extra:.3g} s over {runs:g} runs of ~{steps} steps, "
        f"where a `lax.cond` costs ~{model.update_cond_compile:.3g} s to compile: "
        f"{'a `lax.cond`' if update == 'cond' else 'one expression'}."
    )
    return update, reason


def cg_choices(
    solver: CGSettings,
    given: lx.AbstractLinearOperator,
    prepared: lx.AbstractLinearOperator,
    options: dict[str, Any],
) -> tuple:
    """What CG's state carries of its choices for a solve: `(layout, update)`,
    each as given or, where `"auto"`, as `choose_layout` and `choose_update` take
    it; where the layout is `"auto"`, followed by its `ChoiceRef` (for
    `lxd.explain`) and `LayoutRef` (for `lxd.jit`). Under `lxd.jit`, a second
    trace may be told the trips of the loops around the solve (`layout_hint`, by
    its line and operator kind), for both choices."""
    site, executions = None, 1.0
    if (
        "auto" in (solver.layout, solver.residual_update)
        and current_recorder() is not None
        and isinstance(given, AbstractDispatchOperator)
    ):
        site = (user_site(), operator_key(given))
        executions = layout_hint(site[1])
    update, why = solver.residual_update, ()
    if update == "auto":
        update, reason = choose_update(solver, given, prepared, executions)
        why = (reason,)
    if solver.layout != "auto":
        return solver.layout, update
    layout, reasons, source, saved, compile_s = choose_layout(
        solver, given, prepared, options.get("preconditioner"), executions
    )
    choice = record_solver_choice(
        type(given).__name__,
        f"{given.out_size()}x{given.in_size()}",
        f"CG ({layout.replace('_', '-')} layout)",
        reasons + why,
        source,
    )
    ref = LayoutRef(layout, saved, compile_s, site)
    return layout, update, ChoiceRef(choice), ref
