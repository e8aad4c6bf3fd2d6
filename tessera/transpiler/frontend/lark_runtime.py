"""The parts of Lark the front end uses, from a stand-alone parser kept between runs.

Importing the ``lark`` package cost every ``tesserac`` run about 60 ms (its grammar
compiler, its Earley parsers, ``interegular``), and loading its cached tables another
20, though a run needs only the LALR parser and one grammar's tables. Lark can write
a stand-alone module holding just that runtime and those tables. Tessera writes one
for its grammar into the private cache folder the first time it runs (named after a
digest of the grammar and the options below, so an edited grammar gets a new one)
and imports it from there afterwards; Python keeps its bytecode beside it like any
module's code. The module is loaded as code, so only a folder that belongs to the
user alone is used (``private_cache_dir``); where there is none, the ``lark`` package
is used directly, as it is to write the module.

The module is 350 kB of Python, mostly the tables as literals, and compiling it took
90 to 130 ms of each run wherever Python keeps no bytecode of its own
(``PYTHONDONTWRITEBYTECODE``, a read-only install). Its compiled code is kept beside
it as Tessera keeps its own modules' (``tessera/bytecode.py``): stamped with the
Python, the Tessera version and a digest of the source it came from, so it is used
only for that very text, and compiled anew when it is missing, damaged or stale.

Either way every class below comes from one place, so the tokens the lexer makes are
the ``Token`` the builder and the postlexer check for.
"""

from __future__ import annotations

import hashlib
import io
import sys
from importlib import resources
from types import ModuleType
from typing import Any

from ...bytecode import compiled
from ...cachedir import keep, private_cache_dir

__all__ = [
    "Token", "Tree", "PostLex", "PatternStr", "UnexpectedInput", "UnexpectedToken",
    "UnexpectedCharacters", "new_parser",
]  # fmt: skip

#: What the front end takes from the module.
_TAKEN = ("Token", "Tree", "PostLex", "PatternStr", "UnexpectedInput", "UnexpectedToken",
          "UnexpectedCharacters", "Lark_StandAlone")  # fmt: skip

#: How the grammar is compiled: fixed when the tables are, so part of the file's name.
OPTIONS: dict[str, Any] = {
    "parser": "lalr",
    "lexer": "basic",
    "maybe_placeholders": False,
    "keep_all_tokens": True,  # the builder filters, and takes spans from the edges
}


def _grammar() -> str:
    return resources.files("tessera.grammar").joinpath("tessera.lark").read_text("utf-8")


def _kept_name(grammar: str) -> str:
    digest = hashlib.sha256((grammar + repr(sorted(OPTIONS.items()))).encode()).hexdigest()
    return f"tessera_lalr_{digest[:24]}.py"


def stand_alone_source(grammar: str) -> str:
    """Lark's stand-alone parser module for ``grammar`` (``strict``: a collision between
    two terminals is an error here, not an ambiguity at some user's line)."""
    import lark
    from lark.tools.standalone import gen_standalone

    out = io.StringIO()
    gen_standalone(lark.Lark(grammar, strict=True, **OPTIONS), out=out)
    return out.getvalue()


def _load_kept() -> ModuleType | None:
    """The stand-alone parser from the private cache folder, written there first if it
    is not yet; None where there is no such folder."""
    folder = private_cache_dir("parser")
    if folder is None:
        return None
    grammar = _grammar()
    path = folder / _kept_name(grammar)
    if not path.exists():
        keep(path, stand_alone_source(grammar).encode("utf-8"))
    module = ModuleType("tessera_lalr")
    module.__file__ = str(path)
    try:
        kept = path.with_suffix(f".{sys.implementation.cache_tag}.code")
        exec(compiled(path.read_bytes(), str(path), kept), module.__dict__)
        if all(hasattr(module, name) for name in _TAKEN):
            return module
    except Exception:  # damaged: written anew next time, and lark used this time
        pass
    path.unlink(missing_ok=True)
    return None


_kept = _load_kept()

if _kept is not None:
    Token = _kept.Token
    Tree = _kept.Tree
    PostLex = _kept.PostLex
    PatternStr = _kept.PatternStr
    UnexpectedInput = _kept.UnexpectedInput
    UnexpectedToken = _kept.UnexpectedToken
    UnexpectedCharacters = _kept.UnexpectedCharacters
else:
    from lark import Token, Tree
    from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
    from lark.lark import PostLex
    from lark.lexer import PatternStr


def new_parser(**runtime: Any) -> Any:
    """A LALR parser for the grammar; ``runtime`` holds the options Lark takes when it
    loads tables (``postlex``, ``transformer``)."""
    if _kept is not None:
        return _kept.Lark_StandAlone(**runtime)
    import lark

    return lark.Lark(_grammar(), strict=True, **OPTIONS, **runtime)
