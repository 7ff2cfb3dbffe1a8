#!/usr/bin/env bash
# Contract: stop the cluster scripts/ci/slurm_up.sh STATE_DIR started, and nothing else.
# Usage: scripts/ci/slurm_down.sh STATE_DIR
# Cancels every job and waits (up to 30 s, only while a daemon it started still runs) for the queue to drain, so no slurmstepd outlives
# slurmd; then SIGTERM to each PID in STATE_DIR/pids (read before anything stops: the daemons delete
# their pid files on exit), up to 10 s for them to exit, SIGKILL to what is left. A PID is signalled
# only while it still names the program that was started (its /proc/PID/comm). Safe to call twice,
# or after a slurm_up.sh that failed half-way.
set -uo pipefail
STATE=${1:?usage: slurm_down.sh STATE_DIR}
[ -f "$STATE/pids" ] || exit 0
mapfile -t PIDS < "$STATE/pids"
ours() { case "$(cat "/proc/$1/comm" 2>/dev/null)" in munged|slurmctld|slurmd) return 0;; *) return 1;; esac; }
alive=0
for pid in "${PIDS[@]}"; do [ -n "$pid" ] && ours "$pid" && alive=1; done
# Drain only a cluster that still runs: with the controller gone, every squeue waits out its message
# timeout, so a second call (the caller's exit trap after an explicit stop) would spin for minutes.
if [ "$alive" = 1 ] && [ -f "$STATE/slurm.conf" ]; then
  export SLURM_CONF="$STATE/slurm.conf"
  timeout 10 scancel --full --quiet --partition=ci 2>/dev/null || true
  deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    # drained: no job left, and no step's socket left in slurmd's spool (its slurmstepd has exited)
    jobs=$(timeout 5 squeue -h -o %i 2>/dev/null) || break
    [ -z "$jobs" ] && ! compgen -G "$STATE/spool/d/*_*.*" >/dev/null && break
    sleep 0.2
  done
fi
# slurmd first, then slurmctld, munged last (the others authenticate through it while stopping)
for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
  pid=${PIDS[$i]}
  [ -n "$pid" ] && ours "$pid" && kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do ours "$pid" || break; sleep 0.2; done
  if [ -n "$pid" ] && ours "$pid"; then kill -KILL "$pid" 2>/dev/null; fi
done
: > "$STATE/pids"
echo "slurm_down: stopped ${#PIDS[@]} daemons"
