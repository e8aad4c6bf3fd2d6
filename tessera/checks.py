"""Whether the compiler checks its own work as it goes, at a cost in time.

Some checks find only the compiler's bugs and never change what a correct compilation
produces: that a value class's field is not assigned after ``__init__``
(``tessera/frozen.py``), and that the Tile IR is well formed after every tile pass
rather than once after the last (``tile/passes.py``). Like ``assert`` statements, they
run where ``TESSERA_CHECKS=1``: the test suite sets it (``tests/conftest.py``), so that a
pass that breaks an invariant fails there, at the pass that broke it, and a user's
compilation does not pay for them.
"""

from __future__ import annotations

import os

__all__ = ["ENABLED"]

ENABLED = os.environ.get("TESSERA_CHECKS") == "1"
