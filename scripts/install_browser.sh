#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver, for the dashboard's browser test
# (tests/integration/test_dashboard.py drives headless Chromium through Selenium, which
# is pointed at /usr/bin/chromium and /usr/bin/chromedriver: Selenium Manager does not
# download here). A no-op when both are there. Not installing them is not an error:
# the browser test then skips, saying why. Always exits 0.
set -u
have() { command -v "$1" >/dev/null 2>&1; }
if have chromium && have chromedriver; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! have apt-get; then
    echo "note: chromium/chromedriver missing and cannot be installed here (needs root and apt-get); the dashboard's browser test will skip"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
(apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
 { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }) ||
    echo "note: apt-get could not install chromium and chromium-driver; the dashboard's browser test will skip"
if have chromium && have chromedriver; then
    # (chromium's wrapper script prints a shell warning on some hosts: keep only the version)
    chromium --version 2>/dev/null | head -1
fi
exit 0
