"""Placeholder until the tracker lands (same session): it records nothing, so every group shows
`queued` / `processing` from the committed offsets alone."""

from __future__ import annotations

from typing import Any


class Tracker:
    def __init__(self, settings: Any, registry: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass
