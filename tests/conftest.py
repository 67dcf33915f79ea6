"""Shared by every test: multihost commands started by a test run cold.

A warm controller (multihost/warm/) outlives the command that starts it, for minutes; a
suite that starts hundreds of commands would leave hundreds behind. The tests of the warm
controller turn it on for themselves and stop what they start."""
import os

os.environ["MULTIHOST_WARM"] = "0"
