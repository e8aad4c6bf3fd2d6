"""Tessera: a tile-first kernel language and its source-to-source compiler.

``tessera.compile_file("attn.tsr", target="cpu")`` gives a ``Program`` whose
``inspect_ir(stage)`` shows each stage of the pipeline; the ``tesserac``
command is the same compiler on the command line.

The compiler is imported on first use of one of these names, so that ``import
tessera`` (and a program that only loads generated code) does not pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from . import bytecode  # after the version, which stamps what it keeps

bytecode.install()

#: Each public name and the module that defines it.
_PUBLIC = {
    "CompileError": "tessera.transpiler.frontend.diagnostics",
    "Diagnostic": "tessera.transpiler.frontend.diagnostics",
    "Options": "tessera.transpiler.options",
    "OptionsError": "tessera.transpiler.options",
    "STAGES": "tessera.transpiler.pipeline",
    "InternalCompilerError": "tessera.transpiler.pipeline",
    "Program": "tessera.transpiler.pipeline",
    "StageNotImplemented": "tessera.transpiler.pipeline",
    "compile": "tessera.transpiler.pipeline",
    "compile_file": "tessera.transpiler.pipeline",
    "load_bundle": "tessera.runtime.bundle",
    "KVCache": "tessera.runtime.kvcache",
    "decode_attention": "tessera.runtime.kvcache",
    "OptimizerState": "tessera.runtime.optstate",
}

__all__ = [
    "STAGES",
    "CompileError",
    "Diagnostic",
    "InternalCompilerError",
    "KVCache",
    "OptimizerState",
    "Options",
    "OptionsError",
    "Program",
    "StageNotImplemented",
    "__version__",
    "compile",
    "compile_file",
    "decode_attention",
    "load_bundle",
]

if TYPE_CHECKING:
    from .runtime.bundle import load_bundle
    from .runtime.kvcache import KVCache, decode_attention
    from .runtime.optstate import OptimizerState
    from .transpiler.frontend.diagnostics import CompileError, Diagnostic
    from .transpiler.options import Options, OptionsError
    from .transpiler.pipeline import (
        STAGES,
        InternalCompilerError,
        Program,
        StageNotImplemented,
        compile,
        compile_file,
    )


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tessera' has no attribute '{name}'")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
