"""What vLLM's engine core last said about its scheduler, for `VllmEngine.capacity()`. Imports
vllm lazily (in `factory`)."""

from __future__ import annotations

from typing import Any


class SchedulerView:
    """The latest `SchedulerStats` the engine core sent (it sends them after every step,
    including the step that retires aborted requests, so they are fresh when it goes idle)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        view = self

        class _Probe(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
            ) -> None:
                if scheduler_stats is not None:
                    view.running = scheduler_stats.num_running_reqs
                    view.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                    view.kv_usage = scheduler_stats.kv_cache_usage

            def log_engine_initialized(self) -> None:
                pass

        return _Probe
