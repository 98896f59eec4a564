"""`lxd.LSMR`: the solver (`_lsmr`) and its loop's state and step (`_lsmr_step`)."""

from ._lsmr import LSMR as LSMR
