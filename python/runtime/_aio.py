"""asyncio face of events and streams: ``await event`` and ``await stream.async_done()``.

The future is resolved from the thread that completes the event (an engine worker, or the
caller of ``UserEvent.set``) through ``loop.call_soon_threadsafe``: nothing polls. A
cancelled await (a ``wait_for`` timeout too) takes its callback back from the event at once,
so nothing it holds outlives it; an event completing after its loop closed touches nothing.
The future fails with the exception ``event.synchronize()`` would raise (a failed user event's
``KernelError``, the ``InvalidHandleError`` of an interprocess event whose exporter died).
"""

from __future__ import annotations

import asyncio
from typing import Any


def event_future(event: Any, result: Any = None) -> asyncio.Future[Any]:
    """A future of the running loop that completes with ``result`` once ``event``'s latest
    record has completed (or fails with the error ``event.synchronize()`` would raise)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if fut.done():  # cancelled meanwhile
            return
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)

    def completed(error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:
            pass  # the loop was closed: nobody waits for the future any more

    registration = event._on_complete(completed)

    def let_go(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            registration.cancel()

    fut.add_done_callback(let_go)
    return fut
