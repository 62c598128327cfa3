#!/usr/bin/env bash
# Installs the Debian packages openmrc's tests use when they are missing: tshark for the capture tests;
# iproute2, nftables and ethtool for the namespace testbed (tests/test_testbed.py, root only).
# Never fails the build: tests that need a missing tool skip with a reason.
set -u
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: cannot install ${need[*]} (need root and apt-get); dependent tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
apt-get update -qq || true
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || \
    echo "install-system-deps: apt-get install ${need[*]} failed; dependent tests will skip" >&2
exit 0
