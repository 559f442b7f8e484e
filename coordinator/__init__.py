"""The sidecar coordinator: promotion, Op markers, back-check, discard and queue locks."""

from coordinator.settings import CoordinatorSettings

__all__ = ["CoordinatorSettings"]
