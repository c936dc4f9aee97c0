"""The package's shape: each layer imports only from the layers below it (the import-linter contract in
pyproject.toml), no module is part of an import circle, and no module imports another module's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specrepro"


def test_layers_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("import-linter is not installed in this environment (requirements.txt pins it)")
    res = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def _import_cycles(graph) -> list[list[str]]:
    """Every strongly connected set of modules with more than one member (Tarjan), each sorted."""
    modules = sorted(graph.modules)
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in modules:
        if m not in index:
            visit(m)
    return out


def test_no_import_circle():
    graph = grimp.build_graph("specrepro", include_external_packages=False)
    # a package's __init__ importing its own submodules is not a circle between modules
    for m in sorted(graph.modules):
        for child in graph.find_children(m):
            if graph.direct_import_exists(importer=m, imported=child):
                graph.remove_import(importer=m, imported=child)
    assert _import_cycles(graph) == []


def test_cycle_finder_sees_a_circle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _import_cycles(graph) == [["p.a", "p.b"]]


def private_imports(root: Path = PACKAGE) -> list[str]:
    """``from specrepro.x import _name`` anywhere in the package, where x is another module (aliases such as
    ``import y as _y`` are fine: the name imported is public)."""
    bad = []
    for f in sorted(root.rglob("*.py")):
        here = ".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith("specrepro") and node.module != here:
                bad += [f"{here}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == []


def test_private_import_check_can_fail(tmp_path):
    pkg = tmp_path / "specrepro"
    pkg.mkdir()
    (pkg / "a.py").write_text("def _helper():\n    pass\n")
    (pkg / "b.py").write_text("from specrepro.a import _helper\n")
    assert private_imports(pkg) == ["specrepro.b: from specrepro.a import _helper"]


def test_the_package_imports_absolutely():
    """Every import of a package module is absolute (``from specrepro.x import y``): the import closure that
    :func:`specrepro.files.code_fingerprint` reads (what keys the greedy-equality checkpoint) follows only those, so a
    relative import would leave its module out of the fingerprint."""
    relative = [f"{f.relative_to(ROOT)}:{node.lineno}" for f in sorted(PACKAGE.rglob("*.py"))
                for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, f"relative imports: {relative}"
