"""The package imports downward only: every module's imports (those inside functions included) go to its own layer
or a lower one, and no two modules import each other, directly or around a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import attnkit

SRC = Path(attnkit.__file__).parent

# The first name under attnkit -> its layer. A module may import only from its own layer or below.
LAYERS = {
    # 0: what everything may use: the error type, atomic files, environment checks, the configs.
    "errors": 0,
    "atomic": 0,
    "compat": 0,
    "devices": 0,
    "allocator": 0,
    "config": 0,
    # 1: the paper's model, tokenizers and data reading / batching: built from configs, unaware of training.
    "model": 1,
    "tokenization": 1,
    "data": 1,
    # 2: what runs a built model without changing it: searches (§6.1) and metrics.
    "decoding": 2,
    "evaluation": 2,
    # 3: training machinery (loop, optimizer, state) and the run-directory format it writes and readers load.
    "training": 3,
    "runs": 3,
    # 4: the tasks, each using training for its training and runs for its inference; the two user-facing facades.
    "tasks": 4,
    "classify": 4,
    "translate": 4,
    # 5: what works on trained runs from the outside: conversions, analyses, benchmarks, serving.
    "interop": 5,
    "analysis": 5,
    "bench": 5,
    "serving": 5,
    # 6: the command line, which may call anything.
    "cli": 6,
    # `python -m attnkit` (and `torchrun -m attnkit`): the command line under another name.
    "__main__": 6,
    # "" is attnkit/__init__: the public Python API (`attnkit.ClassifierRun`, ...), imported lazily from every layer
    # below, and the version. Only `from attnkit import __version__` reaches it from inside (see _imports).
    "": 7,
}
# attnkit.classify and attnkit.translate re-export the tasks for users; attnkit itself must not depend on them.
FACADES = {"attnkit", "attnkit.classify", "attnkit.translate"}
KNOWN_UPWARD: set[tuple[str, str]] = set()  # none: an exception here needs a reason written beside it
KNOWN_CYCLES: set[frozenset[str]] = set()


def _module_name(path: Path) -> str:
    parts = ["attnkit", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def _resolve(name: str) -> str:
    """The module an import refers to: ``name`` itself or, for ``from package import name``, its package."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str) -> set[str]:
    """attnkit modules imported anywhere in ``module`` (top level, functions, TYPE_CHECKING blocks alike)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]  # a submodule, or a name in ``base``
        else:
            continue
        # The version string is a constant at the top of attnkit/__init__, defined before anything is imported: reading
        # it depends on no layer.
        names = [name for name in names if name != "attnkit.__version__"]
        found |= {_resolve(name) for name in names if name == "attnkit" or name.startswith("attnkit.")}
    found.discard(module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    assert top in LAYERS, f"{module}: not in the layer table; add attnkit.{top} to LAYERS with its reason"
    return LAYERS[top]


def test_the_public_api_sees_the_tasks():
    # attnkit/__init__ imports its names only for type checkers (and lazily at run time); the graph sees them.
    assert "attnkit.tasks.classify.predict" in GRAPH["attnkit"]


def test_the_graph_sees_imports_inside_functions():
    # analysis.attention imports decoding inside a function only; the graph must still have the edge.
    assert "attnkit.decoding" in GRAPH["attnkit.analysis.attention"]
    assert "attnkit.runs" in GRAPH["attnkit.tasks.classify.predict"]


def test_every_import_goes_to_the_same_or_a_lower_layer():
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if layer(target) > layer(module) and (module, target) not in KNOWN_UPWARD
    ]
    assert not upward, "\n".join(upward)


def test_nothing_inside_attnkit_imports_the_user_facades():
    users = [f"{module} imports {target}" for module, targets in GRAPH.items() for target in targets & FACADES]
    assert not users, "\n".join(users)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return components


def test_no_import_cycles():
    known = {frozenset(pair) for pair in KNOWN_CYCLES}
    cycles = []
    for component in _cycles():
        # A component made only of known pairs is tolerated; anything more is a new cycle.
        edges = {frozenset((a, b)) for a in component for b in GRAPH[a] if b in component}
        if not edges <= known:
            cycles.append(" <-> ".join(component) + f" (edges: {sorted(tuple(sorted(e)) for e in edges - known)})")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_finds_a_cycle():
    GRAPH["attnkit.errors"].add("attnkit.config")
    try:
        assert any({"attnkit.errors", "attnkit.config"} <= set(component) for component in _cycles())
    finally:
        GRAPH["attnkit.errors"].discard("attnkit.config")
