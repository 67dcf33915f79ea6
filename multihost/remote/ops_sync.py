"""The operations of `multihost sync` on a host. The work is in sync_host.py, imported
only when one of these runs, so that every other helper call stays quick to start.

  sync.session   one host's whole sync in one process: the plan, then the changes
  sync_plan      the plan alone (stdin: the manifest)
  sync.receive   apply a sync stream; forward it to the next hosts of a relay
  sync.push      feed files of this host into a relay chain of other hosts (--sync-data)
  sync.join      a relay hop: hand stdin to this host's node of the chain
"""
from .proto import op


@op("sync.session", stream=True)
def sync_session(request):
    from .sync_host import session
    return session(request)


@op("sync.plan")
def sync_plan(request):
    from .sync_host import plan
    return plan(request)


@op("sync.receive", stream=True)
def sync_receive(request):
    from .sync_host import receive
    return receive(request)


@op("sync.push", stream=True)
def sync_push(request):
    from .sync_host import push
    return push(request)


@op("sync.join", stream=True)
def sync_join(request):
    from .sync_rendezvous import join
    return join(request)
