"""The stored points `sgdsweep run` hands to its Snakemake are taken only for the same sweep and
points, and only while their stores are there; anything else reads as no hand-over, and the
stores are opened."""

from __future__ import annotations

from sgdsweep.sweep.stored import STORED_ENV, hand_over, read_stored, write_stored


def test_the_hand_over_is_for_one_sweep_its_points_and_the_stores_there(tmp_path, monkeypatch):
    handed, sweep = tmp_path / "stored.json", tmp_path / "results" / "s"
    points = sweep / "points"
    points.mkdir(parents=True)
    hashes = ["a" * 16, "b" * 16, "c" * 16]
    for h in hashes[:2]:
        (points / f"{h}.npz").write_bytes(b"")
    assert read_stored(sweep, points, hashes) is None  # no hand-over
    monkeypatch.setenv(STORED_ENV, str(handed))
    assert read_stored(sweep, points, hashes) is None  # no file
    write_stored(handed, sweep, hashes, [*hashes[:2], "d" * 16])
    assert read_stored(sweep, points, hashes) == set(hashes[:2])  # only the sweep's own points
    (points / f"{hashes[1]}.npz").unlink()  # deleted after the run checked it: not stored
    assert read_stored(sweep, points, hashes) == {hashes[0]}
    assert read_stored(tmp_path / "results" / "other", points, hashes) is None
    assert read_stored(sweep, points, hashes[:2]) is None and read_stored(sweep, points, hashes[::-1]) is None
    handed.write_text(handed.read_text()[:-5])
    assert read_stored(sweep, points, hashes) is None  # cut short
    handed.write_text('{"directory": 1}')
    assert read_stored(sweep, points, hashes) is None


def test_a_hand_over_that_cannot_be_written_is_withdrawn(tmp_path):
    """Where the temporary directory is full or gone, the run names no file, and Snakemake opens
    the stores itself: the hand-over only saves time."""
    env = {STORED_ENV: str(tmp_path / "earlier round.json")}
    hand_over(env, tmp_path / "gone" / "stored.json", tmp_path, ["a" * 16], [])
    assert STORED_ENV not in env
    hand_over(env, None, tmp_path, ["a" * 16], [])
    assert STORED_ENV not in env
    hand_over(env, tmp_path / "stored.json", tmp_path, ["a" * 16], ["a" * 16])
    assert env[STORED_ENV] == str(tmp_path / "stored.json")
