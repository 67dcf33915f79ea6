"""Code sync: the code directory made identical in every host's workdir
(``sync_code``), and the streams that move files to hosts (used by ``data`` too)."""
from .ignore import MIRROR_MARKER
from .manifest import build_manifest, code_revision, human_bytes
from .model import HostNeeds, HostSync, SyncReport
from .pipeline import sync_code
from .transfer import call_streaming, hop_spec, pipe_errors_raise, stream_to

__all__ = ["HostNeeds", "HostSync", "MIRROR_MARKER", "SyncReport", "build_manifest",
           "call_streaming", "code_revision", "hop_spec", "human_bytes", "pipe_errors_raise",
           "stream_to", "sync_code"]
