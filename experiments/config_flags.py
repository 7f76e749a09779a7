"""Dotted command-line overrides of a frozen config dataclass.

A script picks a preset with ``--config=NAME`` and changes any field of it
by its dotted name::

  python -m experiments.train --config=small --config.model.d_model=256 \\
      --config.model.mixer=gla,sliding_window_attn \\
      --config.model.mixer_options.gla.chunk_size=32 --config.train.steps=50

``split_overrides`` takes the ``--config.<path>=<value>`` arguments out of
``argv`` (absl parses the rest); ``apply_overrides`` converts each value by
the type of the field it names and rebuilds the config through its
``to_dict`` / ``from_dict`` pair, so that every ``__post_init__`` check
runs. An error names the dotted field it comes from: an unknown field, a
value that does not convert, or a value the config rejects (see
``apply_overrides`` for which override a rejection names).

Values: ints, floats and strings as written; booleans ``true`` / ``false``;
``none`` for an optional field; a comma-separated list for a field that
takes a tuple (``mixer``, ``d_models=64,128``), the parts of a tuple item
joined by ``:`` (``settings=64:4,128:8``); a JSON object for a mapping
field (``mixer_options``), or a dotted path into it that sets one entry
(its value JSON, or the plain text when it is not JSON).

A config class may decide the type of a field from other fields: its
``field_type(name, values)`` (``values``: the ``to_dict`` form) returns the
type or None (the annotation's), and the overrides of its
``leading_fields`` are applied first (``Experiment.task`` picks the model
config's class).

``flags_parser`` wires this into ``absl.app.run``; ``to_dict`` and
``from_dict`` are the pair a config dataclass built of plain fields and
nested configs can delegate to.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
import typing
from typing import Any, Callable, Mapping, NoReturn

from absl import flags

PREFIX = "config"


class FlagError(ValueError):
  """A bad flag value: ``--flag: what is wrong``."""

  def __init__(self, flag: str, message: str):
    self.flag = flag
    super().__init__(f"--{flag}: {message}")


def split_overrides(argv: list[str], prefix: str = PREFIX
                    ) -> tuple[list[str], dict[str, str | None]]:
  """``(other arguments, {path: value})`` of the ``--<prefix>.<path>=value``
  arguments in ``argv``; a value is ``None`` when the ``=`` is missing (a
  boolean field then becomes true)."""
  rest, overrides = [], {}
  start = f"--{prefix}."
  for arg in argv:
    if not arg.startswith(start):
      rest.append(arg)
      continue
    path, sep, value = arg[len(start):].partition("=")
    overrides[path] = value if sep else None
  return rest, overrides


def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _is_dataclass_type(kind) -> bool:
  return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _alternatives(kind) -> tuple:
  if typing.get_origin(kind) in (typing.Union, types.UnionType):
    return typing.get_args(kind)
  return (kind,)


def _tuple_item(kind):
  """The item type of a ``tuple[X, ...]`` among the alternatives of
  ``kind``, or None."""
  for option in _alternatives(kind):
    args = typing.get_args(option)
    if (typing.get_origin(option) is tuple and len(args) == 2
        and args[1] is Ellipsis):
      return args[0]
  return None


def _item(text: str, kind) -> Any:
  """One item of a comma-separated list as a value of ``kind``: a number,
  a string, or a fixed tuple written with ``:`` between its parts."""
  if typing.get_origin(kind) is tuple:
    parts, kinds = text.split(":"), typing.get_args(kind)
    if len(parts) != len(kinds):
      raise ValueError(f"item {text!r} must be {len(kinds)} values joined "
                       "by ':'")
    return [_item(part, k) for part, k in zip(parts, kinds)]
  if kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      raise ValueError(f"item {text!r} is not "
                       f"{'an int' if kind is int else 'a float'}") from None
  return text


def _convert(text: str | None, kind, current) -> Any:
  """``text`` as a value of the field type ``kind`` (``current``: the
  field's present value in ``to_dict`` form); raises ``ValueError``."""
  options = _alternatives(kind)
  if text is None:
    if bool in options:
      return True
    raise ValueError("needs a value (--NAME=VALUE)")
  if type(None) in options and text.lower() in ("none", "null"):
    return None
  if isinstance(current, dict):
    try:
      value = json.loads(text)
    except json.JSONDecodeError as error:
      raise ValueError(f"is not JSON ({error.msg}): {text!r}") from None
    if not isinstance(value, dict):
      raise ValueError(f"must be a JSON object, got {text!r}")
    return value
  if any(typing.get_origin(o) is tuple for o in options):
    names = [part.strip() for part in text.split(",")]
    if len(names) == 1 and str in options:
      return names[0]
    item = _tuple_item(kind)
    return names if item is None else [_item(n, item) for n in names]
  if bool in options:
    if text.lower() in ("true", "1", "yes"):
      return True
    if text.lower() in ("false", "0", "no"):
      return False
    raise ValueError(f"must be true or false, got {text!r}")
  for simple in (int, float):
    if simple in options:
      try:
        return simple(text)
      except ValueError:
        raise ValueError(f"must be {'an int' if simple is int else 'a float'}"
                         f", got {text!r}") from None
  if str in options:
    return text
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def _set(values: dict, cls, path: str, text: str | None, prefix: str) -> None:
  """Sets the dotted ``path`` of the ``to_dict`` form ``values`` of a
  ``cls`` to ``text`` converted by the field's type."""
  flag = f"{prefix}.{path}"
  parts = path.split(".")
  kind = cls
  for i, name in enumerate(parts):
    last = i == len(parts) - 1
    if _is_dataclass_type(kind):
      hints = _hints(kind)
      if name not in hints:
        raise FlagError(flag, f"{kind.__name__} has no field {name!r}; its "
                        f"fields: {', '.join(hints)}")
      refine = getattr(kind, "field_type", None)
      kind = (refine(name, values) if refine is not None else None) \
          or hints[name]
    elif isinstance(values, dict) and not last:
      values = values.setdefault(name, {})
      if not isinstance(values, dict):
        raise FlagError(flag, f"{'.'.join(parts[:i + 1])} is not a mapping")
      continue
    elif isinstance(values, dict):
      kind = Any
    else:
      raise FlagError(flag, f"{'.'.join(parts[:i])} is not a mapping")
    if last:
      try:
        values[name] = _convert(text, kind, values.get(name))
      except ValueError as error:
        raise FlagError(flag, str(error)) from None
      return
    if values.get(name) is None and not _is_dataclass_type(kind):
      values[name] = {}
    values = values[name]


def _build(config, overrides: Mapping[str, str | None], prefix: str):
  """``config`` rebuilt with ``overrides``; the config's ``ValueError``
  propagates."""
  values = config.to_dict()
  for path, text in _ordered(type(config), overrides).items():
    _set(values, type(config), path, text, prefix)
  return type(config).from_dict(values)


def _ordered(cls, overrides: Mapping[str, str | None]) -> dict:
  """``overrides`` with the paths of ``cls.leading_fields`` (fields that
  decide the types of others, e.g. ``Experiment.task``) first."""
  leading = getattr(cls, "leading_fields", ())
  return dict(sorted(overrides.items(),
                     key=lambda item: item[0].split(".")[0] not in leading))


def _error(config, overrides: Mapping[str, str | None], prefix: str):
  """The config's ``ValueError`` message for ``overrides``, or None."""
  try:
    _build(config, overrides, prefix)
  except ValueError as error:
    return str(error)
  return None


def apply_overrides(config, overrides: Mapping[str, str | None],
                    prefix: str = PREFIX):
  """``config`` (a dataclass with ``to_dict`` / ``from_dict``) with the
  dotted ``overrides`` (paths below ``prefix``) applied.

  When the config rejects the overrides, the error names the override
  that, applied alone, is rejected with the same message; failing that,
  the overrides without which the rest is accepted; failing that, all of
  them.

  Raises:
    FlagError: naming the dotted field (or fields) whose value is bad.
  """
  values = config.to_dict()
  for path, text in _ordered(type(config), overrides).items():
    _set(values, type(config), path, text, prefix)
  try:
    return _build(config, overrides, prefix)
  except ValueError as error:
    message = str(error)
  paths = list(overrides)
  for path in paths:
    if _error(config, {path: overrides[path]}, prefix) == message:
      raise FlagError(f"{prefix}.{path}", message) from None
  blamed = [path for path in paths if _error(
      config, {p: overrides[p] for p in paths if p != path}, prefix) is None]
  names = " / --".join(f"{prefix}.{path}" for path in (blamed or paths))
  raise FlagError(names, message) from None


def describe(config, prefix: str = PREFIX) -> list[str]:
  """``--<prefix>.<path>=<value>`` for every leaf of ``config.to_dict()``
  (the names ``apply_overrides`` takes)."""
  lines = []

  def walk(values, path):
    for name, value in values.items():
      if isinstance(value, dict) and value:
        walk(value, f"{path}.{name}")
      else:
        shown = (",".join(":".join(map(str, v)) if isinstance(v, list)
                          else str(v) for v in value)
                 if isinstance(value, list)
                 else json.dumps(value) if isinstance(value, (dict, bool))
                 else value)
        lines.append(f"--{path}.{name}={shown}")

  walk(config.to_dict(), prefix)
  return lines


def to_dict(config) -> dict:
  """The fields of the dataclass ``config`` as JSON-ready values: a nested
  config by its own ``to_dict``, tuples as lists."""

  def plain(value):
    if hasattr(value, "to_dict"):
      return value.to_dict()
    if isinstance(value, tuple):
      return [plain(v) for v in value]
    return value

  return {f.name: plain(getattr(config, f.name))
          for f in dataclasses.fields(config)}


def from_dict(cls, values: Mapping[str, Any]):
  """The inverse of ``to_dict``: a ``cls`` from ``values``, a nested config
  by its own ``from_dict``, lists as tuples; an unknown field raises
  ``ValueError``."""
  unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
  if unknown:
    raise ValueError(f"unknown {cls.__name__} fields {unknown}")
  hints = _hints(cls)

  def typed(value, kind):
    if _is_dataclass_type(kind) and isinstance(value, Mapping):
      return kind.from_dict(value)
    if isinstance(value, list):
      return tuple(typed(v, None) for v in value)
    return value

  return cls(**{name: typed(value, hints[name])
                for name, value in values.items()})


def fail(message: str) -> NoReturn:
  """``<script>: error: <message>`` on stderr, exit status 2."""
  print(f"{os.path.basename(sys.argv[0])}: error: {message}",
        file=sys.stderr, flush=True)
  sys.exit(2)


def no_arguments(argv: list[str]) -> None:
  """Stops the script with one line when ``argv`` (what ``absl.app.run``
  leaves) holds more than the program."""
  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]} (flags look like --name=value)")


def command_config(argv: list[str], presets: Mapping[str, Any], name: str,
                   overrides: Mapping[str, str | None], prefix: str = PREFIX):
  """The config of a command line: preset ``name`` with the dotted
  ``overrides``; a stray argument or a bad value stops the script with one
  line naming the flag."""
  no_arguments(argv)
  try:
    return from_preset(presets, name, overrides, prefix)
  except FlagError as error:
    fail(str(error))


def flags_parser(overrides: dict, prefix: str = PREFIX
                 ) -> Callable[[list[str]], list[str]]:
  """A ``flags_parser`` for ``absl.app.run``: the ``--<prefix>.<path>=VALUE``
  arguments go to ``overrides`` (cleared first, ``{path: value}``), absl
  parses the rest; a bad absl flag stops the script with one line."""

  def parse(argv: list[str]) -> list[str]:
    rest, found = split_overrides(argv, prefix)
    overrides.clear()
    overrides.update(found)
    try:
      return flags.FLAGS(rest)
    except flags.Error as error:
      fail(str(error).splitlines()[0])

  return parse


def from_preset(presets: Mapping[str, Any], name: str,
                overrides: Mapping[str, str | None], prefix: str = PREFIX):
  """Preset ``name`` of ``presets`` with the dotted ``overrides`` applied.

  Raises:
    FlagError: naming ``--<prefix>`` for an unknown preset, else the dotted
      field whose value is bad.
  """
  if name not in presets:
    raise FlagError(prefix, f"unknown preset {name!r}; presets: "
                    f"{', '.join(presets)}")
  return apply_overrides(presets[name], overrides, prefix)
