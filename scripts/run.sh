#!/usr/bin/env bash
# Run Lazarus in the foreground: console, a Celery worker with the collector, demo traffic.
# Ctrl-C stops every child; the exit of the console, a worker or beat stops the rest (the demo
# traffic's exit does not: see demo below).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBUG=${DEBUG:-true}
PORT=${PORT:-8000}
M=".venv/bin/python manage.py"

$M migrate --noinput -v 0
$M wire
$M ensure_admin
$M collectstatic --noinput -v 0

pids=()
demo_pid=""
stop() {
  trap - INT TERM EXIT
  kill "${pids[@]}" $demo_pid 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

.venv/bin/celery -A console worker --collector -l info --concurrency 2 -Q "${CELERY_TASK_DEFAULT_QUEUE:-lazarus.tasks}" &
pids+=($!)
# Replay jobs in a pool of their own (REPLAY_TASK_QUEUE): a long job never delays the indexer.
.venv/bin/celery -A console worker --no-collector -l info --concurrency 2 -n "replay@%h" -Q "${REPLAY_TASK_QUEUE:-lazarus.replay}" &
pids+=($!)
# The notification outbox on its own queue (ALERTS_TASK_QUEUE): receivers that stall hold only
# this worker, never rule evaluation.
.venv/bin/celery -A console worker --no-collector -l info --concurrency 2 -n "alerts@%h" -Q "${ALERTS_TASK_QUEUE:-lazarus.alerts}" &
pids+=($!)
.venv/bin/celery -A console beat -l info -s var/celerybeat-schedule &
pids+=($!)
# Demo traffic is not the product: when it exits (RabbitMQ down, the management plugin
# restarting, a bug) it is said and started again after DEMO_RESTART_SECONDS, and the console,
# workers and beat keep running. Only those are waited on below, so only their exit ends run.sh.
demo() {
  local child=""
  trap '[ -n "$child" ] && kill "$child" 2>/dev/null; exit 0' INT TERM
  while true; do
    # mixed: half the demo's publishers and groups send OpenTelemetry spans to the console's
    # intake instead of logging, so the audits read both sources (docs/audit.md).
    $M simulate --count 60 --rate 10 --every 30 --telemetry mixed \
      --otlp-endpoint "http://127.0.0.1:${PORT:-8000}/v1/traces" &
    child=$!
    status=0
    wait "$child" || status=$?
    echo "run.sh: the demo traffic (manage.py simulate) exited ($status); the console and" \
      "the collector keep running; restarting it in ${DEMO_RESTART_SECONDS:-30} s" >&2
    sleep "${DEMO_RESTART_SECONDS:-30}" &
    child=$!
    wait "$child" || true
  done
}
demo &
demo_pid=$!
# --nostatic: WhiteNoise serves /static/ behind the middleware (nosniff and the other headers),
# as in production; runserver's own static handler would bypass them.
$M runserver "127.0.0.1:$PORT" --noreload --nostatic &
pids+=($!)
echo "Lazarus console: http://127.0.0.1:$PORT/  (Ctrl-C stops everything)"
if [ "$DEBUG" = "true" ]; then
  echo "DEBUG is on (a demo): listening on 127.0.0.1 only. Never expose this; see docs for production."
fi
wait -n "${pids[@]}"
