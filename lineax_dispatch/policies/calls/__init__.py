"""Marked calls and what a trace records about them: the layer every policy, the
decision rule, the solvers and `lxd.jit` read.

- `_marked`: an operator's `mv` applied as a named `jax.jit` call, one per
    operator kind (and trace);
- `_keys`: the hashable keys of operator kinds and static parts;
- `_scope`: the trace a decided policy is pinned to;
- `_recorder`: what a traced `mv` or solver `init` records for the `lxd.jit` or
    `lxd.explain` trace reading its program (implemented by `program/_session.py`),
    and the hints an earlier trace left;
- `_sites`: the user's source line of a call or an equation;
- `_per_object`: values computed once per live object."""
