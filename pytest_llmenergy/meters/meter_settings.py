"""Options every meter factory receives; one frozen object, shared by CLI, ini and API."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_POWERCAP_ROOT = "/sys/class/powercap"


@dataclass(frozen=True)
class MeterSettings:
    """What a user can set about measuring.

    ``None`` means "the backend's own default" (NVML samples every 0.1 s,
    powermetrics every 0.2 s).
    """

    gpus: tuple[int, ...] | None = None  # indices among the CUDA-visible GPUs
    # Without ``gpus``: read every visible GPU (--energy-gpus=all) instead of the ones in
    # use (the GPUs a model is placed on, meters/gpu_meter.py), whose idle ones add nothing
    every_gpu: bool = False
    sample_interval_s: float | None = None
    cpu_tdp_w: float | None = None  # overrides the CPU TDP table of the estimate
    powercap_root: str | None = None  # default: $LLMENERGY_POWERCAP_ROOT or /sys/class/powercap
    # Roots of other process trees whose CPU time is charged as this process's (a server
    # the session sends requests to); the CPU meters' attribution covers them too.
    attributed_pids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.sample_interval_s is not None and not self.sample_interval_s > 0:
            raise ValueError(f"sample interval must be > 0 seconds, got {self.sample_interval_s}")
        if self.cpu_tdp_w is not None and not self.cpu_tdp_w > 0:
            raise ValueError(f"CPU TDP must be > 0 watts, got {self.cpu_tdp_w}")
        if self.gpus is not None and any(i < 0 for i in self.gpus):
            raise ValueError(f"GPU indices must be >= 0, got {self.gpus}")

    def interval_s(self, default: float) -> float:
        return self.sample_interval_s if self.sample_interval_s is not None else default

    def resolved_powercap_root(self) -> str:
        if self.powercap_root:
            return self.powercap_root
        return os.environ.get("LLMENERGY_POWERCAP_ROOT") or DEFAULT_POWERCAP_ROOT
