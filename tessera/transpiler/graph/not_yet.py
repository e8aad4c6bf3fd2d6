"""Parts of the language that are accepted but do nothing yet.

The seeds' surface is wider than what the compiler implements. A program that asks
for one of these still compiles, as the seeds' snippets must, but a policy or hint
that silently changes nothing would let a user believe a result is saturated,
stochastically rounded or loss-scaled when it is not. So each one warns at the line
that asks for it, with what happens instead, until it is implemented (and leaves this
table).
"""

from __future__ import annotations

__all__ = ["NOT_YET", "not_yet"]

#: Each feature as the user writes it, and what the program does instead.
NOT_YET = {
    "@device": "the state lives where the target's tensors do",
    "@paged": "the state is held in contiguous tensors",
    "@checkpointable": "the state is not checkpointed",
    "with device(...)": "the code runs on the device of the target it is compiled for",
    "with prefetch(...)": "the schedule's pipeline stages decide what is loaded ahead",
    "vector=": "the schedule's vector width decides how loads are vectorized",
    "prefetch=": "the schedule's pipeline stages decide what is loaded ahead",
}


def not_yet(feature: str) -> str:
    """The warning for a feature of ``NOT_YET``."""
    return f"{feature} is accepted but has no effect yet: {NOT_YET[feature]}"
