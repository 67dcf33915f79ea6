"""Whose is a directory (remote/owners.py): a workdir or log directory another account
may change is named with its owner and mode; what only we or root can change passes."""
import os

from multihost.remote import owners

OTHER = 4242   # a uid nobody here has: another account's


def test_a_directory_of_ours_that_only_we_write_passes(tmp_path):
    mine = tmp_path / "job"
    mine.mkdir(mode=0o755)
    assert owners.why_unsafe(str(mine)) is None
    assert owners.why_unsafe(str(mine / "not" / "made" / "yet")) is None


def test_another_users_directory_is_named_with_owner_and_mode(tmp_path):
    hers = tmp_path / "hers"
    hers.mkdir()
    os.chown(hers, OTHER, OTHER)
    hers.chmod(0o777)
    assert owners.why_unsafe(str(hers)) == f"{hers} belongs to {OTHER} (mode 0777)"
    assert "chmod" not in owners.fix_for(str(hers), owners.why_unsafe(str(hers)))


def test_our_directory_anyone_may_write_is_refused_with_a_chmod_of_our_own(tmp_path):
    mine = tmp_path / "job"
    mine.mkdir()
    mine.chmod(0o1777)   # sticky or not: anyone may add a file to the code
    said = owners.why_unsafe(str(mine))
    assert said == f"{mine} (owner root, mode 1777) may be written by anyone"
    assert owners.fix_for(str(mine), said) == f"make it yours alone: chmod go-w {mine}"


def test_a_group_other_than_our_own_may_write_is_refused_and_our_private_group_is_not(tmp_path):
    shared = tmp_path / "grp"
    shared.mkdir()
    shared.chmod(0o775)
    assert owners.why_unsafe(str(shared)) is None      # group root: root's own group
    os.chown(shared, 0, OTHER)
    assert owners.why_unsafe(str(shared)).endswith("may be written by group %d" % OTHER)


def test_below_a_sticky_directory_every_step_is_checked_and_links_of_others_refused(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    hers = sticky / "a"
    hers.mkdir()
    os.chown(hers, OTHER, OTHER)
    (hers / "b").mkdir()
    assert owners.why_unsafe(str(hers / "b")).startswith(f"{hers} belongs to {OTHER}")
    link = sticky / "job"
    os.symlink(tmp_path, link)
    os.lchown(link, OTHER, OTHER)
    assert owners.why_unsafe(str(link)) == f"{link} is a link made by {OTHER} (to {tmp_path})"


def test_a_world_writable_directory_without_the_sticky_bit_above_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)      # anyone may rename what is in it
    (open_dir / "job").mkdir()
    said = owners.why_unsafe(str(open_dir / "job"))
    assert said.startswith(f"{open_dir} (owner root, mode 0777) may be written by anyone")


def test_system_directories_are_known_through_links(tmp_path):
    os.symlink("/etc", tmp_path / "etc")
    assert owners.is_system_dir(str(tmp_path / "etc")) and not owners.is_system_dir(str(tmp_path))
