.PHONY: setup run test lint bench

setup:
	./scripts/setup.sh

run: setup
	./scripts/run.sh

test: setup
	.venv/bin/ruff check .
	.venv/bin/python -m pytest

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
