#!/usr/bin/env bash
# Set everything up, then run the whole test suite: unit tests and the end-to-end tests
# against a real namespace lab (needs root). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -q -ra "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test: pytest collected no tests: that is a failure, not a pass" >&2
  exit 1
fi
exit "$status"
