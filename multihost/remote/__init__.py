"""The remote helper: a stdlib-only package the controller ships to every host as one zip.

Nothing needs installing on a host: the controller zips this package (``helper.py``),
unpacks it once into ``~/.cache/multihost/helper-HASH/`` keyed by its content hash, and
runs ``python -S -E helper-HASH OP 'JSON'``. There the package is called ``mhremote``;
modules use relative imports only, so the same code also imports as
``multihost.remote`` for unit tests. Every ``ops_<family>.py`` module registers the
operations of its family (``check.host`` lives in ``ops_check``).
"""
