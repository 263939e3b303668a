"""The package layering holds: libraries never import the packages above them.

thor_runtime and engines (runtime, backends) -> agent (planning) -> calib -> thor_app (the
`thor` CLI and the HTTP server, which nothing imports). Read from the source with ``ast``,
including imports inside functions, so a lazy import cannot hide a wrong edge. thor_app imports
every command statically: no importlib, import_module or __import__ dispatch by name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package -> the project packages it must never import
FORBIDDEN = {
    "thor_runtime": {"engines", "agent", "calib", "thor_app"},
    "engines": {"agent", "calib", "thor_app"},
    "agent": {"calib", "thor_app"},
    "calib": {"thor_app"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    if any(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "import_module"
           for n in ast.walk(tree)):
        out.add("<importlib>")                 # dispatch by string would hide the edge
    return out


def dynamic_imports(path: Path) -> list[str]:
    """Where a module is imported by a name computed at run time: the importlib module, or a call
    of import_module or __import__ ("line: what")."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "importlib"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "importlib":
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
    bad = {str(f.relative_to(ROOT)): sorted(imported_packages(f) & (FORBIDDEN[package] | {"<importlib>"}))
           for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_walker_sees_lazy_and_string_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from thor_app.cli import main\n    import importlib\n"
                   "    importlib.import_module('calib.cli')\n")
    assert {"thor_app", "<importlib>"} <= imported_packages(src)


def test_entry_points_import_statically():
    files = sorted((ROOT / "thor_app").rglob("*.py"))
    assert files, "thor_app has no sources"
    bad = {str(f.relative_to(ROOT)): dynamic_imports(f) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_walker_sees_dynamic_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import json\nfrom thor_runtime import errors\n\n\ndef f(name):\n    import importlib.util\n"
                   "    from importlib import import_module\n    return import_module(name), __import__(name)\n")
    assert dynamic_imports(src) == ["6: import importlib.util", "7: from importlib import", "8: __import__()",
                                    "8: import_module()"]
    src.write_text("import json\nfrom thor_runtime import errors\n")
    assert dynamic_imports(src) == []
