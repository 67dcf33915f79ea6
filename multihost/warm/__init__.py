"""A warm controller: multihost's start-up paid once, kept ready like OpenSSH's
ControlPersist keeps a connection (server.py), and the client that uses it (client.py).

Nothing here is imported but by the ``multihost`` script's first step: this file stays
empty so that the client costs little more than the interpreter.
"""
