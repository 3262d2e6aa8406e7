"""The package's import structure: no import cycles, and no module importing the facade of its own package.

Walks every module of ``ddim`` with ``ast`` (function-local imports count too)
and resolves each import to the module it names: ``from ddim.sampling import
process`` names the module ``ddim.sampling.process``; ``from ddim.sampling
import load`` names the package's ``__init__``, its facade.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ddim

ROOT = Path(ddim.__file__).parent


def _module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = ("ddim", *path.relative_to(ROOT).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


MODULES = _module_names()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _imports(name: str) -> set[str]:
    """The ``ddim`` modules that module ``name`` imports, anywhere in its code."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if _is_package(name) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("ddim"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("ddim"):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in MODULES else base)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def _room(name: str) -> str:
    """The part of the house a module belongs to: ``ddim.x`` for ``ddim.x`` and everything under it."""
    return ".".join(name.split(".")[:2])


def test_the_walk_sees_the_imports():
    assert "ddim.sampling.process" in GRAPH["ddim.sampling.programs"]
    assert "ddim.config" in GRAPH["ddim.model"]


def test_no_module_imports_in_a_cycle():
    assert _cycles(GRAPH) == []


def test_no_cycles_between_the_packages_and_modules_of_ddim():
    """Seen from above (``ddim.train``, ``ddim.sampling``, ``ddim.model``, ...) the imports form no loop either.

    ``ddim/__init__.py``, the public facade of the whole package, is left out: it sits on top by design.
    """
    rooms: dict[str, set[str]] = {}
    for name, imported in GRAPH.items():
        if name == "ddim":
            continue
        rooms.setdefault(_room(name), set()).update(_room(other) for other in imported if other != "ddim")
    for room, imported in rooms.items():
        imported.discard(room)
    assert _cycles(rooms) == []


def test_no_module_imports_the_facade_of_its_own_package():
    """A submodule takes names from its siblings; only ``__main__`` (``python -m``) runs its package."""
    upward = [
        (name, other)
        for name, imported in GRAPH.items()
        for other in imported
        if _is_package(other) and name.startswith(other + ".") and not name.endswith(".__main__")
    ]
    assert upward == []
