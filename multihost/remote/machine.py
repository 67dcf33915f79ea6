"""Which machine this is, for telling two entries of a hostfile apart. Stdlib only."""
import os


def machine_identity():
    """What tells two entries of a hostfile apart as machines: the kernel's boot id (one
    per running kernel) and the network namespace (containers on one kernel are separate
    hosts, with their own ports). Two entries with the same pair are one machine, reached
    twice (localhost and 127.0.0.1, or two addresses of one host). None if unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return "%s/%s" % (boot, os.readlink("/proc/self/ns/net"))
    except OSError:
        return None
