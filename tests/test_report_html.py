"""The HTML report: parses, holds every plan id and precision decision, loads nothing."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.cli import EXIT_OK, main
from tests.models import ResNetLike, randomize_batchnorm

pytestmark = pytest.mark.usefixtures("compile_isolation")  # no state from earlier tests


class _Structure(HTMLParser):
    """Collects tags, table cells and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.cells: list[str] = []
        self.sources: list[str] = []
        self._in_cell = False
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in ("meta", "rect", "br"):
            self.open.append(tag)
        self._in_cell = tag == "td"
        self.sources += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1:]}>"
        self.open.pop()
        self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data)


def _report(tmp_path, **options):
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.compile(
            model, backend="embedl_onnxruntime", options={"cache_dir": tmp_path / "c", **options}
        )(x)
    return embedl_dynamo.last_report()


def _parse(path) -> _Structure:
    parser = _Structure()
    text = path.read_text()
    parser.feed(text)
    parser.close()
    assert not parser.open, f"unclosed tags: {parser.open}"
    assert not parser.sources and "<script" not in text
    assert not re.search(r"url\(|@import|https?://(?!www\.w3\.org/2000/svg)", text)
    return parser


def test_page_parses_and_holds_every_plan_id(tmp_path):
    report = _report(tmp_path)
    page = _parse(report.to_html(tmp_path / "report.html"))
    assert page.tags[:1] == ["html"] and "table" in page.tags and "style" in page.tags
    ids = {e.id for e in report[0].plan.entries}
    assert ids and ids <= set(page.cells)


def test_int8_page_shows_each_precision_decision(tmp_path):
    batches = [torch.randn(2, 3, 16, 16) for _ in range(2)]
    report = _report(tmp_path, quantize="int8", calibration_data=batches)
    page = _parse(report.to_html(tmp_path / "int8.html"))
    quant = report[0].pipeline["quantization"]
    assert quant["quantized_layers"] and "int8" in page.cells and "fp32" in page.cells
    for layer in quant["float_layers"]:
        assert layer["reason"] in page.cells


def test_cli_plan_writes_the_page(tmp_path, capsys):
    out = tmp_path / "plan.html"
    argv = ["plan", "tests.models:ResNetLike", "--input-shape", "1,3,16,16", "--html", str(out)]
    assert main(argv) == EXIT_OK
    page = _parse(out)
    assert any(c.startswith("conv_bn_relu@") for c in page.cells)
    assert f"wrote {out}" in capsys.readouterr().out


def test_export_writes_the_page_beside_the_sidecar(tmp_path) -> None:
    """``export(..., html=True)``: ``model.html`` parses, loads nothing, holds every plan id and
    every layer's precision (fp16 here: each layer fp16 or fp32, with its reason)."""
    import json

    from embedl_dynamo.deploy.export import export, sidecar_path

    model = randomize_batchnorm(ResNetLike().eval())
    path = export(
        model,
        torch.randn(2, 3, 16, 16),
        tmp_path / "m.onnx",
        precision="fp16",
        html=True,
        progress=False,
    )
    side = json.loads(sidecar_path(path).read_text())
    assert side["html_file"] == "m.html"
    page = tmp_path / "m.html"
    parsed = _parse(page)
    text = page.read_text()
    assert side["plan"]["matches"]
    for entry in side["plan"]["matches"]:
        assert entry["id"] in text
    cells = set(parsed.cells)
    assert {"fp16", "fp32"} <= cells
    for layer in side["layers"]:
        assert layer["id"].split("@", 1)[-1] in text


def test_cli_export_html(tmp_path) -> None:
    out = tmp_path / "m.onnx"
    code = main(
        [
            "export",
            "tests.models:ResNetLike",
            "--input-shape",
            "1,3,16,16",
            "-o",
            str(out),
            "--html",
            "-q",
        ]
    )
    assert code == EXIT_OK
    _parse(tmp_path / "m.html")
