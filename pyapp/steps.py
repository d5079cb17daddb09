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
"""

from __future__ import annotations

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
