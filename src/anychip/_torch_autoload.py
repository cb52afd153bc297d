"""PyTorch's device-backend autoload hook for anychip (the ``torch.backends`` entry point in
pyproject.toml; see docs/torch.md, "Child processes").

At the end of ``import torch``, torch calls every ``torch.backends`` entry point. This one
imports ``anychip.torch`` (binding the ``anychip`` device) only where
``ANYCHIP_TORCH_AUTOLOAD=1``: ``anychip.torch`` sets it when it is imported, so the
processes a process with the device starts (DataLoader workers, ``torch.multiprocessing``
children) have the device after their ``import torch`` too, on the backend the same rules
choose, without importing ``anychip.torch`` themselves; a user may set it for every process.
Anywhere else it does nothing (it compiles nothing, starts no device). A device that cannot
be set up is a warning: ``import torch`` never fails because of anychip.
"""
from __future__ import annotations

import warnings

from .runtime.env import torch_autoload


def autoload() -> None:
    try:
        if not torch_autoload():
            return
        import anychip.torch  # noqa: F401  (binds the device)
    except Exception as exc:  # noqa: BLE001 - never break `import torch`: say why the device is missing
        warnings.warn(f"anychip: the 'anychip' device could not be set up, so this "
                      f"process has no 'anychip' device: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
