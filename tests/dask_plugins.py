"""A dask scheduler plugin for tests that count tasks in flight."""

from __future__ import annotations

from dask.distributed import SchedulerPlugin


class TasksHeld(SchedulerPlugin):  # type: ignore[misc]
    """The most tasks whose key starts with one of ``prefixes`` that the scheduler held at once (waiting, queued,
    running, or their result in memory), those it holds now, and how many times it came to hold none."""

    name = "tasks-held"

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.held: set[str] = set()
        self.most = 0
        self.emptied = 0

    def transition(self, key: str, start: str, finish: str, *args: object, **kwargs: object) -> None:
        if not str(key).startswith(self.prefixes):
            return
        if finish in ("released", "forgotten", "erred"):
            if key in self.held:
                self.held.discard(key)
                self.emptied += not self.held
        else:
            self.held.add(key)
            self.most = max(self.most, len(self.held))
