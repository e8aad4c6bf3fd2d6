"""``tesserac inspect``: the lowering inspector page, its line maps, and a click on a
source line in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven
by Selenium)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import tessera
from tessera.cli.main import main
from tessera.inspector import inspector_page, page_data

from .conftest import ROOT

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


def _selenium() -> object | None:
    try:
        from selenium import webdriver
    except ImportError:
        return None
    return webdriver


needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None or _selenium() is None,
    reason="needs chromium and chromium-driver (Debian) and selenium (pip)",
)


@pytest.fixture(scope="module")
def program() -> tessera.transpiler.pipeline.Program:
    return tessera.compile_file(ROOT / "examples/attention.tsr", target="cuda", arch="sm_80")


@pytest.fixture(scope="module")
def attention(program: tessera.transpiler.pipeline.Program) -> dict:
    return page_data(program)


def test_every_stage_maps_a_source_line_to_what_it_became(attention: dict) -> None:
    stages = {stage["name"]: stage for stage in attention["stages"]}
    load = 28  # Kb = tile.load(k, nblk, cols=T.d) in the user's tile kernel
    assert "tile.load(k, nblk" in attention["source"][load - 1]
    tile = [stages["tile"]["lines"][i] for i in stages["tile"]["map"][load]]
    assert tile and all(re.search(r"// 28:\d+$", line) for line in tile)
    assert {line.split()[0] for line in tile} >= {"copy", "%Kb"}
    target = [stages["target"]["lines"][i] for i in stages["target"]["map"][load]]
    assert target[0].strip().startswith("// attention.tsr:28:")
    assert any("tsr_copy" in line for line in target)
    assert stages["graph"]["map"][load]
    # The library kernel that ops.flash_attention instantiates maps to the call's line.
    call = next(i for i, text in enumerate(attention["source"], 1) if "ops.flash_attention" in text)
    assert any(
        "kernel @attention" in stages["tile"]["lines"][i] for i in stages["tile"]["map"][call]
    )
    assert any("flash_attention.tsr:" in stages["target"]["lines"][i]
               for i in stages["target"]["map"][call])  # fmt: skip
    assert stages["sched"]["map"][call]


def test_each_kernel_has_its_schedule_resources_roofline_and_findings(attention: dict) -> None:
    kernels = {k["name"]: k for k in attention["kernels"]}
    assert set(kernels) == {"attention", "flash_attention"}
    for kernel in kernels.values():
        assert kernel["schedule"]["warps"] == 8 and kernel["resources"]["shared_bytes"] > 0
        assert kernel["resources"]["registers_estimate"] > 0
        assert kernel["roofline"]["bound"] in ("compute", "memory")
        assert kernel["findings"] == []


def test_the_page_is_self_contained_and_its_text_is_data(tmp_path: Path) -> None:
    source = (
        ROOT / "examples/norms.tsr"
    ).read_text() + "\n# </script><img src=x onerror=alert(1)>\n"
    path = tmp_path / "norms.tsr"
    path.write_text(source)
    page = tmp_path / "report.html"
    assert main(["inspect", str(path), "--target", "opencl", "-o", str(page)]) == 0
    html = page.read_text()
    # The source's "</script>" cannot end the data early: only the page's two do.
    assert html.count("</script>") == 2 and "\\u003c/script>\\u003cimg" in html
    assert not re.search(r"(src|href)=\"?https?:", html)


@needs_chromium
def test_a_click_highlights_the_stages_in_chromium(
    program: tessera.transpiler.pipeline.Program, tmp_path: Path
) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    page = tmp_path / "attention.html"
    page.write_text(inspector_page(program))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(page.as_uri())
        driver.find_element(By.ID, "source-28").click()
        picked = driver.find_elements(By.CSS_SELECTOR, "#pane-source .ln.picked")
        assert [row.get_attribute("id") for row in picked] == ["source-28"]
        tile = driver.find_elements(By.CSS_SELECTOR, "#pane-tile .ln.hl")
        assert tile and all(re.search(r"// 28:\d+$", row.text) for row in tile)
        target = driver.find_elements(By.CSS_SELECTOR, "#pane-target .ln.hl")
        assert "// attention.tsr:28:" in target[0].text
        assert any("tsr_copy" in row.text for row in target)
        assert driver.find_elements(By.CSS_SELECTOR, "#kernel-flash_attention circle")
        driver.save_screenshot(str(tmp_path / "inspector.png"))
    finally:
        driver.quit()
    assert (tmp_path / "inspector.png").stat().st_size > 10_000
