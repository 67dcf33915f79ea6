"""known_hosts as sites write it: @cert-authority and @revoked lines, host certificates
checked as OpenSSH checks them (real certificates made with ssh-keygen -s)."""
import subprocess
from pathlib import Path

import paramiko
import pytest

from multihost.transport.hostcerts import certificate_problem, host_matches
from multihost.transport.hostkeys import (HostKeyPolicy, RevokedHostKey, UnknownHostKey,
                                          load_known_hosts)


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def pub_line(path: Path) -> str:
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def public_key(path: Path) -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key_file(str(path))


@pytest.fixture
def keys(tmp_path):
    class Keys:
        ca = keygen(tmp_path / "ca")
        other_ca = keygen(tmp_path / "other_ca")
        host = keygen(tmp_path / "host")
        old_host = keygen(tmp_path / "old_host")

        @staticmethod
        def certified(*options, ca=None, principals="h1,198.18.0.11") -> paramiko.PKey:
            """The host key carrying a certificate signed with ``options``."""
            cert = tmp_path / "host-cert.pub"
            cert.unlink(missing_ok=True)
            argv = ["ssh-keygen", "-q", "-s", str(ca or Keys.ca), "-I", "h1"]
            argv += (["-n", principals] if principals else []) + list(options)
            subprocess.run(argv + [f"{Keys.host}.pub"], check=True, capture_output=True)
            key = public_key(Keys.host)
            key.load_certificate(str(cert))
            return key
    return Keys


def authorities(keys):
    return [public_key(keys.ca)]


def test_a_certificate_signed_by_the_listed_ca_for_the_host_is_accepted(keys):
    assert certificate_problem(keys.certified("-h"), "h1", authorities(keys), []) is None
    assert certificate_problem(keys.certified("-h"), "198.18.0.11", authorities(keys), []) is None


@pytest.mark.parametrize("case, options, expected", [
    ("another host's", ["-h"], "not for h9"),
    ("a user certificate", [], "not a host certificate"),
    ("an expired", ["-h", "-V", "20200101:20200102"], "expired"),
    ("a critical option's", ["-h", "-O", "force-command=true"], "critical options"),
])
def test_a_certificate_that_openssh_would_refuse_is_refused(keys, case, options, expected):
    host = "h9" if case == "another host's" else "h1"
    assert expected in certificate_problem(keys.certified(*options), host, authorities(keys), [])


def test_a_certificate_of_another_ca_a_revoked_ca_or_a_forged_signature_is_refused(keys):
    other = keys.certified("-h", ca=keys.other_ca)
    assert "CA that known_hosts does not list" in certificate_problem(other, "h1", authorities(keys), [])
    good = keys.certified("-h")
    revoked = [public_key(keys.ca).asbytes()]
    assert "revoked" in certificate_problem(good, "h1", authorities(keys), revoked)
    blob = bytearray(good.public_blob.key_blob)
    blob[-5] ^= 1   # inside the signature
    good.public_blob.key_blob = bytes(blob)
    assert "does not verify" in certificate_problem(good, "h1", authorities(keys), [])
    assert "no certificate" in certificate_problem(public_key(keys.host), "h1", authorities(keys), [])


def test_host_patterns_as_known_hosts_writes_them():
    assert host_matches("*.lab,198.18.0.*", "h1.lab") and host_matches("*.lab", "H1.LAB")
    assert host_matches("[198.18.0.11]:2222", "[198.18.0.11]:2222")   # brackets are literal
    assert not host_matches("*,!h2", "h2") and host_matches("*,!h2", "h1")
    hashed = paramiko.HostKeys.hash_host("h1")
    assert host_matches(hashed, "h1") and not host_matches(hashed, "h2")


def write_known_hosts(tmp_path, keys, *extra):
    path = tmp_path / "known_hosts"
    path.write_text("\n".join([
        "# a comment",
        f"@cert-authority *.lab,h1 {pub_line(keys.ca)}",
        f"@revoked * {pub_line(keys.other_ca)}",
        "@unknown-marker h1 ssh-ed25519 AAAA",
        "h3 ssh-ed25519 not-base64!!",
        *extra]) + "\n")
    return str(path)


def test_marker_and_broken_lines_are_read_not_fatal(tmp_path, keys):
    """paramiko alone ends every command in an InvalidHostKey traceback on these lines."""
    known = load_known_hosts([write_known_hosts(tmp_path, keys, f"h2 {pub_line(keys.host)}"),
                              str(tmp_path / "absent")])
    assert [line.patterns for line in known.plain] == ["h2"]
    assert [p for p, _ in known.authorities] == ["*.lab,h1"]
    assert known.revoked == (public_key(keys.other_ca).asbytes(),)
    assert known.authorities_for("h1") and not known.authorities_for("h2")


def test_the_policy_takes_a_certified_key_refuses_a_revoked_one_even_with_accept_new(tmp_path, keys):
    record = tmp_path / "recorded"
    known = load_known_hosts([write_known_hosts(tmp_path, keys, f"@revoked h5 {pub_line(keys.old_host)}")])
    client = paramiko.SSHClient()
    HostKeyPolicy(False, str(record), known, "h1").missing_host_key(
        client, "h1", keys.certified("-h", principals="h1"))  # no exception: accepted
    assert not record.exists()   # trusted through its CA, never recorded
    with pytest.raises(RevokedHostKey):   # revoked under any name
        HostKeyPolicy(True, str(record), known, "h6").missing_host_key(
            client, "h6", public_key(keys.old_host))
    assert not record.exists()
    with pytest.raises(UnknownHostKey) as info:
        HostKeyPolicy(False, str(record), known, "h1").missing_host_key(
            client, "h1", keys.certified("-h", principals="h7"))
    assert "not for h1" in info.value.why


def test_a_hosts_keys_are_found_by_name_hash_pattern_and_port_first_line_winning(tmp_path, keys):
    hashed = paramiko.HostKeys.hash_host("[10.0.0.7]:2222")
    path = tmp_path / "known_hosts"
    path.write_text("\n".join([
        f"h1,10.0.0.5 {pub_line(keys.host)}",
        f"h1 {pub_line(keys.old_host)}",            # a later line of the same type loses
        f"{hashed} {pub_line(keys.old_host)}",
        f"*.lab,!bad.lab {pub_line(keys.ca)}",
        f"10.0.0.7 {pub_line(keys.ca)}",            # port 22 only
    ]) + "\n")
    known = load_known_hosts([str(path)])

    def found(name):
        table = paramiko.HostKeys()
        known.fill(table, name)
        entry = table.lookup(name)
        return entry and entry["ssh-ed25519"]
    assert found("h1") == public_key(keys.host) and found("10.0.0.5") == public_key(keys.host)
    assert found("[10.0.0.7]:2222") == public_key(keys.old_host)
    assert found("gpu.lab") == public_key(keys.ca) and not found("bad.lab")
    assert not found("h2") and found("10.0.0.7") == public_key(keys.ca)
