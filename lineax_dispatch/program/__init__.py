"""`lxd.jit` and `lxd.explain`: a traced program read and rewritten, one module or
folder per stage, in order: `_arguments` (how arguments are read), `_session`
(what a trace records, and its jit-cache context), `_trace` (one trace of the
user's function), `analyse/` (groups of repeated calls, solves, roll
and stack plans), `_decide` (groups to typed actions), `rewrite/` (one executor
per action kind over one interpreter), `_compiled` (what is kept per signature),
`_jit` and `_explain` (the two entry points)."""

from ._explain import (
    explain as explain,
    ExplainReport as ExplainReport,
    ExplainRow as ExplainRow,
)
from ._jit import jit as jit
