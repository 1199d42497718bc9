"""runs/commit.clamp_mtimes (issue 37): a build step's upper gets no mtime later than its
SOURCE_DATE_EPOCH, its root and every depth included (iteratively: deeper than the recursion
limit), earlier times kept, and a symlink's target outside the upper never touched."""

from __future__ import annotations

import os

from sandtree.engine.runs.commit import clamp_mtimes

NS = 1_000_000_000
EPOCH = 315532800


def test_later_times_are_clamped_and_earlier_ones_kept(tmp_path):
    up = tmp_path / "upper"
    (up / "a" / "b").mkdir(parents=True)
    (up / "a" / "b" / "new.txt").write_text("x")
    (up / "old.txt").write_text("y")
    os.utime(up / "old.txt", ns=(100 * NS, 100 * NS))
    outside = tmp_path / "outside.txt"
    outside.write_text("z")
    before = os.stat(outside).st_mtime_ns
    os.symlink(str(outside), up / "link")
    deep = up / "deep"
    deep.mkdir()
    # past Python's recursion limit; each level made and later removed from its parent's fd (a whole path
    # per level made it quadratic: seconds of path walks)
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    try:
        clamp_mtimes(str(up), EPOCH)
        for p in (up, up / "a", up / "a" / "b", up / "a" / "b" / "new.txt", deep):
            assert os.lstat(p).st_mtime_ns == EPOCH * NS, p
        assert os.fstat(fd).st_mtime_ns == EPOCH * NS          # the deepest
    finally:
        for _ in range(1100):                   # bottom up: pytest's own cleanup of tmp_path recurses
            fd, child = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(child)
            os.rmdir("d", dir_fd=fd)
        os.close(fd)
    assert os.lstat(up / "link").st_mtime_ns == EPOCH * NS       # the link itself
    assert os.stat(outside).st_mtime_ns == before                # never its target
    assert os.lstat(up / "old.txt").st_mtime_ns == 100 * NS
