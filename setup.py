# The package layout, here because pyproject.toml's [tool.setuptools] cannot both find
# the packages and add one that lives elsewhere: the launcher templates sit in the
# top-level templates/ folder, where users look for what to copy, and are shipped as
# the package multihost.templates from there (no second copy inside multihost/).
from setuptools import find_packages, setup

setup(packages=find_packages(include=["multihost", "multihost.*"]) + ["multihost.templates"],
      package_dir={"multihost.templates": "templates"},
      package_data={"multihost.templates": ["*.tmpl"]})
