"""What `lxd.jit` reads from a traced program, with no decision: the groups of
repeated calls (`_groups`), the solves a program carries (`_solves`), and the
plans for rolling (`_roll_plan`, `_roll_steps`, `_hoist`) and stacking
(`_stack_plan`) a group's call sites."""
