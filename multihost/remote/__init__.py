"""The remote helper: a stdlib-only package the controller ships to every host as one zip.

Nothing needs installing on a host: the controller zips this package (``helper.py``),
copies it once to ``~/.cache/multihost/`` keyed by its content hash, and runs
``python -S helper-HASH.pyz OP 'JSON'``. Inside the zip the package is called
``mhremote``; modules use relative imports only, so the same code also imports as
``multihost.remote`` for unit tests. Every ``ops_*.py`` module registers its operations.
"""
