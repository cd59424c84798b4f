"""Shared test helpers.

A component the project needs (Docker engine, Ray, vLLM, ...) must be tested in CI: with CI=true a missing
component fails the test; elsewhere the test is skipped with the reason.
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require(available: bool, reason: str) -> None:
    """Skip (outside CI) or fail (in CI) when a needed component is missing."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this component must be present)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    """A client of a running Docker engine."""
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # any failure means: no usable engine
        require(False, f"no Docker engine reachable: {exc}")
    return client
