"""The package's shape (docs/design.md): imports point one way, Thunder stays in its adapter, the public
names are what they say.  Read from the source with ``ast``, so a cycle fails here before it fails in
a user's import."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

import remat

PACKAGE = Path(remat.__file__).parent

#: layer of each part of the package; a module may import its own layer and the layers listed for it
ALLOWED = {
    "core": {"core", "base"},
    "planning": {"planning", "core", "base"},
    "thunder": {"thunder", "core", "base"},
    "top": {"top", "thunder", "planning", "core", "base", "testing"},
    "testing": {"testing", "top", "thunder", "planning", "core", "base"},
    "base": {"base"},
}
#: the only places that may import Thunder (oracles: lazily, to check traces it is handed)
THUNDER_IMPORTERS = ("remat.thunder", "remat.testing.oracles")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("errors", "_version", "_logging"):
        return "base" if len(parts) > 1 else "top"
    return parts[1] if parts[1] in ("core", "planning", "thunder", "testing") else "top"


def imports() -> list[tuple[str, str, int, bool]]:
    """(importing module, imported name, line, at module level) for every import in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative imports
                    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        package = package.rsplit(".", 1)[0]
                    base = f"{package}.{base}" if base else package
                names = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names]
            else:
                continue
            for name in names:
                found.append((module, name, node.lineno, id(node) in top_level))
    return found


def _is_module(name: str) -> bool:
    if not name.startswith("remat."):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@pytest.fixture(scope="module")
def all_imports():
    return imports()


def test_no_import_cycles(all_imports):
    graph = nx.DiGraph()
    for module, name, _, _ in all_imports:
        if name.startswith("remat") and name != module:
            graph.add_edge(module, name)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_imports_point_down_the_layers(all_imports):
    wrong = [
        f"{module}:{line} imports {name}"
        for module, name, line, _ in all_imports
        if name.startswith("remat") and layer(name) not in ALLOWED[layer(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_function_local_imports_of_remat(all_imports):
    local = [f"{module}:{line} imports {name}" for module, name, line, top in all_imports if name.startswith("remat") and not top]
    assert not local, "\n".join(local)


def test_only_the_adapter_imports_thunder(all_imports):
    wrong = [
        f"{module}:{line} imports {name}"
        for module, name, line, _ in all_imports
        if name.split(".")[0] == "thunder" and not module.startswith(THUNDER_IMPORTERS)
    ]
    assert not wrong, "\n".join(wrong)


def test_core_and_planning_need_no_torch(all_imports):
    wrong = [
        f"{module}:{line} imports {name}"
        for module, name, line, _ in all_imports
        if name.split(".")[0] == "torch" and layer(module) in ("core", "planning", "base")
    ]
    assert not wrong, "\n".join(wrong)


def test_import_and_plain_solve_leave_thunder_alone():
    """``import remat`` loads neither Thunder nor torch and patches nothing; solving a plain graph (with
    a budget too) never imports Thunder."""
    script = """
import sys, time
start = time.perf_counter()
import remat
print(round(time.perf_counter() - start, 3))
assert "thunder" not in sys.modules and "torch" not in sys.modules, "import remat imported Thunder or torch"
import networkx as nx
g = nx.DiGraph()
g.add_node("a", phase="forward", bytes=100, flops=10)
g.add_node("b", phase="forward", bytes=50, flops=10)
g.add_node("c", phase="backward", bytes=1)
g.add_edge("a", "b"); g.add_edge("a", "c"); g.add_edge("b", "c")
plan = remat.solve(g)
plan = remat.solve(g, memory_budget="60%")
assert "thunder" not in sys.modules, "remat.solve imported Thunder"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_public_names():
    for name in remat.__all__:
        assert getattr(remat, name) is not None, name
    assert remat.Op.__module__ == "remat.core.ir"  # what FusionGraph.ops holds
    # a public function never hides a submodule of the same name
    submodules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    for name in remat.__all__:
        value = getattr(remat, name)
        if name in submodules:
            assert isinstance(value, type(remat)) and value.__name__ == f"remat.{name}", name
    assert remat.fuse is importlib.import_module("remat.thunder.fuse").fuse
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        remat.no_such_name  # noqa: B018


def test_every_module_documents_itself():
    missing = [module_name(p) for p in PACKAGE.rglob("*.py") if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not missing, missing
