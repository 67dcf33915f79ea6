"""The SSH transport end to end: real sshd hosts, real keys, every failure a user meets."""
import subprocess
import sys

import pytest


def exec_(lab, *args, hosts=None, timeout=120):
    target = ["--ips", ",".join(hosts)] if hosts else ["--hostfile", str(lab.hostfile)]
    return lab.multihost("exec", *target, *args, timeout=timeout)


def ssh_config(tmp_path, lab, **options):
    """An ssh config for one test: the lab's identity unless told otherwise."""
    settings = {"IdentityFile": str(lab.home / ".ssh" / "id_ed25519"), "IdentitiesOnly": "yes",
                "UserKnownHostsFile": str(lab.home / ".ssh" / "known_hosts"),
                "GlobalKnownHostsFile": "/dev/null", "User": "root"}
    settings.update(options)
    path = tmp_path / "ssh_config"
    path.write_text("Host *\n" + "".join(f"    {k} {v}\n" for k, v in settings.items()))
    return str(path)


def new_key(tmp_path, name="other_key"):
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def test_every_host_answers_in_the_given_order(lab):
    done = exec_(lab, "--plain", "--", "hostname")
    assert done.returncode == 0, done.stderr
    # --plain streams as lines arrive; grouped output keeps the given order
    assert sorted(done.stdout.splitlines()) == [f"{a}: h{i}" for i, a in enumerate(lab.addresses, 1)]
    reordered = [lab.address(3), lab.address(1), lab.address(2)]
    grouped = exec_(lab, "--", "hostname", hosts=reordered)
    titles = [l for l in grouped.stdout.splitlines() if l.startswith("198.18.0.")]
    assert titles == [f"{a} (1)" for a in reordered]


def test_identical_output_is_grouped_and_exit_is_the_largest(lab):
    done = exec_(lab, "--", "sh -c 'echo same; [ $(hostname) = h2 ] && exit 4 || true'")
    assert done.returncode == 4
    assert "198.18.0.[11,13-14] (3)" in done.stdout and "198.18.0.12 (1) exit 4" in done.stdout


def test_argv_reaches_the_remote_command_verbatim(lab):
    hostile = ["a b", "it's", "$(touch /tmp/pwned)", "`id`", "x; echo injected", "two\nlines"]
    done = exec_(lab, "--", "python3", "-c", "import sys; print(repr(sys.argv[1:]))", *hostile,
                 hosts=[lab.address(1)])
    assert done.returncode == 0, done.stderr
    assert repr(hostile) in done.stdout
    assert lab.host_run(1, ["test", "-e", "/tmp/pwned"]).returncode != 0


def test_a_cut_host_is_unreachable_while_the_others_answer(lab):
    with lab.cut_link(2):
        done = exec_(lab, "--connect-timeout", "2", "--", "hostname", timeout=60)
    assert done.returncode == 255
    assert f"multihost: {lab.address(2)}: no answer from {lab.address(2)}:22 within 2s" in done.stderr
    assert "fix:" in done.stderr
    for i in (1, 3, 4):
        assert f"h{i}" in done.stdout


def test_refused_when_sshd_is_down(lab):
    with lab.sshd_stopped(3):
        done = exec_(lab, "--", "true", hosts=[lab.address(3)])
    assert done.returncode == 255
    assert "connection refused on 198.18.0.13:22" in done.stderr and "start sshd" in done.stderr


def test_a_name_that_does_not_resolve(lab):
    done = exec_(lab, "--", "true", hosts=["no-such-host.invalid"])
    assert done.returncode == 255
    assert "name 'no-such-host.invalid' does not resolve" in done.stderr


def test_unknown_host_key_is_refused_then_accepted_on_request(lab, tmp_path):
    known = tmp_path / "known_hosts"
    config = ssh_config(tmp_path, lab, UserKnownHostsFile=str(known))
    refused = exec_(lab, "-F", config, "--", "true", hosts=[lab.address(1)])
    assert refused.returncode == 255
    assert "host key of 198.18.0.11 is not in known_hosts" in refused.stderr
    assert "--accept-new-host-keys" in refused.stderr and "Traceback" not in refused.stderr
    assert not known.exists()
    accepted = exec_(lab, "-F", config, "--accept-new-host-keys", "--", "true", hosts=[lab.address(1)])
    assert accepted.returncode == 0, accepted.stderr
    assert known.read_text().startswith("198.18.0.11 ssh-ed25519 ")
    again = exec_(lab, "-F", config, "--", "true", hosts=[lab.address(1)])
    assert again.returncode == 0, again.stderr


def test_a_changed_host_key_is_always_refused(lab, tmp_path):
    impostor = new_key(tmp_path, "impostor")
    known = tmp_path / "known_hosts"
    known.write_text("198.18.0.11 " + " ".join(impostor.with_suffix(".pub").read_text().split()[:2]) + "\n")
    config = ssh_config(tmp_path, lab, UserKnownHostsFile=str(known))
    for extra in ([], ["--accept-new-host-keys"]):
        done = exec_(lab, "-F", config, *extra, "--", "true", hosts=[lab.address(1)])
        assert done.returncode == 255
        assert "host key CHANGED for 198.18.0.11" in done.stderr
        assert "ssh-keygen -R 198.18.0.11" in done.stderr


def test_a_key_the_host_does_not_accept(lab, tmp_path):
    config = ssh_config(tmp_path, lab, IdentityFile=str(new_key(tmp_path)))
    done = exec_(lab, "-F", config, "--", "true", hosts=[lab.address(2)])
    assert done.returncode == 255
    assert "root@198.18.0.12 rejected our key" in done.stderr and "ssh-copy-id" in done.stderr


def test_ssh_config_aliases_user_and_port(lab, tmp_path):
    config = tmp_path / "ssh_config"
    base = ssh_config(tmp_path, lab)
    config.write_text(f"Host trainer-a\n    HostName {lab.address(4)}\n    Port 22\n\n"
                      + open(base).read())
    done = exec_(lab, "-F", str(config), "--plain", "--", "hostname", hosts=["trainer-a"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trainer-a: h4\n"


def test_this_machine_needs_no_sshd(lab):
    done = exec_(lab, "--plain", "--", "echo", "local", hosts=["127.0.0.1", lab.address(1)])
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["127.0.0.1: local", "198.18.0.11: local"]


@pytest.mark.parametrize("hosts", [1, 4])
def test_plain_streams_every_line_with_its_host(lab, hosts):
    targets = lab.addresses[:hosts]
    done = exec_(lab, "--plain", "--", "seq 1 200", hosts=targets)
    lines = done.stdout.splitlines()
    assert len(lines) == 200 * hosts
    for address in targets:
        assert [l.split(": ")[1] for l in lines if l.startswith(address + ":")] == \
            [str(i) for i in range(1, 201)]


def test_proxyjump_reaches_a_host_through_another(lab, tmp_path):
    config = tmp_path / "ssh_config"
    base = ssh_config(tmp_path, lab)
    config.write_text(f"Host behind\n    HostName {lab.address(2)}\n    ProxyJump {lab.address(1)}\n\n"
                      + open(base).read())
    done = exec_(lab, "-F", str(config), "--plain", "--", "sh -c 'echo $SSH_CONNECTION'",
                 hosts=["behind"])
    assert done.returncode == 0, done.stderr
    # the connection came from the jump host, not from the controller
    assert done.stdout.startswith(f"behind: {lab.address(1)} ")


MUX_SCRIPT = r'''
import sys, time
from multihost.errors import CommandTimeout
from multihost.hosts import Host
from multihost.transport import SshOptions
from multihost.transport.openssh import MuxTransport, start_master

host, options = Host(name=sys.argv[1]), SshOptions()
start_master(host, options)
deadline = time.monotonic() + 30
while MuxTransport.open(host, options) is None:
    assert time.monotonic() < deadline, "no master"
    time.sleep(0.1)
mux = MuxTransport.open(host, options)
done = mux.run("tr a-z A-Z; echo to-stderr >&2; exit 7", input=b"abc" * 100000)
print("run", done.exit_code, done.stdout[:3].decode(), len(done.stdout), done.stderr.decode().strip())
process = mux.start("read line; echo got $line; exit 4")
process.stdin.write(b"hello\n")
process.stdin.close()
print("start", process.stdout.read().decode().strip(), process.wait(30))
process.close()
try:
    mux.run("sleep 3171", timeout=2)
except CommandTimeout as err:
    print("timeout", err)
'''


def test_quick_steps_go_through_the_master_without_an_ssh_client(lab):
    """Through an OpenSSH master's control socket (no `ssh` process): input, output,
    stderr and exit status come through whole; a started command streams both ways; a
    command past its time is given up and ended on the host, as the `ssh` client's was."""
    done = lab.run([sys.executable, "-c", MUX_SCRIPT, lab.address(1)], timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "run 7 ABC 300000 to-stderr", lines
    assert lines[1] == "start got hello 4", lines
    assert lines[2].startswith(f"timeout {lab.address(1)}: command did not finish within 2s")
    # ended (TERM, then KILL a second later) before the timeout was raised
    assert "sleep 3171" not in lab.host_run(1, ["ps", "-eo", "args"]).stdout
