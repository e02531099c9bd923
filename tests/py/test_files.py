"""jobkit.core.files: reports written whole, with the mode the process's umask gives (JOB_UMASK for a job)."""

import os

import pytest

from jobkit.core.files import current_umask, write_atomic


@pytest.fixture
def umask():
    """Sets the umask for one test and puts the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o077, 0o600), (0o027, 0o640), (0o022, 0o644)])
def test_the_mode_is_what_the_umask_gives(tmp_path, umask, mask, mode):
    umask(mask)
    assert current_umask() == mask
    path = write_atomic(tmp_path / "report.html", "<html>1</html>")
    assert path.read_text() == "<html>1</html>"
    assert path.stat().st_mode & 0o777 == mode


def test_a_rewrite_replaces_the_file_whole_and_leaves_no_temp(tmp_path, umask):
    umask(0o077)
    target = tmp_path / "analysis.json"
    target.write_text("old")
    inode = target.stat().st_ino
    write_atomic(target, "new")
    assert target.read_text() == "new" and target.stat().st_ino != inode  # a new file renamed over the old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["analysis.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path, umask):
    umask(0o077)
    target = tmp_path / "page.html"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, "\ud800")  # a lone surrogate cannot be written as UTF-8
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]
