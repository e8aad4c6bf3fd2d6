"""Autotuning and the persistent schedule cache (``tesserac tune``).

``tune_file`` measures the candidates of each tunable launch and merges a
record per launch into a cache file; ``compile_file(..., schedule_cache=PATH)``
(``tesserac --schedule-cache PATH``) then uses the records that still apply.
See ``docs/autotuning.md``.
"""

from .cachefile import CacheWarning, merge, read, update
from .search import TuneError, tune, tune_file

__all__ = ["CacheWarning", "TuneError", "merge", "read", "tune", "tune_file", "update"]
