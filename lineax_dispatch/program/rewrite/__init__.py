"""The program rewrite of `lxd.jit`: one interpreter of a jaxpr's equations
(`_interpret`), each policy's rule registered by policy class (`_rules`), and
their executors: roll (`_roll_loop`, `_roll_carry`, `_roll_inputs`), stack
(`_stack`, `_stack_layout`), one shared matrix (`_shared_matrix`), outline
(`_outline_sites`) and inline (`_inline`); `_rewrite` applies a program's
actions."""
