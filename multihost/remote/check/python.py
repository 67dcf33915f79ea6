"""Other interpreters on this host that have a framework (torch, paddle): what a fix can
name when the job's python lacks it. Stdlib only, python3.6+, like the rest of remote/.

Where people keep them: a venv at the same path as the controller's (one image, or a
shared /opt/venv), conda environments under ~/miniconda3, ~/anaconda3 and /opt/conda.
Found by their files (``lib/python3.X/site-packages/torch/version.py``), never by
starting them: a check of ten environments costs a few directory listings.
"""
import glob
import os
import re

CONDA_ROOTS = ("~/miniconda3", "~/anaconda3", "~/miniforge3", "~/mambaforge", "/opt/conda")
# The version line of each framework's version file, as its build writes it.
VERSION_FILES = (("torch", ("torch/version.py",), r"""^__version__\s*=\s*['"]([^'"]+)"""),
                 ("paddle", ("paddle/version/__init__.py", "paddle/version.py"),
                  r"""^full_version\s*=\s*['"]([^'"]+)"""))
LIMIT = 32   # environments looked at, at most


def _candidates(prefix):
    roots = [prefix] if prefix else []
    for conda in CONDA_ROOTS:
        base = os.path.expanduser(conda)
        if os.path.isdir(base):
            roots.append(base)
            roots += sorted(glob.glob(os.path.join(base, "envs", "*")))
    return roots[:LIMIT]


def _version(path, pattern):
    try:
        with open(path) as f:
            text = f.read(20000)
    except (OSError, UnicodeDecodeError):
        return None
    match = re.search(pattern, text, re.M)
    return match.group(1) if match else None


def framework_pythons(prefix=None, skip=None):
    """[{"python": path, "torch": version, "paddle": version}, ...] for every environment
    found with at least one framework, the controller's own prefix first; ``skip`` is
    the job's python, which the caller has looked at already."""
    # By path, not resolved: a venv's python links to the very interpreter it differs from.
    skip = os.path.abspath(skip) if skip else None
    found = []
    for root in _candidates(prefix):
        python = os.path.join(root, "bin", "python")
        if not os.access(python, os.X_OK) or os.path.abspath(python) == skip:
            continue
        entry = {"python": python}
        for site in sorted(glob.glob(os.path.join(root, "lib", "python3*", "site-packages"))):
            for name, files, pattern in VERSION_FILES:
                for rel in files:
                    version = _version(os.path.join(site, rel), pattern)
                    if version and name not in entry:
                        entry[name] = version
        if len(entry) > 1 and entry not in found:
            found.append(entry)
    return found
