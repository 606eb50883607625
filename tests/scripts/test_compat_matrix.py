"""scripts/compat_matrix.py renders its records into docs/compatibility.md between the markers only."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("compat_matrix", os.path.join(REPO, "scripts", "compat_matrix.py"))
compat_matrix = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(compat_matrix)


def record(torch_version, example_tail, suite_line):
    step = {"command": "/v/bin/python -m apexlite doctor", "status": 0, "seconds": 2.0, "tail": []}
    steps = {"install": dict(step, command="/v/bin/python -m pip install --no-build-isolation -e ."),
             "example O1 float16": dict(step, tail=example_tail),
             "suite native": dict(step, seconds=600.0, tail=[suite_line])}
    return {"facts": {"torch": torch_version, "cuda": None, "gpu": None, "python": "3.11.7"}, "env": {},
            "steps": steps, "date": "2026-11-25", "machine": "x86_64, 2 cores"}


def test_the_table_has_a_column_per_torch_in_version_order_and_says_what_each_run_did():
    results = [record("2.14.1+cu130", ["epoch 0 step 4 loss 2.1 loss_scale 1.0 time 0.5s"], "12 passed in 600s"),
               record("2.5.1+cu124", ["RuntimeError: boom"], "1 failed, 11 passed in 600s")]
    results[1]["steps"]["example O1 float16"]["status"] = 1
    table = compat_matrix.render(results)
    header = table.splitlines()[0]
    assert header.index("torch 2.5.1+cu124") < header.index("torch 2.14.1+cu130")
    example = next(line for line in table.splitlines() if line.startswith("| example O1 float16 |"))
    assert "exit 1: RuntimeError: boom" in example and "ok (epoch 0 step 4 loss 2.1 loss_scale 1.0)" in example
    suite = next(line for line in table.splitlines() if line.startswith("| suite native |"))
    assert "1 failed, 11 passed in 600s (10 min)" in suite
    assert "| suite python | not run | not run |" in table
    assert "- install: `python -m pip install --no-build-isolation -e .`" in table


def test_only_the_text_between_the_markers_is_rewritten(tmp_path, monkeypatch):
    doc = tmp_path / "compatibility.md"
    doc.write_text(f"prose before\n{compat_matrix.START}\nold table\n{compat_matrix.END}\nprose after\n")
    monkeypatch.setattr(compat_matrix, "DOC", doc)
    compat_matrix.write_doc([record("2.13.0+cpu", [], "3 passed in 1s")])
    text = doc.read_text()
    assert text.startswith("prose before\n") and text.endswith("prose after\n")
    assert "old table" not in text and "torch 2.13.0+cpu" in text


def test_a_document_without_markers_is_refused(tmp_path, monkeypatch):
    doc = tmp_path / "compatibility.md"
    doc.write_text("no markers\n")
    monkeypatch.setattr(compat_matrix, "DOC", doc)
    with pytest.raises(ValueError, match="lacks the lines"):
        compat_matrix.write_doc([])
