"""The package's layer order holds for every import, function-local ones included.

An import inside a function is still an import: it hides a cycle from Python's import
graph but not from a reader.  Each part (a folder, or a top-level module) may import
only parts of lower layers or its own; no part reaches into another's private names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

import pytest_llmenergy
from pytest_llmenergy.layers import LAYERS, SHARED_NAMES

ROOT = Path(pytest_llmenergy.__file__).parent
PACKAGE = ROOT.name

RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _part(module: str) -> str:
    """``pytest_llmenergy.routing.route_plots`` -> ``routing``; the package itself: ``__init__``."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        names = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if names[-1] == "__init__":
            names.pop()
        yield ".".join(names), path


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _imports(module: str, path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, imported module, imported name or "") for every import of the package,
    wherever it stands in the file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield node.lineno, alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if _is_module(sub):  # ``from . import plots``: the module is imported
                    yield node.lineno, sub, ""
                else:
                    yield node.lineno, source, alias.name


MODULES = list(_modules())


def test_every_part_has_a_layer() -> None:
    parts = {_part(m) for m, _ in MODULES}
    assert parts == set(RANK), "add new parts to LAYERS in pytest_llmenergy/layers.py"


def test_module_names_are_unique() -> None:
    """A file's name says which one it is: no two modules share one (``__init__`` aside,
    and the deprecated aliases ``SHARED_NAMES`` explains)."""
    seen: dict[str, list[str]] = {}
    for _, path in MODULES:
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert set(twice) == set(SHARED_NAMES), twice


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_upward_import_and_no_private_reach(module: str, path: Path) -> None:
    mine = _part(module)
    wrong = []
    for line, source, name in _imports(module, path):
        theirs = _part(source)
        if theirs == mine:
            continue
        if RANK[theirs] >= RANK[mine]:
            wrong.append(f"{path.name}:{line} imports {source} (layer of {theirs!r})")
        if name.startswith("_") and name != "__version__":
            wrong.append(f"{path.name}:{line} uses {theirs}'s private {name}")
    assert not wrong, "\n".join(wrong)


def _loops(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import loops of ``graph`` (module -> the modules it imports): each strongly
    connected set of more than one module, found by Tarjan's algorithm (iteratively,
    so a long chain of imports needs no deep recursion), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(
                (w for w in edges if w in graph and (w not in index or w in on_stack)), None
            )
            if step is not None:
                if step in index:
                    low[node] = min(low[node], index[step])
                else:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                found = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    found.append(member)
                    if member == node:
                        break
                if len(found) > 1:
                    loops.append(sorted(found))
    return sorted(loops)


def _graph_within_parts() -> dict[str, set[str]]:
    """Each module's imports of modules of its own part, function-local and
    TYPE_CHECKING ones included (a reader follows those too)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES:
        mine = _part(module)
        graph[module] = {
            source
            for _, source, _ in _imports(module, path)
            if _part(source) == mine and source != module
        }
    return graph


def test_no_import_loop_inside_a_part() -> None:
    """Parts import only lower layers, so no loop crosses parts; inside one, modules
    import each other in one direction too: a loop (``base`` needs ``marks`` needs
    ``base``) means neither can be read, tested or moved without the other."""
    loops = _loops(_graph_within_parts())
    assert not loops, "import loops: " + "; ".join(" <-> ".join(loop) for loop in loops)


def test_the_checker_finds_a_loop() -> None:
    """The check itself: a loop through three modules, beside a chain that is none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _loops(graph) == [["a", "b", "c"]]
    assert _loops({"a": {"b"}, "b": set()}) == []


def test_the_checker_sees_function_local_imports(tmp_path: Path) -> None:
    """The check itself: an import inside a function is found like any other."""
    source = tmp_path / "profile.py"
    source.write_text("def f():\n    from ..frontier import swept\n    return swept\n")
    found = list(_imports(f"{PACKAGE}.routing.profile", source))
    assert found == [(2, f"{PACKAGE}.frontier", "swept")]
    assert RANK[_part(found[0][1])] > RANK["routing"]
