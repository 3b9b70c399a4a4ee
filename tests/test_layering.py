"""Dependencies point one way (docs/design.md): context/ imports nothing else of acmrl; envs and
engines know nothing of rollout, teacher or train; train never imports the teacher."""

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


def _acmrl_imports(package: str) -> list[tuple[str, str]]:
    return [
        (f.name, mod)
        for f in sorted((ROOT / package).glob("*.py"))
        for mod in imported_modules(f)
        if mod.split(".")[0] == "acmrl"
    ]


def test_lower_layers_do_not_import_upper_ones():
    for package, banned in (
        ("envs", ("acmrl.rollout", "acmrl.teacher", "acmrl.train", "acmrl.engines")),
        ("engines", ("acmrl.rollout", "acmrl.teacher", "acmrl.train", "acmrl.envs")),
        ("rollout", ("acmrl.teacher", "acmrl.train")),
        # an arm is called by the agent loop and the teacher, and knows neither
        (
            "arms",
            (
                "acmrl.teacher",
                "acmrl.train",
                "acmrl.eval",
                "acmrl.rollout.agent",
                "acmrl.rollout.worker",
            ),
        ),
        ("train", ("acmrl.teacher",)),
        (
            "rewards",
            ("acmrl.rollout", "acmrl.teacher", "acmrl.train", "acmrl.engines", "acmrl.envs"),
        ),
    ):
        for name, mod in _acmrl_imports(package):
            assert not mod.startswith(banned), f"{package}/{name} imports {mod}"
