"""Repeated `amp.initialize` in one process (apex's own tests, loops over opt levels): what the program
drops is freed, and a call's work does not grow with the calls made before it.

On a GPU apex's test_3models2losses2optimizers (hundreds of initialize calls in one process) crawled
because every registration stayed alive and every call walked all of them. Work is counted here
(weights handed to the cast cache, patch records alive), not timed: bench/bench_repeated_initialize.py
times it.
"""
import gc
import weakref

import pytest
import torch

from apexlite import amp
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

LEVELS = ("O0", "O1", "O2", "O3")


class TwoWeights(torch.nn.Module):
    """apex's multiple-models test model: an fp32 and an fp16 weight."""

    def __init__(self, unique: float) -> None:
        super().__init__()
        self.weight0 = torch.nn.Parameter(unique + torch.arange(2.0))
        self.weight1 = torch.nn.Parameter(1.0 + unique + torch.arange(2.0).half())

    def forward(self, x):
        return (x * self.weight0.float() * self.weight1.float()).sum()


def _one_configuration(level, sizes):
    """What a test or an opt-level loop does: fresh models and optimizers, initialize, two steps."""
    from apexlite.amp.legacy_state import legacy_flags

    models = [TwoWeights(1.0), TwoWeights(2.0)]
    optimizer = torch.optim.SGD([p for m in models for p in m.parameters()], lr=0.25, momentum=0.5)
    legacy_flags.allow_incoming_model_not_fp32 = True
    try:
        models, optimizer = amp.initialize(models, optimizer, opt_level=level, verbosity=0, cast_model_type=False)
    finally:
        legacy_flags.allow_incoming_model_not_fp32 = False
    x = torch.ones(2)
    for _ in range(2):
        optimizer.zero_grad()
        with amp.scale_loss(models[0](x) + models[1](x), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    sizes.append(len(current_session().patcher))
    return weakref.ref(models[0]), weakref.ref(optimizer)


def test_dropped_models_and_optimizers_are_freed_and_leave_the_session():
    refs, sizes = [], []
    try:
        for round_ in range(8):
            refs.append(_one_configuration(LEVELS[round_ % 4], sizes))
        gc.collect()
        session = current_session()
        assert all(model() is None and optimizer() is None for model, optimizer in refs)
        assert len(session.models) == 0 and len(session.optimizers) == 0
        assert len(session.patcher) == 0, session.patcher.descriptions()
    finally:
        amp.deinitialize()


class _CountingCache:
    """The session's cast cache, counting the weights each `own` call hands it."""

    def __init__(self, cache, handed):
        self._cache, self._handed = cache, handed

    def own(self, weights):
        self._handed.append(len(weights))
        self._cache.own(weights)

    def __getattr__(self, name):
        return getattr(self._cache, name)


def test_each_initialize_hands_the_cache_only_its_own_weights(monkeypatch):
    handed = []
    sizes = []
    try:
        _one_configuration("O1", sizes)
        session = current_session()
        monkeypatch.setattr(session, "cache", _CountingCache(session.cache, handed))
        kept = [_one_configuration(LEVELS[i % 4], sizes) for i in range(40)]  # all alive: nothing is freed
        # one configuration's weights each time (four, and at O2 the optimizer's two fp32 masters too),
        # never the forty configurations registered before
        assert handed[:4] == [4, 4, 6, 4] and handed == handed[:4] * 10
        assert len(kept) == 40
    finally:
        amp.deinitialize()


def test_patch_records_stay_bounded_over_many_configurations():
    sizes = []
    try:
        for round_ in range(60):
            _one_configuration(LEVELS[round_ % 4], sizes)
            if round_ % 10 == 9:
                gc.collect()
        # after each collection only the live configuration's records remain; between them, the garbage
        assert max(sizes[-10:]) <= max(sizes[:10]) + 10 * max(sizes[:4])
    finally:
        amp.deinitialize()


def test_a_model_registered_after_others_were_freed_gets_its_forward_scope():
    """Forward scopes were tracked by id: a new model at a freed model's address went without one."""
    try:
        for _ in range(20):
            model = torch.nn.Linear(2, 2)
            amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
            assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
            del model
            gc.collect()
    finally:
        amp.deinitialize()
