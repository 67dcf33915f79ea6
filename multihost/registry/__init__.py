"""The host registry, as the controller sees it: each host keeps one (the helper's
remote/registry/holds.py) of every run that holds it and every run waiting in line for it.

entry.py is this run's entry and the name people call it by; holders.py reads every host's
entries and merges them by run (``status --all``); queue.py is ``run --queue``'s line.
"""
