"""How deeply a program may nest, and the Python recursion the compiler needs for it.

The passes over the AST (analysis, evaluation, printing, fingerprints) recurse once per
level of nesting, a few Python frames at a time (a call is evaluated, its arguments
bound, each evaluated). So the parser refuses a program nested deeper than
``MAX_DEPTH`` at the place where it gets too deep, and the pipeline runs its stages with
a recursion limit that covers the deepest program it accepts. A flat chain such as
``a + b + ... + z`` is a left-deep tree, one level per term, so the limit allows long
ones; the later IRs are flat lists of operations and do not recurse on it.
(``process_settings.recursion_headroom`` raises the limit while a compilation runs.)
"""

from __future__ import annotations

__all__ = ["MAX_DEPTH", "RECURSION_NEEDED"]

#: Levels of nested expressions and blocks, counted from the top of the file.
MAX_DEPTH = 500
#: Python frames per level in the deepest-recursing pass, and frames around them.
_FRAMES_PER_LEVEL = 10
_BASE_FRAMES = 1000
#: The recursion limit that the deepest program the parser accepts needs.
RECURSION_NEEDED = MAX_DEPTH * _FRAMES_PER_LEVEL + _BASE_FRAMES
