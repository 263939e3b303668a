"""The tests' own layout: tests/ mirrors the packages (tests/<package>/<subpackage>/test_*.py),
what tests share lives in tests/helpers/ (imported as ``tests.helpers.*``), no test module imports
another, and no test folder can stand in for the package it mirrors."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

TESTS = ROOT / "tests"
HELPERS = TESTS / "helpers"
# the tests that check the whole tree sit at tests/ itself
TREE_WIDE = {"test_docs.py", "test_layering.py", "test_test_layout.py"}
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
# the helpers' modules, by the bare names they must not be imported under
HELPER_NAMES = {"helpers"} | {p.stem for p in HELPERS.glob("*.py") if p.stem != "__init__"}
# the test modules, by the bare names an import would reach them under
TEST_MODULES = {p.stem for p in TESTS.rglob("test_*.py")}


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def bad_imports(source: str) -> list[str]:
    """Imports in ``source`` (module level or inside a function) that reach another test module,
    a module by a relative name, or a helper by its bare name. -> one line each."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append(f"line {node.lineno}: a relative import")
                continue
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if (
                parts[0] in TEST_MODULES
                or parts[0] == "tests"
                and any(p.startswith("test_") for p in parts[1:])
            ):
                out.append(f"line {node.lineno}: {name} is a test module")
            elif parts[0] == "tests" and parts[1:2] not in ([], ["helpers"]):
                out.append(f"line {node.lineno}: {name}: from tests/ only tests.helpers")
            elif parts[0] in HELPER_NAMES:
                out.append(f"line {node.lineno}: {name}: import the helpers as tests.helpers.*")
    return out


def test_the_import_check_sees_what_it_must():
    assert bad_imports("from test_agent import ScriptedRuntime")
    assert bad_imports("def f():\n    from tests.agent.test_agent import good_plan\n")
    assert bad_imports("from tests.agent import test_agent")
    assert bad_imports("import tiny") and bad_imports("from helpers.tiny import make_tiny_dir")
    assert bad_imports("from .tiny import make_tiny_dir")
    assert bad_imports("import tests.conftest")
    assert not bad_imports("from tests.helpers.tiny import make_tiny_dir\nimport torch")
    assert not bad_imports("from aiohttp.test_utils import TestClient")  # not one of ours
    assert not bad_imports("from test_msgs.action import Fibonacci")


@pytest.mark.parametrize("path", python_files(), ids=lambda p: p.relative_to(TESTS).as_posix())
def test_no_test_imports_another(path):
    found = bad_imports(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


def test_every_test_file_sits_in_the_folder_of_the_package_it_tests():
    misplaced = []
    for path in TESTS.rglob("test_*.py"):
        rel = path.relative_to(TESTS)
        if HELPERS in path.parents:
            misplaced.append(f"{rel}: tests/helpers/ holds no tests")
        elif rel.parent == Path("."):
            if rel.name not in TREE_WIDE:
                misplaced.append(f"{rel}: at tests/ only the tests of the whole tree")
        elif not (ROOT / rel.parent / "__init__.py").is_file():
            misplaced.append(f"{rel}: {rel.parent.as_posix()}/ is no package of the project")
    assert not misplaced, "\n".join(sorted(misplaced))


def test_no_test_folder_is_a_package():
    """An __init__.py in tests/agent/ would make it a package that could stand in for `agent`."""
    inits = [
        p.relative_to(ROOT).as_posix() for p in TESTS.rglob("__init__.py") if p.parent != HELPERS
    ]
    assert inits == []


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_as_itself(package):
    """Whatever the way pytest was started, `import agent` is agent/, never tests/agent/."""
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve() == ROOT / package / "__init__.py"
