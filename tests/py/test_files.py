"""jobkit.core.files: reports written whole, with the mode the process's umask gives (JOB_UMASK for a job)."""

import os

import pytest

from jobkit.core.files import Untrusted, current_umask, make_own_dir, open_append, read_own, write_atomic


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


# ------------------------------------------------------------- a shared workspace: planted links and files


def test_a_link_planted_at_the_target_is_replaced_not_followed(tmp_path, umask):
    umask(0o077)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "report.html").symlink_to(victim)
    write_atomic(tmp_path / "report.html", "new")
    assert victim.read_text() == "mine"
    assert not (tmp_path / "report.html").is_symlink() and (tmp_path / "report.html").read_text() == "new"


def test_append_refuses_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "state.log").symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        open_append(tmp_path / "state.log")
    assert victim.read_text() == "mine"
    os.close(open_append(tmp_path / "new.log"))
    assert (tmp_path / "new.log").stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a teammate's file needs root (chown)")
def test_only_our_own_regular_files_in_our_own_dirs_are_trusted(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    (ours / "m").write_text("ok\n")
    assert read_own(ours / "m", in_own_dir=True) == "ok\n"
    with pytest.raises(FileNotFoundError):
        read_own(ours / "absent")
    (ours / "link").symlink_to(ours / "m")
    os.link(ours / "m", ours / "hard")
    (ours / "theirs").write_text("x")
    os.chown(ours / "theirs", 65534, 65534)
    for name, why in [("link", "is a symlink"), ("hard", "has 2 links"), ("theirs", "belongs to uid 65534")]:
        with pytest.raises(Untrusted, match=why):
            read_own(ours / name)
    ours.chmod(0o775)
    with pytest.raises(Untrusted, match=r"writable by group or others \(mode 775\)"):
        read_own(ours / "m", in_own_dir=True)
    team = tmp_path / "team"
    team.mkdir()
    os.chown(team, 65534, 65534)
    with pytest.raises(Untrusted, match="belongs to uid 65534"):
        make_own_dir(team)
    assert make_own_dir(tmp_path / "fresh").stat().st_mode & 0o022 == 0
