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

# A node (or a run) in one of these has ended for good: nothing will change it again.
FINAL_STATES = (SUCCEEDED, FAILED, STOPPED)
