"""``python -m multihost``: the same command as the installed ``multihost`` (the
package's ``__init__`` has already taken the working directory off ``sys.path``)."""
import sys

from .cli import main

sys.exit(main())
