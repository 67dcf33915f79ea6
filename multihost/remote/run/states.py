"""The words a run's states are written in: on a host (node.json), on the wire (the
answers of run.status and run.watch, the state frames of logs.tail) and in the
controller's record. One list for the helper and the controller, which imports it from
here as it imports sync_wire. Stdlib only, Python 3.6+ (this runs on the hosts).
"""

SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"      # ended by multihost (teardown after another failure, Ctrl-C, stop)

# Why a node of a run of several stopped itself: the controller never told it that every
# node launched (run.launched) before its launch deadline.
LAUNCH_LOST = "launch never completed: the controller was lost during the launch"

# Why a node failed when its run directory (~/.multihost) filled up: the controller adds
# the host's name, and the fix (run.outcome, run.request).
NO_SPACE = "no space left in ~/.multihost"

# A node (or a run) in one of these has ended for good: nothing will change it again.
FINAL_STATES = (SUCCEEDED, FAILED, STOPPED)
