#!/usr/bin/env bash
# The test command of the README: set up .venv if needed, lint, then run the tests not marked
# slow (under 10 minutes on a 2-core CPU). Arguments replace that selection and go to pytest:
# `-m slow` runs the slow tests (the real 135M model, multi-process and Slurm launches, long
# end-to-end runs), `tests` runs every test. CI runs both halves (.ci/run).
# ACMRL_TEST_SLURM=0 skips installing Slurm (its tests are then skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the Slurm tests start a real single-node cluster: install Debian's Slurm where we may (root,
# apt); elsewhere tests/test_slurm.py is skipped and says why
if ! command -v slurmctld >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    && [ "${ACMRL_TEST_SLURM:-1}" = 1 ]; then
    echo "acmrl tests: installing slurmctld slurmd slurm-client (Debian) for tests/test_slurm.py" >&2
    slurm_install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            slurmctld slurmd slurm-client >/dev/null 2>&1
    }
    # a fresh machine may have no package lists yet: refresh them once if the install fails
    slurm_install || { apt-get update -qq >/dev/null 2>&1 && slurm_install; } ||
        echo "acmrl tests: Slurm could not be installed; its tests will be skipped" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$#" -eq 0 ]; then
    set -- -m "not slow"
fi
.venv/bin/python -m pytest "$@"
