#!/usr/bin/env bash
# Run Monarch's own public-API tests, its supervision tests and its CPU examples through
# danaus's runner (python -m danaus.monarch), from a Monarch checkout given as the first
# argument (a work tree, or a bare git directory read at --rev), and print pass/fail
# counts per file. Not part of `make test`: it needs that checkout. See
# scripts/monarch_conformance.py for what runs and how it is counted.
#
#   git clone https://github.com/meta-pytorch/monarch /tmp/monarch
#   scripts/monarch_conformance.sh /tmp/monarch [--tests test_actor_error.py] [-v]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
if [ $# -lt 1 ]; then
    echo "usage: $0 MONARCH_SRC [--rev REV] [--tests FILE...] [--examples EX...] [-v]" >&2
    exit 2
fi
# what Monarch's tests (cloudpickle) and its crawler example (bs4) import besides Monarch
"$py" -c "import cloudpickle, bs4" 2>/dev/null || "$py" -m pip install -q cloudpickle beautifulsoup4
exec "$py" "$here/scripts/monarch_conformance.py" "$@"
