import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from acmrl.config import (
    COMMAND_CONFIGS,
    ConfigError,
    GenerateConfig,
    config_class_for,
    field_help,
    load_config,
    parse_override,
    to_dict,
)

_CONFIGS = Path(__file__).parent.parent / "configs"
CONFIGS = sorted([*_CONFIGS.glob("*.yaml"), *_CONFIGS.glob("your-agent/*.yaml")])


def test_defaults_are_valid():
    cfg = load_config(GenerateConfig)
    assert cfg.model.name == "smollm2-135m-instruct"
    assert cfg.sampling.temperature == 0.0


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(_CONFIGS)) for p in CONFIGS])
def test_every_checked_in_config_loads(path):
    cfg = load_config(config_class_for(path), path)
    assert dataclasses.is_dataclass(cfg)


def test_there_are_configs_for_each_command():
    stems = {p.stem.split("_")[0] for p in CONFIGS}
    assert set(COMMAND_CONFIGS) <= stems


@pytest.mark.parametrize("cls", list(COMMAND_CONFIGS.values()))
def test_every_field_has_help(cls):
    missing = [name for name, text in field_help(cls).items() if not text.strip()]
    assert not missing


def test_overrides_apply_on_top_of_yaml(tmp_path):
    f = tmp_path / "generate.yaml"
    f.write_text("model:\n  dtype: bfloat16\nsampling:\n  max_new_tokens: 7\n")
    cfg = load_config(GenerateConfig, f, ["sampling.max_new_tokens=9", "sampling.stop=[a, b]"])
    assert cfg.model.dtype == "bfloat16"
    assert cfg.sampling.max_new_tokens == 9
    assert cfg.sampling.stop == ["a", "b"]
    assert to_dict(cfg)["sampling"]["stop"] == ["a", "b"]


def test_int_is_accepted_for_float_but_not_bool_for_int():
    assert load_config(GenerateConfig, None, ["sampling.temperature=1"]).sampling.temperature == 1.0
    with pytest.raises(
        ConfigError, match=r"sampling.max_new_tokens: got True, expected an integer"
    ):
        load_config(GenerateConfig, None, ["sampling.max_new_tokens=true"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.nmae=x", r"unknown key 'model.nmae' \(did you mean 'model.name'\?\)"),
        ("modle.name=x", r"unknown key 'modle'"),
        (
            "model.dtype=fp8",
            r"model.dtype: got 'fp8', expected one of 'float32', 'bfloat16', 'float16'",
        ),
        ("sampling.max_new_tokens=abc", r"sampling.max_new_tokens: got 'abc', expected an integer"),
        ("sampling.max_new_tokens=0", r"sampling.max_new_tokens: got 0, must be >= 1"),
        ("sampling.top_p=0", r"sampling.top_p: got 0.0, must be in \(0, 1\]"),
        ("sampling.top_p=1.5", r"sampling.top_p: got 1.5, must be <= 1.0"),
        ("model.device=gpu", r"model.device: got 'gpu'"),
        ("model=3", r"model: got 3, expected a mapping"),
        ("model.name.x=3", r"model.name: got \{'x': 3\}, expected a string"),
        ("sampling.stop=abc", r"sampling.stop: got 'abc', expected a list, each item a string"),
        ("noequals", r"not of the form key.path=value"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GenerateConfig, None, [override])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(GenerateConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(GenerateConfig, bad)
    bad.write_text("model: {name: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(GenerateConfig, bad)


def test_parse_override_values():
    assert parse_override("a.b=1.5") == (["a", "b"], 1.5)
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=") == (["a"], "")


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; from acmrl.cli import app\n"
        "try:\n    app(sys.argv[1:])\n"
        "except SystemExit as e:\n"
        "    print('TORCH_LOADED' if 'torch' in sys.modules else 'NO_TORCH'); raise\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "override", ["model.dtpe=float32", "sampling.max_new_tokens=ten", "model.dtype=fp8"]
)
def test_cli_rejects_bad_config_before_loading_any_model(override):
    res = _run_cli("generate", "--prompt", "hi", override)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("acmrl: error: config: ")
    assert "NO_TORCH" in res.stdout  # nothing heavy was imported, so no model could have loaded


def test_cli_help_does_not_import_torch():
    res = _run_cli("--help")
    assert res.returncode == 0
    assert "generate" in res.stdout and "NO_TORCH" in res.stdout


def test_override_below_a_value_is_refused():
    with pytest.raises(ConfigError, match=r"'sampling.stop' is not a section"):
        load_config(GenerateConfig, None, ["sampling.stop=[a]", "sampling.stop.x=3"])


def test_exponent_floats_without_a_dot_are_numbers():
    """YAML 1.1 reads `5e-5` as a string; an override optim.lr=5e-5 still means 5e-5."""
    from acmrl.config import ConfigError, SFTConfig, load_config

    assert load_config(SFTConfig, None, ["optim.lr=5e-5"]).optim.lr == 5e-5
    assert load_config(SFTConfig, None, ["optim.lr=1E-4"]).optim.lr == 1e-4
    with pytest.raises(ConfigError, match="expected a number"):
        load_config(SFTConfig, None, ["optim.lr=fast"])
