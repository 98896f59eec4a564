"""Solvers (one-`mv`-site iterative solvers, `linear_solve`, `batch_solve`)."""
