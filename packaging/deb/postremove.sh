#!/bin/sh
set -e
# On purge, forget the socket unit's enablement (postinstall enabled it).
if [ "$1" = purge ] && command -v deb-systemd-helper >/dev/null; then
  deb-systemd-helper purge muster-agent.socket >/dev/null || true
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
fi
