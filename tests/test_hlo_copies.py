"""`benchmarks.dependent_sites.copies_started`: the bytes a compiled program copies
into on-chip memory, in its loops' bodies (per trip) and elsewhere (once), read
from optimised HLO as XLA:TPU writes it."""

import types

import jax
import jax.numpy as jnp

from benchmarks.dependent_sites import copies_started


# The shape of XLA:TPU's optimised HLO (abridged from a TPU v5e's): a weight
# brought on chip by a `copy-start` in the loop's body, two quarters of another
# by `slice-start`s there, a vector in a branch the body calls, a small one in the
# loop's condition; a vector in the entry computation, another in a branch it
# calls; and a copy that stays in HBM (no `S(1)`), which is not counted.
_TPU_TEXT = """\
HloModule jit_rolled

%body.3 (arg: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %copy-start = (f32[1024,1024]{1,0:T(8,128)S(1)}, f32[1024,1024]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%get-tuple-element.1486)
  %slice-start = ((f32[1024,1024]{1,0:T(8,128)}), f32[256,1024]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) slice-start(%get-tuple-element.1488), slice={[0:256], [0:1024]}
  %slice-start.1 = ((f32[1024,1024]{1,0:T(8,128)}), f32[256,1024]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) slice-start(%get-tuple-element.1488), slice={[256:512], [0:1024]}
  %copy-start.9 = (f32[512]{0:T(512)}, f32[512]{0:T(512)}, u32[]{:S(2)}) copy-start(%get-tuple-element.7)
  %conditional = f32[1024] conditional(%p, %a, %b), branch_computations={%branch.6, %branch.7}
}

%branch.6 (a: f32[1024]) -> f32[1024] {
  %copy-start.3 = (f32[256]{0:T(256)S(1)}, f32[256]{0:T(256)}, u32[]{:S(2)}) copy-start(%a)
}

%branch.7 (a: f32[1024]) -> f32[1024] {
}

%branch.8 (a: f32[1024]) -> f32[1024] {
  %copy-start.4 = (f32[128]{0:T(128)S(1)}, f32[128]{0:T(128)}, u32[]{:S(2)}) copy-start(%a)
}

%cond.4 (arg: (s32[], f32[1024])) -> pred[] {
  %copy-start.2 = (f32[8]{0:T(8)S(1)}, f32[8]{0:T(8)}, u32[]{:S(2)}) copy-start(%p)
}

ENTRY %main.5 (p0: f32[1024,1024], p1: f32[1024]) -> f32[1024] {
  %copy-start.1 = (f32[1024]{0:T(1024)S(1)}, f32[1024]{0:T(1024)}, u32[]{:S(2)}) copy-start(%p1)
  %while = (s32[], f32[1024]) while(%tuple), condition=%cond.4, body=%body.3
  %conditional.1 = f32[1024] conditional(%q, %c), branch_computations={%branch.8}
}
"""


def _compiled(text: str):
    return types.SimpleNamespace(as_text=lambda: text)


def test_copies_run_at_every_trip_apart_from_the_others():
    counts = copies_started(_compiled(_TPU_TEXT))
    weight = 1024 * 1024 * 4
    in_loops = weight + weight // 2 + 256 * 4 + 8 * 4
    assert counts == {"in_loops": in_loops, "outside": 1024 * 4 + 128 * 4}


def test_the_compiled_program_of_equinox_is_read_through():
    wrapped = types.SimpleNamespace(compiled=_compiled(_TPU_TEXT))
    assert copies_started(wrapped) == copies_started(_compiled(_TPU_TEXT))


def test_a_program_on_this_backend_reads_as_text():
    def looped(w, x):
        return jax.lax.fori_loop(0, 4, lambda i, x: jnp.tanh(w @ x), x)

    w, x = jnp.eye(8), jnp.ones(8)
    counts = copies_started(jax.jit(looped).lower(w, x).compile())
    assert set(counts) == {"in_loops", "outside"}
    if jax.default_backend() == "cpu":  # XLA:CPU has no on-chip memory space
        assert counts == {"in_loops": 0, "outside": 0}
