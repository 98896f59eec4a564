"""Policies: how an operator applies its `mv`.

The policy classes are modules of this folder; `calls/` holds the marked calls
they apply through (keys, the trace's scope and recorder, source sites) and
`decision/` the rule `Auto` decides by (records, observation, cost, the model's
formulas, `decide`)."""

from ._auto import Auto as Auto
from ._batching import Scan as Scan, VmapBatch as VmapBatch
from ._dense import dense_matrix as dense_matrix
from ._lazy import Lazy as Lazy
from ._materialise import Materialise as Materialise
from ._memory import (
    default_memory_budget as default_memory_budget,
    format_bytes as format_bytes,
    parse_memory_budget as parse_memory_budget,
)
from ._outline import Outline as Outline
from ._policy_interface import (
    AbstractPolicy as AbstractPolicy,
    check_policy as check_policy,
    in_raw_mv_context as in_raw_mv_context,
    RawMv as RawMv,
)
from ._roll import Roll as Roll
from .calls._recorder import SolverChoice as SolverChoice
from .decision._calibration import machine_cost_model as machine_cost_model
from .decision._cost import mv_cost as mv_cost, MvCost as MvCost
from .decision._model import CostModel as CostModel
from .decision._observation import Observation as Observation, observe as observe
from .decision._records import Decision as Decision, Estimate as Estimate
from .decision._rule import decide as decide
from .decision._unseen import decide_unseen as decide_unseen


def default_policy() -> AbstractPolicy:
    """The policy an operator gets when none is given: `Auto()`.

    - Under [`lineax_dispatch.jit`][] it decides on the traced program (call sites
        rolled into one loop body, one matrix built, or left inline).
    - In a solve by one of this package's solvers it decides once per solve, from
        the solver's expected iterations.
    - Under a plain `jax.jit` each call site is decided alone: inline, as lineax,
        unless an out-of-line call (`jax.Inline.XLA_LATE`) would compile in less
        time; on XLA:CPU that is always inline.
    - Eagerly, `mv` runs the operator's compiled `mv`.

    What it decided, and why, is printed by [`lineax_dispatch.explain`][]. Ask for
    `Lazy()` to have lineax's behaviour with no decision at all.

    **Returns:**

    An [`lineax_dispatch.Auto`][] policy.
    """
    return Auto()
