"""What the iterative solvers of this package (CG, BiCGStab, GMRES, MINRES, LSMR,
Normal) are written on: their base class, its stopping test and the mapping of a
loop's end to lineax's results (`_one_site_solver`, `_loop_results`), the linear
system a loop applies through one call site (`_linear_system`), and flat views of
operators and vectors (`_flat_vectors`)."""
