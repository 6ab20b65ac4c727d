"""A dask scheduler plugin for tests that count tasks in flight."""

from __future__ import annotations

from dask.distributed import SchedulerPlugin


class TasksHeld(SchedulerPlugin):  # type: ignore[misc]
    """The most tasks whose key starts with one of ``prefixes`` that the scheduler held at once (waiting, queued,
    running, or their result in memory), those it holds now, how many times it came to hold none, and the most that
    waited at once for a task that had not run (state ``waiting``)."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.name = f"tasks-held-{'-'.join(prefixes)}"
        self.held: set[str] = set()
        self.most = 0
        self.emptied = 0
        self.waiting: set[str] = set()
        self.most_waiting = 0

    def transition(self, key: str, start: str, finish: str, *args: object, **kwargs: object) -> None:
        if not str(key).startswith(self.prefixes):
            return
        if finish == "waiting":
            self.waiting.add(key)
            self.most_waiting = max(self.most_waiting, len(self.waiting))
        else:
            self.waiting.discard(key)
        if finish in ("released", "forgotten", "erred"):
            if key in self.held:
                self.held.discard(key)
                self.emptied += not self.held
        else:
            self.held.add(key)
            self.most = max(self.most, len(self.held))
