"""Documentation generated from code stays current, and every figure the documentation
states about the compiler's output (how many kernels a program is) comes from here."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import tessera
from tessera.transpiler.graph.graph_ops import GRAPH_OPS
from tessera.transpiler.graph.opdocs import main as write_ops_doc
from tessera.transpiler.graph.opdocs import render_ops_doc

from .conftest import ROOT
from .reference import f32_attention_source

pytestmark = pytest.mark.unit
OPS_DOC = ROOT / "docs" / "ops.md"


def test_ops_reference_is_current(update_golden: bool) -> None:
    expected = render_ops_doc()
    if update_golden:
        OPS_DOC.write_text(expected, encoding="utf-8")
    assert (
        OPS_DOC.read_text(encoding="utf-8") == expected
    ), "docs/ops.md is stale: run python -m tessera.transpiler.graph.opdocs"


def test_ops_reference_writer_takes_help_as_an_option_not_a_file_name(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        write_ops_doc(["--help"])
    assert exit_info.value.code == 0 and "operation reference" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())
    write_ops_doc(["ops.md"])
    assert (tmp_path / "ops.md").read_text(encoding="utf-8") == render_ops_doc()


def test_every_operation_is_documented() -> None:
    undocumented = [name for name, spec in GRAPH_OPS.items() if len(spec.doc) < 20]
    assert not undocumented


# ------------------------------------------------------------- figures in the docs

#: The documents whose prose states figures about the compiler's output.
DOCUMENTS = [
    "README.md",
    *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))),
    *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "examples").glob("*.tsr"))),
]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve"]  # fmt: skip
#: Two tensors of one shape, and ``fused_adam`` with ``master=`` on tensors.
PAIR = 'x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]'
ADAM_MASTER = """\
def f(w: Tensor["N", bf16], dw: Tensor["N", bf16], m: Tensor["N", f32], v: Tensor["N", f32],
      w32: Tensor["N", f32]) -> tuple[Tensor["N", bf16], Tensor["N", f32], Tensor["N", f32],
                                      Tensor["N", f32]]:
    return fused_adam(w, dw, m, v, lr=0.1, step=1, master=w32)
"""
#: A count of kernels in prose: "12 kernels", "is one kernel", "one elementwise kernel".
COUNT = re.compile(rf"(?<![\w:.+-])(?:\d+|{'|'.join(WORDS)})(?: [\w`-]+)? kernels?\b")
#: Phrases that COUNT finds but that state no figure of a program's output.
NOT_FIGURES = ["the operations fused into one kernel", "(a tile kernel, always one kernel)"]


def _prose(path: str) -> str:
    """A document's text with its lines joined (and a ``.tsr`` file's comments only)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".tsr"):
        text = "\n".join(line.removeprefix("#") for line in text.splitlines()
                          if line.startswith("#"))  # fmt: skip
    return " ".join(text.split())


@functools.cache
def _launches(source: str, function: str | None = None) -> tuple[str, ...]:
    """The library kernels (Schedule IR templates) that a program's function launches:
    the file's one function, or ``function``. ``source`` is a path under the repository
    or the text of a program."""
    path = ROOT / source
    program = (tessera.compile_file(path, target="cpu") if source.endswith(".tsr")
               else tessera.compile(source, filename="doc.tsr", target="cpu"))  # fmt: skip
    (chosen,) = [p for p in program.ir("sched").programs if function in (None, p.function)]
    return tuple(launch.template for launch in chosen.launches if launch.kind != "host")


@functools.cache
def _decode_kernels() -> tuple[bool, ...]:
    """Whether each of ``examples/decode.tsr``'s kernels is an earlier kernel's twin."""
    program = tessera.compile_file(ROOT / "examples/decode.tsr", target="cuda")
    return tuple(k.twin is not None for p in program.ir("tile").programs for k in p.kernels)


def _snippet(params: str, result: str, *before: str) -> str:
    """A function of ``params`` that returns ``result``, after the statements ``before``."""
    body = "".join(f"    {line}\n" for line in (*before, f"return {result}"))
    return f"@kernel\ndef f({params}):\n{body}"


@dataclass(frozen=True)
class Figure:
    """A sentence of a document that states a figure, ``{n}`` where it stands, and the
    figure computed from the compiler's output."""

    path: str
    text: str
    figure: Callable[[], int | dict[str, int]]
    words: bool = True

    def expected(self) -> str:
        """The sentence with the figure (``{n}``), or the named figures, in place."""
        figures = self.figure()
        figures = figures if isinstance(figures, dict) else {"n": figures}
        return self.text.format(**{k: WORDS[n] if self.words and n < len(WORDS) else n
                                   for k, n in figures.items()})  # fmt: skip


def _hip_attention_plan() -> dict[str, int]:
    """The schedule of f32 attention over a run-time head dim (128 wide) on gfx90a."""
    program = tessera.compile(f32_attention_source(False), "attention.tsr", target="hip")
    (launch,) = program.ir("sched").programs[0].launches
    tiles = dict(launch.tiles)
    return {"m": tiles["BM"], "n": tiles["BN"], "head": tiles["BD"], "warps": launch.warps,
            "smem": launch.smem_bytes}  # fmt: skip


#: Activations by an i4 weight with a scale and a zero point per group of 32 rows, and
#: by an i8 weight with a scale per row (a form the product does not dequantize itself).
DEQUANTIZED = (
    'x: Tensor["M", "K", bf16], q: Tensor["K", "N", i4], s: Tensor["K/32", "N", f32], '
    'z: Tensor["K/32", "N", f32]'
)
PER_ROW = 'x: Tensor["M", "K", bf16], q: Tensor["K", "N", i8], r: Tensor["K", 1, f32]'
VECTOR = 'v: Tensor["N", f32]'
MATRIX = 'x: Tensor["R", "C", f32]'
WHERE = f'{MATRIX}, b: Tensor["C", f32], y: Tensor["R", "C", f32]'
#: A W8A8 layer: the exact product of int8s, scaled per row and per column.
W8A8 = (
    'x: Tensor["M", "K", i8], w: Tensor["K", "N", i8], xs: Tensor["M", f32], '
    'ws: Tensor["N", f32]'
)


def _w8a8_kernels() -> dict[str, int]:
    """The kernels of ``docs/numerics.md``'s W8A8 layer: in all, and elementwise ones."""
    launches = _launches(_snippet(W8A8, "cast(x @ w, f32) * xs[:, None] * ws[None, :]"))
    return {"n": launches.count("elementwise"), "all": len(launches)}


FIGURES = [
    Figure("docs/numerics.md", "the function is the product's `gemm_i8` and {n} elementwise "
           "kernel, {all} kernels in all", _w8a8_kernels),
    Figure("README.md", "`tesserac examples/decoder_block.tsr --emit graph` shows the {n} kernels.",
           lambda: len(_launches("examples/decoder_block.tsr")), words=False),
    Figure("examples/decoder_block.tsr",
           "`tesserac decoder_block.tsr --emit graph` shows the {n} kernels.",
           lambda: len(_launches("examples/decoder_block.tsr")), words=False),
    Figure("examples/decoder_block.tsr",
           "Each RMSNorm written out is the library's rmsnorm ({n} kernel that reads a row once)",
           lambda: _launches("examples/decoder_block.tsr").count("rmsnorm") // 2),  # 2 norms
    Figure("examples/mlp.tsr", "into one kernel: {n} kernels in all.",
           lambda: len(_launches("examples/mlp.tsr", "mlp"))),
    Figure("docs/cuda-backend.md", "and two of its {n} sm_80 kernels",
           lambda: sum(len(_launches("examples/mlp.tsr", f)) for f in ("linear_gelu", "mlp"))),
    Figure("docs/schedule-ir.md", "f32 attention with a {head}-wide head on gfx90a runs {m} x {n} "
           "blocks on {warps} wavefront, {smem} bytes of LDS", _hip_attention_plan),
    Figure("examples/norms.tsr", "Each is {n} kernel:",
           lambda: max(len(_launches("examples/norms.tsr", f))
                       for f in ("row_softmax", "pre_norm", "rms", "add_rms"))),
    Figure("docs/graph-ir.md", "(`softmax(v * 2.0)` is {n} kernel)",
           lambda: len(_launches(_snippet(VECTOR, "softmax(v * 2.0)")))),
    Figure("docs/graph-ir.md", "(`sqrt(sum(v * v))` is {n} kernel;",
           lambda: len(_launches(_snippet(VECTOR, "sqrt(sum(v * v))")))),
    Figure("docs/tile-ir.md", "`relu(x * 2.0).T + y` is {n} kernel.",
           lambda: len(_launches(_snippet(f'{MATRIX}, y: Tensor["C", "R", f32]',
                                          "relu(x * 2.0).T + y")))),
    Figure("docs/tile-ir.md", "`silu(h[:, :F]) * h[:, F:]` of a product `h` is {n} elementwise "
           "kernel that reads both halves in place",
           lambda: _launches(_snippet('a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]',
                                      "silu(h[:, :F]) * h[:, F:]", "h = a @ b",
                                      "F = h.shape[-1] / 2")).count("elementwise")),
    Figure("docs/tile-ir.md", "`transpose(x, (2, 0, 1))` of `[A, B, C]` is {n} `transpose` kernel",
           lambda: len(_launches(_snippet('x: Tensor["A", "B", "C", f32]',
                                          "transpose(x, (2, 0, 1))")))),
    Figure("docs/tile-ir.md", '(`x.reshape("B*S", "C") @ w` is {n} gemm kernel)',
           lambda: len(_launches(_snippet('x: Tensor["B", "S", "C", f32], w: Tensor["C", "N", f32]',
                                          'x.reshape("B*S", "C") @ w')))),
    Figure("docs/tile-ir.md", "`sum(x, axis=0)` of a matrix is {n} kernels, `transpose` and "
           "`row_sum`", lambda: len(_launches(_snippet(MATRIX, "sum(x, axis=0)")))),
    Figure("docs/tile-ir.md", "a softmax over that axis is {n} (`transpose`, `softmax`, "
           "`transpose`)", lambda: len(_launches(_snippet(MATRIX, "softmax(x, axis=0)")))),
    Figure("docs/ops.md", "swaps ``[A*B, C]``: {n} kernel)",
           lambda: len(_launches(_snippet('x: Tensor["A", "B", "C", f32]',
                                          "transpose(x, (2, 0, 1))")))),
    Figure("docs/ops.md", "is kept between the {n} kernels as the floats 1.0 and 0.0",
           lambda: len(_launches(_snippet(WHERE, "where(b < 0.5, x, y)")))),
    Figure("docs/graph-ir.md", "(`a = x * y; return a, exp(a) + 1.0` is {n} kernel",
           lambda: len(_launches(_snippet(PAIR, "a, exp(a) + 1.0", "a = x * y")))),
    Figure("docs/graph-ir.md", "and a `fused_adam` step is {n} kernel",
           lambda: len(_launches("examples/optimizer_step.tsr", "adamw"))),
    Figure("docs/autodiff.md", "The graph op is {n} elementwise kernel",
           lambda: _launches(ADAM_MASTER).count("elementwise")),
    Figure("docs/autodiff.md", "where the {n} elementwise kernel that computes the new state",
           lambda: _launches("examples/optimizer_step.tsr", "adamw_bf16").count("elementwise")),
    Figure("docs/autodiff.md", "An `OptimizerState` step is {n} elementwise kernel",
           lambda: _launches("examples/optimizer_step.tsr", "adamw").count("elementwise")),
    Figure("docs/tile-ir.md", "{n} of decode's", lambda: sum(_decode_kernels())),
    Figure("docs/tile-ir.md", "decode's {n} kernels", lambda: len(_decode_kernels())),
    Figure("examples/optimizer_step.tsr", "in the same pass, {n} elementwise kernel",
           lambda: _launches("examples/optimizer_step.tsr", "adamw_bf16").count("elementwise")),
    Figure("docs/numerics.md", "weight `q` of shape `[K, N]` is {n} kernel",
           lambda: len(_launches(_snippet(DEQUANTIZED, "x @ dequantize(q, s, zero_point=z, "
                                          "group=32, dtype=bf16)")))),
    Figure("docs/ops.md", "``x @ dequantize(q, ...)`` of an i8 or i4 weight is {n} kernel",
           lambda: len(_launches(_snippet(DEQUANTIZED, "x @ dequantize(q, s, group=32, "
                                          "dtype=bf16)")))),
    Figure("docs/numerics.md", "The forms it does not take keep the {n} kernels of before",
           lambda: len(_launches(_snippet(PER_ROW, "x @ dequantize(q, r, dtype=bf16)")))),
    Figure("examples/quant_linear.tsr", "(as GPTQ and AWQ store them): {n} library kernel",
           lambda: len(_launches("examples/quant_linear.tsr", "linear_per_group"))),
]  # fmt: skip


@pytest.mark.parametrize("figure", FIGURES, ids=[f"{f.path}:{f.text[:40]}" for f in FIGURES])
def test_each_figure_is_the_compilers(figure: Figure) -> None:
    expected = figure.expected()
    assert expected in _prose(figure.path), f"{figure.path} should say: {expected}"


def test_every_figure_in_the_docs_is_checked() -> None:
    """A count of kernels stated anywhere in the documents is one of ``FIGURES``, so that
    a change of the compiler's output that makes it wrong fails a test."""
    unchecked = []
    for path in DOCUMENTS:
        prose = _prose(path)
        covered = [f.expected() for f in FIGURES if f.path == path] + NOT_FIGURES
        spans = [(m.start(), m.end()) for c in covered for m in re.finditer(re.escape(c), prose)]
        for m in COUNT.finditer(prose):
            if not any(a <= m.start() and m.end() <= b for a, b in spans):
                unchecked.append(f"{path}: ...{prose[max(0, m.start() - 60) : m.end()]}")
    assert not unchecked, "figures no test computes:\n" + "\n".join(unchecked)
