"""The program rewrite of `lxd.jit`: one interpreter of a jaxpr's equations
(`_interpret`) and one executor per action kind: roll (`_roll_loop`,
`_roll_carry`, `_roll_inputs`), stack (`_stack`, `_stack_layout`), one shared
matrix (`_shared_matrix`) and outline (`_outline_sites`); `_rewrite` applies a program's actions."""
