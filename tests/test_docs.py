"""Documentation generated from code stays current."""

from __future__ import annotations

import pytest

from tessera.transpiler.graph.graph_ops import GRAPH_OPS
from tessera.transpiler.graph.opdocs import render_ops_doc

from .conftest import ROOT

pytestmark = pytest.mark.unit
OPS_DOC = ROOT / "docs" / "ops.md"


def test_ops_reference_is_current(update_golden: bool) -> None:
    expected = render_ops_doc()
    if update_golden:
        OPS_DOC.write_text(expected, encoding="utf-8")
    assert (
        OPS_DOC.read_text(encoding="utf-8") == expected
    ), "docs/ops.md is stale: run python -m tessera.transpiler.graph.opdocs"


def test_every_operation_is_documented() -> None:
    undocumented = [name for name, spec in GRAPH_OPS.items() if len(spec.doc) < 20]
    assert not undocumented
