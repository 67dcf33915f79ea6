"""Hosts as they are met in the wild, over real sshd: a login shell that talks on
start-up, host keys signed by a CA or revoked in known_hosts, an ssh config that turns
host-key checking off."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

RUN_DIR = "/run/multihost"   # where a lab host's sshd reads its config and key
CHATTY_BASHRC = "echo Welcome to the cluster; echo 'motd: be nice' >&2; printf 'no newline'\n"


def pub_of(path: Path) -> str:
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def new_key(tmp_path: Path, name: str) -> Path:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def ssh_config(tmp_path: Path, lab, known: Path, **options) -> str:
    settings = {"IdentityFile": str(lab.home / ".ssh" / "id_ed25519"), "IdentitiesOnly": "yes",
                "UserKnownHostsFile": str(known), "GlobalKnownHostsFile": "/dev/null",
                "User": "root"}
    settings.update(options)
    path = tmp_path / "ssh_config"
    path.write_text("Host *\n" + "".join(f"    {k} {v}\n" for k, v in settings.items()))
    return str(path)


def lab_known_line(lab, i: int) -> str:
    """Host i's plain line from the lab's own known_hosts."""
    address = lab.address(i)
    return next(line for line in (lab.home / ".ssh" / "known_hosts").read_text().splitlines()
                if line.split()[0].split(",")[0] == address)


@contextlib.contextmanager
def chatty_shell(lab, i: int):
    """Host i's root gets a ~/.bashrc that prints on start-up (bash reads it for every
    command sshd starts); removed again on exit."""
    lab.host_run(i, ["sh", "-c", "cat > /root/.bashrc"], input=CHATTY_BASHRC, check=True)
    try:
        yield
    finally:
        lab.host_run(i, ["rm", "-f", "/root/.bashrc"])


def test_a_login_shell_that_prints_on_start_up_breaks_no_command(lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import os\nprint('rank', os.environ['RANK'], 'done')\n")
    (code / "big.bin").write_bytes(bytes(range(256)) * 70000)   # bulk stream and relay
    hosts = ",".join(lab.addresses[:2])
    with chatty_shell(lab, 1), chatty_shell(lab, 2):
        assert "Welcome to the cluster" in lab.ssh(1, "true").stdout   # it does talk
        done = lab.multihost("exec", "--ips", hosts, "--", "echo", "hi", timeout=120)
        assert done.returncode == 0, done.stderr
        checked = lab.multihost("check", "--ips", hosts, "--json", timeout=120)
        doc = json.loads(checked.stdout)
        for host in doc["hosts"]:
            results = {c["name"]: c["status"] for c in host["checks"]}
            assert results["ssh"] == "pass" and results["software"] != "fail", checked.stdout
        synced = lab.multihost("sync", "--ips", hosts, "--code", str(code), "--workdir",
                               "/root/work/chatty", timeout=120)
        assert synced.returncode == 0, synced.stderr
        assert "came host to host" in synced.stdout   # the relay hop ran through it too
        again = lab.multihost("sync", "--ips", hosts, "--code", str(code), "--workdir",
                              "/root/work/chatty", timeout=120)
        assert again.returncode == 0, again.stderr
        ran = lab.multihost("run", "--ips", hosts, "--launcher", "python", "--no-check",
                            "--plain", "--code", str(code), "--workdir", "/root/work/chatty", "--log_dir", str(tmp_path / "log"),
                            "--", "train.py", timeout=180)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        for i in (1, 2):
            workdir = lab.host_run(i, ["sha256sum", "/root/work/chatty/big.bin"]).stdout
            assert workdir.split()[0] == subprocess.run(
                ["sha256sum", str(code / "big.bin")], capture_output=True, text=True
            ).stdout.split()[0]
    for text in (done.stderr, checked.stderr, synced.stderr, ran.stderr):
        assert "Traceback" not in text


@contextlib.contextmanager
def host_certificate(lab, i: int, ca: Path, tmp_path: Path):
    """Host i's sshd presents a certificate for its key, signed by ``ca`` for its address
    and name; sshd is restarted with its old config on exit."""
    public = lab.host_run(i, ["ssh-keygen", "-y", "-f", f"{RUN_DIR}/ssh_host_ed25519_key"],
                          check=True).stdout
    pub = tmp_path / f"host{i}.pub"
    pub.write_text(public)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", f"h{i}", "-h",
                    "-n", f"{lab.address(i)},h{i}", str(pub)], check=True)
    cert = (tmp_path / f"host{i}-cert.pub").read_text()
    config = lab.host_run(i, ["cat", f"{RUN_DIR}/sshd_config"], check=True).stdout
    install = (f"cat > {RUN_DIR}/host-cert.pub && "
               f"echo 'HostCertificate {RUN_DIR}/host-cert.pub' >> {RUN_DIR}/sshd_config")
    lab.host_run(i, ["sh", "-c", install], input=cert, check=True)
    lab.lab.sshd_stop(i)
    lab.lab.sshd_start(i)
    try:
        yield
    finally:
        lab.host_run(i, ["sh", "-c", f"cat > {RUN_DIR}/sshd_config"], input=config, check=True)
        lab.lab.sshd_stop(i)
        lab.lab.sshd_start(i)


def test_a_host_certified_by_a_listed_ca_works_and_a_revoked_key_is_refused_by_name(lab, tmp_path):
    ca, retired = new_key(tmp_path, "ca"), new_key(tmp_path, "retired")
    known = tmp_path / "known_hosts"
    lines = [f"@cert-authority 198.18.0.* {pub_of(ca)}", f"@revoked * {pub_of(retired)}",
             lab_known_line(lab, 2)]
    known.write_text("\n".join(lines) + "\n")
    config = ssh_config(tmp_path, lab, known)
    target = ["--ips", ",".join(lab.addresses[:2])]
    with host_certificate(lab, 1, ca, tmp_path):
        done = lab.multihost("exec", "-F", config, *target, "--", "hostname", timeout=120)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()).count("h1") == 1 and "h2" in done.stdout
        assert known.read_text() == "\n".join(lines) + "\n"   # trusted via the CA, not recorded
        # host 2's own key revoked: refused by name, even with --accept-new-host-keys
        known.write_text("\n".join(lines + [f"@revoked * {lab_known_line(lab, 2).split(None, 1)[1]}"]) + "\n")
        refused = lab.multihost("exec", "-F", config, "--accept-new-host-keys", *target,
                                "--", "hostname", timeout=120)
    assert refused.returncode == 255
    assert f"multihost: {lab.address(2)}: host key of {lab.address(2)} is REVOKED" in refused.stderr
    assert "h1" in refused.stdout and "Traceback" not in refused.stderr + done.stderr


def test_a_host_certified_by_a_ca_not_listed_is_refused_in_one_line(lab, tmp_path):
    ca, other_ca = new_key(tmp_path, "ca"), new_key(tmp_path, "other_ca")
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority * {pub_of(other_ca)}\n")
    config = ssh_config(tmp_path, lab, known)
    with host_certificate(lab, 1, ca, tmp_path):
        done = lab.multihost("exec", "-F", config, "--ips", lab.address(1), "--", "true",
                             timeout=120)
    assert done.returncode == 255 and "Traceback" not in done.stderr
    assert "a CA is listed for it (@cert-authority) but its certificate is signed by a CA " \
           "that known_hosts does not list" in done.stderr
    assert "fix:" in done.stderr


BULK_SSH = textwrap.dedent("""\
    import subprocess, sys
    from multihost.hosts import Host
    from multihost.sync.bulk import openssh_argv
    from multihost.transport import SshOptions
    from multihost.transport.ssh import SshTransport
    alias, address, config, known, impostor = sys.argv[1:6]
    transport = SshTransport.connect(Host(name=alias), SshOptions(config_file=config))
    argv = openssh_argv(transport, config)
    transport.close()
    open(known, "w").write(address + " " + impostor + "\\n")   # the key changes now
    done = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=60)
    print(done.returncode, done.stderr.strip().splitlines()[-1:])
""")


def test_the_bulk_ssh_refuses_a_changed_key_whatever_the_users_config_says(lab, tmp_path):
    """The user reaches the host by an alias; a block for its address turns checking off.
    The paramiko connection (by the alias) refuses a changed key, so the `ssh` that
    carries sync's heavy files (by the address) must refuse it too."""
    known = tmp_path / "known_hosts"
    known.write_text(lab_known_line(lab, 1) + "\n")
    config = tmp_path / "ssh_config"
    config.write_text(textwrap.dedent(f"""\
        Host gpu1
            HostName {lab.address(1)}
        Host 198.18.0.*
            StrictHostKeyChecking no
        Host *
            User root
            IdentityFile {lab.home / ".ssh" / "id_ed25519"}
            IdentitiesOnly yes
            UserKnownHostsFile {known}
            GlobalKnownHostsFile /dev/null
        """))
    impostor = pub_of(new_key(tmp_path, "impostor"))
    done = lab.run([sys.executable, "-c", BULK_SSH, "gpu1", lab.address(1), str(config),
                    str(known), impostor], timeout=120)
    assert done.returncode == 0, done.stderr
    code = int(done.stdout.split()[0])
    assert code == 255, done.stdout   # the old argv logged in despite the changed key
    assert "Host key verification failed" in done.stdout or "CHANGED" in done.stdout
