"""The embedded pair with a host-round engine and a resident-round engine (run eagerly, the
graphs' oracle), for the modules that compare the two; a module's own fixtures of these names win."""

from __future__ import annotations

import pytest

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.session import open_session


@pytest.fixture(scope="module")
def session():
    return open_session()


@pytest.fixture(scope="module")
def engines(session):
    return {"host": Engine(session.target, session.drafter, max_context=256, resident=False),
            "resident": Engine(session.target, session.drafter, max_context=256, resident=True, graphs=False)}
