.PHONY: setup run test lint client-wheel

setup:
	./scripts/setup.sh

run: setup
	./scripts/run.sh

# Every test, in two sessions: the disruptive ones restart PostgreSQL / RabbitMQ themselves, so
# they run after the rest, alone.
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -m "not disruptive" --durations=25
	.venv/bin/python -m pytest --run-disruptive -m disruptive

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# The client library as its own distribution (dist/lazarus_client-<version>-py3-none-any.whl).
client-wheel: setup
	./scripts/build-client.sh
