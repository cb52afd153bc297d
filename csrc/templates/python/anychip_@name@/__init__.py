"""anychip plugin @name@: the DevicePlugin anychip finds through the ``anychip.plugins``
entry point (see pyproject.toml)."""
from .device import @Name@Plugin

__all__ = ["@Name@Plugin"]
