"""The config file's shape as msgspec Structs, and their errors as replag's one-line errors.

Every table of the file is a `FileTable`: unknown keys are refused and nothing is
coerced (TOML has types: "5" is not 5). Values TOML has no type for (durations,
slot ranges, environment variable names, ...) are small classes with a `parse`
classmethod, which `validate` calls through msgspec's decode hook. Checks that
span keys run in a table's `__post_init__`; one that knows a finer key than the
table it runs in raises `AtKey`. `validate()` turns msgspec's first error,
"Expected `str`, got `int` - at `$.regions[0].name`", into
`ConfigError("file: regions[0].name: expected a string, got an integer")`.
Values are echoed only where they are choices: a mistyped value may be a secret.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import msgspec

from replag.durations import parse_duration_s
from replag.errors import ConfigError

Loc = tuple[str | int, ...]
T = TypeVar("T", bound="FileTable")


class FileTable(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, omit_defaults=True
):
    """A table of the config file: known keys only, TOML's own types, immutable.

    `noun` names the table in "missing region name"-style errors. Encoded (to write
    a file), keys left at their default are left out. Subclasses restate `frozen=True,
    kw_only=True`: neither msgspec (kw_only) nor mypy (frozen) carries them down.
    """

    noun: ClassVar[str] = ""


class AtKey(ValueError):
    """A validation failure at `key`, a path below the table that raised it."""

    def __init__(self, key: Loc, message: str) -> None:
        super().__init__(message)
        self.key = key

    def under(self, *prefix: str | int) -> AtKey:
        return AtKey((*prefix, *self.key), str(self))


NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class Seconds(float):
    """A duration, written "5m", "80ms" or a number of seconds."""

    @classmethod
    def parse(cls, value: Any) -> Seconds:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"expected a duration like 5m, got {value!r}")
        return cls(parse_duration_s(value))


class PositiveSeconds(Seconds):
    """A duration longer than 0s."""

    @classmethod
    def parse(cls, value: Any) -> PositiveSeconds:
        seconds = cls(Seconds.parse(value))
        if seconds <= 0:
            raise ValueError("must be longer than 0s")
        return seconds


class EnvVar(str):
    """The name of an environment variable that holds a secret; it must be set."""

    @classmethod
    def parse(cls, value: Any) -> EnvVar:
        if not isinstance(value, str) or not value:
            raise ValueError("expected the name of an environment variable")
        return cls(value)


def validate(
    table: type[T], data: Any, *, where: str, environ: Mapping[str, str] | None = None
) -> T:
    """`table` from `data` (a file's parsed tables), or ConfigError naming `where` and the key.

    `environ` is where `EnvVar` values must be set.
    """
    environ = {} if environ is None else environ

    def decode(kind: type, value: Any) -> Any:
        parse = getattr(kind, "parse", None)
        if parse is None:
            raise NotImplementedError(kind)
        parsed = parse(value)
        if isinstance(parsed, EnvVar) and parsed not in environ:
            raise ValueError(f"environment variable {parsed} is not set")
        return parsed

    try:
        return msgspec.convert(data, table, strict=True, dec_hook=decode)
    except msgspec.ValidationError as exc:
        raise config_error(table, exc, where=where) from None


def as_written(table: FileTable) -> dict[str, Any]:
    """`table` as the file writes it: keys in declared order, those left at their default out."""

    def encode(value: Any) -> Any:  # the value classes (Seconds, ...) as what they extend
        for builtin in (str, float):
            if isinstance(value, builtin):
                return builtin(value)
        raise NotImplementedError(type(value))

    written: dict[str, Any] = msgspec.to_builtins(table, enc_hook=encode)
    return written


def config_error(
    table: type[FileTable], exc: msgspec.ValidationError, *, where: str
) -> ConfigError:
    """`exc` as one line: `where: key.path: what is wrong`."""
    match = _AT.match(str(exc))
    text, path = (match["text"], match["path"] or "") if match else (str(exc), "")
    loc: Loc = tuple(name or int(index) for name, index in _STEP.findall(path))
    if isinstance(exc.__cause__, AtKey):
        loc += exc.__cause__.key
        message = str(exc.__cause__)
    elif unknown := _UNKNOWN.match(text):
        message = f"unknown key {unknown[1]!r}"
        if _is_table(kind := _type_at(table, loc, a_table=True)):
            known = sorted(f.encode_name for f in msgspec.structs.fields(kind))
            message += f" (expected {', '.join(known)})"
    elif missing := _MISSING.match(text):
        noun = getattr(_type_at(table, loc, a_table=True), "noun", "")
        loc += (missing[1],)
        message = " ".join(w for w in ("missing", noun, missing[1]) if w)
    else:
        message = _message(text, _type_at(table, loc))
    key = key_path(loc)
    return ConfigError(message, where=f"{where}: {key}" if key else where)


def key_path(loc: Loc) -> str:
    """("regions", 0, "write") → "regions[0].write"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


_AT = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$")
_MISSING = re.compile(r"^Object missing required field `(.*)`$")
_ENUM = re.compile(r"^Invalid enum value (.*)$")
_EXPECTED = re.compile(r"^Expected `([^`]*)`(?:, got `([^`]*)`)?(.*)$")
_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "array": "an array",
    "object": "a table",
}


def _message(text: str, kind: Any) -> str:
    """msgspec's message in replag's words; `kind` is the type declared at the key."""
    if enum := _ENUM.match(text):
        return f"expected one of {', '.join(get_args(kind))}, got {enum[1]}"
    expected = _EXPECTED.match(text)
    if expected is None:
        return text[:1].lower() + text[1:]
    wanted, given, rest = expected.groups()
    if get_origin(kind) is Literal:
        return f"expected one of {', '.join(get_args(kind))}, got {_WORDS.get(given, given)}"
    if wanted == "str" and rest == " of length >= 1":
        return "must not be empty"
    words = [_WORDS.get(w, w) for w in wanted.split(" | ") if w != "null"]
    phrase = f"expected {' or '.join(words)}{rest}"
    return f"{phrase}, got {_WORDS.get(given, given)}" if given else phrase


def _type_at(table: type[FileTable], loc: Loc, *, a_table: bool = False) -> Any:
    """The type declared at `loc` below `table` (a Struct, a Literal, ...); `a_table`:
    the table in a union such as `str | EndpointTable`."""
    current: Any = table
    for part in loc:
        current = _unwrap(current, part)
        if isinstance(part, int):
            current = get_args(current)[0] if get_args(current) else Any
            continue
        if not _is_table(current):
            return Any
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(current)}
        current = fields.get(part, Any)
    return _unwrap(current, "" if a_table else None)


def _unwrap(kind: Any, step: str | int | None) -> Any:
    """`kind` without Annotated and None; in a union, the member the next `step` goes into."""
    while get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if get_origin(kind) in (Union, types.UnionType):
        members = [_unwrap(m, step) for m in get_args(kind) if m is not type(None)]
        if isinstance(step, int):
            members = [m for m in members if get_origin(m) is list] or members
        elif isinstance(step, str):
            members = [m for m in members if _is_table(m)] or members
        kind = members[0] if len(members) == 1 else kind
    return kind


def _is_table(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)
