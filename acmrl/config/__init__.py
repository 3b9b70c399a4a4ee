"""Configuration: nested dataclasses, YAML files and dotted command-line overrides.

Every acmrl command takes ``--config file.yaml`` plus overrides such as ``model.dtype=bfloat16``.
The YAML file and the overrides are merged into the command's dataclass and checked *before* any
model loads: unknown keys, wrong types and impossible values raise :class:`ConfigError` with one
line that names the field and what it accepts.

Each field documents itself through ``field(metadata={"help": ...})``; range checks live in the
same metadata (``"min"``, ``"max"``) so that the declaration is the one place to read. A dataclass
may add cross-field checks in a ``check(self) -> None`` method that raises ``ConfigError``.

The package holds three modules: :mod:`acmrl.config.base` (building a dataclass from YAML and
overrides), :mod:`acmrl.config.parts` (the sections several commands share) and
:mod:`acmrl.config.stages` (each command's config); every public name is imported from here.
"""

from __future__ import annotations

from acmrl.config.base import (
    ConfigError,
    field_help,
    load_config,
    option,
    parse_override,
    read_yaml,
    section,
    to_dict,
)
from acmrl.config.parts import (
    ARMS,
    DEFAULT_ARMS,
    DEFAULT_MODEL,
    AgentConfig,
    DecisionConfig,
    EngineConfig,
    EnvConfig,
    GenerateConfig,
    JudgeConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    SamplingConfig,
    TeacherConfig,
    WeightsConfig,
    check_arms,
)
from acmrl.config.stages import (
    COMMAND_CONFIGS,
    TRIVIAL_STRATEGIES,
    AnnotateConfig,
    AuditConfig,
    DemoConfig,
    EvalConfig,
    ExportConfig,
    GRPOConfig,
    RolloutConfig,
    ServeConfig,
    SFTConfig,
    TrainConfig,
    config_class_for,
)

__all__ = [
    "ARMS",
    "COMMAND_CONFIGS",
    "DEFAULT_ARMS",
    "DEFAULT_MODEL",
    "TRIVIAL_STRATEGIES",
    "AgentConfig",
    "AnnotateConfig",
    "AuditConfig",
    "ConfigError",
    "DecisionConfig",
    "DemoConfig",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "ExportConfig",
    "GRPOConfig",
    "GenerateConfig",
    "JudgeConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardConfig",
    "RolloutConfig",
    "SFTConfig",
    "SamplingConfig",
    "ServeConfig",
    "TeacherConfig",
    "TrainConfig",
    "WeightsConfig",
    "check_arms",
    "config_class_for",
    "field_help",
    "load_config",
    "option",
    "parse_override",
    "read_yaml",
    "section",
    "to_dict",
]
