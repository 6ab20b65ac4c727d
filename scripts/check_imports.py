"""Check postcast's import graph: no import cycle, nothing below the CLI imports the CLI package, and each room
(:data:`ROOMS`) imports only its own modules and the rooms it stands on.

    python scripts/check_imports.py [ROOT]

Reads every module of the package (``cli/`` is ``postcast``, ``datasets/`` is ``postcast.datasets``, ...:
setup.py) with ``ast``, without importing anything, and builds the graph of its imports of its own modules:
every import counts, at the top, in a function or under ``if TYPE_CHECKING:``. ``from X import Y`` is an
edge to ``X.Y`` when that is a module, else (a name defined in ``X``) to ``X`` itself: a package's
``__init__`` is a node only where names are imported from it. Relative imports are resolved.

Prints each cycle (a strongly connected component, with one cycle through it and the lines that make it),
each import of the CLI package (``postcast`` itself or a module of ``cli/``) by a module of a layer and each
import out of a room to a module it does not stand on; exits 1 if there is any, else prints a summary and exits
0. tests/test_quality.py runs it (the direction between layers is its ``upward_imports``).
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CLI = "cli"  # the folder of the package `postcast`
LAYERS = ("datasets", "models", "compression", "pipeline", "serve")  # `postcast.<layer>`
# rooms inside the layers, and what each stands on besides itself (a module or package and all below it)
ROOMS = {
    # the forecast files' contract and the maps: the data layer only (no torch), so the service needs no more
    "postcast.pipeline.products": ("postcast.datasets",),
    # the service: the forecast products, not the pipeline that makes them
    "postcast.serve": ("postcast.datasets", "postcast.pipeline.products"),
    # the verification stage: the data, the models, an opened checkpoint and the maps, not training or forecast
    "postcast.pipeline.verify": (
        "postcast.datasets",
        "postcast.models",
        "postcast.pipeline.checkpoints",
        "postcast.pipeline.products",
    ),
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted, as installed: postcast.datasets.io
    path: Path
    is_package: bool  # an __init__.py


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # "datasets/io.py:12"


def modules(root: Path) -> dict[str, Module]:
    """Every module of the package in the tree at ``root``, by dotted name (``__main__`` included)."""
    found: dict[str, Module] = {}
    for folder in (CLI, *LAYERS):
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(PurePosixPath(path.relative_to(root).as_posix()).with_suffix("").parts)
            parts[0] = "postcast" if parts[0] == CLI else f"postcast.{parts[0]}"
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            found[name] = Module(name, path, package)
    return found


def _base(module: Module, level: int, name: str | None) -> str:
    """The absolute module a relative ``from`` import names (``level`` dots, then ``name``)."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".")
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*parts, name] if name else parts)


def _owner(name: str, known: dict[str, Module]) -> str | None:
    """``name`` if it is a module, else the closest enclosing module (``import a.b.c`` of a missing ``c``)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: Module, known: dict[str, Module], root: Path) -> list[Edge]:
    """The edges from ``module`` to the package's modules, one per imported module and line."""
    edges: list[Edge] = []
    rel = module.path.relative_to(root).as_posix()
    for node in ast.walk(ast.parse(module.path.read_text(), filename=str(module.path))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_owner(a.name, known) for a in node.names if a.name.split(".")[0] == "postcast"]
        else:
            base = _base(module, node.level, node.module) if node.level else node.module or ""
            if base.split(".")[0] != "postcast":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else _owner(base, known))
        edges += [Edge(module.name, t, f"{rel}:{node.lineno}") for t in dict.fromkeys(targets) if t is not None]
    return edges


def graph(root: Path) -> tuple[dict[str, Module], list[Edge]]:
    known = modules(root)
    return known, [e for m in known.values() for e in imports(m, known, root)]


def _components(nodes: list[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                out.append(sorted(comp))
    return out


def cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle through each strongly connected component of more than one module (or a module that imports
    itself), as its edges: the shortest way from the component's first module back to it."""
    succ: dict[str, list[str]] = {}
    by_pair: dict[tuple[str, str], Edge] = {}
    for e in edges:
        if (e.source, e.target) not in by_pair:
            by_pair[e.source, e.target] = e
            succ.setdefault(e.source, []).append(e.target)
    found = []
    for comp in _components(sorted(succ), succ):
        if len(comp) == 1 and (comp[0], comp[0]) not in by_pair:
            continue
        members, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first, back to start
            node = queue.popleft()
            if node == start and prev:
                break
            for nxt in sorted(succ.get(node, ())):
                if nxt in members and nxt not in prev:
                    prev[nxt] = node
                    queue.append(nxt)
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(prev[path[-1]])
        path.reverse()
        found.append([by_pair[a, b] for a, b in itertools.pairwise(path)])
    return found


def _is_cli(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "postcast" and (len(parts) == 1 or parts[1] not in LAYERS)


def cli_imports(edges: list[Edge]) -> list[Edge]:
    """Imports of the CLI package (``postcast`` itself, or a module of ``cli/``) by a module of a layer."""
    return [e for e in edges if not _is_cli(e.source) and _is_cli(e.target)]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def room_imports(edges: list[Edge]) -> list[tuple[Edge, str]]:
    """(edge, room) for each import by a module of a room of a module outside it and outside what it stands on."""
    return [
        (e, room)
        for e in edges
        for room, base in ROOMS.items()
        if _within(e.source, room) and not any(_within(e.target, r) for r in (room, *base))
    ]


def report(root: Path) -> tuple[list[str], int, int]:
    """(problems as lines, modules, edges) of the tree at ``root``."""
    known, edges = graph(root)
    lines = []
    for cycle in cycles(edges):
        chain = " -> ".join([cycle[0].source, *(f"{e.target} ({e.where})" for e in cycle)])
        lines.append(f"import cycle: {chain}")
    lines += [f"the CLI package imported below it: {e.where} imports {e.target}" for e in cli_imports(edges)]
    lines += [
        f"{e.where}: imports {e.target}, but {room} stands on {', '.join(ROOMS[room])} only"
        for e, room in room_imports(edges)
    ]
    return lines, len(known), len(edges)


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    problems, n_modules, n_edges = report(root)
    for line in problems:
        print(line)
    if problems:
        return 1
    print(
        f"no import cycle, no import of the CLI package below it and no room standing on more than it may "
        f"({', '.join(ROOMS)}): {n_modules} modules, {n_edges} imports"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
