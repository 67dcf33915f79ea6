#!/usr/bin/env bash
# Set everything up, then run the whole test suite: unit tests and the end-to-end tests
# against a real namespace lab (needs root). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The paddle launcher is tested against the real paddle.distributed.launch (paddlepaddle
# from PyPI, CPU, installed once into a cached venv); MULTIHOST_TEST_PADDLE=0 skips it.
export MULTIHOST_TEST_PADDLE="${MULTIHOST_TEST_PADDLE:-1}"
# Two workers: the unit tests on one, the lab tests (which mostly wait on real processes
# and timeouts) file by file on both; MULTIHOST_TEST_WORKERS=0 runs everything in order.
set +e
.venv/bin/python -m pytest -q -ra -n "${MULTIHOST_TEST_WORKERS:-2}" --dist loadgroup "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test: pytest collected no tests: that is a failure, not a pass" >&2
  exit 1
fi
exit "$status"
