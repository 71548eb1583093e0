#!/bin/sh
# Create the system user both units run as; keep the secrets files private.
set -e
if ! getent passwd muster >/dev/null; then
  adduser --system --group --home /var/lib/muster --no-create-home --quiet muster
fi
chown root:muster /etc/muster/authority.env /etc/muster/agent.env
chmod 0640 /etc/muster/authority.env /etc/muster/agent.env
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
fi
