"""How a program of `lxd.jit` compiled ahead of time (`.lower(...).compile()`) is
called: as `jax.jit`'s compiled functions are."""

from typing import Any

import jax.tree_util as jtu

from ._arguments import Arguments, split_arguments, static_key, StaticSpec


class CallConvention:
    """How a compiled program of `lxd.jit` (`.lower(...).compile()`) is called:
    as `jax.jit`'s is, without the arguments `static_argnums` / `static_argnames`
    make static, the others with the structure and static leaves (Python numbers,
    operators' functions...) they were lowered with.

    **Arguments:**

    - `spec`: the function's static arguments.
    - `args`, `kwargs`: the arguments it was lowered with.
    - `split`: those arguments, split.
    """

    def __init__(self, spec: StaticSpec, args: tuple, kwargs: dict, split: Arguments):
        nums, names = spec.positions(len(args))
        self._spec = spec
        self._count = len(args)
        self._static_args = {i: args[i] for i in sorted(nums) if i < len(args)}
        self._static_kwargs = {k: v for k, v in kwargs.items() if k in names}
        self._tree = self._call_tree(
            tuple(a for i, a in enumerate(args) if i not in self._static_args),
            {k: v for k, v in kwargs.items() if k not in self._static_kwargs},
        )
        self._static_key = static_key(split.key)

    @property
    def positional(self) -> bool:
        """Whether no argument is static whole: the call's arguments are the
        program's, static leaves and all (see `LastCall`)."""
        return not self._spec.any_static

    @staticmethod
    def _call_tree(args: tuple, kwargs: dict) -> Any:
        return jtu.tree_structure((args, kwargs))

    def split(self, args: tuple, kwargs: dict) -> Arguments:
        """A call's arguments (without the static ones), split as the lowered
        ones were, with the static ones put back.

        **Arguments:**

        - `args`, `kwargs`: the call's arguments.

        **Returns:**

        An `Arguments`.

        **Raises:**

        `TypeError`, as `jax.jit`'s compiled functions raise it, where their
        structure is not the lowered one; where a static leaf is not the lowered
        one (under `lxd.jit`'s rule, a Python number or an operator's function is
        part of the program).
        """
        tree = self._call_tree(args, kwargs)
        if tree != self._tree:
            raise TypeError(
                "Function compiled with input pytree does not match the input "
                f"pytree it was called with. Compiled for {self._tree}, called with "
                f"{tree}. (As for `jax.jit`, the arguments that `static_argnums` "
                "and `static_argnames` make static are left out of the call.)"
            )
        full = list(args)
        for i, value in self._static_args.items():
            full.insert(i, value)
        split = split_arguments(
            self._spec, tuple(full), {**kwargs, **self._static_kwargs}
        )
        if static_key(split.key) != self._static_key:
            raise TypeError(
                "Function compiled for other static leaves of its arguments than "
                "those it was called with: under `lxd.jit` a Python number, a "
                "string, a function (an operator's) is static, part of the compiled "
                "program, which takes no other value of it. Lower it again for "
                "these arguments."
            )
        return split
