"""Policies: how an operator applies its `mv`."""

from ._base import (
    AbstractPolicy as AbstractPolicy,
    check_policy as check_policy,
    in_raw_mv_context as in_raw_mv_context,
    raw_mv_context as raw_mv_context,
    RawMv as RawMv,
)
from ._dense import dense_matrix as dense_matrix, dense_mv as dense_mv
from ._lazy import Lazy as Lazy
from ._materialise import Materialise as Materialise
from ._outline import Outline as Outline


def default_policy() -> AbstractPolicy:
    """The policy an operator gets when none is given.

    **Returns:**

    A fresh [`lineax_dispatch.Lazy`][] policy.
    """
    return Lazy()
