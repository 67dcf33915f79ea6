"""The fabric bridge end to end: a fabric group from multihost's hosts, on real sshd hosts,
with host keys checked as multihost checks them (a plain fabric Connection accepts any)."""
import sys

import pytest

from test_transport import new_key, ssh_config

pytest.importorskip("fabric")

# Run as the lab's controller: builds the group, runs COMMAND on every host and prints one
# line per connection in group order: "LABEL: STDOUT", or the error's class and its line
# (multihost's errors name the host themselves).
SCRIPT = r"""
import sys
from fabric.exceptions import GroupException
from multihost.hosts import load_hosts
from multihost.transport import SshOptions
from multihost.transport.fabric_bridge import fabric_group

source, hosts_arg, config, accept, command = sys.argv[1:6]
hosts = load_hosts(hosts_arg if source == "ips" else None, hosts_arg if source == "hostfile" else None)
options = SshOptions(connect_timeout=5, config_file=config or "~/.ssh/config")
group = fabric_group(hosts, accept == "accept", options=options)
print(type(group).__name__, [type(c.gateway).__name__ for c in group])
try:
    results = group.run(command, hide=True, warn=True)
except GroupException as exc:
    results = exc.result
for connection in group:
    outcome = results[connection]
    if isinstance(outcome, Exception):
        print(f"{type(outcome).__name__}: {outcome}")
    else:
        print(f"{connection.multihost_host.label}: {outcome.stdout.strip()}")
group.close()
"""


def bridge(lab, command="hostname", *, hosts=None, config="", accept=False):
    source = ("ips", ",".join(hosts)) if hosts else ("hostfile", str(lab.hostfile))
    done = lab.run([sys.executable, "-c", SCRIPT, *source, config,
                    "accept" if accept else "refuse", command], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    header, *lines = done.stdout.splitlines()
    return header, lines


def known_hosts_with(lab, tmp_path, impostor_for: int):
    """The lab's known_hosts with host i's key replaced by a freshly made one."""
    impostor = new_key(tmp_path, "impostor").with_suffix(".pub").read_text().split()[:2]
    lines = (lab.home / ".ssh" / "known_hosts").read_text().splitlines()
    wanted = lab.address(impostor_for) + ","
    kept = [line for line in lines if not line.startswith(wanted)]
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(kept + [f"{lab.address(impostor_for)} {' '.join(impostor)}"]) + "\n")
    return known


def test_a_fabric_group_from_the_hostfile_runs_on_every_host_in_rank_order(lab):
    header, lines = bridge(lab)
    assert header.startswith("ThreadingGroup")
    assert lines == [f"{address}: h{i}" for i, address in enumerate(lab.addresses, 1)]
    reordered = [lab.address(3), lab.address(1), lab.address(4)]
    _, lines = bridge(lab, hosts=reordered)
    assert lines == [f"{lab.address(3)}: h3", f"{lab.address(1)}: h1", f"{lab.address(4)}: h4"]


def test_fabric_refuses_a_changed_host_key_even_with_accept_new(lab, tmp_path):
    known = known_hosts_with(lab, tmp_path, impostor_for=1)
    before = known.read_text()
    config = ssh_config(tmp_path, lab, UserKnownHostsFile=str(known))
    for accept in (False, True):
        _, lines = bridge(lab, hosts=lab.addresses[:2], config=config, accept=accept)
        changed, other = lines
        assert changed.startswith("ConnectError: 198.18.0.11: host key CHANGED for 198.18.0.11")
        assert "(fix: if the host was reinstalled, run `ssh-keygen -R 198.18.0.11`" in changed
        assert other == f"{lab.address(2)}: h2"  # the group goes on with the other hosts
    assert known.read_text() == before


def test_fabric_refuses_an_unknown_host_key_unless_accept_new(lab, tmp_path):
    known = tmp_path / "known_hosts"
    config = ssh_config(tmp_path, lab, UserKnownHostsFile=str(known))
    _, lines = bridge(lab, hosts=[lab.address(1)], config=config)
    assert lines[0].startswith("ConnectError: 198.18.0.11: host key of 198.18.0.11 is not in "
                               "known_hosts (ssh-ed25519 SHA256:")
    assert "--accept-new-host-keys" in lines[0]
    assert not known.exists()
    _, lines = bridge(lab, hosts=[lab.address(1)], config=config, accept=True)
    assert lines == [f"{lab.address(1)}: h1"]
    assert known.read_text().startswith("198.18.0.11 ssh-ed25519 ")
    _, lines = bridge(lab, hosts=[lab.address(1)], config=config)
    assert lines == [f"{lab.address(1)}: h1"]


def test_fabric_reaches_a_proxyjump_host_through_its_gateway(lab, tmp_path):
    config = tmp_path / "ssh_config"
    base = ssh_config(tmp_path, lab)
    config.write_text(f"Host behind\n    HostName {lab.address(2)}\n    ProxyJump {lab.address(1)}\n\n"
                      + open(base).read())
    header, lines = bridge(lab, "echo $SSH_CONNECTION", hosts=["behind"], config=str(config))
    assert header.endswith("['CheckedConnection']")
    # the connection came from the jump host, not from the controller
    assert lines[0].startswith(f"behind: {lab.address(1)} ")
