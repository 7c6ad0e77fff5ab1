"""The boutique's JSON as the Python ports read and write it, held to what the Rust services'
serde types accept and produce, so that a caller cannot tell a port from the Rust service:

- reading: an input that is not UTF-8 or not JSON, a missing or mistyped field, a field given
  twice, an integer out of its Rust type's range: 400 ``SERVICE: bad request: WHY`` (the
  status and the prefix are the Rust service's; WHY follows serde's wording, without its line
  and column);
- writing: compact JSON, keys in the order of the Rust structs' fields, text as UTF-8 (what
  serde_json writes, byte for byte);
- quoting input in a message as Rust's ``{:?}`` does.

Python's ``json`` is laxer than serde_json in a few places, closed here: it takes ``NaN`` and
``Infinity``, keeps the last of two equal keys, and lets a lone surrogate escape through.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Any

import zerohop

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
U32_MAX = 2**32 - 1

NANOS_PER_UNIT = 1_000_000_000

_MISSING: Any = object()


class _Object(dict):
    """A JSON object; ``twice`` holds the keys it has more than once."""

    __slots__ = ("twice",)


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.twice = set()
    for k, v in pairs:
        if k in obj:
            obj.twice.add(k)
        obj[k] = v
    return obj


def _no_constant(name: str) -> None:
    raise ValueError(f"`{name}` is not JSON")


@dataclass(frozen=True)
class Money:
    """An amount, as money.rs's ``Money``: a currency code, units and nanos."""

    currency_code: str
    units: int
    nanos: int

    @property
    def total_nanos(self) -> int:
        return self.units * NANOS_PER_UNIT + self.nanos


def bad_request(service: str, why: str) -> zerohop.HandlerError:
    return zerohop.HandlerError(400, f"{service}: bad request: {why}")


def text(service: str, body: memoryview) -> str:
    """The request's body as text (decoded straight from the slot)."""
    try:
        return str(body, "utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(service, f"invalid UTF-8: {e}") from None


def dump(value: Any) -> bytes:
    """``value`` as serde_json writes it: compact, UTF-8, keys in the dict's order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


_ESCAPES = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}


def rust_debug(s: str) -> str:
    """``s`` quoted as Rust's ``{:?}`` shows a string: the same escapes, and ``\\u{..}`` for
    what is not printable (categories C*, Z* but the space) or is a combining mark."""
    out = ['"']
    for c in s:
        e = _ESCAPES.get(c)
        if e is None:
            if not c.isprintable() or unicodedata.category(c) in ("Mn", "Me"):
                e = f"\\u{{{ord(c):x}}}"
            else:
                e = c
        out.append(e)
    out.append('"')
    return "".join(out)


def describe(v: Any) -> str:
    """How serde names an unexpected value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f"string {rust_debug(v)}"
    if isinstance(v, list):
        return "sequence"
    return "map"


class Reader:
    """One request's JSON, parsed; its methods check a value's type and return it, or raise
    the 400 that serde's error would have been."""

    def __init__(self, service: str, data: str) -> None:
        self.service = service
        try:
            self.root = json.loads(data, object_pairs_hook=_object, parse_constant=_no_constant)
        except ValueError as e:  # JSONDecodeError, a huge integer
            raise self.bad(str(e)) from None
        except RecursionError:
            raise self.bad("recursion limit exceeded") from None

    def bad(self, why: str) -> zerohop.HandlerError:
        return bad_request(self.service, why)

    def struct(self, v: Any, what: str) -> _Object:
        if not isinstance(v, _Object):
            raise self.bad(f"invalid type: {describe(v)}, expected {what}")
        return v

    def field(self, obj: _Object, name: str, default: Any = _MISSING, alias: str = "") -> Any:
        """The field ``name`` (or its serde ``alias``) of ``obj``; ``default`` when absent
        (``#[serde(default)]``), else missing is an error."""
        present = [n for n in (name, alias) if n and n in obj]
        if len(present) > 1 or (present and present[0] in obj.twice):
            raise self.bad(f"duplicate field `{name}`")
        if not present:
            if default is _MISSING:
                raise self.bad(f"missing field `{name}`")
            return default
        return obj[present[0]]

    def string(self, v: Any) -> str:
        if not isinstance(v, str):
            raise self.bad(f"invalid type: {describe(v)}, expected a string")
        # Only a \uD800-\uDFFF escape makes a surrogate (the text was valid UTF-8), and a
        # surrogate is not ASCII: most strings need no encoding to rule one out.
        if not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise self.bad("lone surrogate in hex escape") from None
        return v

    def integer(self, v: Any, lo: int, hi: int, what: str) -> int:
        """An integer of the Rust type ``what`` (``u32``), from ``lo`` to ``hi``."""
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.bad(f"invalid type: {describe(v)}, expected {what}")
        if not lo <= v <= hi:
            raise self.bad(f"invalid value: integer `{v}`, expected {what}")
        return v

    def sequence(self, v: Any, what: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.bad(f"invalid type: {describe(v)}, expected {what}")
        return v

    def money(self, v: Any) -> Money:
        m = self.struct(v, "struct Money")
        return Money(
            self.string(self.field(m, "currency_code", alias="currencyCode")),
            self.integer(self.field(m, "units", default=0), I64_MIN, I64_MAX, "i64"),
            self.integer(self.field(m, "nanos", default=0), I32_MIN, I32_MAX, "i32"),
        )
