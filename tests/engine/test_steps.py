"""pyapp.steps: the sync and async drivers of request-yielding generators."""

from __future__ import annotations

import asyncio

import pytest

from pyapp.steps import drive, drive_async


def logic():
    """Asks twice, recovers from a failed request, returns what it learnt."""
    a = yield "a"
    try:
        yield "boom"
    except KeyError as e:  # thrown back in at the yield, as if the call were direct
        caught = e.args[0]
    b = yield "b"
    return a, caught, b


def handle(request):
    if request == "boom":
        raise KeyError("no such thing")
    return request.upper()


async def handle_async(request):
    return handle(request)


def handle_mixed(request):
    # drive_async awaits awaitables and passes plain values through
    return handle_async(request) if request == "b" else handle(request)


def test_drive():
    assert drive(logic(), handle) == ("A", "no such thing", "B")


@pytest.mark.parametrize("h", [handle, handle_async, handle_mixed])
def test_drive_async(h):
    assert asyncio.run(drive_async(logic(), h)) == ("A", "no such thing", "B")


def test_uncaught_error_reaches_the_caller():
    def steps():
        yield "boom"

    with pytest.raises(KeyError):
        drive(steps(), handle)
    with pytest.raises(KeyError):
        asyncio.run(drive_async(steps(), handle_async))


def test_no_requests():
    def steps():
        return 42
        yield  # a generator that asks nothing

    assert drive(steps(), handle) == 42
    assert asyncio.run(drive_async(steps(), handle)) == 42


def test_sync_driver_refuses_awaitable_answers():
    import asyncio

    def steps():
        yield "x"

    async def later():
        await asyncio.sleep(0)
        return 1

    with pytest.raises(TypeError, match="drive_async"):
        drive(steps(), lambda req: later())


def test_calls_run_a_method_or_its_async_twin():
    """pyapp.app's use cases yield call(engine.generate, ...): `run` answers with the method, `run_async`
    with its awaited `_async` twin, and an error either raises is thrown back where the step asked."""
    import asyncio

    from pyapp.steps import call, run, run_async

    class Engine:
        def generate(self, n, scale=1):
            return ("sync", n * scale)

        async def generate_async(self, n, scale=1):
            await asyncio.sleep(0)
            return ("async", n * scale)

        def fail(self):
            raise KeyError("sync")

        async def fail_async(self):
            raise KeyError("async")

    eng = Engine()

    def steps():
        out = yield call(eng.generate, 2, scale=3)
        try:
            yield call(eng.fail)
        except KeyError as e:
            return out, e.args[0]

    assert run(steps()) == (("sync", 6), "sync")
    assert asyncio.run(run_async(steps())) == (("async", 6), "async")
