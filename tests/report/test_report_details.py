"""Report details an operator reads: sizes with units (one formatting function), figures that do not wrap,
the headline parity of a quantized bundle, host-measured numbers labelled as the host's, and the sweep page."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from edgekit.report import render_report
from edgekit.report.formatting import bundle_vs_fp32, fmt_bytes, fmt_mib, measured_on_target, where_measured
from edgekit.report.sweep_plot import render_sweep_html, sweep_cells
from tests.report.test_report import _parse, _visible_text, realistic_manifest

HOST = {"machine": "x86_64", "cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "os": "Linux 6.1", "python": "3.11.7"}


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 B"), (8, "8 B"), (999, "999 B"), (1000, "1 KB"), (1500, "1.5 KB"), (2_412, "2.41 KB"), (999_960, "1 MB"),
    (1_234_567, "1.23 MB"), (90_500_000, "90.5 MB"), (123_456_789, "123 MB"), (1.23e9, "1.23 GB"), (None, "n/a"),
])  # fmt: skip
def test_sizes_have_units_and_no_exponent(size: Any, text: str) -> None:
    assert fmt_bytes(size) == text


def test_fixed_units_and_megabyte_figures() -> None:
    assert fmt_bytes(1_234_567, "MB") == "1.23 MB" and fmt_bytes(45_300_000, "MB") == "45.3 MB"
    # peak_rss_mb is MiB (VmHWM kB / 1024), written in decimal units as every size: 90.5 MiB = 94,896,128 bytes
    assert fmt_mib(90.5) == "94.9 MB" and fmt_mib(0.5) == "524 KB" and fmt_mib(1500) == "1.57 GB"
    with pytest.raises(ValueError, match="fmt_bytes: unit 'MiB' is not one of B, KB, MB, GB, TB"):
        fmt_bytes(1, "MiB")


@pytest.mark.parametrize(("value", "digits", "text"), [
    (9999.6, 4, "10,000"), (999.7, 3, "1,000"), (99999.5, 4, "100,000"), (9999.4, 4, "9999"), (12.345, 4, "12.35"),
])  # fmt: skip
def test_numbers_that_round_up_to_the_next_power_of_ten_have_no_exponent(value: float, digits: int, text: str) -> None:
    from edgekit.report.formatting import fmt_number

    assert fmt_number(value, digits) == text


@pytest.mark.parametrize(("value", "text"), [(99.996, "100 ms"), (99.994, "99.99 ms"), (0.9996, "1.00 ms"), (0.5, "0.5 ms")])
def test_milliseconds_that_round_up_take_the_next_ranges_format(value: float, text: str) -> None:
    from edgekit.report.formatting import fmt_ms

    assert fmt_ms(value) == text


def test_a_throughput_that_rounds_up_to_1000_is_written_without_an_exponent() -> None:
    page = render_report({"benchmark": {"throughput_per_s": 999.7}}, None, None)
    card = re.search(r'Throughput.*?<div class="value">(.*?)</div>', page, re.S)
    assert card is not None and card.group(1) == "1,000\u00a0/s" and "1e+03" not in page


def _manifest(target: str = "jetson-orin-nano-8gb", display: str = "NVIDIA Jetson Orin Nano 8GB", isa: Any = None,
              precision: str = "int8") -> dict[str, Any]:  # fmt: skip
    manifest = copy.deepcopy(realistic_manifest())
    manifest["target"].update(name=target, display_name=display)
    manifest["target"]["cpu"]["isa"] = isa
    manifest["precision"] = precision
    manifest["benchmark"]["host"] = HOST
    manifest["benchmark"]["peak_rss_mb"] = 90.5
    manifest["golden"]["outputs"] = {
        "logits": {"atol": 4e-2, "rtol": 1e-3, "min_cosine": 0.998, "measured": {"max_abs_diff": 1.82e-2, "cosine_min": 0.99931, "max_abs_reference": 9.1}},
        "features": {"atol": 1e-2, "rtol": 1e-3, "min_cosine": 0.999, "measured": {"max_abs_diff": 3.5e-3, "cosine_min": 0.99975, "max_abs_reference": 2.0}},
    }  # fmt: skip
    return manifest


def test_a_quantized_reports_headline_parity_is_its_own_against_fp32() -> None:
    manifest = _manifest()
    assert bundle_vs_fp32(manifest) == {"max_abs_diff": 1.82e-2, "cosine_min": 0.99931, "outputs": 2}
    text = _visible_text(_parse(render_report(manifest, None, None)))
    cards = text[text.index("Model size"):text.index("Export parity: does")]
    assert "INT8 vs FP32 max |diff| 1.82e-02 cosine min 0.99931; on the golden inputs (export parity 3.10e-06)" in cards
    assert "Parity max |diff|" not in cards  # the FP32 export's number is not the headline
    fp32 = _visible_text(_parse(render_report(_manifest(precision="fp32"), None, None)))
    assert "Parity max |diff| 3.10e-06 atol 1.00e-04" in fp32 and "vs FP32 max" not in fp32


def test_host_numbers_are_labelled_as_the_hosts_for_another_target() -> None:
    manifest = _manifest()
    assert not measured_on_target(manifest)
    where = "on this host (Intel(R) Xeon(R) Processor, 2 cores), not on the NVIDIA Jetson Orin Nano 8GB"
    assert where_measured(manifest) == where
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert f"Benchmark {where}" in text
    assert f"Measured {where}: the device's own kernels may differ slightly." in text  # the accuracy section
    for card in ("Accuracy (this host)", "Latency p50 / p99 (this host)", "Throughput (this host)", "Peak RSS, build process (this host)"):
        assert card in text


def test_the_host_target_has_no_host_label() -> None:
    manifest = _manifest("x86-64-cpu", "Generic x86-64 CPU (this host)", isa="host", precision="fp32")
    assert measured_on_target(manifest)
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert "Benchmark on this host (Intel(R) Xeon(R) Processor, 2 cores) Latency" in text
    assert "not on the" not in text and "(this host) 1" not in text and "kernels may differ" not in text


def test_memory_figures_stay_on_one_line() -> None:
    page = render_report(_manifest(), None, None)
    assert re.search(r"td\.num, th\.num \{[^}]*white-space: nowrap;[^}]*overflow-wrap: normal;", page)
    assert '<td class="num">94.9 MB</td>' in page  # peak RSS (90.5 MiB) in the memory table, a numeric cell
    assert "Peak RSS, build process (this host)</div>\n    <div class=\"value\">94.9\u00a0MB</div>" in page  # number and unit glued


def test_peak_rss_is_shown_in_mib_but_left_out_of_the_fit_check() -> None:
    """980 MiB is 1.03 GB of a 1 GB target (review: share, bar and check used 10^6 bytes per MiB while the value column used
    2^20). The figure is the build process's peak (torch, export, quantization ...: 641 MB for a 657 KB model whose ONNX
    Runtime process peaks near 80 MiB), so the fit check counts the model files only (review: 'Needs 641 MB')."""
    manifest = {"name": "m", "target": {"name": "t", "memory": {"gb": 1.0}}, "model": {"size_bytes": 657_000},
                "benchmark": {"peak_rss_mb": 980.0, "host": HOST}}
    page = render_report(manifest, None, None)
    device = page[page.index('id="device"'):]
    row = re.search(r'peak RSS of the build process[^<]*not the model&#39;s need\)</th><td class="num">(.*?)</td>.*?<td class="num">(.*?)</td>',
                    device, re.S)
    assert row is not None and row.groups() == ("1.03 GB", "103%"), row and row.groups()
    assert "Needs" not in device
    assert ("Fits: the model file(s) (657 KB) are 0.066% of the target&#39;s memory (the build process&#39;s peak RSS is not the "
            "device&#39;s need, so it is not counted)") in device
    manifest["model"]["size_bytes"] = 1_500_000_000
    device = render_report(manifest, None, None).split('id="device"')[1]
    assert "Needs 1.5 GB for the model file(s) alone, more than the target&#39;s 1 GB of memory." in device


def test_peak_rss_card_says_whose_peak_it_is() -> None:
    manifest = _manifest()
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert ("Peak RSS, build process (this host) 94.9 MB the build process's lifetime peak (torch, export, quantization, "
            "evaluation): not the model's own footprint") in text.replace("\u00a0", " ")
    manifest["benchmark"]["peak_rss_scope"] = "process during the benchmark"  # the peak was reset before the benchmark
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert ("the build process's peak during the benchmark, torch and the build's libraries included: not the model's own "
            "footprint") in text
    assert "peak RSS of the build process 94.9 MB (the build process's peak during the benchmark" in text.replace("\u00a0", " ")


def _sweep_rows() -> list[dict[str, Any]]:
    return [
        {"variant": "fp32", "status": "built", "size_bytes": 90_500_000, "p50_ms": 12.1, "latency_vs_fp32": 1.0,
         "metric_value": 0.9812, "cosine_min": None, "reason": None, "budget_line": 0.976},
        {"variant": "fp16", "status": "built", "size_bytes": 45_300_000, "p50_ms": 12.3, "latency_vs_fp32": 1.02,
         "metric_value": 0.9811, "cosine_min": 0.99999, "budget_line": 0.976},
        {"variant": "bf16", "status": "built", "size_bytes": 45_300_000, "p50_ms": 12.4, "latency_vs_fp32": 1.03,
         "metric_value": 0.9809, "budget_line": 0.976},
        {"variant": "int8", "status": "built", "size_bytes": 23_000_000, "p50_ms": 6.2, "latency_vs_fp32": 0.51,
         "metric_value": 0.979, "budget_line": 0.976},
        {"variant": "int8-dynamic", "status": "built", "size_bytes": 23_100_000, "p50_ms": 6.4, "latency_vs_fp32": 0.53,
         "metric_value": 0.9791, "budget_line": 0.976},
        {"variant": "nvfp4", "status": "skipped", "reason": "nvfp4 runs on jetson's other backend; no estimate for it here",
         "budget_line": 0.976},
    ]  # fmt: skip


def test_sweep_page_has_a_title_units_and_no_na_noise() -> None:
    page = render_sweep_html(_sweep_rows(), "top1", True, recipe="digits-cnn", target="NVIDIA Jetson Orin Nano 8GB", batch=64)
    parser = _parse(page)
    text = _visible_text(parser)
    title = "digits-cnn on NVIDIA Jetson Orin Nano 8GB, batch 64"
    assert f"<title>edgekit sweep: {title}</title>" in page and f"<h1>Sweep of {title}</h1>" in page
    assert f"Sweep of {title}" in page[page.index("<svg"):]  # the plot's own title
    assert "n/a" not in text and "size bytes" not in text and "90500000" not in text
    assert "fp32 built 90.5 MB 12.10 1.00× 0.9812 — " in text
    assert "int8 built 23 MB 6.20 0.51× 0.979 — " in text
    assert "nvfp4 skipped — — — — — nvfp4 runs on jetson's other backend" in text
    for label in ("fp32 (90.5 MB)", "fp16 (45.3 MB)", "int8-dynamic (23.1 MB)"):  # plot labels carry sizes with units
        assert label in page
    assert sweep_cells({"variant": "x", "status": "built"})[-1] == ""  # no note: an empty cell
    assert sweep_cells({"variant": "tiny", "status": "built", "p50_ms": 0.007634})[3] == "0.00763"  # not 0.01


def test_sweep_plot_labels_do_not_overlap() -> None:
    """Points close together (fp16/bf16 beside fp32, int8 beside int8-dynamic): every label box is clear of the
    others, as measured on the figure the SVG is written from."""
    import matplotlib.text

    from edgekit.report import sweep_plot

    figures = []
    real = sweep_plot._to_svg

    def keep(figure: Any, prefix: str, description: str) -> str:
        figures.append(figure)
        return real(figure, prefix, description)

    sweep_plot._to_svg = keep
    try:
        assert sweep_plot.sweep_pareto_svg(_sweep_rows(), "top1", True, title="t") is not None
    finally:
        sweep_plot._to_svg = real
    (figure,) = figures
    renderer = figure.canvas.get_renderer() if hasattr(figure.canvas, "get_renderer") else figure._get_renderer()
    (axes,) = figure.axes
    labels = [child for child in axes.get_children() if isinstance(child, matplotlib.text.Annotation)]
    assert sorted(label.get_text().split(" ")[0] for label in labels) == ["bf16", "fp16", "fp32", "int8", "int8-dynamic"]
    boxes = [label.get_window_extent(renderer) for label in labels]
    frame = axes.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, labels[i].get_text()
        for j in range(i + 1, len(boxes)):
            assert not box.overlaps(boxes[j]), f"{labels[i].get_text()!r} overlaps {labels[j].get_text()!r}"
