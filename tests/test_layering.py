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


COMMANDS = ("acmrl.cli", "acmrl.demo", "acmrl.rollout.run")


def test_only_the_cli_imports_a_command_module():
    """A command module (the CLI, the demo recipe, ``acmrl rollout``'s table) is a leaf: what
    other code needs lives in a library module (engine factories in ``engines.factory``,
    ``make_episode`` beside ``Episode``, ``run_rollout`` in ``rollout.worker``)."""
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 60
    for f in files:
        if f == ROOT / "cli.py":
            continue
        for mod in imported_modules(f) | _named_submodules(f):
            assert mod not in COMMANDS, f"{f.relative_to(ROOT)} imports the command module {mod}"


def _named_submodules(path: Path) -> set[str]:
    """``from acmrl import demo`` names the module acmrl.demo."""
    return {
        f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for a in node.names
    }


def test_the_trainers_ask_engines_not_their_kind():
    """An engine owns its lifecycle (sleep, wake up, a new policy: ``engines/base.py``), so a
    new engine needs no change in ``train/``: no ``hasattr`` probe and no comparison with an
    engine kind there."""
    for f in sorted((ROOT / "train").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "hasattr", f"train/{f.name}:{node.lineno} probes hasattr"
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                kinds = [s for s in sides if isinstance(s, ast.Attribute) and s.attr == "kind"]
                assert not kinds, f"train/{f.name}:{node.lineno} branches on an engine kind"
