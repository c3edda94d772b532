"""The stored points `sgdsweep run` hands to its Snakemake are taken only for the same sweep and
points, and only while their stores are there; anything else reads as no hand-over, and the
stores are opened."""

from __future__ import annotations

import os
import tempfile

from sgdsweep.sweep.stored import STORED_FD_ENV, hand_over, read_stored


def test_the_hand_over_is_for_one_sweep_its_points_and_the_stores_there(tmp_path, monkeypatch):
    sweep = tmp_path / "results" / "s"
    points = sweep / "points"
    points.mkdir(parents=True)
    hashes = ["a" * 16, "b" * 16, "c" * 16]
    for h in hashes[:2]:
        (points / f"{h}.npz").write_bytes(b"")
    assert read_stored(sweep, points, hashes) is None  # no hand-over
    env: dict[str, str] = {}
    with tempfile.TemporaryFile() as handed:
        hand_over(env, handed, sweep, hashes, [*hashes[:2], "d" * 16])
        monkeypatch.setenv(STORED_FD_ENV, env[STORED_FD_ENV])
        handed.seek(0, os.SEEK_END)  # the reader does not depend on the file's position
        assert read_stored(sweep, points, hashes) == set(hashes[:2])  # only the sweep's own points
        (points / f"{hashes[1]}.npz").unlink()  # deleted after the run checked it: not stored
        assert read_stored(sweep, points, hashes) == {hashes[0]}
        assert read_stored(tmp_path / "results" / "other", points, hashes) is None
        assert read_stored(sweep, points, hashes[:2]) is None and read_stored(sweep, points, hashes[::-1]) is None
        hand_over(env, handed, sweep, hashes[:2], [])  # the next round's set replaces the first
        assert read_stored(sweep, points, hashes[:2]) == set() and read_stored(sweep, points, hashes) is None
        text = os.pread(handed.fileno(), 10_000, 0)
        handed.truncate(len(text) - 5)
        assert read_stored(sweep, points, hashes[:2]) is None  # cut short
    assert read_stored(sweep, points, hashes[:2]) is None  # closed
    with open(tmp_path / "large", "wb") as large:  # another program's file: its size is enough to refuse it
        large.truncate(10**11)
        monkeypatch.setenv(STORED_FD_ENV, str(large.fileno()))
        assert read_stored(sweep, points, hashes[:2]) is None
    read, write = os.pipe()
    try:
        monkeypatch.setenv(STORED_FD_ENV, str(read))  # a descriptor that is not a file
        assert read_stored(sweep, points, hashes[:2]) is None
    finally:
        os.close(read)
        os.close(write)
    for junk in ("", "x", "-1", "99999999999999999999"):
        monkeypatch.setenv(STORED_FD_ENV, junk)
        assert read_stored(sweep, points, hashes[:2]) is None


def test_a_hand_over_that_cannot_be_written_is_withdrawn(tmp_path):
    """Where no temporary file could be made, or it cannot be written (a full temporary
    directory), the run names none, and Snakemake opens the stores itself: the hand-over only
    saves time."""
    env = {STORED_FD_ENV: "7"}
    hand_over(env, None, tmp_path, ["a" * 16], [])
    assert STORED_FD_ENV not in env
    with open(tmp_path / "read-only", "w+b") as fh, open(tmp_path / "read-only", "rb") as readonly:
        hand_over(env, fh, tmp_path, ["a" * 16], ["a" * 16])
        assert env[STORED_FD_ENV] == str(fh.fileno())
        hand_over(env, readonly, tmp_path, ["a" * 16], ["a" * 16])
        assert STORED_FD_ENV not in env
