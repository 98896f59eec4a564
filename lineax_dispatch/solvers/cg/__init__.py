"""`lxd.CG`: the solver and its one-site loop (`_cg`), its inline layout
(`_inline_layout`), what both loops share (`_loop_rules`), and the choice of
layout and residual update for a solve (`_layout_choice`)."""

from ._cg import CG as CG
