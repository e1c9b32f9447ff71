"""Fixtures of the container tests: a Docker daemon and replag's image, once a session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.docker import docker_daemon, remove_leftovers, replag_image


@pytest.fixture(scope="session")
def docker_ready() -> Iterator[None]:
    with docker_daemon():
        remove_leftovers()
        yield
        remove_leftovers()


@pytest.fixture(scope="session")
def image(docker_ready: None) -> str:
    """replag's image, built from this checkout by deploy/image/build."""
    return replag_image()
