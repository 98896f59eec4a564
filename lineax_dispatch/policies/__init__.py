"""Policies: how an operator applies its `mv`."""

from ._auto import Auto as Auto
from ._base import (
    AbstractPolicy as AbstractPolicy,
    check_policy as check_policy,
    in_raw_mv_context as in_raw_mv_context,
    raw_mv_context as raw_mv_context,
    RawMv as RawMv,
)
from ._batching import Scan as Scan, VmapBatch as VmapBatch
from ._budget import (
    default_memory_budget as default_memory_budget,
    format_bytes as format_bytes,
    parse_memory_budget as parse_memory_budget,
)
from ._calibration import machine_cost_model as machine_cost_model
from ._cost import mv_cost as mv_cost, MvCost as MvCost
from ._decide import CostModel as CostModel, decide as decide
from ._decision import Decision as Decision, Estimate as Estimate
from ._dense import dense_matrix as dense_matrix, dense_mv as dense_mv
from ._explain import (
    explain as explain,
    ExplainReport as ExplainReport,
    ExplainRow as ExplainRow,
)
from ._jit import jit as jit
from ._lazy import Lazy as Lazy
from ._materialise import Materialise as Materialise
from ._observation import Observation as Observation, observe as observe
from ._outline import Outline as Outline
from ._registry import (
    expected_executions as expected_executions,
    SolverChoice as SolverChoice,
)
from ._roll_policy import Roll as Roll
from ._unseen import decide_unseen as decide_unseen


def default_policy() -> AbstractPolicy:
    """The policy an operator gets when none is given.

    `Lazy()`, lineax's own behaviour, until program-level dispatch (`lxd.jit`
    deciding on the traced program) meets its targets: measured, a default `Auto`
    made eager `mv` 70x slower than lineax and compiled programs 6-11x slower on
    every call after the first. Ask for `Auto()` explicitly to have it decide.

    **Returns:**

    A [`lineax_dispatch.Lazy`][] policy.
    """
    return Lazy()
