"""The machinery of acmrl's configs: building a dataclass from plain data with checked types
and bounds, YAML files and dotted overrides (the package docstring, :mod:`acmrl.config`)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


def option(default: Any, help: str, **checks: Any) -> Any:
    """A dataclass field with its help text and optional ``min``/``max`` bounds.

    Mutable defaults (lists, dicts) are copied per instance.
    """
    meta = {"help": help, **checks}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type, help: str, **defaults: Any) -> Any:
    """A nested dataclass field with its help text; ``defaults`` override the section's own
    defaults for this command (a YAML file or override still wins)."""
    return dataclasses.field(
        default_factory=lambda: cls(**defaults), metadata={"help": help, "defaults": defaults}
    )


# ---------------------------------------------------------------------------------------------
# building a dataclass from plain data


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is list:
        (inner,) = get_args(tp) or (Any,)
        return f"a list, each item {_describe(inner)}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping of its fields"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert it (dicts into dataclasses)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        return _build(tp, value, where + ".")
    if origin in (types.UnionType, typing.Union):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in get_args(tp)):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        return value
    if origin is list:
        (inner,) = get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        return [_convert(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        _, inner = get_args(tp) or (str, Any)
        return {str(k): _convert(v, inner, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: got {value!r}, expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: got {value!r}, expected an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            # YAML 1.1 reads 5e-5 (no dot) as a string; it is a number to anyone writing it
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: got {value!r}, expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: got {value!r}, expected a string")
        return value
    if tp is Path:
        if not isinstance(value, str | Path):
            raise ConfigError(f"{where}: got {value!r}, expected a path")
        return Path(value)
    raise TypeError(f"config field {where} has an unsupported annotation {tp!r}")


def _check_bounds(f: dataclasses.Field, value: Any, where: str) -> None:
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if value is None or not isinstance(value, int | float):
        return
    if lo is not None and value < lo:
        raise ConfigError(f"{where}: got {value!r}, must be >= {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where}: got {value!r}, must be <= {hi}")


def _build(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
        raise ConfigError(
            f"unknown key '{prefix}{key}'{hint}; valid keys here: "
            + ", ".join(prefix + name for name in fields)
        )
    kwargs = {}
    for name, value in data.items():
        where = prefix + name
        if isinstance(value, dict) and fields[name].metadata.get("defaults"):
            value = {**fields[name].metadata["defaults"], **value}
        converted = _convert(value, hints[name], where)
        _check_bounds(fields[name], converted, where)
        kwargs[name] = converted
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {exc}") from None
    # defaults are checked too, so a bad default in code cannot hide
    for name, f in fields.items():
        if name not in kwargs:
            _check_bounds(f, getattr(obj, name), prefix + name)
    check = getattr(obj, "check", None)
    if callable(check):
        check()
    return obj


# ---------------------------------------------------------------------------------------------
# YAML + overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and a YAML-parsed value.

    >>> parse_override("model.dtype=bfloat16")
    (['model', 'dtype'], 'bfloat16')
    >>> parse_override("rollout.samples=4")
    (['rollout', 'samples'], 4)
    """
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc})") from None
    return key.split("."), value


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {'.'.join(path)}: '{'.'.join(path[: i + 1])}' is not a section"
            )
        node = child
    node[path[-1]] = value


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or a non-mapping is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Build ``cls`` from an optional YAML file plus dotted overrides, validating everything."""
    data = read_yaml(path) if path is not None else {}
    for text in overrides:
        key_path, value = parse_override(text)
        _set_path(data, key_path, value)
    return _build(cls, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-data view of a config (for logging and for writing next to outputs)."""

    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def field_help(cls: type) -> dict[str, str]:
    """Dotted field name -> help text, for every field of ``cls`` and its sections."""
    out: dict[str, str] = {}
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out[f.name] = f.metadata.get("help", "")
        if dataclasses.is_dataclass(hints[f.name]):
            for sub, text in field_help(hints[f.name]).items():
                out[f"{f.name}.{sub}"] = text
    return out
