"""Logic written once, run sync (CPython) or async (the browser): generators of requests.

Code that needs I/O (a file range, a GPU readback, a folder listing) is written
as a generator that *yields a request* and receives the answer:

    def load(...):
        data = yield ReadFile(path, 0, 64)      # answered by a driver
        ...
        return result

A driver runs the generator and answers each request with a handler: `drive`
calls a plain function, `drive_async` awaits what the handler returns when it
is awaitable. A handler's exception is thrown back into the generator at the
`yield`, so the logic's own try/except sees it as if the call had been direct.
These two functions are the only sync/async bridge in the package.

A step that calls a method with an async twin (Engine.generate / generate_async, Trainer.train_step /
train_step_async, ...) yields `call(engine.generate, ...)`; `twins(asynchronous)` answers it with the
method natively and with its awaited `_async` twin in the browser. The application layer (pyapp.app) is
written this way, once for the page and the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generator

Steps = Generator[Any, Any, Any]


def drive(steps: Steps, handle: Callable[[Any], Any]):
    """Run `steps`, answering each yielded request with handle(request); return its result.

    The same loop as drive_async: with answers that are never awaitable, the coroutine
    runs to its end in one send, never suspending."""
    loop = drive_async(steps, handle)
    try:
        loop.send(None)
    except StopIteration as done:
        return done.value
    loop.close()
    raise TypeError("drive: the handler returned an awaitable; use drive_async")


async def drive_async(steps: Steps, handle: Callable[[Any], Any]):
    """Run `steps`, answering each request with handle(request), awaited when awaitable.
    A handler's exception is thrown into the generator at its yield."""
    try:
        request = next(steps)
        while True:
            try:
                answer = handle(request)
                if hasattr(answer, "__await__"):
                    answer = await answer
            except Exception as e:
                request = steps.throw(e)
            else:
                request = steps.send(answer)
    except StopIteration as stop:
        return stop.value


@dataclass(frozen=True)
class Call:
    """A request to call `method(*args, **kwargs)`, a bound method whose owner also has `<name>_async`."""
    method: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def call(method: Callable, *args, **kwargs) -> Call:
    return Call(method, args, kwargs)


def twins(asynchronous: bool = False) -> Callable[[Call], Any]:
    """The handler of Call requests: the method itself (its result), or its `_async` twin (an awaitable)."""
    def handle(req: Call):
        method = req.method
        if asynchronous:
            method = getattr(method.__self__, method.__name__ + "_async")
        return method(*req.args, **req.kwargs)
    return handle


def run(steps: Steps):
    """Run steps that yield Calls, natively."""
    return drive(steps, twins())


async def run_async(steps: Steps):
    """Run steps that yield Calls in the browser."""
    return await drive_async(steps, twins(asynchronous=True))
