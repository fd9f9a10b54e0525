#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, beside the default node (which keeps running on
# 5672 for everything else):
#
#   scripts/rabbitmq-cluster.sh start    # nodes lazarus-c1..3@<host>, joined into one cluster
#   scripts/rabbitmq-cluster.sh stop     # stops them and removes their data
#   scripts/rabbitmq-cluster.sh status
#   scripts/rabbitmq-cluster.sh kill N | stop-node N | start-node N   # faults, and back
#
# Node i listens for AMQP on 570i, the management API on 1570i, Erlang distribution on 2570i;
# its data, logs, config and plugin list live under $LAZARUS_CLUSTER_DIR/c<i>
# (default /tmp/lazarus-rabbit-cluster). The nodes run as the rabbitmq user through Debian's
# wrapper scripts, so they share the default node's Erlang cookie. Only the management plugin is
# enabled on them (rabbitmq_prometheus would take the default node's port 15692).
# tests/cluster/conftest.py uses this script; so can you, to try Lazarus against a cluster:
#   RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5701/%2F RABBITMQ_NODES=127.0.0.1:5702,127.0.0.1:5703
set -euo pipefail

BASE=${LAZARUS_CLUSTER_DIR:-/tmp/lazarus-rabbit-cluster}
HOST=$(hostname -s)
NODES=(1 2 3)

name() { echo "lazarus-c$1@$HOST"; }
ctl() { local i=$1; shift; rabbitmqctl -q -n "$(name "$i")" "$@"; }

start_node() {
  local i=$1 dir="$BASE/c$1"
  mkdir -p "$dir/mnesia" "$dir/log"
  echo "[rabbitmq_management]." >"$dir/enabled_plugins"
  cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 570$i
management.tcp.port = 1570$i
EOF
  chown -R rabbitmq:rabbitmq "$dir"
  env RABBITMQ_NODENAME="$(name "$i")" \
    RABBITMQ_NODE_PORT="570$i" \
    RABBITMQ_DIST_PORT="2570$i" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" \
    RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_PID_FILE="$dir/pid" \
    rabbitmq-server -detached
}

wait_node() {
  for _ in $(seq 120); do
    ctl "$1" await_startup >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "node $(name "$1") did not start; see $BASE/c$1/log" >&2
  return 1
}

case "${1:-}" in
start)
  for i in "${NODES[@]}"; do start_node "$i"; done
  for i in "${NODES[@]}"; do wait_node "$i"; done
  for i in 2 3; do
    ctl "$i" stop_app
    ctl "$i" reset
    ctl "$i" join_cluster "$(name 1)" 2>/dev/null
    ctl "$i" start_app
  done
  ctl 1 cluster_status --formatter json | grep -q "$(name 3)"
  echo "cluster up: $(for i in "${NODES[@]}"; do printf '127.0.0.1:570%s ' "$i"; done)"
  ;;
stop)
  for i in "${NODES[@]}"; do
    ctl "$i" stop >/dev/null 2>&1 || true
    if [ -f "$BASE/c$i/pid" ]; then kill -9 "$(cat "$BASE/c$i/pid")" 2>/dev/null || true; fi
  done
  rm -rf "$BASE"
  ;;
status)
  ctl 1 cluster_status
  ;;
kill) # the node's Erlang VM, as a crash or an OOM kill would; returns once it is gone (a
  # start-node right after must not find it still there and only start_app it)
  pid=$(cat "$BASE/c$2/pid")
  kill -9 "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  ;;
stop-node) # the RabbitMQ application stops cleanly; the VM stays up
  ctl "$2" stop_app
  ;;
start-node) # back after kill (a new VM on the same data) or stop-node
  if kill -0 "$(cat "$BASE/c$2/pid" 2>/dev/null)" 2>/dev/null; then
    ctl "$2" start_app
  else
    start_node "$2"
  fi
  wait_node "$2"
  ;;
*)
  echo "usage: $0 start|stop|status|kill N|stop-node N|start-node N" >&2
  exit 2
  ;;
esac
