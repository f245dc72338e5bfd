"""Typed, strict configuration: YAML is data, dataclasses declare and document it (DESIGN §6.6).

`build(cls, data, where)` turns a mapping into the (frozen) dataclass `cls`, checking every key and
type against the dataclass's annotations. Unknown keys, missing required keys and wrong types raise
`ConfigError` naming the field path and what is allowed; a number must be finite (YAML's `.nan`
and `.inf` are refused: no setting means "not a number"). The CLIs turn `ConfigError` into exit
status 2.

`load_yaml` reads a config file as plain data and refuses what is not a config: a file larger than
`MAX_YAML_BYTES`, one that is not UTF-8 text, YAML nested too deeply, and YAML aliases (`*name`:
a config is written out value by value, and aliases are how a small file expands into a huge tree).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import signal
import sys
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"


class ConfigError(ValueError):
    """Bad configuration: the message names the field and what is allowed."""


EXIT_BAD_INPUT = 2  # every CLI's exit status for bad input (a ConfigError)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
MAX_YAML_BYTES = 1_000_000  # the largest shipped config is under 8 KB; a bigger "config" is another file


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so that the same clean-up runs (worker pools
    terminated, staging directories removed, a checkpoint saved) before the CLI exits."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signal.Signals(signum).name)


def run_cli(prog: str, body: Callable[[], int]) -> int:
    """`body()`'s exit status; a `ConfigError` becomes "PROG: error: ..." on stderr and
    `EXIT_BAD_INPUT`, Ctrl-C "interrupted" and `EXIT_INTERRUPTED` (every command-line tool). SIGTERM
    is handled as Ctrl-C (`Terminated`) and exits with 128 + SIGTERM, as a process it stopped would."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return body()
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


class _DataLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` without aliases (module docstring: a config is data written out in full)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in a config; write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml(path: str | Path) -> Any:
    """Parse the YAML file at `path` as plain data; a missing, unreadable, oversized or binary file
    and bad YAML are `ConfigError`s (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror})") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_YAML_BYTES:,} bytes; a config is a few KB of YAML (is it the right file?)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not a text file (byte {e.start} is not UTF-8); a config is YAML text"
        ) from None
    try:
        return yaml.load(text, Loader=_DataLoader)  # a SafeLoader: plain data only
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply to be a config") from None


def resolve_config(kind: str, name_or_path: str | Path, suffix: str = ".yaml") -> Path:
    """A config by name (looked up in configs/<kind>/) or by path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"{p}: no such file")
        return p
    candidate = CONFIGS / kind / f"{name_or_path}{suffix}"
    if candidate.is_file():
        return candidate
    known = sorted(x.stem for x in (CONFIGS / kind).glob(f"*{suffix}"))
    hint = difflib.get_close_matches(str(name_or_path), known, n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ConfigError(f"unknown {kind} {str(name_or_path)!r}{extra}; known: {known}")


def build(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass `cls` from `data`, strictly. `where` prefixes error messages."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping with keys {_field_names(cls)}, got {type(data).__name__}"
        )
    hints = get_type_hints(cls)
    flds = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
    unknown = [k for k in data if k not in flds]
    if unknown:
        k = unknown[0]
        hint = difflib.get_close_matches(str(k), list(flds), n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"{where}.{k}: unknown key{extra}; allowed: {sorted(flds)}")
    kwargs = {}
    for name, f in flds.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}.{name}: required key is missing")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: {e}") from None


def require_positive(where: str, **values: float) -> None:
    """`ConfigError` naming the first of `values` (field name -> value) that is not > 0."""
    for k, v in values.items():
        if not v > 0:
            raise ConfigError(f"{where}.{k} must be > 0, got {v}")


def require_in(where: str, low: float, high: float, **values: float) -> None:
    """`ConfigError` naming the first of `values` (field name -> value) outside [low, high]."""
    for k, v in values.items():
        if not low <= v <= high:
            raise ConfigError(f"{where}.{k} must be in [{low:g}, {high:g}], got {v}")


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[-1] if errors else f"{where}: invalid value {value!r}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not allowed; choose one of {list(allowed)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a type hint: a class, never an instance
        return build(tp, value, where)
    if origin in (tuple, list):
        args = get_args(tp)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        out = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin in (dict, Mapping) or tp is dict:
        args = get_args(tp) or (str, Any)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return {_convert(args[0], k, where): _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def plain_data(x: Any) -> Any:
    """Data YAML and JSON can dump: dataclasses -> dicts of their init fields (a field derived in
    `__post_init__` is not data), tuples and sets -> lists (sets sorted), enums -> their values,
    NaN and infinities -> None."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain_data(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
    if isinstance(x, Mapping):
        return {str(k): plain_data(v) for k, v in x.items()}
    if isinstance(x, list | tuple | frozenset | set):
        return [plain_data(v) for v in (sorted(x, key=str) if isinstance(x, frozenset | set) else x)]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, enum.Enum):
        return x.value
    return x
