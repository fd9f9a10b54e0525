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


def _stat(pid):
    """(process name, the fields after it) of /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid, reaped_children=False):
    """User + system CPU seconds of a process (None if it is gone); with ``reaped_children``
    also those of children it has waited for."""
    stat = _stat(pid)
    return None if stat is None else _seconds(stat[1], reaped_children)


def process_tree(pid):
    """``pid`` and its running descendants (a worker and the collector processes it started)."""
    parents = {}
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None:
            parents.setdefault(int(stat[1][1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, ()))
    return tree


def tree_cpu_seconds(pid):
    """{pid: CPU seconds} for ``pid`` and its running descendants."""
    return {p: s for p in process_tree(pid) if (s := cpu_seconds(p)) is not None}


def _seconds(fields, reaped_children):
    return sum(int(v) for v in fields[11 : 15 if reaped_children else 13]) / CLOCK


def _family_seconds():
    """{(family, pid): CPU seconds} of every running process of FAMILIES."""
    totals = {}
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None and stat[0] in FAMILIES:
            # With the reaped children: the postmaster collects the CPU of backends that
            # exited (a closed connection), so none of it goes missing.
            totals[stat[0], entry] = _seconds(stat[1], reaped_children=True)
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
