"""The package's layering, read from its import lines (no module is imported).

Every `import` and `from ... import` in pyapp, at any depth (a function-level import is a dependency
too), becomes an edge from its module to the module it names, and to the packages above that one
(importing pyapp.a.b runs pyapp/a/__init__.py first) but its own (they run before it). The graph has
no cycle, and the layers run one way:

    model, runtime, reference  <-  families (each family's package)  <-  engine  <-  webapp, __main__

The engine finds a family through the registry (pyapp.families) and names none; a family builds on
pyapp.runtime.loaded, never on the engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "pyapp"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the pyapp modules its import lines name (and the packages above them)."""
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]   # `from . import decode`: a module
            for t in targets:
                while t.startswith("pyapp") and not (name + ".").startswith(t + "."):   # its own packages run first
                    if t in modules:
                        edges.add(t)
                    t = t.rpartition(".")[0]
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports_at_any_depth():
    g = import_graph()
    assert "pyapp.engine.decode" in g["pyapp.engine.engine"]          # `from . import decode, ...`
    assert "pyapp.runtime.loaded" in g["pyapp.engine.engine"]
    assert "pyapp.tokenizer" in g["pyapp.runtime.loaded"]              # a function-level import
    assert "pyapp.engine" not in g["pyapp.engine.engine"]                 # its own package runs before it
    assert "pyapp.families" in g["pyapp.engine.loading"]                  # `from ..families import ...`


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_cycles_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_run_one_way():
    g = import_graph()

    def imports(prefix: str, target: str) -> list[str]:
        return sorted(m for m, edges in g.items() if m.startswith(prefix)
                      for e in edges if e == target or e.startswith(target + "."))

    for low in ("pyapp.model", "pyapp.runtime", "pyapp.reference"):
        assert imports(low, "pyapp.engine") == [] and imports(low, "pyapp.families") == [], low
    assert imports("pyapp.families", "pyapp.engine") == []              # a family builds on runtime.loaded
    named = sorted({e for m, edges in g.items() if m.startswith("pyapp.engine") for e in edges
                    if e.startswith("pyapp.families.")})
    assert named == []                                                  # the engine finds families, names none
    assert imports("pyapp.engine", "pyapp.families") == ["pyapp.engine.loading"]    # through the registry
    # one family's package never reaches into another's (the registry is their only meeting place)
    packages = {m.split(".")[2] for m in g if m.startswith("pyapp.families.") and m.count(".") >= 3}
    for p in packages:
        others = [e for m, edges in g.items() if m.startswith(f"pyapp.families.{p}") for e in edges
                  if e.startswith("pyapp.families.") and e.split(".")[2] not in (p, "family")]
        assert others == [], p
