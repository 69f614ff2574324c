"""Facts about the machine a speed number was measured on: native bf16 support and load.

Speed is a property of (pair, machine, load). :func:`native_bf16` says whether a bf16 draft can be
cheap here (a CPU with AVX512-BF16 or AMX-BF16 instructions, or a CUDA GPU with bf16), and
:class:`LoadSampler` records the 1-minute load average while a measurement runs, so monitoring can
call a run on an overloaded machine speed-inconclusive instead of alerting.

No torch import at module level (``specdec.validation.report`` users stay light).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["cpu_flags", "native_bf16", "load_average", "usable_cpus", "LoadSampler", "BF16_CPU_FLAGS"]

#: /proc/cpuinfo flags that mean the CPU computes bf16 dot products natively.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


#: mean 1-minute load average per CPU above which speed timings are unreliable (other work took more
#: than a quarter of the machine besides the measurement's own threads); the default of the nightly's
#: speed-inconclusive bound (monitoring RuleSettings.speed_max_load_per_cpu) and of recommend's warning
OVERLOADED_LOAD_PER_CPU = 1.25


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The ``flags`` of the first CPU in ``cpuinfo`` (Linux); an empty set where it is unreadable."""
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if line.startswith("flags") and ":" in line:
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16(device: str = "cpu", flags: set[str] | None = None) -> dict:
    """Whether bf16 runs natively on ``device``.

    Args:
        device: ``"cpu"`` or ``"cuda"``/``"cuda:N"``.
        flags: CPU flags to judge (default: :func:`cpu_flags` of this machine), for tests.
    Returns:
        ``{"native": bool, "device": str, "flags": [matching flags], "detail": one line}``. On a
        CPU ``native`` means AVX512-BF16 or AMX-BF16 is present; without them torch emulates bf16
        matmuls through fp32 and a bf16 draft is usually *slower* than an fp32 target. On CUDA it
        is ``torch.cuda.is_bf16_supported()``.
    """
    if str(device).startswith("cuda"):
        import torch

        ok = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        name = torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else "no CUDA device"
        return {"native": ok, "device": str(device), "flags": [],
                "detail": f"{name}: bf16 {'supported' if ok else 'not supported'}"}
    flags = cpu_flags() if flags is None else flags
    found = [f for f in BF16_CPU_FLAGS if f in flags]
    if found:
        detail = f"CPU has native bf16 ({', '.join(found)})"
    elif flags:
        detail = "CPU has no native bf16 (no avx512_bf16 / amx_bf16 flag): bf16 is emulated, a bf16 draft is slow"
    else:
        detail = "CPU flags unreadable: native bf16 unknown"
    return {"native": bool(found), "device": "cpu", "flags": found, "detail": detail}


def load_average() -> float:
    """The 1-minute load average (runnable + uninterruptible tasks), or NaN where unavailable."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        try:
            import psutil

            return float(psutil.getloadavg()[0])
        except Exception:  # noqa: BLE001 (no load information on this platform)
            return math.nan


def current_load(window_s: float = 1.0) -> float:
    """CPUs' worth of work running now: the busy share of all CPUs over the next ``window_s`` seconds (psutil's
    ``cpu_percent``) times their number, while this process sleeps. Unlike :func:`load_average`, it does not
    carry the last minute's work (e.g. the install ``make demo`` ran just before); NaN where unavailable."""
    try:
        import psutil

        return float(psutil.cpu_percent(interval=window_s)) / 100.0 * (psutil.cpu_count() or 1)
    except Exception:  # noqa: BLE001 (no CPU times on this platform)
        return math.nan


def usable_cpus() -> int:
    """Logical CPUs this process may run on (affinity-aware where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class LoadSampler:
    """Samples of the 1-minute load average taken during a measurement.

    Call :meth:`sample` after each timed unit of work (a prompt). The load average lags by about a
    minute, so the samples describe the load the timings were taken under only roughly; the
    maximum is the conservative summary.
    """

    samples: list[float] = field(default_factory=list)

    def sample(self) -> float:
        """Take one sample (also returned)."""
        x = load_average()
        if not math.isnan(x):
            self.samples.append(x)
        return x

    @property
    def mean(self) -> float:
        """Mean of the samples, NaN without any."""
        return sum(self.samples) / len(self.samples) if self.samples else math.nan

    @property
    def max(self) -> float:
        """Largest sample, NaN without any."""
        return max(self.samples) if self.samples else math.nan


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (``model name`` in /proc/cpuinfo; ``platform.processor()`` or ``"unknown"``
    where that is unreadable): recorded next to every timing, since CPUs differ between machines."""
    import platform

    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
