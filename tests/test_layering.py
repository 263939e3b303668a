"""The package layering holds: libraries never import the packages above them, and no module
imports itself through others.

thor_runtime and engines (runtime, backends) -> agent (planning) -> calib -> evals (the lab:
evaluation code and sets) -> thor_app (the `thor` CLI, the HTTP server and the benchmark tools,
which nothing imports). Other packages enter the runtime by its front door; the plan's checks
(gate, executor, solver) import nothing that reads the task's words. Read from the source with
``ast``, including imports inside functions, so a lazy import cannot hide a wrong edge or a cycle.
thor_app imports every command statically: no importlib, import_module or __import__ dispatch
by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("thor_runtime", "engines", "agent", "calib", "evals", "thor_app")
# package -> the project packages it must never import
FORBIDDEN = {
    "thor_runtime": {"engines", "agent", "calib", "evals", "thor_app"},
    "engines": {"agent", "calib", "evals", "thor_app"},
    "agent": {"calib", "evals", "thor_app"},
    "calib": {"evals", "thor_app"},
    "evals": {"thor_app"},
}
# the runtime's top-level modules other packages may import directly (the rest is subpackages)
RUNTIME_FACES = {"config", "errors", "fileio", "device", "catalog", "model_choice"}
# the plan's checks: what they import, however indirectly, never reads the task's words
WORD_FREE = ("agent.symbolic.gate", "agent.symbolic.executor", "agent.symbolic.solver")


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    if any(
        isinstance(n, ast.Call)
        and getattr(n.func, "attr", getattr(n.func, "id", "")) == "import_module"
        for n in ast.walk(tree)
    ):
        out.add("<importlib>")  # dispatch by string would hide the edge
    return out


def dynamic_imports(path: Path) -> list[str]:
    """Where a module is imported by a name computed at run time: the importlib module, or a call
    of import_module or __import__ ("line: what")."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "importlib"
            ]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "importlib"
        ):
            out.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("import_module", "__import__"):
                out.append(f"{node.lineno}: {name}()")
    return sorted(out)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_upwards(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package} has no sources"
    bad = {
        str(f.relative_to(ROOT)): sorted(
            imported_packages(f) & (FORBIDDEN[package] | {"<importlib>"})
        )
        for f in files
    }
    assert {f: b for f, b in bad.items() if b} == {}


def test_walker_sees_lazy_and_string_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from thor_app.cli import main\n    import importlib\n"
        "    importlib.import_module('calib.cli')\n"
    )
    assert {"thor_app", "<importlib>"} <= imported_packages(src)


def test_entry_points_import_statically():
    files = sorted((ROOT / "thor_app").rglob("*.py"))
    assert files, "thor_app has no sources"
    bad = {str(f.relative_to(ROOT)): dynamic_imports(f) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_walker_sees_dynamic_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import json\nfrom thor_runtime import errors\n\n\n"
        "def f(name):\n    import importlib.util\n"
        "    from importlib import import_module\n"
        "    return import_module(name), __import__(name)\n"
    )
    assert dynamic_imports(src) == [
        "6: import importlib.util",
        "7: from importlib import",
        "8: __import__()",
        "8: import_module()",
    ]
    src.write_text("import json\nfrom thor_runtime import errors\n")
    assert dynamic_imports(src) == []


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports, anywhere in its source (function bodies too).
    ``from a import b`` is an edge to the module a.b where there is one, else to a; importing a
    submodule is not counted as importing its package's ``__init__``."""
    files = {
        module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
    }
    graph = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.add(sub if sub in files else base)
        graph[name] = {m for m in out if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    graph = import_graph()
    assert (
        len(graph) > 100 and "thor_runtime.engine.runner" in graph["thor_runtime.engine.generate"]
    )
    found = cycles(graph)
    assert found == [], "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c)
        for c in found
    )


def test_cycle_finder_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")
    (pkg / "c.py").write_text("import p.a\n")
    graph = import_graph(tmp_path, ("p",))
    assert graph["p.a"] == {"p.sub.b"} and graph["p.sub.b"] == {"p.a"} and graph["p.c"] == {"p.a"}
    assert graph["p.sub"] == {"p.a"}
    assert cycles(graph) == [["p.a", "p.sub.b"]]


def runtime_imports_past_the_door(path: Path) -> list[str]:
    """Imports of the runtime from outside it that reach into a subpackage's files: anything
    deeper than ``thor_runtime.<child>``, or a submodule taken from a subpackage by name."""
    tree = ast.parse(path.read_text(), str(path))
    runtime = ROOT / "thor_runtime"
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [(node.module, a.name) for a in node.names]
        for module, name in names:
            parts = module.split(".")
            if parts[0] != "thor_runtime" or len(parts) == 1 and name is not None:
                continue
            deep = len(parts) > 2 or (isinstance(node, ast.Import) and len(parts) > 1)
            child = runtime / parts[1] if len(parts) > 1 else None
            if (
                not deep
                and child is not None
                and not child.is_dir()
                and parts[1] not in RUNTIME_FACES
            ):
                deep = True  # a loose file of the runtime not made a face
            if not deep and child is not None and child.is_dir() and name is not None:
                deep = (child / f"{name}.py").exists() or (child / name).is_dir()
            if deep:
                out.append(f"{node.lineno}: {module}" + (f" import {name}" if name else ""))
    return out


@pytest.mark.parametrize("package", ["agent", "calib", "engines", "evals", "thor_app"])
def test_runtime_entered_by_its_front_door(package):
    files = sorted((ROOT / package).rglob("*.py"))
    bad = {str(f.relative_to(ROOT)): runtime_imports_past_the_door(f) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_front_door_walker_sees_deep_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "from thor_runtime.engine.generate import Runtime\nimport thor_runtime.engine\n"
        "from thor_runtime.engine import generate\nfrom thor_runtime.engine import Runtime\n"
        "from thor_runtime import Runtime\nfrom thor_runtime.config import RuntimeConfig\n"
    )
    assert runtime_imports_past_the_door(src) == [
        "1: thor_runtime.engine.generate import Runtime",
        "2: thor_runtime.engine",
        "3: thor_runtime.engine import generate",
    ]


def test_front_door_names_resolve():
    """Every name a face promises loads (a typo in a face would only fail at first use)."""
    import thor_runtime
    from thor_runtime import cache, engine, kernels, loading, models, speculative

    for face in (thor_runtime, cache, engine, kernels, models):
        for name in face.__all__:
            assert getattr(face, name) is not None, (face.__name__, name)
    for face in (loading, speculative):
        for name in getattr(face, "_LAZY", ()):
            assert getattr(face, name) is not None, (face.__name__, name)


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(graph.get(m, ()))
    return seen


def test_plan_checks_import_no_language():
    graph = import_graph()
    for start in WORD_FREE:
        assert start in graph, start
        reached = sorted(m for m in closure(graph, start) if m.startswith("agent.language"))
        assert reached == [], f"{start} reaches {reached}"
