#!/usr/bin/env bash
# The Debian packages the tests run for real on this machine (docs/testing.md, "fast"):
#   haproxy     the gateway's configuration is run by Debian's HAProxy 2.6, the package the lab's
#               gateway image is built from (tests/unit/hostscripts/test_gateway_haproxy.py, ...).
#   netplan.io  the stack's fabric netplan files are validated by the real netplan, in the unit
#               tier and on the lab's nodes, which share this machine's /usr (lab/hosts.py).
#   iptables    the lab's bridges, and the firewall's test that the old rendezvous guard (0.20's
#               iptables chain) is removed.
#   nftables    the stack's firewall: its table is checked and loaded by the real nft in
#               network namespaces of the unit tier (tests/unit/hostscripts/test_firewall.py),
#               and the lab's nodes, which share this machine's /usr, load it with it.
#   systemd     systemctl enables the firewall's unit offline and systemd-analyze verifies it
#               (no systemd needs to run; Debian installs it with the system anyway).
#   prometheus  promtool checks the stack's Prometheus configuration and alert rules, and runs
#               their unit tests; its prometheus scrapes a stand-in gateway in the unit tier
#               (tests/unit/hostscripts/test_monitoring.py). The lab's image is built from it.
#   prometheus-alertmanager  amtool checks the stack's Alertmanager configuration and its routes;
#               its alertmanager delivers test alerts to a stand-in webhook in the unit tier
#               (tests/unit/hostscripts/test_alertmanager.py). The lab's image is built from it.
#   wrk         the load generator of `make bench`'s gateway section (bench/gateway.py).
#   earlyoom    the OOM killer the stack's guard configures: the unit tier runs it for real in a
#               PID namespace of its own (tests/unit/hostscripts/test_guard.py), and the lab's
#               nodes, which share this machine's /usr, run it. Never on the machine itself: its
#               boot links are removed after the install.
# `make setup` runs this. Missing and root: `apt-get update` once, then `apt-get install -y
# --no-install-recommends` (no service is started by the install). Missing and not root: it
# says how to install and exits 0; the tests that need the binary then fail saying the same,
# they never skip. Present: nothing happens (a warm run takes milliseconds).
set -euo pipefail

# Debian package[:its binary, when the names differ] (SPARK_VLLM_HOST_PACKAGES: another list,
# for its own test)
read -r -a PACKAGES <<< "${SPARK_VLLM_HOST_PACKAGES:-haproxy netplan.io:netplan iptables nftables:nft systemd:systemd-analyze prometheus:promtool prometheus-alertmanager:amtool wrk earlyoom}"

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }

missing=()
for entry in "${PACKAGES[@]}"; do
  have "${entry#*:}" || missing+=("${entry%%:*}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

how="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ]; then
  echo "host packages: ${missing[*]} missing; the unit tier runs it for real and fails without" \
       "it. As root: make setup, or: $how" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "host packages: ${missing[*]} missing and this is not a Debian system (no apt-get):" \
       "install them (HAProxy 2.6, netplan, iptables, nftables, systemd, Prometheus 2.42, Alertmanager 0.25, earlyoom) so that their binaries are on PATH" >&2
  exit 1
fi

echo "host packages: installing ${missing[*]} (Debian's, for the unit tier)"
export DEBIAN_FRONTEND=noninteractive
# the package's service must not start (a HAProxy of the machine's own is not what the tests
# run, and the lab may be using this host): invoke-rc.d asks policy-rc.d first
policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  made_policy=1
fi
cleanup() { if [ -n "$made_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for entry in "${PACKAGES[@]}"; do
  have "${entry#*:}" || { echo "host packages: ${entry%%:*} still missing after apt-get install" >&2; exit 1; }
done
# a machine-wide earlyoom would kill this machine's processes (the tests', the lab's): its
# package's boot links go (policy-rc.d kept it from starting now)
for entry in "${missing[@]}"; do
  if [ "$entry" = earlyoom ]; then
    deb-systemd-helper disable earlyoom.service >/dev/null 2>&1 || true
    update-rc.d earlyoom disable >/dev/null 2>&1 || true
  fi
done
echo "host packages: ${missing[*]} installed"
