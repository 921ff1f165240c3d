"""asyncio face of events and streams: ``await event`` and ``await stream.async_done()``.

The future is resolved from the thread that completes the event (an engine worker, or the
caller of ``UserEvent.set``) through ``loop.call_soon_threadsafe``: nothing polls. A
cancelled await leaves the event alone; a loop closed before completion is not touched.
"""

from __future__ import annotations

import asyncio
from typing import Any


def event_future(event: Any, result: Any = None) -> asyncio.Future[Any]:
    """A future of the running loop that completes with ``result`` once ``event``'s latest
    record has completed (or fails with the ``KernelError`` of a failed user event)."""
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

    event._on_complete(completed)
    return fut
