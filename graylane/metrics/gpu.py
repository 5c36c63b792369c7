"""GPU utilisation and memory through NVML; no samples (not an error) without a GPU."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["GPU_METRIC_NAMES", "NvmlCollector", "load_nvml"]

log = logging.getLogger(__name__)

UTILIZATION = "graylane_gpu_utilization_ratio"
MEMORY_USED = "graylane_gpu_memory_used_bytes"
MEMORY_TOTAL = "graylane_gpu_memory_total_bytes"
GPU_METRIC_NAMES = (UTILIZATION, MEMORY_USED, MEMORY_TOTAL)
_LABELS = ["model", "version", "gpu"]


def load_nvml() -> ModuleType | None:
    """``pynvml`` (package nvidia-ml-py) initialised, or None where there is no GPU/driver."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.debug("no NVML (%s): GPU metrics are not exported", exc)
        return None
    return nvml


@dataclass(frozen=True, eq=False)
class NvmlCollector(Collector):
    """Reads every visible GPU at scrape time; ``nvml=None`` yields nothing."""

    model: str
    version: str
    nvml: Any = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.nvml is None:
            return
        util = GaugeMetricFamily(UTILIZATION, "GPU busy fraction (0..1)", labels=_LABELS)
        used = GaugeMetricFamily(MEMORY_USED, "GPU memory in use", labels=_LABELS)
        total = GaugeMetricFamily(MEMORY_TOTAL, "GPU memory installed", labels=_LABELS)
        try:
            for index in range(self.nvml.nvmlDeviceGetCount()):
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                labels = [self.model, self.version, str(index)]
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                util.add_metric(labels, float(rates.gpu) / 100.0)
                used.add_metric(labels, float(memory.used))
                total.add_metric(labels, float(memory.total))
        except Exception as exc:  # a GPU fell off the bus: report what we have, keep serving
            log.warning("NVML read failed: %s", exc)
        yield from (util, used, total)
