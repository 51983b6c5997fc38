"""The house rules of docs/architecture.md, read from the source: no import cycle, no arrow from a
lower floor to a higher one, and serving (dispatch, the engine adapters) never reaching the referee.

Every ``import`` / ``from ... import`` statement of every module under ``src/kernelslot`` counts,
lazy ones inside functions included; only ``if TYPE_CHECKING:`` blocks are left out (they never run).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kernelslot"

# Which package may import which: a module may import its own floor and the floors below it.
FLOORS = {
    "kernelslot": 0, "abi": 0, "formats": 0,  # the contract and the numeric formats
    "kernels": 1,  # built-in implementations
    "slots": 2,  # the catalog: spec + trusted reference + profiles per slot
    "bundle": 3,  # manifests, hashing, loading candidates, sealed direct artifacts
    "isolation": 4,  # where untrusted code runs (sandbox, workers, wire, observations)
    "dispatch": 5, "verify": 5,  # live routing; the referee
    "report": 6, "store": 6,  # what the referee produced, rendered and kept
    "engines": 7,  # engine adapters, e2e qualification
    "service": 7,  # the admission service: store, Ray workers running `kernelslot verify`, leaderboard
    "cli": 8, "__main__": 9,
}
SELF_CONTAINED = ("abi", "formats")  # import nothing of ours but themselves
SERVING = ("dispatch", "engines.transformers")  # never import the referee, directly or through anything they import


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Import nodes of ``tree``, lazy ones included, outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``kernelslot.x.y`` -> the modules of ours it imports (a ``from P import m`` of a submodule ``m`` counts as ``P.m``)."""
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                origin = node.module or ""
                if node.level:
                    anchor = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                    origin = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in files else origin for a in node.names]
            for t in targets:
                while t not in files and "." in t:
                    t = t.rpartition(".")[0]
                if t in files and t != name and t.split(".")[0] == "kernelslot":
                    edges.add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def package_graph(graph: dict[str, set[str]], depth: int = 3) -> dict[str, set[str]]:
    """The module graph collapsed to packages ``kernelslot.a.b`` (a package's own ``__init__`` included)."""
    def pkg(m: str) -> str:
        return ".".join(m.split(".")[:depth])
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(pkg(m), set()).update(pkg(t) for t in targets if pkg(t) != pkg(m))
    return out


def floor(module: str) -> int:
    top = module.split(".")[1] if "." in module else "kernelslot"
    return FLOORS[top]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})" for m, ts in graph.items() for t in ts if floor(t) > floor(m)]
    for m, ts in graph.items():
        top = m.split(".")[1] if "." in m else ""
        if top in SELF_CONTAINED:
            bad += [f"{m} imports {t}: {top}/ imports nothing of ours" for t in ts if t.split(".")[1] != top]
    return sorted(bad)


def reaches(graph: dict[str, set[str]], start: str, prefix: str) -> list[str]:
    """An import path from ``start`` to a module under ``prefix``, or []."""
    seen, todo = {start: [start]}, [start]
    while todo:
        m = todo.pop()
        for t in sorted(graph.get(m, ())):
            if t not in seen:
                seen[t] = seen[m] + [t]
                if t == prefix or t.startswith(prefix + "."):
                    return seen[t]
                todo.append(t)
    return []


GRAPH = module_graph()


def test_every_package_has_a_floor():
    assert {m.split(".")[1] for m in GRAPH if "." in m} <= set(FLOORS)


def test_no_import_cycle_between_modules():
    assert cycles(GRAPH) == []


def test_no_import_cycle_between_packages():
    assert cycles(package_graph(GRAPH)) == []


def test_no_import_from_a_lower_floor_to_a_higher_one():
    assert upward_imports(GRAPH) == []


@pytest.mark.parametrize("serving", SERVING)
def test_serving_never_reaches_the_referee(serving):
    paths = {m: reaches(GRAPH, m, "kernelslot.verify") for m in GRAPH if m == f"kernelslot.{serving}" or m.startswith(f"kernelslot.{serving}.")}
    assert {m: p for m, p in paths.items() if p} == {}


def test_isolation_never_imports_the_referee():
    assert {m: p for m in GRAPH if m.startswith("kernelslot.isolation") if (p := reaches(GRAPH, m, "kernelslot.verify"))} == {}


def test_the_checks_can_fail(tmp_path):
    """The same analysis finds a cycle, an upward import and a path to the referee in a package that has them."""
    pkg = tmp_path / "kernelslot"
    for sub in ("kernels", "verify", "dispatch"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "a.py").write_text("def f():\n    from kernelslot.kernels import b  # lazy\n")
    (pkg / "kernels" / "b.py").write_text("from . import a\nfrom kernelslot.verify import referee\n")
    (pkg / "verify" / "referee.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kernelslot.dispatch import r\n")
    (pkg / "dispatch" / "r.py").write_text("from kernelslot.kernels.b import x\n")
    g = module_graph(pkg)
    assert cycles(g) == [["kernelslot.kernels.a", "kernelslot.kernels.b"]]
    assert upward_imports(g) == ["kernelslot.kernels.b (floor 1) imports kernelslot.verify.referee (floor 5)"]
    assert reaches(g, "kernelslot.dispatch.r", "kernelslot.verify") == [
        "kernelslot.dispatch.r", "kernelslot.kernels.b", "kernelslot.verify.referee"]
    assert "kernelslot.dispatch.r" not in g["kernelslot.verify.referee"]  # TYPE_CHECKING imports never run
