"""Every file a user names (hostfile, job file, env file) is read through here, with a
bound: real ones are a few KB. A wrong path (/dev/zero, a dataset, a log) is refused at
the bound in one line, not read into memory until the OOM killer comes."""
from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

MAX_FILE_BYTES = 1 << 20
MAX_LINE_CHARS = 65536


def read_config_bytes(path: Path, what: str, flag: str) -> bytes:
    """A file a user named, read up to MAX_FILE_BYTES; larger (or endless) is one line."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}",
                          fix=f"check the path given to {flag}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, the most a {what} "
                          f"may be", fix=f"check the path given to {flag}: a {what} is a "
                          "few lines of text")
    return data


def read_config_text(path: Path, what: str, flag: str) -> str:
    """A small config file as text, within the bounds above; unreadable, non-UTF-8, too
    large or with too long a line is one line naming the place and the bound."""
    data = read_config_bytes(path, what, flag)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{lineno}: not UTF-8 text (byte {exc.object[exc.start]:#04x})",
                          fix=f"save the {what} as UTF-8 text") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if len(line) > MAX_LINE_CHARS:
            raise ConfigError(f"{path}:{lineno}: a line longer than {MAX_LINE_CHARS} characters, "
                              f"the most a {what} line may be",
                              fix=f"check the path given to {flag}, and that line")
    return text
