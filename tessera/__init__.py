"""Tessera: a tile-first kernel language and its source-to-source compiler.

``tessera.compile_file("attn.tsr", target="cpu")`` gives a ``Program`` whose
``inspect_ir(stage)`` shows each stage of the pipeline; the ``tesserac``
command is the same compiler on the command line.
"""

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

__version__ = "0.1.0"

__all__ = [
    "STAGES",
    "CompileError",
    "Diagnostic",
    "InternalCompilerError",
    "Options",
    "OptionsError",
    "Program",
    "StageNotImplemented",
    "__version__",
    "compile",
    "compile_file",
]
