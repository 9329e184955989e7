#!/usr/bin/env bash
# Expose Debian's python3-pyverbs (rdma-core, built for CPython 3.11) to the venv.
# PyPI's pyverbs does not import on these machines. The .pth adds only a shim
# folder holding a symlink to the pyverbs package, not all of dist-packages.
# Missing pyverbs is not an error: danaus then runs without the ibverbs backend.
set -u
py=${1:-.venv/bin/python}
src=/usr/lib/python3/dist-packages/pyverbs
if [ ! -d "$src" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get install -y -q python3-pyverbs >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q python3-pyverbs >/dev/null 2>&1; }) ||
        echo "note: python3-pyverbs could not be installed; the ibverbs backend stays off"
fi
[ -d "$src" ] || exit 0
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "$ver" != 3.11 ]; then
    echo "note: Debian's pyverbs is built for Python 3.11, the venv has $ver; ibverbs stays off"
    exit 0
fi
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# the physical path: a venv reached through a symlink (a clone sharing another's) must
# not leave the link's path in the .pth, which breaks once the link goes
shim="$(cd "$(dirname "$py")/.." && pwd -P)/pyverbs-shim"
mkdir -p "$shim"
ln -sfn "$src" "$shim/pyverbs"
echo "$shim" > "$site/danaus-pyverbs.pth"
"$py" -c 'import pyverbs.device' 2>/dev/null || echo "note: pyverbs is present but does not import; ibverbs stays off"
exit 0
