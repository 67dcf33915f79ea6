"""The scaling table as a user reads it: markdown, JSON, the text chart, the PNG."""
import io
import json

from multihost.scale.table import ScalePoint, ScaleTable
from multihost.views.scale_png import write_png
from multihost.views.scale_view import markdown, render, text_chart, to_json

TABLE = ScaleTable("train_ddp.py --epochs 9", "speed", (
    ScalePoint(1, 2, 1000.0, "20260101-000000-aaaa"),
    ScalePoint(2, 2, 1540.0, "20260101-000100-bbbb"),
    ScalePoint(3, 2, 2400.0, "20260101-000200-cccc")))


def test_markdown_has_the_reference_docs_columns():
    lines = markdown(TABLE).splitlines()
    assert lines[0] == ("| machines | processes per machine | throughput | speed-up | "
                        "efficiency | run |")
    assert lines[3] == "| 2 | 2 | 1540.0 | 1.54 | 77% | 20260101-000100-bbbb |"
    assert len(lines) == 5


def test_json_round_trips():
    document = json.loads(to_json(TABLE))
    assert [p["machines"] for p in document["points"]] == [1, 2, 3]
    assert document["points"][2]["efficiency"] == 0.8


def test_text_chart_marks_linear_scaling_where_the_bar_falls_short():
    chart = text_chart(TABLE, width=30).splitlines()
    assert chart[0].startswith("throughput by machines")
    one, two, three = chart[1:]
    assert one.startswith("1 machine ") and "|" not in one.split("  ")[1]
    bar = two[len("3 machines  "):len("3 machines  ") + 30]
    # 1540 of a 3000 top is 15 cells; linear (2000) is marked at cell 20
    assert bar.rstrip(" |").count("█") == 15 and bar[19] == "|"
    assert two.endswith("1.54x   77%") and three.endswith("2.40x   80%")


def test_plain_render_in_a_pipe_has_table_notes_and_chart():
    out = io.StringIO()
    render(TABLE, out)
    text = out.getvalue()
    assert "processes per machine" in text and "speed-up over 1 machine(s)" in text
    assert "throughput by machines" in text and "\x1b" not in text


def test_png_is_a_png(tmp_path):
    path = write_png(TABLE, str(tmp_path / "scale.png"))
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert [p.name for p in tmp_path.iterdir()] == ["scale.png"]   # no temporary left
