"""The operations of `multihost sync` on a host; the work is in host.py.

  sync.session   one host's whole sync in one process: the plan, then the changes
  sync_plan      the plan alone (stdin: the manifest)
  sync.receive   apply a sync stream; forward it to the next hosts of a relay
  sync.push      feed files of this host into a relay chain of other hosts (--sync-data)
  sync.join      a relay hop: hand stdin to this host's node of the chain
"""
from . import host as sync_host
from . import rendezvous as sync_rendezvous
from ..proto import op


@op("sync.session", stream=True)
def sync_session(request):
    return sync_host.session(request)


@op("sync.plan")
def sync_plan(request):
    return sync_host.plan(request)


@op("sync.receive", stream=True)
def sync_receive(request):
    return sync_host.receive(request)


@op("sync.push", stream=True)
def sync_push(request):
    return sync_host.push(request)


@op("sync.join", stream=True)
def sync_join(request):
    return sync_rendezvous.join(request)
