"""The public API as docs/api.md names it, and each feature package's face: the names
other packages (and users' tools) import from it."""
import importlib
import re
import types
from pathlib import Path

import pytest

import multihost

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
PACKAGES = ["multihost", "multihost.check", "multihost.sync", "multihost.data", "multihost.run",
            "multihost.logs", "multihost.scale", "multihost.events"]


def test_the_names_docs_api_md_promises_are_the_public_ones():
    text = API_DOC.read_text()
    paragraph = text[text.index("The public names are those in"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    promised = set(re.findall(r"`(\w+)`", paragraph))
    assert {"Cluster", "Run", "MultihostError", "RunStarted"} <= promised, paragraph
    assert promised <= set(multihost.__all__)
    assert multihost.Cluster.from_ips and multihost.Run.load
    assert issubclass(multihost.ConnectError, multihost.MultihostError)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_a_face_exports_is_there(package):
    face = importlib.import_module(package)
    assert face.__all__, f"{package} names nothing"
    namespace = {}
    exec(f"from {package} import *", namespace)
    for name in face.__all__:
        assert not isinstance(namespace[name], types.ModuleType), f"{package}.{name} is a module"
