#!/usr/bin/env bash
# Build and test the Python binding: a venv under build-py/, `pip install
# ./python` (scikit-build-core over the repo's CMake build), then pytest on
# tests/python. Needs PyPI (scikit-build-core, numpy, ml_dtypes, pytest, tokenizers) and
# the Debian build dependencies (scripts/install-deps.sh). openai: the server test.
#   PYTHON=python3.13 VENV=build-py/venv313 scripts/test-python.sh   # another interpreter
#   scripts/test-python.sh -k codec -x            # extra args go to pytest
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
venv="${VENV:-$root/build-py/venv}"
jobs="${JOBS:-2}"

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv" || {
    echo "test-python: '$py -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "scikit-build-core>=0.10" numpy ml_dtypes pytest tokenizers openai
# Build without isolation (the venv has the backend) so that the persistent
# build tree python/build/ is reused: a rerun recompiles only what changed.
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "${pip[@]}" install --no-build-isolation ./python
# The CLI for tests that run it (test_gen_model_hf.py); `make test` builds it.
export FT_BIN="${FT_BIN:-$root/build/flextier}"
# Run from tests/python so that `import flextier` is the installed package.
cd "$root/tests/python"
exec "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$@"
