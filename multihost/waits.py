"""How long multihost waits on a host before it gives up: defaults made for a LAN,
settable from the environment for a network or hosts slower (or faster) than that.

- ``MULTIHOST_LOST_AFTER`` (15 s): a host of a followed run that answers nothing for this
  long is lost (run/monitor.py, logs/follow.py), and a sync's relay hop whose upstream
  sends nothing for this long plus 5 s is cut (remote/sync/relay.py): the hosts behind
  it are then fed from the controller.
- ``MULTIHOST_HELPER_START`` (60 s): the multihost helper on a host must print its first
  line within this long, or its python is taken to hang while starting (helper.py).

Read when a command needs them, not at import: a bad value is a ConfigError (one line,
the fix), refused by the CLI before any host is touched (commands/common.py).
"""
from __future__ import annotations

import math
import os

from .errors import ConfigError

LOST_AFTER_ENV, LOST_AFTER = "MULTIHOST_LOST_AFTER", 15.0
HELPER_START_ENV, HELPER_START = "MULTIHOST_HELPER_START", 60.0
# A relay hop waits this much longer than the controller does for a lost host: a run's
# cut host is said by the controller first, and a slow hop is not cut for a hiccup.
RELAY_SLACK = 5.0


def _seconds(name: str, default: float, least: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= least):
        raise ConfigError(f"{name}={text!r} is not a number of seconds ({least:g} or more)",
                          fix=f"set {name} to seconds, like {default:g} (the default), or "
                              f"unset it")
    return value


def lost_after() -> float:
    """Seconds without an answer after which a host of a run is lost (3 at least: a log
    stream's heartbeat comes every 2 s)."""
    return _seconds(LOST_AFTER_ENV, LOST_AFTER, 3.0)


def relay_idle() -> float:
    """Seconds a sync relay hop waits for a byte from its upstream host."""
    return lost_after() + RELAY_SLACK


def helper_start() -> float:
    """Seconds a host's helper may take to print its first line."""
    return _seconds(HELPER_START_ENV, HELPER_START, 1.0)


# A followed run's status and log streams look 4x as often in their first seconds, so a
# short job's end (a rerun of an edited script) is heard at once; only at up to
# QUICK_HOSTS hosts, where that is most of the run's time (each tick wakes every host).
QUICK_SECONDS, QUICK_HOSTS = 5.0, 8


def quick_start(hosts: int) -> float:
    """The seconds a stream to each of ``hosts`` hosts looks 4x as often (0: never)."""
    return QUICK_SECONDS if hosts <= QUICK_HOSTS else 0.0


def check_environment() -> None:
    """Refuse a bad setting now, before a host is touched."""
    lost_after()
    helper_start()
