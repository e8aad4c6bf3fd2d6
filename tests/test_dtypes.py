"""Every dtype the language accepts, on every target, as a parameter, a result and an
intermediate (within a kernel and between two): it compiles, or it is refused at the
line that uses it with a message naming the target. Which ones run correctly is checked
by the backends' tests (``check_integers`` for i8 and i32)."""

from __future__ import annotations

import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import CompileError
from tessera.transpiler.graph.dtypes import DTYPES

pytestmark = pytest.mark.unit

TARGETS = [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", None)]
#: Each role's program, and the line (1-based) where the dtype is first used.
ROLES = {
    "parameter": ('def f(x: Tensor["R", "C", {d}]) -> Tensor["R", "C", f32]:\n'
                  "    return cast(x, f32)\n", 2),
    "result": ('def f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", {d}]:\n'
               "    return cast(x, {d})\n", 3),
    "within a kernel": ('def f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:\n'
                        "    return cast(cast(x, {d}), f32) + x\n", 3),
    "between kernels": ('def f(x: Tensor["R", "C", f32]) -> Tensor["R", f32]:\n'
                        "    y = cast(x, {d})\n"
                        "    return cast(sum(y, axis=1), f32) + sum(cast(y, f32) * x, axis=1)\n",
                        3),
}  # fmt: skip
#: What a target may refuse today: nothing.
REFUSED: set[str] = set()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a or t for t, a in TARGETS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_lowers_or_is_refused_at_its_line(
    dtype: str, target: str, arch: str | None, role: str
) -> None:
    text, line = ROLES[role]
    source = "@kernel\n" + text.format(d=dtype)
    try:
        program = tessera.compile(source, filename="d.tsr", target=target, arch=arch)
        assert program.source
    except CompileError as exc:
        assert dtype in REFUSED, str(exc)
        assert str(exc).startswith(
            f"d.tsr:{line}:"
        ) and f"{dtype} tensors are not supported on the {target} target" in str(exc), str(exc)
    else:
        assert dtype not in REFUSED
