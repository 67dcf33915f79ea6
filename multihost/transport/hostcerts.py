"""Host certificates: a host key signed by a CA that known_hosts trusts (``@cert-authority``).

Sites that sign their host keys list only the CA in known_hosts; OpenSSH then accepts
any host whose certificate that CA signed for its name. paramiko can receive a host
certificate (it offers the ``*-cert-v01@openssh.com`` algorithms) but checks nothing in
it, so multihost checks it here, as OpenSSH does (sshkey_cert_check_authority): a host
certificate, signed by a trusted CA whose signature verifies, valid now, naming the host
among its principals, with no critical option, and neither key nor CA revoked.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

import paramiko

CERT_SUFFIX = "-cert-v01@openssh.com"
HOST_CERTIFICATE = 2


@dataclass(frozen=True)
class HostCertificate:
    cert_type: int
    key_id: str
    principals: Tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    ca_blob: bytes
    signature: bytes
    signed: bytes   # everything the CA signed: the certificate up to its signature


def parse_certificate(blob: bytes) -> HostCertificate:
    """The fields of an OpenSSH certificate (PROTOCOL.certkeys); ValueError if it is not one."""
    msg = paramiko.Message(blob)
    name = msg.get_text()
    if not name.endswith(CERT_SUFFIX):
        raise ValueError(f"{name!r} is not a certificate")
    msg.get_string()  # nonce
    plain = name[: -len(CERT_SUFFIX)]
    if plain == "ssh-rsa":
        msg.get_mpint(), msg.get_mpint()
    elif plain == "ssh-ed25519":
        msg.get_string()
    elif plain.startswith("ecdsa-sha2-"):
        msg.get_string(), msg.get_string()
    else:
        raise ValueError(f"unknown certificate type {name!r}")
    msg.get_int64()  # serial
    cert_type, key_id, principals = msg.get_int(), msg.get_text(), msg.get_string()
    valid_after, valid_before = msg.get_int64(), msg.get_int64()
    critical = msg.get_string()
    msg.get_string(), msg.get_string()  # extensions, reserved
    ca_blob = msg.get_string()
    signed = blob[: msg.packet.tell()]
    signature = msg.get_string()
    if not signature or msg.get_remainder():
        raise ValueError("a truncated or overlong certificate")
    return HostCertificate(cert_type, key_id, _strings(principals), valid_after, valid_before,
                           critical, ca_blob, signature, signed)


def _strings(packed: bytes) -> Tuple[str, ...]:
    msg, names = paramiko.Message(packed), []
    while msg.get_remainder():
        names.append(msg.get_text())
    return tuple(names)


def glob_matches(pattern: str, name: str) -> bool:
    """OpenSSH's host patterns: only * and ? are wild ("[host]:port" is literal), no case."""
    if "*" not in pattern and "?" not in pattern:
        return pattern.lower() == name.lower()  # most lines: no regex to build
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                    for c in pattern.lower())
    return re.fullmatch(regex, name.lower()) is not None


def host_matches(patterns: str, name: str) -> bool:
    """Whether a known_hosts pattern list (``a,*.lab,!b,|1|hash``) names ``name``."""
    matched = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            hit = paramiko.HostKeys.hash_host(name, pattern) == pattern
        else:
            hit = glob_matches(pattern, name)
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def certificate_problem(key: paramiko.PKey, host: str, authorities: Iterable[paramiko.PKey],
                        revoked: Iterable[bytes], now: Optional[float] = None) -> Optional[str]:
    """Why the host's certificate is not accepted for ``host`` (None: it is)."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not blob.key_type.endswith(CERT_SUFFIX):
        return "the host offered no certificate"
    try:
        cert = parse_certificate(blob.key_blob)
    except (ValueError, paramiko.SSHException) as exc:
        return f"its certificate is malformed ({exc})"
    if cert.cert_type != HOST_CERTIFICATE:
        return "its certificate is not a host certificate"
    if cert.ca_blob not in {ca.asbytes() for ca in authorities}:
        return "its certificate is signed by a CA that known_hosts does not list for it"
    if cert.ca_blob in set(revoked):
        return "the CA that signed its certificate is revoked (@revoked)"
    try:
        ca = paramiko.PKey.from_type_string(paramiko.Message(cert.ca_blob).get_text(), cert.ca_blob)
        verified = ca.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature))
    except (ValueError, paramiko.SSHException):
        verified = False
    if not verified:
        return "its certificate's signature does not verify"
    now = time.time() if now is None else now
    if not cert.valid_after <= now < cert.valid_before:
        return "its certificate is expired or not yet valid"
    if cert.critical_options:
        return "its certificate has critical options, which no host certificate may have"
    if not any(glob_matches(principal, host) for principal in cert.principals):
        shown = ", ".join(cert.principals) or "none"
        return f"its certificate is not for {host} (its principals: {shown})"
    return None
