"""The operations of data verification on a host (`--data`, `--sync-data`). The work
is in host.py, imported only when one of these runs.

  data.scan    hash each dataset path (in parallel, through the hash cache): digests,
               and the full listing when asked
  data.trash   move files aside before --sync-data replaces or removes them
"""
from ..proto import op


@op("data.scan", stream=True)
def data_scan(request):
    from .host import scan
    return scan(request)


@op("data.trash")
def data_trash(request):
    from .host import trash
    return trash(request)
