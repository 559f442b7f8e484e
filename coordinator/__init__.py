"""The sidecar coordinator: promotion, Op markers, back-check, discard and queue locks."""

from coordinator.lock_service import LockService
from coordinator.settings import CoordinatorSettings

__all__ = ["CoordinatorSettings", "LockService"]
