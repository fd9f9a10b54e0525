.PHONY: setup run test quick lint client-wheel

setup:
	./scripts/setup.sh

run: setup
	./scripts/run.sh

# Every test, in three sessions. Most run in TEST_WORKERS processes at once (pytest-xdist): each
# has its own RabbitMQ vhost and PostgreSQL database, and most of a test's time is spent waiting
# on the broker, so more processes than cores pay. The ``serial`` ones read node-wide broker
# counters that any other test's reject moves, so they run next, in one process, with the
# ``cluster`` ones (three more RabbitMQ nodes: started beside three busy test processes, a node
# failed to start twice in a row); the ``disruptive`` ones restart PostgreSQL / RabbitMQ themselves, so they run last, alone.
TEST_WORKERS ?= 3
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -m "not disruptive and not serial and not cluster" -n $(TEST_WORKERS) --dist loadgroup --durations=25
	.venv/bin/python -m pytest -m "(serial or cluster) and not disruptive" --durations=10
	.venv/bin/python -m pytest --run-disruptive -m disruptive

# The quick loop while iterating: everything but the slow, serial and disruptive tests (a few
# Spark audits stay in, marked quick), in TEST_WORKERS processes; no setup, no lint.
quick:
	.venv/bin/python -m pytest -m "not slow and not disruptive and not serial" -n $(TEST_WORKERS) --dist loadgroup -q

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# The client library as its own distribution (dist/lazarus_client-<version>-py3-none-any.whl).
client-wheel: setup
	./scripts/build-client.sh
