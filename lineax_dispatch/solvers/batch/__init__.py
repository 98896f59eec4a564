"""`lxd.batch_mv` and `lxd.batch_solve` (`_batch_solve`), over a device mesh and
chunk by chunk (`_mesh_chunks`)."""

from ._batch_solve import batch_mv as batch_mv, batch_solve as batch_solve
