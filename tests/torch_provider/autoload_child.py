"""What a DataLoader worker started with the "spawn" method runs: this module imports torch
only (not anychip.torch), so the worker has the ``anychip`` device through torch's backend
autoload (src/anychip/_torch_autoload.py) or not at all."""
import torch


class OnTheDevice(torch.utils.data.Dataset):
    """Item i: 2 * [i, i, i], computed on ``anychip:1`` in the worker, with the worker's backend."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        x = torch.full((3,), float(i), device="anychip:1")
        return (x * 2).cpu(), torch.anychip.backend()
