#!/usr/bin/env bash
# Contract: bring up a one-node Slurm cluster on localhost, as root, without systemd, for the Slurm
# tests (tests/slurm). Usage: scripts/ci/slurm_up.sh STATE_DIR
#
# * Installs Debian's slurmctld slurmd slurm-client munge when slurmctld is missing (one apt-get
#   update, no recommends, no prompts).
# * Everything it writes lives under STATE_DIR: a munge daemon on its own socket, slurm.conf,
#   gres.conf, state, spool, pid and log files, and eight character devices (STATE_DIR/dev/nvidia0-7,
#   /dev/null's numbers) that Slurm registers as GPU GRES, so `--gpus-per-node` schedules on a
#   machine without GPUs. Nothing under /etc is changed and no daemon of anyone else is touched.
# * Ports are free ones picked now, so a second cluster on the same host does not collide.
# * Writes STATE_DIR/env (`export SLURM_CONF=...`; source it before sbatch/srun) and STATE_DIR/pids
#   (one PID a line, every daemon started here), which scripts/ci/slurm_down.sh reads.
# * Exits 0 once the node is idle; otherwise prints the daemons' last log lines and exits 1 (call
#   slurm_down.sh either way: it stops whatever was started).
set -euo pipefail
STATE=${1:?usage: slurm_up.sh STATE_DIR}
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
: > "$STATE/pids"

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

HOST=$(hostname -s)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)

# munge: its own key, socket, pid, log and seed under STATE/munge (munged runs as the munge user
# and refuses folders others can write)
M="$STATE/munge"
mkdir -p "$M"
chmod 0711 "$STATE"
if [ ! -f "$M/munge.key" ]; then
  dd if=/dev/urandom of="$M/munge.key" bs=1024 count=1 status=none
fi
chown -R munge:munge "$M"
chmod 0700 "$M"
chmod 0600 "$M/munge.key"
runuser -u munge -- /usr/sbin/munged --socket="$M/munge.socket" --key-file="$M/munge.key" \
  --pid-file="$M/munged.pid" --log-file="$M/munged.log" --seed-file="$M/munged.seed" --force
for _ in $(seq 50); do [ -s "$M/munged.pid" ] && break; sleep 0.1; done
cat "$M/munged.pid" >> "$STATE/pids"
chmod 0755 "$M"  # clients (root here) reach the socket

# fake GPUs: character devices (regular files are refused, Count= without File= registers nothing)
mkdir -p "$STATE/dev" "$STATE/spool/ctld" "$STATE/spool/d" "$STATE/log"
for n in 0 1 2 3 4 5 6 7; do
  [ -c "$STATE/dev/nvidia$n" ] || mknod "$STATE/dev/nvidia$n" c 1 3
done

NODE=$(slurmd -C | head -n 1 | sed -e "s/^NodeName=[^ ]*/NodeName=$HOST NodeAddr=127.0.0.1/")
cat > "$STATE/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$M/munge.socket
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
MailProg=/bin/true
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
GresTypes=gpu
$NODE Gres=gpu:8 State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
cat > "$STATE/gres.conf" <<CONF
AutoDetect=off
NodeName=$HOST Name=gpu File=$STATE/dev/nvidia[0-7]
CONF
echo "export SLURM_CONF=$STATE/slurm.conf" > "$STATE/env"
export SLURM_CONF="$STATE/slurm.conf"

/usr/sbin/slurmctld -f "$SLURM_CONF"
for _ in $(seq 50); do [ -s "$STATE/slurmctld.pid" ] && break; sleep 0.1; done
cat "$STATE/slurmctld.pid" >> "$STATE/pids"
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 50); do [ -s "$STATE/slurmd.pid" ] && break; sleep 0.1; done
cat "$STATE/slurmd.pid" >> "$STATE/pids"

for _ in $(seq 100); do
  if sinfo -h -N -o '%t' 2>/dev/null | grep -qx 'idle'; then
    echo "slurm_up: one-node cluster '$HOST' idle (SLURM_CONF=$SLURM_CONF)"
    exit 0
  fi
  sleep 0.2
done
echo "slurm_up: the node did not become idle; last log lines:" >&2
tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" "$M/munged.log" >&2 || true
sinfo -N -l >&2 || true
exit 1
