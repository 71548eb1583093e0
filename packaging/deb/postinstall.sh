#!/bin/sh
# Create the system users the units run as: muster for the authority,
# muster-agent for the agent, so an agent on the authority's machine cannot
# read the CA keys. Create their state directories now, as the units'
# StateDirectory= would at their first start: `muster init` runs before
# the authority's first start (docs/install.md). Keep the secrets files
# readable only by root and the service's group (0640). On an upgrade,
# restart the services that were running so they run the new binary (a
# stopped one stays stopped, as docs/install.md's upgrade of SQLite says).
set -e
if ! getent passwd muster >/dev/null; then
  adduser --system --group --home /var/lib/muster --no-create-home --quiet muster
fi
if ! getent passwd muster-agent >/dev/null; then
  adduser --system --group --home /var/lib/muster-agent --no-create-home --quiet muster-agent
fi
[ -d /var/lib/muster ] || install -d -o muster -g muster -m 0700 /var/lib/muster
if [ -d /var/lib/muster-agent ]; then
  # Earlier packages ran the agent as muster: its identity moves to its user.
  if [ "$(stat -c %U /var/lib/muster-agent)" = muster ]; then
    chown -R muster-agent:muster-agent /var/lib/muster-agent
  fi
else
  install -d -o muster-agent -g muster-agent -m 0700 /var/lib/muster-agent
fi
chown root:muster /etc/muster/authority.env
chown root:muster-agent /etc/muster/agent.env
chmod 0640 /etc/muster/authority.env /etc/muster/agent.env
# The agent's Workload API socket (muster-agent.socket) is enabled once,
# the first time the package brings it: an operator's later disable stays
# (deb-systemd-helper remembers it has handled the unit).
if command -v deb-systemd-helper >/dev/null; then
  if ! deb-systemd-helper debian-installed muster-agent.socket; then
    deb-systemd-helper enable muster-agent.socket >/dev/null || true
  fi
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
  if [ "$1" = configure ] && [ -n "${2:-}" ]; then
    systemctl try-restart muster-authority.service muster-agent.service >/dev/null || true
  fi
fi
