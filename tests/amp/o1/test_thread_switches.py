"""Probe: O1's cast switches are per thread, as torch.autocast's state is.

Before, `amp.disable_casts()` in one thread turned casts off in all of them, two overlapping blocks
in two threads left casts off for good, and a training thread plus a `no_grad` evaluation thread on
one model failed with a dtype mismatch (the optimizer step's internal switch leaked across threads).
"""
import threading

import pytest
import torch

from apexlite import amp
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

DTYPE = torch.bfloat16


def run_in_thread(fn):
    result, errors = {}, []

    def target():
        try:
            result["value"] = fn()
        except BaseException as error:  # reported to the test thread
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result["value"]


def o1_linear():
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return amp.initialize(model, opt, opt_level="O1", dtype=DTYPE, verbosity=0)


def test_disable_casts_in_one_thread_leaves_other_threads_casting():
    model, _ = o1_linear()
    try:
        x = torch.randn(2, 8)
        inside, other = threading.Event(), threading.Event()
        seen = {}

        def protected():
            with amp.disable_casts():
                seen["protected"] = model(x).dtype
                inside.set()
                other.wait(10)

        thread = threading.Thread(target=protected)
        thread.start()
        inside.wait(10)
        seen["main"] = model(x).dtype  # while the other thread is inside its block
        other.set()
        thread.join()
        assert seen == {"protected": torch.float32, "main": DTYPE}
        assert run_in_thread(lambda: model(x).dtype) is DTYPE  # a new thread starts with casts on
    finally:
        amp.deinitialize()


def test_overlapping_blocks_in_two_threads_restore_exactly():
    model, _ = o1_linear()
    try:
        x = torch.randn(2, 8)
        a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

        def first():  # enters, waits for the second to enter, leaves first
            with amp.disable_casts():
                a_in.set()
                b_in.wait(10)
            a_out.set()

        def second():  # enters after the first, leaves after the first left
            a_in.wait(10)
            with amp.disable_casts():
                b_in.set()
                a_out.wait(10)
                assert model(x).dtype is torch.float32

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert model(x).dtype is DTYPE
        assert run_in_thread(lambda: model(x).dtype) is DTYPE
    finally:
        amp.deinitialize()


def test_nested_blocks_restore_in_one_thread():
    model, _ = o1_linear()
    try:
        x = torch.randn(2, 8)
        with amp.disable_casts():
            with amp.disable_casts():
                assert model(x).dtype is torch.float32
            assert model(x).dtype is torch.float32
        assert model(x).dtype is DTYPE
    finally:
        amp.deinitialize()


def test_training_thread_and_no_grad_eval_thread_on_one_model():
    """The optimizer step's internal casts-off switch must not reach a concurrent eval forward."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        data = [torch.randn(8, 16) for _ in range(60)]
        errors, eval_dtypes = [], set()
        stop = threading.Event()

        def train():
            for x in data:
                loss = model(x).float().pow(2).mean()
                opt.zero_grad()
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
            stop.set()

        def evaluate():
            while not stop.is_set():
                with torch.no_grad():
                    eval_dtypes.add(model(data[0]).dtype)

        def guarded(fn):
            def run():
                try:
                    fn()
                except BaseException as error:
                    errors.append(error)
                    stop.set()
            return run

        threads = [threading.Thread(target=guarded(train)), threading.Thread(target=guarded(evaluate))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert eval_dtypes == {DTYPE}
        assert all(torch.isfinite(p).all() for p in model.parameters())
    finally:
        amp.deinitialize()


def test_data_parallel_style_concurrent_forwards_equal_sequential_ones():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    amp.initialize(model, opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        chunks = [torch.randn(4, 16) for _ in range(4)]
        with torch.no_grad():
            sequential = [model(chunk) for chunk in chunks]
        outputs = [None] * len(chunks)
        barrier = threading.Barrier(len(chunks))

        def replica(index):
            barrier.wait(10)
            for _ in range(20):
                with torch.no_grad():
                    outputs[index] = model(chunks[index])

        threads = [threading.Thread(target=replica, args=(i,)) for i in range(len(chunks))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for got, expected in zip(outputs, sequential):
            assert got.dtype is DTYPE and torch.equal(got, expected)
    finally:
        amp.deinitialize()


def _capture(fn):
    """What `fn` raised (None if it returned)."""
    try:
        fn()
    except BaseException as error:  # returned to the caller to inspect
        return error
    return None


def _casts_off_blocks():
    """Every way a casts-off block is entered: the public one, the handle's and the session's own."""
    return {
        "amp.disable_casts": lambda: amp.disable_casts(),
        "handle._disable_casts": lambda: amp._amp_state.handle._disable_casts(),
        "session.casts_disabled": lambda: current_session().casts_disabled(),
    }


@pytest.mark.parametrize("kind", list(_casts_off_blocks()))
def test_a_casts_off_block_exited_on_another_thread_is_an_error_that_changes_no_thread(kind):
    model, _ = o1_linear()
    try:
        x = torch.randn(2, 8)
        block = _casts_off_blocks()[kind]()
        block.__enter__()
        assert model(x).dtype is torch.float32

        def exit_here():
            error = _capture(lambda: block.__exit__(None, None, None))
            return error, model(x).dtype, current_session().cast_state.enabled

        error, dtype_there, enabled_there = run_in_thread(exit_here)
        assert isinstance(error, RuntimeError)
        assert "another thread" in str(error) and "thread that entered it" in str(error)
        assert dtype_there is DTYPE and enabled_there  # the other thread's casts are untouched
        assert run_in_thread(lambda: model(x).dtype) is DTYPE
        assert model(x).dtype is torch.float32  # the entering thread is still inside its block...
        block.__exit__(None, None, None)  # ...which it can still leave
        assert model(x).dtype is DTYPE
        assert current_session().cast_state.enabled
    finally:
        amp.deinitialize()


def test_leaving_more_casts_off_blocks_than_were_entered_is_an_error_that_changes_nothing():
    model, _ = o1_linear()
    try:
        state = current_session().cast_state
        with pytest.raises(RuntimeError, match="without a matching push_disabled"):
            state.pop_disabled()
        assert state.enabled and state.thread.disabled_depth == 0
        assert model(torch.randn(2, 8)).dtype is DTYPE
    finally:
        amp.deinitialize()


def test_a_casts_off_block_cannot_be_entered_twice_at_once():
    model, _ = o1_linear()
    try:
        block = amp.disable_casts()
        with block:
            with pytest.raises(RuntimeError, match="already entered"):
                block.__enter__()
            assert model(torch.randn(2, 8)).dtype is torch.float32
        assert model(torch.randn(2, 8)).dtype is DTYPE
    finally:
        amp.deinitialize()


def test_disable_casts_still_decorates_functions():
    model, _ = o1_linear()
    try:
        @amp.disable_casts()
        def protected(x):
            return model(x).dtype

        x = torch.randn(2, 8)
        assert protected(x) is torch.float32 and protected(x) is torch.float32
        assert model(x).dtype is DTYPE
    finally:
        amp.deinitialize()
