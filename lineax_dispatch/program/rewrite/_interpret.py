"""The one interpreter of the rewrite: every evaluator of `rewrite/` (the prologue
and epilogue of a roll or a stack, a rolled step's branch, the batched evaluation
of a stack, a materialised program, the splicing of inlined calls) runs a jaxpr's
equations through `eval_eqns`, which reads each equation's inputs (a literal's
value or the environment's), binds it or hands it to a rule, writes its outputs
(a dropped one is not written) and, where the caller says which values it reads
afterwards, drops each other value after the equation that reads it last, as
`jax.core.eval_jaxpr` does.

It evaluates with `primitive.bind`, so `jax.jit`, `grad`, `jvp` and `vmap` of a
rewritten program see ordinary JAX operations."""

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import jax.extend.core as jex

from ..._compat import bind_equation
from ..._jaxpr import is_literal


# `literal(i, q, atom)`: the value of the literal `atom`, input `q` of equation `i`.
Literal = Callable[[int, int, Any], Any]
# `rule(i, eqn, invals)`: the outputs of equation `i` (a list), or `None` to bind it.
Rule = Callable[[int, Any, list], list | None]


def read(env: dict, atom: Any, literal: Callable[[Any], Any] | None = None) -> Any:
    """The value of `atom`: `env[atom]` for a variable, for a literal its value
    (or `literal(atom)`, where given)."""
    if not is_literal(atom):
        return env[atom]
    return atom.val if literal is None else literal(atom)


def write(env: dict, outvars: Sequence[Any], values: Iterable[Any]) -> None:
    """Sets `env[var] = value` for each output variable that is not dropped."""
    for var, value in zip(outvars, values):
        if not isinstance(var, jex.DropVar):
            env[var] = value


def read_by(eqns: Iterable[Any], atoms: Iterable[Any] = ()) -> set:
    """The variables the equations `eqns` read, and those of `atoms`."""
    found = {v for v in atoms if not is_literal(v)}
    found.update(v for eqn in eqns for v in eqn.invars if not is_literal(v))
    return found


def last_reads(eqns: Sequence[Any], keep: Collection[Any]) -> list[list[Any]]:
    """Per equation of `eqns`, the variables it is the last to read, but those of
    `keep` (what `jax.core.eval_jaxpr` computes as `last_used`)."""
    seen = set(keep)
    last: list[list[Any]] = [[] for _ in eqns]
    for i in range(len(eqns) - 1, -1, -1):
        for v in eqns[i].invars:
            if not is_literal(v) and v not in seen:
                seen.add(v)
                last[i].append(v)
    return last


def eval_eqns(
    eqns: Sequence[Any],
    env: dict,
    literal: Literal | None = None,
    rule: Rule | None = None,
    keep: Collection[Any] | None = None,
) -> None:
    """Evaluates `eqns` in order, reading and writing `env` (Var -> value).

    **Arguments:**

    - `eqns`: the equations.
    - `env`: the values of the variables they read from outside; their outputs are
        added to it.
    - `literal`: `literal(i, q, atom)`, if given, the value of the literal input
        `q` of equation `i` (a step's literal read from a table); else its own.
    - `rule`: `rule(i, eqn, invals)`, if given, the outputs of equation `i` where
        it is not bound as it is (else `None`).
    - `keep`: the variables read after `eqns` (their values are kept in `env`);
        every other value leaves `env` after the equation that reads it last.
        `None`: all are kept (the whole environment is read afterwards).
    """
    last = None if keep is None else last_reads(eqns, keep)
    for i, eqn in enumerate(eqns):
        invals = [
            read(env, v) if literal is None or not is_literal(v) else literal(i, q, v)
            for q, v in enumerate(eqn.invars)
        ]
        outs = None if rule is None else rule(i, eqn, invals)
        write(env, eqn.outvars, bind_equation(eqn, invals) if outs is None else outs)
        if last is not None:
            for v in last[i]:
                env.pop(v, None)


def prologue(closed: Any, inputs: Sequence[Any], stop: int) -> dict:
    """The environment after running the equations of `closed` before index
    `stop` on `inputs` (its constants and inputs bound first), holding what the
    rest of the program reads."""
    jaxpr = closed.jaxpr
    env: dict = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, inputs))
    keep = read_by(jaxpr.eqns[stop:], jaxpr.outvars)
    eval_eqns(jaxpr.eqns[:stop], env, keep=keep)
    return env
