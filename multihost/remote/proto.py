"""The helper's protocol: one operation per process, a JSON request in argv, one JSON
reply on stdout (``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ..., "fix":
...}``). Streaming operations own stdin and stdout instead and exit with their status.
"""
import json
import sys

OPS = {}
EXIT_HELPER_FAILED = 1
EXIT_USAGE = 2


class OpError(Exception):
    """An expected failure: the controller shows ``error`` and ``fix`` to the user."""

    def __init__(self, error, fix=None):
        Exception.__init__(self, error)
        self.error = error
        self.fix = fix


def op(name, stream=False):
    """Register ``function(request: dict)``; a streaming op writes its own output."""
    def register(function):
        OPS[name] = (function, stream)
        return function
    return register


def reply(payload):
    sys.stdout.write(json.dumps(payload, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def dispatch(argv):
    if len(argv) < 2 or argv[1] not in OPS:
        reply({"ok": False, "error": "unknown helper operation %r" % (argv[1:2],),
               "fix": "the controller and helper versions differ; run again"})
        return EXIT_USAGE
    function, stream = OPS[argv[1]]
    request = json.loads(argv[2]) if len(argv) > 2 and argv[2] else {}
    if stream:
        return function(request) or 0
    try:
        result = function(request)
    except OpError as err:
        reply({"ok": False, "error": err.error, "fix": err.fix})
        return EXIT_HELPER_FAILED
    reply({"ok": True, "result": result})
    return 0
