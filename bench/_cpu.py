"""CPU time by process family on this machine, for benchmarks: robust where rates are not.

Rates move with whatever else runs on a shared machine; the CPU a run costs per message barely
does. ``CpuMeter`` sums user+system time of this process and of every process named
``postgres`` or ``beam.smp`` (PostgreSQL and RabbitMQ run here), so a run can print what each
costs per message beside its rate. Other clients of the same servers add to their share.
"""

import os
import resource

CLOCK = os.sysconf("SC_CLK_TCK")
FAMILIES = ("postgres", "beam.smp")


def _family_seconds():
    """{(family, pid): CPU seconds} of every running process of FAMILIES."""
    totals = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name in FAMILIES:
            fields = stat[stat.rindex(")") + 2 :].split()
            # utime + stime, and cutime + cstime: the postmaster collects the CPU of backends
            # that exited (a closed connection), so none of it goes missing.
            totals[name, entry] = sum(int(v) for v in fields[11:15]) / CLOCK
    return totals


def _self_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """``with CpuMeter() as cpu: ...`` then ``cpu.per_message(n)``."""

    def __enter__(self):
        self.start_self, self.start = _self_seconds(), _family_seconds()
        return self

    def __exit__(self, *_exc):
        end = _family_seconds()
        self.used = {"python": _self_seconds() - self.start_self, **dict.fromkeys(FAMILIES, 0.0)}
        for (family, pid), seconds in end.items():
            # A process started inside the block counts from zero.
            self.used[family] += seconds - self.start.get((family, pid), 0.0)
        return False

    def per_message(self, n):
        """'python 60 us, postgres 120 us, beam.smp 80 us' per message."""
        return ", ".join(f"{name} {1e6 * used / n:.0f} us" for name, used in self.used.items())
