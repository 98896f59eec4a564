"""`CostModel`: the machine constants of the decision rule."""

import dataclasses

import equinox as eqx
import jax

from ..._compat import XLA_OUTLINE
from ..._validate import check_positive_int, check_positive_real, check_tolerance
from .._materialise import Materialise
from .._outline import Outline
from .._roll import Roll


class CostModel(eqx.Module):
    """Machine constants for [`lineax_dispatch.decide`][], in seconds, bytes and
    flops.

    The defaults were fitted on a 2-core XLA:CPU machine. Give `Auto` your own
    when its choices do not suit your machine.

    !!! Example

        ```python
        model = lxd.CostModel(flops_per_second=5e13, bytes_per_second=3e12)
        policy = lxd.Auto(cost_model=model)
        ```

    **Arguments:** (all have defaults; each is also the attribute of that name)

    - `flops_per_second`: throughput of dense batched work (building a matrix).
    - `bytes_per_second`: memory bandwidth (a matrix-vector product, an `mv`) for
        arrays larger than the last-level cache.
    - `cache_bytes`: the last-level cache (0: none): an `mv` whose operator's
        arrays and intermediates fit in it, run again and again, reads them at
        `cache_bytes_per_second` (so does a product with a matrix that fits).
    - `cache_bytes_per_second`: the rate of those reads.
    - `compile_per_dot`, `compile_per_op`: compile time of one dot product, and
        of any other operation, in one copy of `mv` (XLA:CPU emits code for each
        matrix-vector product, which is slow to compile).
    - `compile_per_site`: compile time every call site of a program adds whatever
        its strategy (the code around the call, the call itself).
    - `compile_per_batched_dot`: compile time of one dot product applied to a
        block of vectors (as when building the matrix, or in a stacked `Roll`: a
        library call).
    - `materialise_fixed`: compile time of the machinery of one matrix build.
    - `outline_native`: whether `Outline` is a call XLA keeps out of line
        (`jax.Inline.XLA_LATE`, jax >= 0.11: no host callback, native run speed);
        else a host callback (jax 0.10). Defaults to what this JAX has.
    - `outline_callbacks`: without `outline_native`, whether an outlined call (a
        host callback running its callee's executable while the program runs)
        can run on the backend: on XLA:CPU; on an accelerator the callee waits
        for the device that the calling program holds, and the program never
        ends. [`lineax_dispatch.Auto`][] sets it from the default backend.
    - `outline_clone`: with `outline_native`, the fraction of one copy of `mv`'s
        compile time that every further outlined site still pays (XLA:CPU clones
        a called computation for each of its callers before it emits code: 1.0,
        as `python -m benchmarks.callsites` measures; lower on a backend that
        compiles the callee once).
    - `outline_site`: compile time of one outlined call site (a host callback).
    - `outline_call`: fixed run-time cost of one outlined call (a host callback).
    - `callback_bytes_per_second`: rate at which an outlined call hands the
        operator's arrays to its callee (a host callback).
    - `matmul_site`: compile time of one matrix-vector product site.
    - `build_chunk`: columns built together when materialising.
    - `factor_flops_per_second`: throughput of a dense factorisation (LU,
        Cholesky, QR), for `AutoSolver`'s choice between direct and iterative.
    - `krylov_compile`: compile time of an iterative solver's loop, beyond its
        copy of `mv`.
    - `krylov_step`: fixed run time of one iteration of an iterative solver.
    - `roll_fixed`: compile time of the loop of a rolled group of call sites.
    - `roll_site`: compile time each rolled call site adds (its step's code, its
        entry in the loop's tables).
    - `roll_step`: fixed run time of one step of a rolled loop.
    - `solve_copy`: compile time each further copy of a repeated solve adds beyond
        its copy of `mv` (JAX lowers the solve's trace once; XLA:CPU clones it):
        `lxd.jit` rolls k solves of the user's only where the k - 1 copies it
        saves cost more than rolling them.
    - `inline_compile`: compile time of [`lineax_dispatch.CG`][]'s inline layout
        beyond its one-site loop, besides the inline layout's two further copies
        of `mv` (a `lax.cond` and the stopping test before it).
    - `fused_test_compile`: compile time the one-site loop of
        [`lineax_dispatch.CG`][] saves below `FUSED_TEST_BELOW` unknowns by taking
        its stopping test and `gamma` in one reduction, where the inline layout
        has a test before its `lax.cond` and another inside it: added to
        `inline_compile` there.
    - `update_cond_compile`: compile time of the `lax.cond` in which
        [`lineax_dispatch.CG`][] updates its residual where that runs faster
        (from `UPDATE_IN_COND` unknowns on), against the plain expression.
    - `compile_per_constant_byte`: compile time a copy of `mv` adds per byte of
        the constants it holds (arrays the program closes over rather than takes
        as arguments): XLA:CPU compiles each copy with its constants.
    - `refresh_pass`: run time of one residual pass of CG's one-site loop beyond
        its `mv` and its vector traffic: what the inline layout saves for each
        refresh and each check of the true residual.
    - `departure_margin`: how much cheaper than lineax's behaviour (`Lazy`)
        `Roll` or `Outline` must be estimated before `Auto` departs from it: the
        factor by which the model's estimated gain was measured to exceed the
        real one on the backend. 1 on XLA:CPU, where the constants were fitted;
        more on a backend where they are scaled from the CPU's (a wrong
        departure costs more than a missed one).
    - `materialise_margin`: the same for `Materialise`.
    - `source`: where the constants come from, as `lxd.explain` reports it.

    Where a user gives no cost model, `Auto` and `AutoSolver` use this machine's:
    these defaults with every constant that depends on the machine scaled by a
    few micro-measurements taken at first use and cached per machine (see
    `lineax_dispatch.policies.machine_cost_model`; `LINEAX_DISPATCH_CALIBRATION=off`
    keeps the defaults).
    """

    # Fitted to benchmarks/results/auto.json (2-core XLA:CPU, jax 0.10.2): the
    # compile and run times of every fixed strategy at 1, 4 and 16 sites.
    flops_per_second: float = 1.5e11
    # The Lazy run per mv in benchmarks/results/auto.json: weights larger than the
    # last-level cache (`bytes_per_second`) and within it (`cache_bytes_per_second`).
    bytes_per_second: float = 2.7e10
    cache_bytes: int = 32 * 2**20
    cache_bytes_per_second: float = 5e10
    compile_per_dot: float = 1e-2
    compile_per_op: float = 2e-4
    compile_per_site: float = 2e-2
    compile_per_batched_dot: float = 2e-3
    materialise_fixed: float = 0.08
    outline_native: bool = XLA_OUTLINE is not None
    outline_callbacks: bool = True
    outline_clone: float = 1.0
    outline_site: float = 2e-2
    outline_call: float = 1e-4
    callback_bytes_per_second: float = 3e9
    matmul_site: float = 1e-2
    build_chunk: int = 128
    factor_flops_per_second: float = 2e10
    krylov_compile: float = 0.25
    krylov_step: float = 5e-6
    roll_fixed: float = 0.015
    roll_site: float = 6e-3
    roll_step: float = 1e-5
    # Fitted to `lxd.jit` programs of k dependent solves, rolled and not, of the
    # fit half of `benchmarks.families_cases`.
    solve_copy: float = 5e-3
    # Fitted to CG on 1-D operators (a diagonal, a three-point stencil) at n = 64
    # and 4096, one site against inline.
    inline_compile: float = 3e-3
    # Fitted to CG on the same two at n = 64: the compile the one-site loop saves
    # by taking its stopping test as one reduction.
    fused_test_compile: float = 1e-2
    # Fitted to CG on the 2-D five-point stencil at n = 4096: what the residual
    # update's `lax.cond` adds to the compile.
    update_cond_compile: float = 1.5e-2
    # Fitted to a 4096 x 4096 float32 matrix closed over, as the operator's array
    # and as a closure's constant, per copy of `mv`.
    compile_per_constant_byte: float = 3e-9
    # Fitted to CG on the 2-D five-point stencil at n = 1024 and 4096
    # (`benchmarks.steady`'s operator), one site against inline.
    refresh_pass: float = 1.5e-6
    departure_margin: float = 1.0
    materialise_margin: float = 1.0
    source: str = "defaults (fitted on a 2-core XLA:CPU machine, jax 0.10.2)"

    def margin(self, policy: type) -> float:
        """How much cheaper than `Lazy` a policy of class `policy` must be estimated
        before `Auto` departs for it: `departure_margin` for `Roll` and `Outline`,
        `materialise_margin` for `Materialise`, 1 for any other."""
        if policy is Materialise:
            return self.materialise_margin
        return self.departure_margin if policy in (Roll, Outline) else 1.0

    def margins(self) -> dict[str, float]:
        """Each strategy's margin over `Lazy` (`margin`), by its policy class's name.

        **Returns:**

        A dict from strategy name to factor.
        """
        return {p.__name__: self.margin(p) for p in (Roll, Outline, Materialise)}

    def __check_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "source":
                if not isinstance(value, str):
                    raise TypeError(
                        "`CostModel(source=...)` must be a str (where the constants "
                        f"come from); got {type(value).__name__}."
                    )
            elif field.name == "build_chunk":
                check_positive_int(value, f"CostModel({field.name}=...)")
            elif field.name in ("outline_callbacks", "outline_native"):
                if not isinstance(value, bool):
                    raise TypeError(
                        f"`CostModel({field.name}=...)` must be a bool; got "
                        f"{type(value).__name__}."
                    )
                if field.name == "outline_native" and value and XLA_OUTLINE is None:
                    raise ValueError(
                        "`CostModel(outline_native=True)` needs a JAX with "
                        "`jax.Inline.XLA_LATE` (jax >= 0.11); this is jax "
                        f"{jax.__version__}."
                    )
            elif field.name == "outline_clone":
                check_tolerance(value, f"CostModel({field.name}=...)")
                if value > 1.0:
                    raise ValueError(
                        "`CostModel(outline_clone=...)` is a fraction in [0, 1]; got "
                        f"{value!r}."
                    )
            elif field.name in ("departure_margin", "materialise_margin"):
                check_positive_real(value, f"CostModel({field.name}=...)")
                if value < 1.0:
                    raise ValueError(
                        f"`CostModel({field.name}=...)` is a factor of at least 1; "
                        f"got {value!r}."
                    )
            elif "per_second" in field.name:
                # A rate divides: zero would make every decision divide by zero.
                check_positive_real(value, f"CostModel({field.name}=...)")
            else:
                check_tolerance(value, f"CostModel({field.name}=...)")
