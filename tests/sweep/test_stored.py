"""The stored points `sgdsweep run` hands to its Snakemake are taken only for the same sweep and
points; anything else reads as no hand-over, and the stores are opened."""

from __future__ import annotations

from sgdsweep.sweep.stored import STORED_ENV, read_stored, write_stored


def test_the_hand_over_is_for_one_sweep_and_its_points_only(tmp_path, monkeypatch):
    handed, sweep = tmp_path / "stored.json", tmp_path / "results" / "s"
    hashes = ["a" * 16, "b" * 16, "c" * 16]
    assert read_stored(sweep, hashes) is None  # no hand-over
    monkeypatch.setenv(STORED_ENV, str(handed))
    assert read_stored(sweep, hashes) is None  # no file
    write_stored(handed, sweep, hashes, [hashes[0], "d" * 16])
    assert read_stored(sweep, hashes) == {hashes[0]}  # only the sweep's own points
    assert read_stored(tmp_path / "results" / "other", hashes) is None
    assert read_stored(sweep, hashes[:2]) is None and read_stored(sweep, hashes[::-1]) is None
    handed.write_text(handed.read_text()[:-5])
    assert read_stored(sweep, hashes) is None  # cut short
    handed.write_text('{"directory": 1}')
    assert read_stored(sweep, hashes) is None
