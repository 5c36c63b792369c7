"""Progress for builds and benchmarks: a small protocol, a rich console and a silent one."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["NullProgress", "ProgressSink", "RichProgress"]


class ProgressSink(Protocol):
    """Where a long job says what it is doing."""

    def begin(self, total: int) -> None:
        """The job has ``total`` steps."""

    def step(self, message: str) -> None:
        """A step starts."""

    def done(self, message: str, ok: bool = True) -> None:
        """The current step ended; ``message`` is its one-line result."""

    def note(self, message: str) -> None:
        """A line within the current step (a search's trial); the step goes on."""

    def end(self) -> None:
        """The job finished (or failed); release the display."""


class NullProgress:
    """Says nothing; for tests and library use."""

    def begin(self, total: int) -> None:
        pass

    def step(self, message: str) -> None:
        pass

    def done(self, message: str, ok: bool = True) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def end(self) -> None:
        pass


class RichProgress:
    """A progress bar with the current step, and one printed line per finished step."""

    def __init__(self, console: Console | None = None, title: str = "build") -> None:
        self._console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn(f"[bold]{title}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self._console,
            transient=True,
        )
        self._task: TaskID | None = None

    def begin(self, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task("", total=total)

    def step(self, message: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=message)

    def done(self, message: str, ok: bool = True) -> None:
        mark = "[green]✓[/]" if ok else "[red]✗[/]"
        self._progress.console.print(f"{mark} {message}", highlight=False)
        if self._task is not None:
            self._progress.advance(self._task)

    def note(self, message: str) -> None:
        self._progress.console.print(f"  {message}", highlight=False)

    def end(self) -> None:
        self._progress.stop()

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end()
