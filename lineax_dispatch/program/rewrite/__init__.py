"""The program rewrite of `lxd.jit`: one interpreter of a jaxpr's equations
(`_interpret`) and one executor per action kind: roll (`_roll`, `_roll_carry`,
`_roll_inputs`), stack (`_stack`, `_stack_layout`), materialise (`_materialise`)
and outline (`_outline`); `_rewrite` applies a program's actions."""
