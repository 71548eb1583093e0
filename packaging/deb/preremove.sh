#!/bin/sh
# On removal, stop the services (and the agent's socket unit, whose next
# caller would start the agent again) before their binary and units go: left
# running, they would keep serving from a deleted /usr/bin/muster under a
# unit systemd no longer has a file for. An upgrade does not stop them
# here: the new package's postinst restarts those that were running.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop muster-authority.service muster-agent.socket muster-agent.service >/dev/null 2>&1 || true
fi
