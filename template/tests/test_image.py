"""`image` error messages: a push failure is read for its cause (the real pushes run in the
template's tests/test_image_build.py against podman)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "registry, message, cause",
    [
        # A port that contains 401 is no HTTP status (this once read as "not logged in").
        (
            "127.0.0.1:43401",
            "trying to reuse blob sha256:d2 at destination: pinging container registry 127.0.0.1:43401: "
            'Get "https://127.0.0.1:43401/v2/": dial tcp 127.0.0.1:43401: connect: connection refused',
            "not reachable",
        ),
        ("registry.example.com", "unexpected status from PUT request: 401 Unauthorized", "Not logged in"),
        ("registry.example.com", "denied: requested access to the resource is denied", "Not logged in"),
        ("10.0.0.5:5000", "http: server gave HTTP response to HTTPS client", "insecure"),
    ],
)
def test_push_error_names_the_cause(pkg, registry, message, cause):
    text = pkg.module("image.build").push_error(registry, f"{registry}/run:1", message)
    assert text.startswith(f"push of {registry}/run:1 to registry {registry} failed")
    assert cause in text, text
