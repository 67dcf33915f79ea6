"""The launcher templates multihost ships: this folder is the package
``multihost.templates`` (setup.py maps it), so ``--launcher torchrun`` finds
``torchrun.tmpl`` here in a checkout and in an installed wheel alike. Copy one next to
your code and change it to make your own (docs/templates.md)."""
