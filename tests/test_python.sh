#!/usr/bin/env bash
# The Python package's tests (python/tests) against this build: libnsa and the nsa
# tool of the build tree. Skipped (77) when python3, torch or numpy is missing.
# fake_dir (optional): tests/fake/failing of the build, whose fakeplan module has no f64.
set -u
lib=$1 tool=$2 src=$3 fake_dir=${4:-}
python3 -c "import torch, numpy" 2>/dev/null || { echo "SKIP: python3 with torch and numpy is needed"; exit 77; }
export NSA_LIBRARY=$lib NSA_TOOL=$tool PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
[ -n "$fake_dir" ] && export NSA_TEST_FAKE_DIR=$fake_dir
exec python3 -W ignore::UserWarning -m unittest discover -v "$src/python/tests"
