"""Dependencies point one way (DESIGN.md): context/ imports nothing else of acmrl."""

import ast
from pathlib import Path

import acmrl

ROOT = Path(acmrl.__file__).parent


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_context_imports_nothing_else_of_acmrl():
    files = sorted((ROOT / "context").glob("*.py"))
    assert len(files) >= 6
    for f in files:
        for mod in imported_modules(f):
            if mod.split(".")[0] == "acmrl":
                assert mod.startswith("acmrl.context"), f"{f.name} imports {mod}"
