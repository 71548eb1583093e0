#!/bin/sh
# On purge, forget whether the units were enabled (the links
# `systemctl enable` made would point at unit files that are gone). The
# data directories, which hold the CA keys, the database and the agent's
# identity, and the two users are kept: docs/install.md, "Removing".
set -e
if [ "$1" = purge ]; then
  rm -f /etc/systemd/system/multi-user.target.wants/muster-authority.service \
    /etc/systemd/system/multi-user.target.wants/muster-agent.service
  # The socket unit's enablement (postinstall enabled it).
  if command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper purge muster-agent.socket >/dev/null || true
  fi
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
fi
