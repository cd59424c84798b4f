#!/usr/bin/env bash
# A real one-node Slurm on this host for the Slurm target's tests (tests/test_slurm.py): Debian's slurm-wlm (22.05)
# and munge; slurmctld and slurmd configured for this host's cores and memory, one partition `debug`.
# Idempotent: re-running keeps running daemons and rewrites slurm.conf only when this host's shape changed.
# No accounting database (sacct says so): the launcher keeps a run's state in its run directory.
set -euo pipefail

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# munge: one key, the munge user's alone; munged runs as that user.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  su -s /bin/sh munge -c /usr/sbin/munged
  for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
fi

host=$(hostname -s)
node=$(slurmd -C | head -1)  # NodeName=<host> CPUs=... RealMemory=...: what slurmd will find here
conf=$(cat <<EOF
# Written by .ci/slurm.sh: a one-node cluster for tests.
ClusterName=verl-deploy-ci
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobRequeue=1
# Seconds between the SIGTERM of a cancel, requeue or time limit and the SIGKILL: the trainer's checkpoint time.
KillWait=60
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$node
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
install -d /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
changed=0
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$conf" ]; then
  printf '%s\n' "$conf" >/etc/slurm/slurm.conf
  changed=1
fi

if [ $changed = 1 ] && [ -s /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null; then
  scontrol reconfigure
fi
[ -s /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null || slurmctld
[ -s /run/slurmd.pid ] && kill -0 "$(cat /run/slurmd.pid)" 2>/dev/null || slurmd
for _ in $(seq 30); do
  state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
  case "$state" in idle*|mix*|alloc*) break ;; esac
  sleep 1
done
case "$state" in
  idle*|mix*|alloc*) ;;
  down*|drain*) scontrol update nodename="$host" state=resume ;;
  *) echo "slurm did not come up (node state: ${state:-none}); see /var/log/slurm/" >&2; exit 1 ;;
esac
echo "slurm $(sinfo -V | cut -d' ' -f2) is up: $(sinfo -h -o '%P %D %t %c cpus %m MB')"
