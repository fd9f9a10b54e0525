"""What an operator needs to see when messages pile up (seed 004): per node memory and disk use
against their alarm limits, the alarms in force, file descriptors and sockets, connections that
are blocked or blocking (flow control), and the recovery queues' depth, consumers and rates.

From the management API, cached for BROKER_HEALTH_CACHE_SECONDS per process so a page that is
reloaded (or several operators looking at once) does not hammer the broker at the moment it is
struggling. A management API that does not answer is a result of its own (``error``), shown as
such, never as an empty, healthy-looking page.
"""

import time
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.core.cache import cache

from recovery.broker.coverage import (
    effective_delivery_limit,
    read_operator_policies,
    recovery_limits,
)
from recovery.broker.management import Management
from recovery.broker.topology import Names, broker_version

CACHE_KEY = "lazarus:broker-health"


@dataclass
class Node:
    name: str
    running: bool
    mem_used: int | None
    mem_limit: int | None
    mem_alarm: bool | None  # None: not reported (unknown, never "no alarm")
    disk_free: int | None
    disk_free_limit: int | None
    disk_free_alarm: bool | None
    fd_used: int | None
    fd_total: int | None
    sockets_used: int | None
    sockets_total: int | None
    uptime_seconds: int | None

    @property
    def mem_percent(self):
        return _percent(self.mem_used, self.mem_limit)

    @property
    def fd_percent(self):
        return _percent(self.fd_used, self.fd_total)

    @property
    def disk_headroom(self):
        """Free disk over the alarm limit (1.0 = exactly at the limit; below 1 = in alarm)."""
        if not self.disk_free or not self.disk_free_limit:
            return None
        return self.disk_free / self.disk_free_limit


@dataclass
class RecoveryQueue:
    # None: the management API left the number out (statistics disabled): shown as unknown.
    vhost: str
    name: str
    messages: int | None
    ready: int | None
    unacked: int | None
    consumers: int | None
    publish_rate: float | None
    deliver_rate: float | None
    # The effective delivery limit of a quorum recovery queue ("unlimited", a number, "unknown")
    # and, when it is not unlimited, what that means (coverage.recovery_limits).
    delivery_limit: str = "unlimited"
    limit_problem: str = ""


@dataclass
class BrokerHealth:
    checked_at: float
    nodes: list[Node] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)
    blocked_connections: list[dict] = field(default_factory=list)
    queues: list[RecoveryQueue] = field(default_factory=list)
    missing_queues: list[str] = field(default_factory=list)
    # What the management API did not say (a field left out): unknown, so never "ok".
    unknown: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self):
        return not (
            self.error
            or self.alarms
            or self.blocked_connections
            or self.missing_queues
            or self.unknown
        )

    def as_dict(self):
        data = asdict(self)
        for node, raw in zip(self.nodes, data["nodes"], strict=True):
            raw.update(mem_percent=node.mem_percent, fd_percent=node.fd_percent)
        data["ok"] = self.ok
        return data


def _percent(used, total):
    return round(100 * used / total, 1) if used is not None and total else None


def _rate(stats, name):
    details = (stats or {}).get(f"{name}_details") or {}
    return details.get("rate")


def read(management=None) -> BrokerHealth:
    """One look at the broker (four management API calls); never cached."""
    management = management or Management()
    health = BrokerHealth(checked_at=time.time())
    try:
        nodes = management.request("GET", "/nodes") or []
        connections = (
            management.request(
                "GET", "/connections?columns=name,user,vhost,state,client_properties,peer_host"
            )
            or []
        )
    except Exception as exc:  # noqa: BLE001 - the page says the broker could not be seen
        health.error = str(exc)
        return health
    for raw in nodes:
        _add_node(health, raw)
    for conn in connections:
        if conn.get("state") in ("blocked", "blocking"):
            product = ((conn.get("client_properties") or {}).get("product")) or ""
            health.blocked_connections.append(
                {
                    "name": conn.get("name", "?"),
                    "user": conn.get("user", ""),
                    "vhost": conn.get("vhost", ""),
                    "state": conn.get("state"),
                    "client": product,
                }
            )
    for vhost in settings.RECOVERY_VHOSTS:
        _add_recovery_queues(health, management, vhost)
    return health


def _flag(raw, key):
    value = raw.get(key)
    return None if value is None else bool(value)


def _add_node(health, raw):
    node = Node(
        name=raw.get("name", "?"),
        running=bool(raw.get("running", True)),
        mem_used=raw.get("mem_used"),
        mem_limit=raw.get("mem_limit"),
        mem_alarm=_flag(raw, "mem_alarm"),
        disk_free=raw.get("disk_free"),
        disk_free_limit=raw.get("disk_free_limit"),
        disk_free_alarm=_flag(raw, "disk_free_alarm"),
        fd_used=raw.get("fd_used"),
        fd_total=raw.get("fd_total"),
        # RabbitMQ 4.x reports both as 0 always (it no longer limits sockets separately from
        # file descriptors): a total of 0 is "not reported", not "no sockets".
        sockets_used=raw.get("sockets_used") if raw.get("sockets_total") else None,
        sockets_total=raw.get("sockets_total") or None,
        uptime_seconds=(raw["uptime"] // 1000) if raw.get("uptime") else None,
    )
    health.nodes.append(node)
    if not node.running:
        health.alarms.append(f"{node.name}: node not running")
    for what, flag in (("memory", node.mem_alarm), ("disk", node.disk_free_alarm)):
        if flag is None and node.running:
            health.unknown.append(f"{node.name}: the management API does not say its {what} alarm")
    if node.mem_alarm:
        health.alarms.append(
            f"{node.name}: memory alarm ({node.mem_used} of {node.mem_limit} bytes): "
            "publishers are blocked"
        )
    if node.disk_free_alarm:
        health.alarms.append(
            f"{node.name}: disk alarm ({node.disk_free} bytes free, limit "
            f"{node.disk_free_limit}): publishers are blocked"
        )


def _add_recovery_queues(health, management, vhost):
    names = Names.from_settings()
    try:
        found = {
            q["name"]: q
            for q in management.request(
                "GET",
                f"/queues/{management.quote(vhost)}?columns=name,messages,messages_ready,"
                "messages_unacknowledged,consumers,message_stats,type,arguments,policy,"
                "operator_policy,effective_policy_definition,delivery_limit",
            )
            or []
        }
    except Exception as exc:  # noqa: BLE001 - said on the page, per vhost
        health.missing_queues.append(f"{vhost}: cannot list queues ({exc})")
        return
    version = broker_version(management)
    try:
        policies = management.policies(vhost) or []
    except Exception:  # noqa: BLE001 - then a limit only the policies say is unknown
        policies = None
    operator = read_operator_policies(management, vhost)
    limits = {
        row.name: row
        for row in recovery_limits(vhost, found.values(), version, names, policies, operator)
    }
    for name in (*names.source_queues, names.quarantine):
        q = found.get(name)
        if q is None:
            health.missing_queues.append(f"{vhost}/{name}: not declared (manage.py wire)")
            continue
        stats = q.get("message_stats")
        health.queues.append(
            RecoveryQueue(
                vhost=vhost,
                name=name,
                messages=q.get("messages"),
                ready=q.get("messages_ready"),
                unacked=q.get("messages_unacknowledged"),
                consumers=q.get("consumers"),
                publish_rate=_rate(stats, "publish"),
                deliver_rate=_rate(stats, "deliver_get"),
                delivery_limit=_shown_limit(
                    effective_delivery_limit(q, version, policies, operator)
                ),
                limit_problem=(
                    f"{limits[name].detail} ({limits[name].fix})" if name in limits else ""
                ),
            )
        )


def _shown_limit(limit):
    return "unknown" if limit is None else str(limit)


def broker_health(refresh=False) -> BrokerHealth:
    """``read()``, cached for BROKER_HEALTH_CACHE_SECONDS (``refresh``: look now)."""
    if not refresh:
        cached = cache.get(CACHE_KEY)
        if cached is not None:
            return cached
    health = read()
    cache.set(CACHE_KEY, health, settings.BROKER_HEALTH_CACHE_SECONDS)
    return health
