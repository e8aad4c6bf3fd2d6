"""Kernel metadata as the system architecture's YAML (seed 003, section 11.2).

One YAML document per kernel, each a mapping of the seed's keys (``name``, ``tile``,
``fragments``, ``resources``, ``launch``, ``epilogue``, and ``function``, the ``.tsr``
function that launches it), whose values are scalars or flow collections:

```yaml
name: mlp_k0
function: mlp
tile: {BM: 128, BN: 256, BK: 64, stages: 4}
fragments: {mma: "64x256x16", inst: wgmma.bf16, dtype_in: bf16, dtype_acc: f32}
resources: {regs_per_thread: 168, smem_per_cta: 196608}
launch: {grid: [ceil(F/256), ceil(T/128), 1], block: [256, 1, 1]}
epilogue: [add, gelu, cast]
```

``dump`` writes records so, and ``load`` reads what ``dump`` writes (that subset of
YAML: no block collections, anchors or tags, so that Tessera needs no YAML library);
``load(dump(records)) == records``. A text outside the subset is a ``ValueError`` that
names the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["dump", "load"]

#: A string written without quotes: it starts with a letter and holds nothing that YAML
#: reads as syntax in a flow collection.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.()/*+-]*\Z")
#: Plain scalars YAML reads as something other than a string.
_RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}
_INTEGER = re.compile(r"-?[0-9]+\Z")
_TOKEN = re.compile(
    r'\s*(?:([\[\]{},])|("(?:[^"\\]|\\.)*")|([^\[\]{},:\s"][^\[\]{},]*?)(?=\s*(?:[\[\]{},]|:\s|:$|$))|(:)(?:\s+|$))'
)


def dump(records: Iterable[Mapping[str, Any]], comment: str | None = None) -> str:
    """The records as YAML documents, a ``---`` line before each; ``comment`` first."""
    lines = [f"# {line}" for line in (comment.splitlines() if comment else [])]
    for record in records:
        lines.append("---")
        lines += [f"{_key(key)}: {_flow(value)}" for key, value in record.items()]
    return "\n".join(lines) + "\n"


def load(text: str, name: str = "<yaml>") -> list[dict[str, Any]]:
    """The records of ``dump``'s text; ``name`` is the file's, for the messages."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped == "---":
            records.append({})
            continue
        if not records or line[:1].isspace():
            raise ValueError(f"{name}:{number}: expected '---' or 'key: value' at column 1")
        try:
            tokens = _tokens(stripped)
            key, rest = tokens[0], tokens[1:]
            if key[0] != "scalar" or not rest or rest[0] != ("punct", ":"):
                raise ValueError("expected 'key: value'")
            value, end = _value(rest, 1)
            if end != len(rest):
                raise ValueError("unexpected text after the value")
        except ValueError as exc:
            raise ValueError(f"{name}:{number}: {exc}") from None
        records[-1][str(key[1])] = value
    return records


def _key(key: str) -> str:
    return key if _PLAIN.match(key) and key.lower() not in _RESERVED else json.dumps(key)


def _flow(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _key(value)
    raise TypeError(f"kernel metadata holds no {type(value).__name__}: {value!r}")


def _tokens(text: str) -> list[tuple[str, Any]]:
    """``("punct", c)`` for the flow syntax, ``("scalar", value)`` for a scalar."""
    tokens: list[tuple[str, Any]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"unexpected {text[position:].strip()[:20]!r}")
        punct, quoted, plain, colon = match.groups()
        if punct or colon:
            tokens.append(("punct", punct or colon))
        elif quoted:
            tokens.append(("scalar", json.loads(quoted)))
        else:
            tokens.append(("scalar", _plain(plain.strip())))
        position = match.end()
    return tokens


def _plain(text: str) -> Any:
    if _INTEGER.match(text):
        return int(text)
    return {"true": True, "false": False, "null": None, "~": None}.get(text, text)


def _value(tokens: list[tuple[str, Any]], at: int) -> tuple[Any, int]:
    """The value that starts at ``tokens[at]``, and the index after it."""
    if at >= len(tokens):
        raise ValueError("expected a value")
    kind, token = tokens[at]
    if kind == "scalar":
        return token, at + 1
    if token not in "[{":
        raise ValueError(f"unexpected {token!r}")
    close, items, mapping = ("]" if token == "[" else "}"), [], {}
    at += 1
    while tokens[at : at + 1] != [("punct", close)]:
        if token == "{":
            key, at = _value(tokens, at)
            if tokens[at : at + 1] != [("punct", ":")]:
                raise ValueError("expected ': ' after a key")
            mapping[key], at = _value(tokens, at + 1)
        else:
            item, at = _value(tokens, at)
            items.append(item)
        if tokens[at : at + 1] == [("punct", ",")]:
            at += 1
        elif tokens[at : at + 1] != [("punct", close)]:
            raise ValueError(f"expected ',' or {close!r}")
    return (mapping if token == "{" else items), at + 1
