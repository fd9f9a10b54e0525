#!/usr/bin/env bash
# Make this machine ready for Lazarus: system packages, services, virtualenv, database, topology.
# Idempotent: every step checks before it acts, so `make run` / `make test` can run it every time.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
DB_NAME=${DB_NAME:-lazarus}
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

need_pkgs=()
command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || need_pkgs+=(rabbitmq-server)
command -v pg_ctlcluster >/dev/null 2>&1 || need_pkgs+=(postgresql)
[ -x /usr/bin/chromium ] || need_pkgs+=(chromium)
command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jre-headless)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
# PgBouncer for the tests that run Lazarus through a transaction-mode pooler (started by the
# tests on a port of their own; the Debian service is not used).
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need_pkgs+=(pgbouncer)
# nginx: the login tests put a real reverse proxy in front of the console (started by the tests).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_pkgs+=(nginx)
# Node.js and npm: the single sign-on tests run a real OpenID Connect provider (npm's
# oidc-provider, tests/sso/provider), installed below.
command -v node >/dev/null 2>&1 || need_pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || need_pkgs+=(npm)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  say "installing ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  say "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

if ! rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
  say "starting RabbitMQ"
  rabbitmq-server -detached
  for _ in $(seq 60); do rabbitmq-diagnostics -q ping >/dev/null 2>&1 && break; sleep 1; done
fi
if ! curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null; then
  say "enabling the RabbitMQ management plugin"
  rabbitmq-plugins enable rabbitmq_management >/dev/null
  for _ in $(seq 60); do curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null && break; sleep 1; done
fi
# The broker's own dead-letter and unroutable counters, which the broker tally sets against the
# store (recovery/broker/tally.py), are served by the prometheus plugin on :15692.
if ! curl -sf http://127.0.0.1:15692/metrics >/dev/null; then
  say "enabling the RabbitMQ prometheus plugin"
  rabbitmq-plugins enable rabbitmq_prometheus >/dev/null
  for _ in $(seq 60); do curl -sf http://127.0.0.1:15692/metrics >/dev/null && break; sleep 1; done
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  $PY -m venv .venv
fi
stamp=.venv/.requirements.sha256
if ! sha256sum -c --status "$stamp" 2>/dev/null; then
  # requirements.txt is what production installs; the development tools (pytest, Playwright,
  # schemathesis, ruff, ...) come on top from requirements-dev.txt for make test / make run.
  say "installing requirements-dev.txt (requirements.txt + development tools)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements-dev.txt
  sha256sum requirements.txt requirements-dev.txt > "$stamp"
fi

if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'" | grep -q 1; then
  say "creating database $DB_NAME"
  psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE \"$DB_NAME\""
fi

# The test identity provider's packages (tests/sso/provider, pinned in its package-lock.json).
provider_stamp=tests/sso/provider/node_modules/.package-lock.sha256
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  say "WARNING: Node.js $(node --version) is older than 20, which the test identity provider (oidc-provider 9) needs: the single sign-on tests will fail until Node.js 20+ is installed"
fi
if ! sha256sum -c --status "$provider_stamp" 2>/dev/null; then
  say "installing the test identity provider (npm ci in tests/sso/provider)"
  (cd tests/sso/provider && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  sha256sum tests/sso/provider/package-lock.json > "$provider_stamp"
fi

# The instrumented Node service of the span-audit tests (tests/telemetry/services/node: amqplib
# with @opentelemetry/instrumentation-amqplib, pinned in its package-lock.json; Node.js 20.6+).
amqplib_service_stamp=tests/telemetry/services/node/node_modules/.package-lock.sha256
if ! sha256sum -c --status "$amqplib_service_stamp" 2>/dev/null; then
  say "installing the instrumented Node service (npm ci in tests/telemetry/services/node)"
  (cd tests/telemetry/services/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  sha256sum tests/telemetry/services/node/package-lock.json > "$amqplib_service_stamp"
fi
