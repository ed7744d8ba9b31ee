"""The SIMULATED engine's LoRA adapters: which are loaded, and what loading one costs. Pure.

vLLM loads an adapter from disk inside the engine's step that first needs it (the worker's LoRA
manager activates a batch's adapters before running it), so the whole step waits; a step serves
at most `max_loras` adapters (the scheduler keeps other adapters' requests waiting), and that
many are held, the least recently used making room. The sim does the same: its scheduler limits
a step's adapters, and a step that needs adapters not held lasts `load_s` longer for each.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class Adapters:
    def __init__(self, max_loras: int, load_s: float) -> None:
        self.max_loras = max(1, max_loras)
        self.load_s = load_s
        self._held: OrderedDict[str, None] = OrderedDict()
        self.loads = 0

    def held(self) -> tuple[str, ...]:
        return tuple(self._held)

    def activate(self, names: Iterable[str]) -> float:
        """Hold every adapter a step needs; the seconds loading the missing ones adds to it."""
        missing = 0
        for name in names:
            if name in self._held:
                self._held.move_to_end(name)
                continue
            missing += 1
            self._held[name] = None
            if len(self._held) > self.max_loras:
                self._held.popitem(last=False)
        self.loads += missing
        return missing * self.load_s
