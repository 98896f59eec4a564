"""The package's layers and the direction of their imports, read from the modules'
own import statements (at any depth: an import inside a function counts).

Imports run one way, from the bottom up:

1. `_compat`, `_validate`, `_explicit_axes`, `_jaxpr`, `_precision`,
    `_reductions`: JAX's internals per version, argument checks, shardings,
    jaxpr helpers, the precision of batched products, reductions as XLA:CPU
    compiles them cheaply;
2. `policies/_policy_interface.py`: the policy interface;
3. `policies/calls/`: marked calls, keys, the trace's scope, the recorder
    interface a traced `mv` or solver `init` records through, source sites;
4. the policy classes (`policies/_*.py` but `_policy_interface` and `_auto`),
    with the memory guard;
5. `policies/decision/`: the rule `Auto` decides by;
6. `policies/_auto.py` and the `policies` package;
7. `operators/`;
8. `preconditioners/`: Jacobi and block Jacobi built from an operator, and the
    solver that builds them;
9. `solvers/`: `skeleton/` (the base class of the iterative solvers, the system
    their loops apply, flat vectors), the solvers (`cg/`, `lsmr/`, one module
    each for the others), `batch/`, `AutoSolver`, `PolicySolver`;
10. `program/` (`lxd.jit`, `explain`), whose stages also run one way: arguments,
    errors and the trace's session (the recorder, and the jit-cache context),
    `analyse/`, `rewrite/` (each policy's rule, registered by policy class, that
    the decide stage picks and plans with), `_decide`, `_trace` (which traces
    again where the decide stage finds solves better decided together),
    `_compiled`, `_jit`, `_explain`;
11. the package's `__init__`.

A module may import its own layer or a lower one. An import upwards fails the
suite, and `test_an_upward_import_is_found` shows that it would.

No module imports itself back, through any chain of imports
(`test_no_import_cycle`; `test_an_added_cycle_is_found` shows the check at
work). Neither the number of lines of a module nor the number of modules in a
folder is capped: what a module holds decides the files. Functions stay short
(60 lines), and the repository's other text files (docs, tests, benchmarks and
their JSON results) stay under 400 lines each.
"""

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lineax_dispatch"

# (layer, module name prefixes), bottom first. A module belongs to the layer of
# its longest matching prefix.
LAYERS = (
    (
        "base",
        (
            "lineax_dispatch._compat",
            "lineax_dispatch._validate",
            "lineax_dispatch._explicit_axes",
            "lineax_dispatch._jaxpr",
            "lineax_dispatch._precision",
            "lineax_dispatch._reductions",
        ),
    ),
    ("policy interface", ("lineax_dispatch.policies._policy_interface",)),
    ("policies.calls", ("lineax_dispatch.policies.calls",)),
    ("policy classes", ("lineax_dispatch.policies._",)),
    ("policies.decision", ("lineax_dispatch.policies.decision",)),
    ("policies", ("lineax_dispatch.policies._auto", "lineax_dispatch.policies")),
    ("operators", ("lineax_dispatch.operators",)),
    ("preconditioners", ("lineax_dispatch.preconditioners",)),
    ("solvers", ("lineax_dispatch.solvers",)),
    (
        "program: arguments, errors, session",
        (
            "lineax_dispatch.program._arguments",
            "lineax_dispatch.program._call_convention",
            "lineax_dispatch.program._errors",
            "lineax_dispatch.program._session",
        ),
    ),
    ("program: analyse", ("lineax_dispatch.program.analyse",)),
    ("program: rewrite", ("lineax_dispatch.program.rewrite",)),
    ("program: decide", ("lineax_dispatch.program._decide",)),
    ("program: trace", ("lineax_dispatch.program._trace",)),
    ("program: compiled", ("lineax_dispatch.program._compiled",)),
    ("program: jit", ("lineax_dispatch.program._jit",)),
    ("program: explain", ("lineax_dispatch.program._explain",)),
    ("program", ("lineax_dispatch.program",)),
    ("package", ("lineax_dispatch",)),
)


def layer_of(module: str) -> int:
    """The index in `LAYERS` of `module`'s layer (its longest matching prefix)."""
    best, length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(
                prefix if prefix.endswith("_") else prefix + "."
            )
            if matches and len(prefix) > length:
                best, length = index, len(prefix)
    assert best is not None, f"{module} is in no layer"
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The modules of this package that `path` imports (a `from . import x` of a
    submodule counts as an import of that submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if node.module or not node.level:
                found.add(module)  # not `from . import x`: that imports x only
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                if _exists(candidate):
                    found.add(candidate)
    return {
        m for m in found if m == "lineax_dispatch" or m.startswith("lineax_dispatch.")
    }


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, as `"importer (layer) -> imported
    (layer)"`. A package's `__init__` may import its own modules."""
    found = []
    for importer, imported in sorted(graph.items()):
        here = layer_of(importer)
        for target in sorted(imported):
            if target.startswith(importer + "."):
                continue  # a package's own modules
            there = layer_of(target)
            if there > here:
                found.append(
                    f"{importer} ({LAYERS[here][0]}) -> {target} ({LAYERS[there][0]})"
                )
    return found


def test_imports_run_one_way():
    graph = import_graph()
    assert len(graph) > 50  # the whole package was read
    assert upward_imports(graph) == []


def test_an_upward_import_is_found():
    """The check fails on an added upward import: the cost model importing
    `lxd.jit`, a solver importing the program's rewrite, the marked calls
    importing a policy class."""
    added = {
        "lineax_dispatch.policies.decision._cost": "lineax_dispatch.program._jit",
        "lineax_dispatch.solvers._prepare": "lineax_dispatch.program.rewrite._roll_loop",
        "lineax_dispatch.policies.calls._marked": "lineax_dispatch.policies._lazy",
        "lineax_dispatch.program.analyse._groups": "lineax_dispatch.program._decide",
    }
    for importer, target in added.items():
        graph = import_graph()
        assert importer in graph and target in graph
        graph[importer] = graph[importer] | {target}
        (found,) = upward_imports(graph)
        assert found.startswith(importer) and target in found


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of `graph` that hold a cycle (two
    modules or more, or one that imports itself): the modules that import one
    another back through some chain of imports, of any length."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module] & graph.keys()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while module not in component:
                component.add(stack.pop())
            if len(component) > 1 or module in graph[module]:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _chain(graph: dict[str, set[str]], cycle: frozenset[str]) -> str:
    """One cycle through the first module of `cycle`, as `a -> b -> ... -> a`."""
    start = min(cycle)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module] & cycle):
            if target == start:
                return " -> ".join(paths[module] + [start])
            if target not in paths:
                paths[target] = paths[module] + [target]
                queue.append(target)
    raise AssertionError(cycle)


def test_no_import_cycle():
    graph = import_graph()
    assert [_chain(graph, cycle) for cycle in import_cycles(graph)] == []


def test_an_added_cycle_is_found():
    """An import back, through a short chain (the operators' shardings importing
    the operators package, which imports them through the operator classes) or
    a long one (JAX's internals importing `lxd.jit`), makes a cycle the check
    reports."""
    added = {
        "lineax_dispatch.operators._sharding": "lineax_dispatch.operators",
        "lineax_dispatch._compat": "lineax_dispatch.program._jit",
    }
    for importer, target in added.items():
        graph = import_graph()
        assert importer in graph and target in graph
        before = import_cycles(graph)
        graph[importer] = graph[importer] | {target}
        (cycle,) = [c for c in import_cycles(graph) if c not in before]
        chain = _chain(graph, cycle).split(" -> ")
        assert chain[0] == chain[-1] and f"{importer} -> {target}" in " -> ".join(chain)


def _repository_text_files() -> list[Path]:
    """The repository's text files: every file below its root outside hidden
    folders (`.git`, virtual environments, caches), build output and packaging
    metadata, without a NUL byte (a PNG plot is not text)."""
    skipped = {"site", "__pycache__", "build", "dist"}
    found = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if any(
            p.startswith(".") or p in skipped or p.endswith(".egg-info") for p in parts
        ):
            continue
        if path.is_file() and b"\0" not in path.read_bytes():
            found.append(path)
    return found


def test_no_file_outside_the_package_is_over_400_lines():
    """Docs, tests, benchmarks, configuration and the benchmarks' JSON results.
    The package (`lineax_dispatch/`) is not held to it: its modules follow what
    they hold."""
    files = _repository_text_files()
    assert any(p.name == "README.md" for p in files)
    assert any(p.suffix == ".json" for p in files)
    long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if PACKAGE not in p.parents and (n := len(p.read_bytes().splitlines())) > 400
    }
    assert long == {}


def _function_lengths(path: Path) -> dict[str, int]:
    """Lines of each function of `path`, its docstring excluded."""
    lengths = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            doc = (
                body[0].end_lineno - body[0].lineno + 1
                if isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
                else 0
            )
            n = node.end_lineno - node.lineno + 1 - doc
            lengths[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    return lengths


def test_no_function_of_the_package_is_over_60_lines():
    """Functions short enough to hold in one's head (their docstrings aside)."""
    lengths = {}
    for path in PACKAGE.rglob("*.py"):
        lengths.update(_function_lengths(path))
    assert len(lengths) > 500
    assert {name: n for name, n in lengths.items() if n > 60} == {}
