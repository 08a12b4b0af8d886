"""The one value coercer: a raw option value (CLI/env text, or a parsed TOML/JSON value)
to a declared type. Used by the policy registry (``--policy NAME@KEY=VALUE``) and by the
router's settings (``router.settings``), so both read ``yes``/``off``/``1`` the same way.

Types: ``bool`` (``True``/``False``, ``0``/``1``, or the words true/false, yes/no, on/off,
1/0 in any case), ``int`` (not a bool, not a fractional float), ``float`` (not a bool),
``str`` (a table or list becomes its JSON text), ``tuple[str, ...]`` (comma-separated
text or a list), or any class with a ``from_option(value)`` classmethod (a value already of
that class is kept). A value the type cannot take raises ``OptionError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, get_type_hints

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class OptionError(ValueError):
    """An option value its declared type cannot take (the message names the key)."""


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE_WORDS:
            return True
        if text in FALSE_WORDS:
            return False
    raise ValueError(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value.strip() if isinstance(value, str) else value)


def _float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def _str(value: Any) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    raise ValueError(value)


_BY_TYPE = {bool: _bool, int: _int, float: _float, str: _str}


def type_name(typ: Any) -> str:
    return getattr(typ, "__name__", None) or str(typ)


def coerce(key: str, typ: Any, value: Any) -> Any:
    """``value`` as ``typ``; ``OptionError`` (naming ``key``) when it cannot be one."""
    convert = _BY_TYPE.get(typ)
    if convert is None and getattr(typ, "__origin__", None) is tuple:
        convert = _strings
    from_option = getattr(typ, "from_option", None)
    if convert is None and callable(from_option):
        if isinstance(typ, type) and isinstance(value, typ):
            return value
        convert = from_option
    if convert is None:
        raise OptionError(f"{key}: cannot be set from a string or file value")
    try:
        return convert(value)
    except (TypeError, ValueError) as exc:
        if convert is from_option:  # the class's own message says what is wrong
            raise OptionError(f"{key}: {exc}") from None
        raise OptionError(f"{key}: cannot use {value!r} as {type_name(typ)}") from None


def config_from_options(config_cls: type[Any], options: Mapping[str, Any]) -> Any:
    """The dataclass ``config_cls`` with its defaults overridden by ``options``, each coerced
    to its field's declared type; an unknown key raises ``OptionError``. The config's own
    validation (``__post_init__``) raises ``ValueError``."""
    hints = get_type_hints(config_cls)
    fields = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise OptionError(f"unknown options {unknown}; known: {sorted(fields)}")
    return config_cls(**{k: coerce(k, hints[k], v) for k, v in options.items()})
