"""The solver pairs of `solvers.py`: each lineax-dispatch solver and its lineax
counterpart, with the same `rtol`, `atol` and `max_steps` on both sides and
lineax's defaults for everything else."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import lineax as lx


RTOL = 1e-5
ATOL = 1e-5
MAX_STEPS = 500


@dataclass(frozen=True)
class Pair:
    key: str
    ours_name: str
    lineax_name: str
    # `(module, rtol, atol, max_steps) -> solver`, module being lxd.solvers or lx.
    make_ours: Callable
    make_lineax: Callable
    needs: tuple[str, ...]  # names of lineax_dispatch.solvers the ours side needs


def _iterative(name: str) -> Callable:
    def make(module, rtol, atol, max_steps):
        return getattr(module, name)(rtol=rtol, atol=atol, max_steps=max_steps)

    return make


def _normal_cg(module, rtol, atol, max_steps):
    return module.Normal(module.CG(rtol=rtol, atol=atol, max_steps=max_steps))


PAIRS = {
    p.key: p
    for p in (
        Pair("cg", "lxd.CG", "lx.CG", _iterative("CG"), _iterative("CG"), ("CG",)),
        Pair(
            "bicgstab",
            "lxd.BiCGStab",
            "lx.BiCGStab",
            _iterative("BiCGStab"),
            _iterative("BiCGStab"),
            ("BiCGStab",),
        ),
        Pair(
            "gmres",
            "lxd.GMRES",
            "lx.GMRES",
            _iterative("GMRES"),
            _iterative("GMRES"),
            ("GMRES",),
        ),
        Pair(
            "lsmr",
            "lxd.LSMR",
            "lx.LSMR",
            _iterative("LSMR"),
            _iterative("LSMR"),
            ("LSMR",),
        ),
        Pair(
            "normal",
            "lxd.Normal(lxd.CG)",
            "lx.Normal(lx.CG)",
            _normal_cg,
            _normal_cg,
            ("Normal", "CG"),
        ),
        Pair(
            "minres",
            "lxd.MINRES",
            "lx.CG (no lx.MINRES)",
            _iterative("MINRES"),
            _iterative("CG"),
            ("MINRES",),
        ),
    )
}
SIDES = ("lineax", "ours")


def available_pairs(keys: Sequence[str]) -> tuple[list[Pair], dict[str, str]]:
    """The selected pairs whose lineax-dispatch solvers import, and a note for each
    one skipped."""
    try:
        import lineax_dispatch.solvers as ours_module
    except Exception as e:  # pragma: no cover - the package is being written
        return [], {k: f"lineax_dispatch.solvers does not import: {e!r}" for k in keys}
    pairs, skipped = [], {}
    for key in keys:
        pair = PAIRS[key]
        missing = [name for name in pair.needs if not hasattr(ours_module, name)]
        if missing:
            skipped[key] = "lineax_dispatch.solvers has no " + ", ".join(missing)
            continue
        try:
            make_solver(pair, "ours", RTOL, ATOL, MAX_STEPS)
        except Exception as e:
            skipped[key] = f"{pair.ours_name} cannot be built: {e!r}"
            continue
        pairs.append(pair)
    return pairs, skipped


def make_solver(pair: Pair, side: str, rtol: float, atol: float, max_steps: int):
    import lineax_dispatch.solvers as ours_module

    if side == "ours":
        return pair.make_ours(ours_module, rtol, atol, max_steps)
    return pair.make_lineax(lx, rtol, atol, max_steps)


def result_name(index: int) -> str:
    try:
        names = {
            int(item._value): name for name, item in lx.RESULTS._name_to_item.items()
        }
        return names.get(index, str(index))
    except Exception:  # pragma: no cover - equinox internals changed
        return str(index)
