"""kvsim validate's handling of committed measurement runs."""

from __future__ import annotations


def test_committed_runs_are_packed_and_still_read(tmp_path):
    """kvsim validate gzips a copied run's large files reproducibly and reads them back."""
    import json

    from kvsim.calibration.validate import _pack_large, read_results

    run = tmp_path / "run"
    run.mkdir()
    body = {"executor": "hw", "calls": [{"i": i} for i in range(20000)]}
    (run / "results.json").write_text(json.dumps(body))
    (run / "report.md").write_text("small")
    _pack_large(run)
    assert sorted(p.name for p in run.iterdir()) == ["report.md", "results.json.gz"]
    assert read_results(run) == body
    first = (run / "results.json.gz").read_bytes()
    (run / "results.json").write_text(json.dumps(body))
    (run / "results.json.gz").unlink()
    _pack_large(run)
    assert (run / "results.json.gz").read_bytes() == first  # byte-identical
