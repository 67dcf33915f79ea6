"""The remote helper: a stdlib-only package the controller ships to every host.

Nothing needs installing on a host: the controller packs this package as a gzipped tar
(``helper.py``), unpacks it once into ``~/.cache/multihost/helper-HASH/`` keyed by its
content hash, and runs ``python -S -E helper-HASH OP 'JSON'``. There the package is called
``mhremote``; modules use relative imports only, so the same code also imports as
``multihost.remote`` for unit tests. Its subpackages mirror the controller's features
(``check/``, ``run/``, ``logs/``, ``sync/``, ``data/``, ``registry/``), each with its
operations in ``ops.py``; ``main.FAMILIES`` maps an operation's family to that module.
"""
