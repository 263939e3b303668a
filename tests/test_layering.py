"""The package layering holds: libraries never import the packages above them.

thor_runtime and engines (runtime, backends) -> agent (planning) -> calib -> thor_app (the
`thor` CLI and the HTTP server, which nothing imports). Read from the source with ``ast``,
including imports inside functions, so a lazy import cannot hide a wrong edge.
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
