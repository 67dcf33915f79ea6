"""`multihost lab status` as a user reads it: a header naming the lab and its hostfile,
one aligned line per host (a dead init, a stopped sshd and a cut cable say so), and
Slurm's nodes when the lab runs Slurm."""
import io

from multihost.lab.lab import HostStatus
from multihost.views.lab_view import render_status


def test_the_lab_status_table_says_which_host_is_dead_down_or_cut():
    out = io.StringIO()
    hosts = [HostStatus(1, "h1", "198.18.0.11", 4242, True, True),
             HostStatus(2, "h2", "198.18.0.12", None, False, False)]
    render_status("mhlab", "/labs/mhlab", "/labs/mhlab/hosts.ini", hosts, {}, out)
    assert out.getvalue().splitlines() == [
        "lab mhlab at /labs/mhlab  (hostfile /labs/mhlab/hosts.ini)",
        "HOST  ADDRESS      INIT PID  SSHD  LINK",
        "h1    198.18.0.11  4242      up    up",
        "h2    198.18.0.12  dead      down  cut",
    ]


def test_a_lab_with_slurm_lists_its_nodes_states_after_the_hosts():
    out = io.StringIO()
    hosts = [HostStatus(1, "h1", "198.18.0.11", 7, True, True)]
    render_status("mhlab", "/l", "/l/hosts.ini", hosts, {"h1": "idle", "h2": "down"}, out)
    assert out.getvalue().splitlines()[-1] == "slurm: h1 idle, h2 down"
