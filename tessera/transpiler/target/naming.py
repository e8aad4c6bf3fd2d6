"""Names printed into generated source: valid, unique, and as close to the ``.tsr`` as can be.

One ``Namer`` per generated function. Names from the source keep their spelling
where the target language allows it (``acc.1`` becomes ``acc_1``); a clash with a
keyword, a reserved name or an earlier name gets a numeric suffix.
"""

from __future__ import annotations

import re

__all__ = ["Namer", "C_KEYWORDS"]

_WORDS = """alignas alignof and asm auto bool break case catch char class const constexpr
    const_cast continue decltype default delete do double dynamic_cast else enum explicit
    export extern false float for friend goto if inline int long mutable namespace new
    noexcept not nullptr operator or private protected public register reinterpret_cast
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void
    volatile wchar_t while xor area std tsr i64 kernel local global private constant i j r"""
C_KEYWORDS = frozenset(_WORDS.split())


class Namer:
    def __init__(self, reserved: frozenset[str] = frozenset()) -> None:
        self.used: set[str] = set(C_KEYWORDS) | set(reserved)

    def fresh(self, wanted: str | None, fallback: str = "t") -> str:
        base = re.sub(r"\W", "_", wanted or fallback)
        if not base or base[0].isdigit():
            base = f"{fallback}{base}"
        base = base.rstrip("_") or fallback
        name, n = base, 1
        while name in self.used or name.startswith("__"):
            name = f"{base}_{n}"
            n += 1
        self.used.add(name)
        return name
