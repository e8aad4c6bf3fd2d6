"""Kernel metadata as the system architecture's YAML: what ``--emit meta --format yaml``
prints, and the reader that takes it back without a YAML library."""

from __future__ import annotations

import re

import pytest

import tessera
from tessera.cli.main import main
from tessera.runtime.kernel_yaml import dump, load
from tessera.transpiler.target.kernel_records import kernel_records, kernel_yaml

from .conftest import ROOT

pytestmark = pytest.mark.unit

MLP = ROOT / "examples" / "mlp.tsr"


def test_each_kernel_is_a_document_of_the_seeds_keys() -> None:
    program = tessera.compile_file(MLP, target="cuda", arch="sm_90a", kernel="mlp")
    records = kernel_records(program.ir("tile"), program.ir("meta"))
    assert [r["name"] for r in records] == ["mlp_k0", "mlp_k1"]
    first = records[0]
    assert list(first) == ["name", "function", "tile", "fragments", "resources", "launch",
                           "epilogue"]  # fmt: skip
    assert first["tile"] == {"BM": 128, "BN": 256, "BK": 64, "stages": 4}
    assert first["fragments"] == {"mma": "64x256x16", "inst": "wgmma.bf16", "dtype_in": "bf16",
                                  "dtype_acc": "f32"}  # fmt: skip
    assert first["resources"]["smem_per_cta"] == 196608
    assert first["launch"] == {"grid": ["ceil(F/256)", "ceil(T/128)", 1], "block": [256, 1, 1]}
    assert first["epilogue"] == ["add", "gelu", "cast"]
    text = kernel_yaml(program.ir("tile"), program.ir("meta"))
    assert '\nfragments: {mma: "64x256x16", inst: wgmma.bf16, dtype_in: bf16' in text
    assert load(text) == records


def test_the_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(MLP), "--target", "cpu", "--emit", "meta", "--format", "yaml"]) == 0
    out = capsys.readouterr().out
    program = tessera.compile_file(MLP, target="cpu")
    assert out == kernel_yaml(program.ir("tile"), program.ir("meta"))
    assert out.startswith("# Kernel metadata of mlp.tsr for cpu native")
    with pytest.raises(SystemExit):
        main([str(MLP), "--emit", "graph", "--format", "yaml"])
    assert "--format yaml goes with --emit meta" in capsys.readouterr().err


def test_every_scalar_reads_back_as_it_was_written() -> None:
    records = [{"s": "1", "t": "true", "u": "a: b", "v": 'q"x, [y]', "w": "", "x": None,
                "y": -3, "z": [[], {}, [1, [2]]], "yes": False, "m": {"k v": "ceil(N/4)"}},
               {}]  # fmt: skip
    assert load(dump(records)) == records


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("---\nname: [a, b\n", "k.yaml:2: expected ',' or ']'"),
        ("---\nname:\n  - a\n", "k.yaml:2: expected a value"),
        ("name: a\n", "k.yaml:1: expected '---'"),
        ("---\nname: {a b}\n", "k.yaml:2: expected ': ' after a key"),
        ("---\n[a]: b\n", "k.yaml:2: expected 'key: value'"),
    ],
)
def test_text_outside_the_subset_is_refused_at_its_line(text: str, where: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(where)}"):
        load(text, "k.yaml")
