#!/usr/bin/env bash
# A single-node Slurm cluster on this machine (slurmctld + slurmd, with accounting through
# slurmdbd + MariaDB), to run hydra/launcher=slurm against a real controller (docs/slurm.md,
# tests/test_slurm.py). No systemd: each daemon is started here, as root (munged as munge).
#
#   scripts/slurm_local.sh install   # apt-get: slurm-wlm munge slurmdbd mariadb-server (root, network)
#   scripts/slurm_local.sh start     # write the configs, start the daemons, wait until the node is idle
#   scripts/slurm_local.sh status    # which daemons run; sinfo and squeue (exit 1 if the cluster is not up)
#   scripts/slurm_local.sh stop      # cancel the cluster's jobs, stop the daemons this script started
#   eval "$(scripts/slurm_local.sh env)"   # SLURM_CONF for sbatch/sinfo/sacct/submitit in this shell
#
# Everything (configs, logs, spool, the accounting database) lives in $HARNESS_SLURM_DIR
# (default /tmp/harness-slurm); it is kept by stop, so the next start reuses the database.
# Environment: HARNESS_SLURM_DIR, HARNESS_SLURM_DB_PORT (MariaDB's port on 127.0.0.1, default
# 3307), HARNESS_SLURM_PORTS (slurmctld, slurmd and slurmdbd ports, default "6817 6818 6819").
set -euo pipefail

STATE=${HARNESS_SLURM_DIR:-/tmp/harness-slurm}
DB_PORT=${HARNESS_SLURM_DB_PORT:-3307}
read -r CTLD_PORT SLURMD_PORT DBD_PORT <<<"${HARNESS_SLURM_PORTS:-6817 6818 6819}"
CLUSTER=harness
PACKAGES=(slurm-wlm munge slurmdbd mariadb-server)
ETC=$STATE/etc LOG=$STATE/log RUN=$STATE/run DB=$STATE/mysql DBRUN=$STATE/mysql-run
export SLURM_CONF=$ETC/slurm.conf

die() { echo "slurm_local.sh: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (it runs munged as munge, mariadbd as mysql, the Slurm daemons as root)"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# wait_for SECONDS WHAT CMD...: poll CMD every 0.2 s until it succeeds
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "$what did not come up within ${limit}s (logs: $LOG)"
    sleep 0.2
  done
}

cmd_install() {
  need_root install
  command -v apt-get >/dev/null || die "install needs apt-get (Debian/Ubuntu); install ${PACKAGES[*]} by hand"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
}

write_configs() {
  local host node
  host=$(hostname -s)
  node=$(slurmd -C | head -n1)  # NodeName=<host> CPUs=... RealMemory=...: this machine as slurmd sees it
  case $node in "NodeName=$host "*) ;; *) die "slurmd -C names another node than hostname -s ($host): $node" ;; esac
  mkdir -p "$ETC" "$LOG" "$RUN" "$STATE/spool/ctld" "$STATE/spool/d"
  cat >"$ETC/slurm.conf" <<EOF
# written by scripts/slurm_local.sh start; a single-node cluster for testing
ClusterName=$CLUSTER
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
# seconds between scancel's SIGTERM and SIGKILL (default 30)
KillWait=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$host
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
MailProg=/bin/true
$node State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  (umask 077; cat >"$ETC/slurmdbd.conf" <<EOF
# written by scripts/slurm_local.sh start
AuthType=auth/munge
DbdHost=$host
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm-local
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$ETC/slurmdbd.conf"  # slurmdbd refuses a config others can read
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi  # a munged already runs
  [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- munged
  wait_for 10 munged sh -c 'munge -n | unmunge'
  cp /run/munge/munged.pid "$RUN/munged.pid"  # started here: stop stops it
}

start_mariadb() {
  local mysql=(mariadb --socket="$DBRUN/mysqld.sock" -u root)
  install -d -o mysql -g mysql -m 0755 "$DBRUN"
  if [ ! -d "$DB/mysql" ]; then
    install -d -o mysql -g mysql -m 0750 "$DB"
    mariadb-install-db --user=mysql --datadir="$DB" --skip-test-db >"$LOG/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed: see $LOG/mariadb-install.log"
  fi
  if ! alive "$DBRUN/mariadbd.pid"; then
    setsid mariadbd --user=mysql --datadir="$DB" --socket="$DBRUN/mysqld.sock" --pid-file="$DBRUN/mariadbd.pid" \
      --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve --log-error="$LOG/mariadb.log" \
      --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
  fi
  wait_for 60 mariadbd mariadb-admin --socket="$DBRUN/mysqld.sock" -u root ping
  "${mysql[@]}" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm-local';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

cmd_start() {
  need_root start
  local b
  for b in slurmctld slurmd slurmdbd munged mariadbd; do
    command -v "$b" >/dev/null || die "$b not found: run 'scripts/slurm_local.sh install' (apt-get install ${PACKAGES[*]})"
  done
  write_configs
  start_munge
  start_mariadb
  alive "$RUN/slurmdbd.pid" || slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  alive "$RUN/slurmctld.pid" || slurmctld
  alive "$RUN/slurmd.pid" || slurmd
  local host
  host=$(hostname -s)
  wait_for 60 "node $host idle" sh -c "sinfo -h -n '$host' -o %T | grep -qx idle"
  echo "slurm cluster '$CLUSTER' up: node $host idle (SLURM_CONF=$SLURM_CONF)"
}

stop_pidfiles() {  # stop_pidfiles NAME FILE [NAME FILE ...]: SIGTERM to all, SIGKILL after 15 s
  local -a names=() pids=()
  local i
  while [ $# -gt 0 ]; do
    if alive "$2"; then names+=("$1"); pids+=("$(cat "$2")"); kill "$(cat "$2")"; fi
    rm -f "$2"
    shift 2
  done
  for i in "${!pids[@]}"; do
    local n=0
    while kill -0 "${pids[$i]}" 2>/dev/null && [ $n -lt 75 ]; do sleep 0.2; n=$((n + 1)); done
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "${names[$i]} (${pids[$i]}) ignored SIGTERM for 15 s: SIGKILL"
      kill -9 "${pids[$i]}"
    fi
    echo "stopped ${names[$i]} (${pids[$i]})"
  done
}

cmd_stop() {
  need_root stop
  if alive "$RUN/slurmctld.pid"; then  # jobs' processes outlive slurmd: cancel them first
    local jobs i
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs || true
      for i in $(seq 100); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  stop_pidfiles slurmd "$RUN/slurmd.pid" slurmctld "$RUN/slurmctld.pid"
  stop_pidfiles slurmdbd "$RUN/slurmdbd.pid"  # after slurmctld, which reports to it until the end
  stop_pidfiles mariadbd "$DBRUN/mariadbd.pid" munged "$RUN/munged.pid"
}

cmd_status() {
  local up=0 name file
  for name in munged slurmdbd slurmctld slurmd mariadbd; do
    file=$RUN/$name.pid
    [ $name = mariadbd ] && file=$DBRUN/$name.pid
    if alive "$file"; then echo "$name: running (pid $(cat "$file"))"
    elif [ $name = munged ] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then echo "munged: running (not started here)"
    else echo "$name: not running"; up=1; fi
  done
  [ $up = 0 ] || return 1
  sinfo
  squeue
}

case ${1:-} in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) die "usage: $0 install|start|stop|status|env (got '${1:-}')" ;;
esac
