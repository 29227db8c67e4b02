"""Each check's verdict as soon as a judge knows it, for whoever listens.

`check` is what a learner runs while working: a wrong `claim` should be on the
screen in seconds, while the slower checks and the chaos run go on. A judge
that learns a verdict early says so here; the grade it returns at the end is
the record, and nothing listens while grading for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

Listener = Callable[[str, bool, str], None]     # (check name, passed, why)
_listeners: list[Listener] = []
_lock = threading.Lock()
_speaking = threading.Lock()     # one verdict at a time: two prints can share a line


@contextlib.contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """While open, `listener` hears every verdict said in this process."""
    if listener is None:
        yield
        return
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def say(name: str, ok: bool, why: str = "") -> None:
    with _lock:
        listeners = list(_listeners)
    with _speaking:
        for listener in listeners:
            listener(name, ok, why)
