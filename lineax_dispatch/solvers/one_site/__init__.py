"""The iterative solvers whose `mv` appears once in the compiled program: CG,
BiCGStab, GMRES, MINRES, LSMR and Normal, on one skeleton (`_base`): every
application of the operator goes through one slot of the loop body. `_system`
and `_flat` are the linear system they solve, flattened."""
