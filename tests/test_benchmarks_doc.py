"""`python -m benchmarks` rewrites only its own block of docs/benchmarks.md."""

from pathlib import Path

from benchmarks import __main__ as bench


def test_write_markdown_replaces_only_its_block(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"{bench.BEGIN}\nold figures\n{bench.END}\n\n## Kept\n\nhand-written 1.23x\n")
    monkeypatch.setattr(bench, "_generated_lines", lambda results: ["# Benchmarks", "new"])
    bench.write_markdown({}, doc)
    text = doc.read_text()
    assert "old figures" not in text and "new" in text
    assert text.endswith("## Kept\n\nhand-written 1.23x\n")
    bench.write_markdown({}, doc)  # idempotent
    assert doc.read_text() == text


def test_the_repo_doc_has_both_markers_once():
    text = (Path(bench.REPO) / "docs" / "benchmarks.md").read_text()
    assert text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1
    assert text.index(bench.BEGIN) < text.index(bench.END)
