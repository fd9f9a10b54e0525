#!/usr/bin/env bash
# Build the client library's wheel (dist/lazarus_client-<version>-py3-none-any.whl): stage
# recovery/client/ beside clients/python/pyproject.toml and let pip build it.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=var/client-build
rm -rf "$stage"
mkdir -p "$stage/recovery/client" dist
cp clients/python/pyproject.toml clients/python/README.md "$stage/"
cp recovery/client/*.py recovery/client/LOGS.md recovery/client/py.typed "$stage/recovery/client/"
.venv/bin/python -m pip wheel -q --no-deps -w dist "$stage"
ls dist/lazarus_client-*.whl
