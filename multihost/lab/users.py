"""An ordinary user whose home is one directory on every host: the lab's shared home.

Most clusters share home directories (NFS). The lab shows one directory at the same
path in every host (a bind mount: coherent, like NFS with close-to-open), and puts a
user's home in it: ``<lab dir>/shared/home/<user>``. Users come from this machine's
/etc/passwd, which every lab host shares. The account gets the controller's key (the
controller logs in as that user) and the cluster key (hosts reach each other as that
user, for relays), and a hostfile with ``user =`` in its home.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from ..errors import LabError
from .config import LabPaths, host_address

SHELLS = ("bash", "sh", "dash", "zsh", "tcsh", "fish")


def shared_dir(paths: LabPaths) -> Path:
    return paths.dir / "shared"


def home_of(paths: LabPaths, user: str) -> Path:
    return shared_dir(paths) / "home" / user


def login_shell(shell: str) -> str:
    """The path of a login shell given by name (or path); a LabError when missing."""
    path = shell if shell.startswith("/") else shutil.which(shell)
    if not path or not os.access(path, os.X_OK):
        raise LabError(f"login shell {shell!r} is not installed",
                       fix=f"apt-get install {os.path.basename(shell)}")
    return path


def check_free(user: str) -> None:
    """A LabError unless ``user`` is a new account's name."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return
    raise LabError(f"user {user!r} already exists on this machine",
                   fix="pick another name with --shared-home USER")


def add_user(paths: LabPaths, user: str, n: int, shell: str = "bash",
             python: str = "/usr/bin/python3") -> Path:
    """Make ``user`` with its home in the lab's shared directory; returns its hostfile.
    A locked account is refused by sshd, so the password is '*' (no password login)."""
    home = home_of(paths, user)
    check_free(user)
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    for directory in (paths.dir, shared_dir(paths), home.parent):
        os.chmod(directory, 0o755)   # the user must reach its home through them
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", login_shell(shell), "-p", "*", user],
                   check=True, capture_output=True)
    _keys(paths, ssh)
    hostfile = _hostfile(home, user, n, python)
    subprocess.run(["chown", "-R", f"{user}:", str(home)], check=True)
    _close(home)
    return hostfile


def _keys(paths: LabPaths, ssh: Path) -> None:
    """The controller's key and the cluster key let in; the cluster key to go host to host."""
    ctl_pub = (paths.ctl_ssh / "id_ed25519.pub").read_text()
    cluster_pub = Path(f"{paths.cluster_key}.pub").read_text()
    (ssh / "authorized_keys").write_text(ctl_pub + cluster_pub)
    shutil.copy(paths.cluster_key, ssh / "id_ed25519")
    shutil.copy(paths.ctl_ssh / "known_hosts", ssh / "known_hosts")


def _hostfile(home: Path, user: str, n: int, python: str) -> Path:
    hostfile = home / "hosts.ini"
    hostfile.write_text("\n".join(["[defaults]", f"user = {user}", f"python = {python}"]
                                  + [f"[{host_address(i)}]" for i in range(1, n + 1)]) + "\n")
    return hostfile


def _close(home: Path) -> None:
    """Modes sshd's StrictModes wants: the home and ~/.ssh the user's alone."""
    os.chmod(home, 0o700)
    os.chmod(home / ".ssh", 0o700)
    for name in ("authorized_keys", "id_ed25519", "known_hosts"):
        os.chmod(home / ".ssh" / name, 0o600)


SSHFS_HOMES = "/run/multihost-sshfs"   # /run is each host's own: one mount point each


def add_sshfs_user(paths: LabPaths, user: str, n: int, host_argv) -> Path:
    """Make ``user`` whose home is an sshfs mount on every host, all of one directory
    that host 1 serves (a network filesystem's weak semantics: attribute caching, no
    locks across clients, close-to-open). The files live in ``<lab dir>/shared/sshfs/
    USER`` (``home_of``'s place for it); its path on the hosts is ``/run/multihost-sshfs/
    USER``. Mounted as root with the cluster key, every file shown as the user's
    (``idmap``). ``host_argv(i, argv)`` runs argv inside host i. Returns its hostfile."""
    store = shared_dir(paths) / "sshfs" / user
    check_free(user)
    home = f"{SSHFS_HOMES}/{user}"
    ssh = store / ".ssh"
    ssh.mkdir(parents=True)
    for directory in (paths.dir, shared_dir(paths), store.parent):
        os.chmod(directory, 0o755)
    subprocess.run(["useradd", "-M", "-d", home, "-s", login_shell("bash"), "-p", "*", user],
                   check=True, capture_output=True)
    _keys(paths, ssh)
    hostfile = _hostfile(store, user, n, "/usr/bin/python3")
    subprocess.run(["chown", "-R", f"{user}:", str(store)], check=True)
    _close(store)
    ids = pwd.getpwnam(user)
    options = (f"allow_other,idmap=user,uid={ids.pw_uid},gid={ids.pw_gid},"
               "IdentityFile=/root/.ssh/id_ed25519,BatchMode=yes")
    for i in range(1, n + 1):
        done = subprocess.run(host_argv(i, ["sh", "-c", f"mkdir -p {home} && sshfs -o {options} "
                                                     f"root@{host_address(1)}:{store} {home}"]),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise LabError(f"sshfs on host {i} failed: {done.stderr.strip()[-200:]}",
                           fix="apt-get install sshfs; check that /dev/fuse exists")
    return hostfile


def remove_user(user: Optional[str]) -> None:
    """Remove the account (its files go with the lab's directory)."""
    if not user:
        return
    try:
        pwd.getpwnam(user)
    except KeyError:
        return
    subprocess.run(["userdel", user], capture_output=True, check=False)
