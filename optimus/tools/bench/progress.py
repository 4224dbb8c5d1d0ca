"""A progress bar: tqdm when it is installed, otherwise one stderr line per item."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.start = time.perf_counter()
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def describe(self, what: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description(what)
        else:
            elapsed = time.perf_counter() - self.start
            print(f"[{self.done + 1}/{self.total}] {what} (elapsed {elapsed:.0f}s)", file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
