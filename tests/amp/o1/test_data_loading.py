"""A DataLoader's batches under O1 are the batches it makes without amp (data_loading.py), whether the data is
loaded in the main process, in forked workers (which inherit the patched torch) or in spawned ones; the
training step itself is still cast. The reference is the same loader run before amp.initialize."""
import multiprocessing

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset

from apexlite import amp


class Augmented(Dataset):
    """Items made with patched ops (matmul, softmax, linear), as an augmentation or soft labels are."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        gen = torch.Generator().manual_seed(index)
        a, b = torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen)
        return F.softmax(torch.matmul(a, b), -1) + F.linear(a, b)


class Streamed(IterableDataset):
    def __iter__(self):
        return (Augmented()[index] for index in range(8))


class Precomputed(IterableDataset):
    """Its __iter__ does the work before returning (torch calls it when the loader's fetcher is made)."""

    def __iter__(self):
        return iter([Augmented()[index] for index in range(8)])


def collate(items):
    return torch.cat([torch.mm(item, item) for item in items])


def batches(dataset, workers, context=None):
    loader = DataLoader(dataset, batch_size=2, num_workers=workers, collate_fn=collate,
                        multiprocessing_context=context if workers else None)
    return list(loader)


LOADERS = {  # name -> (dataset, workers, start method)
    "main process": (Augmented, 0, None),
    "main process, iterable": (Streamed, 0, None),
    "main process, iterable that works in __iter__": (Precomputed, 0, None),
    "forked workers": (Augmented, 2, "fork"),
}
if "fork" not in multiprocessing.get_all_start_methods():
    del LOADERS["forked workers"]


@pytest.mark.parametrize("loader", list(LOADERS))
def test_batches_are_made_as_without_amp(loader, cast_path):
    dataset, workers, context = LOADERS[loader]
    expected = batches(dataset(), workers, context)
    model = torch.nn.Linear(4, 4)
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        got = batches(dataset(), workers, context)
        out = model(got[0])  # the step still runs under O1
    finally:
        amp.deinitialize()
    assert all(g.dtype == torch.float32 and torch.equal(g, e) for g, e in zip(got, expected))
    assert out.dtype == torch.bfloat16


def test_spawned_workers_agree():
    """Spawned workers import a torch without amp: their batches equal the main process's under O1."""
    model = torch.nn.Linear(4, 4)
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        spawned = batches(Augmented(), 1, "spawn")
        in_process = batches(Augmented(), 0)
    finally:
        amp.deinitialize()
    assert all(torch.equal(s, p) and s.dtype == torch.float32 for s, p in zip(spawned, in_process))
