#!/usr/bin/env bash
# A real 2-node SLURM cluster on loopback (one machine, two slurmd daemons).
#
#   scripts/slurm_cluster.sh up     [STATE_DIR]   start; prints `export SLURM_CONF=...` on stdout
#   scripts/slurm_cluster.sh down   [STATE_DIR]   stop, kill leftovers, remove STATE_DIR
#   scripts/slurm_cluster.sh status [STATE_DIR]   exit 0 if up (both nodes answer), 1 otherwise
#
# STATE_DIR defaults to <repo>/.slurm-cluster (git-ignored).  It holds slurm.conf, logs,
# pid files and spool/state directories.  /etc/slurm/slurm.conf is NOT touched: every
# caller must use `export SLURM_CONF=<STATE_DIR>/slurm.conf` (the `up` command prints it),
# e.g.   eval "$(scripts/slurm_cluster.sh up)"
#
# Needs root and the packages of scripts/install_system_deps.sh (installs nothing itself).
# Several clusters can run on one machine, each with its own STATE_DIR and ports: they share
# munged and the node names node1/node2 (both 127.0.0.1), nothing else.
# Every wait is bounded; all diagnostics go to stderr, only the export line to stdout.
#
# Environment knobs (the ports are read by `up` only; the others find them in slurm.conf):
#   SLURM_CLUSTER_CTLD_PORT   (16817)  slurmctld port
#   SLURM_CLUSTER_NODE_PORTS  (17001,17002) slurmd ports of node1,node2 ("P1,P2" or "P1-P2")
#   SLURM_CLUSTER_CPUS        (2)      CPUs per virtual node
#   SLURM_CLUSTER_MEM_MB      (8000)   RealMemory per virtual node
#   SLURM_CLUSTER_UP_TIMEOUT  (60)     seconds to wait for both nodes idle
#   SLURM_CLUSTER_KEEP_STATE  (0)      1: `down` keeps STATE_DIR (logs) instead of removing it
#   SLURM_CLUSTER_NETLAB      ()       a network lab's name (scripts/netlab.sh up --name NAME,
#                                      2 nodes or more): read by `up` only, see below
#
# On a network lab (SLURM_CLUSTER_NETLAB=NAME): slurmd of nodeI runs in the lab's node I
# (what `ip netns exec NAME-nI slurmd -N nodeI` would do, see on_node), NodeAddr = its lab
# address; slurmctld stays in
# the root namespace, as on a cluster's head node, reached at the lab's bridge address by the
# nodes and by sbatch/squeue in the root namespace.  The jobs run in the nodes: traffic
# between node1 and node2 crosses the lab's links (shaped or not: `netlab.sh shape`), and
# node names resolve through the lab's per-node hosts files (/etc/hosts is not touched).
# `down` is the same in both cases; `netlab.sh down` kills the slurmds with the namespaces.
set -uo pipefail
# (so a pipe into grep reads to the end, `grep ... >/dev/null`: `grep -q` exits at the first
# match, and a writer still writing dies of SIGPIPE, which pipefail reports as the pipe's status)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CTLD_PORT="${SLURM_CLUSTER_CTLD_PORT:-16817}"
NODE_PORTS="${SLURM_CLUSTER_NODE_PORTS:-17001,17002}"
CPUS="${SLURM_CLUSTER_CPUS:-2}"
MEM_MB="${SLURM_CLUSTER_MEM_MB:-8000}"
UP_TIMEOUT="${SLURM_CLUSTER_UP_TIMEOUT:-60}"
NODES=(node1 node2)
NETLAB="${SLURM_CLUSTER_NETLAB:-}"
NETLAB_DIR="/run/ddp_lab_netlab"   # netlab.sh's records: NAME.env
CTLD_ADDR="127.0.0.1"              # where the nodes and clients reach slurmctld
NODE_ADDR=(127.0.0.1 127.0.0.1)    # NodeAddr of node1, node2
NODE_NS=("" "")                    # the network namespace each slurmd runs in ("": root)
MARKER=".slurm_cluster_state"   # only directories holding this file are ever rm -rf'ed
# munged and /etc/hosts are shared by every cluster on the machine. MACHINE_DIR says which
# clusters use munged (users/<hash of STATE_DIR>) and whether one of them started it; it is
# read and written only under its lock, so two `up`/`down` at once do not race.
MACHINE_DIR="/run/ddp_lab_slurm_cluster"

log() { echo "slurm_cluster: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
    echo "usage: $0 {up|down|status} [STATE_DIR]" >&2
    exit 2
}

[ $# -ge 1 ] && [ $# -le 2 ] || usage
CMD="$1"
case "$NODE_PORTS" in
    *,*) NODE_PORT=("${NODE_PORTS%%,*}" "${NODE_PORTS##*,}") ;;
    *-*) NODE_PORT=("${NODE_PORTS%%-*}" "${NODE_PORTS##*-}") ;;
    *) NODE_PORT=() ;;
esac
for port in "$CTLD_PORT" "${NODE_PORT[@]}"; do
    [[ "$port" =~ ^[0-9]+$ ]] || { echo "slurm_cluster: bad SLURM_CLUSTER_CTLD_PORT/NODE_PORTS: '$CTLD_PORT' / '$NODE_PORTS' (want e.g. 16817 and 17001,17002)" >&2; exit 2; }
done
[ ${#NODE_PORT[@]} -eq 2 ] || { echo "slurm_cluster: SLURM_CLUSTER_NODE_PORTS needs two ports, got '$NODE_PORTS'" >&2; exit 2; }
STATE_DIR="${2:-$REPO_ROOT/.slurm-cluster}"
mkdir -p "$(dirname "$STATE_DIR")" 2>/dev/null || true
# absolute path without requiring the directory to exist yet
STATE_DIR="$(cd "$(dirname "$STATE_DIR")" && pwd)/$(basename "$STATE_DIR")"
CONF="$STATE_DIR/slurm.conf"
export SLURM_CONF="$CONF"

# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
# alive = exists and is not a zombie (a killed daemon stays 'Z' until init reaps it)
pid_alive() {
    [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
    local st; st="$(cut -d')' -f2 2>/dev/null </proc/"$1"/stat | awk '{print $1}')"
    [ "$st" != Z ]
}

pidfile_pid() { [ -f "$1" ] && tr -dc '0-9' <"$1"; }

# pids of processes that belong to THIS cluster: slurm daemons / steps / job processes
# whose environment has SLURM_CONF=$CONF (slurmd/slurmctld also get `-f $CONF`).  Interactive
# shells that merely exported SLURM_CONF are not matched (they have no SLURM_JOB_ID and are
# not slurm daemons); this script and its ancestors are excluded.
cluster_pids() {
    local self_chain=" $$ " p=$$ pid comm env
    while [ "$p" -gt 1 ] 2>/dev/null; do
        p="$(awk '/^PPid:/{print $2}' "/proc/$p/status" 2>/dev/null)" || break
        [ -n "$p" ] || break
        self_chain+="$p "
    done
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        case "$self_chain" in *" $pid "*) continue ;; esac
        env="$(tr '\0' '\n' 2>/dev/null <"$d/environ")" || continue
        grep -qxF "SLURM_CONF=$CONF" <<<"$env" || continue
        comm="$(cat 2>/dev/null <"$d/comm")"
        case "$comm" in
            slurmctld|slurmd|slurmstepd) echo "$pid" ;;
            *) grep -q '^SLURM_JOB_ID=' <<<"$env" && echo "$pid" ;;
        esac
    done
}

port_in_use() {  # port -> 0 if something listens on 127.0.0.1/0.0.0.0:port
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

sinfo_states() {  # "node1 idle" lines; empty on failure
    timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u
}

is_up() {  # both nodes known to a responding controller and not down/unknown
    [ -f "$CONF" ] || return 1
    pid_alive "$(pidfile_pid "$STATE_DIR/run/slurmctld.pid")" || return 1
    local n st
    for n in "${NODES[@]}"; do
        pid_alive "$(pidfile_pid "$STATE_DIR/run/slurmd-$n.pid")" || return 1
    done
    st="$(sinfo_states)"
    for n in "${NODES[@]}"; do
        grep -Eq "^$n (idle|alloc|mix|comp)" <<<"$st" || return 1
    done
}

check_tools() {
    local t missing=()
    local tools=(slurmctld slurmd sinfo scontrol sbatch srun munged munge unmunge)
    [ -z "$NETLAB" ] || tools+=(ip nsenter unshare)
    for t in "${tools[@]}"; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: run scripts/install_system_deps.sh"
    [ "$(id -u)" -eq 0 ] || die "must run as root (SlurmUser=root, munge setup)"
}

# the lab's addresses and namespaces (netlab.sh's record); exits if it is not up
read_netlab() {
    [[ "$NETLAB" =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "SLURM_CLUSTER_NETLAB='$NETLAB' is not a netlab name"
    local rec="$NETLAB_DIR/$NETLAB.env" line key val nodes="" bridge_addr="" i ns
    local -a addr=()
    [ -f "$rec" ] || die "netlab $NETLAB is not up (no $rec): scripts/netlab.sh up --name $NETLAB"
    while IFS= read -r line; do
        key="${line%%=*}"; val="${line#*=}"
        case "$key" in
            NETLAB_NODES) nodes="$val" ;; NETLAB_BRIDGE_ADDR) bridge_addr="$val" ;;
            NETLAB_NODE1_ADDR) addr[0]="$val" ;; NETLAB_NODE2_ADDR) addr[1]="$val" ;;
        esac
    done <"$rec"
    [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 2 ] \
        || die "netlab $NETLAB has ${nodes:-no} node(s): the cluster needs 2 (netlab.sh up --nodes 2)"
    [ -n "$bridge_addr" ] && [ -n "${addr[0]:-}" ] && [ -n "${addr[1]:-}" ] \
        || die "cannot read $rec (NETLAB_BRIDGE_ADDR='$bridge_addr', NETLAB_NODE1_ADDR='${addr[0]:-}', NETLAB_NODE2_ADDR='${addr[1]:-}'): scripts/netlab.sh down, then up, --name $NETLAB"
    CTLD_ADDR="$bridge_addr"
    for i in 0 1; do
        ns="$NETLAB-n$((i + 1))"
        ip netns list 2>/dev/null | awk '{print $1}' | grep -xF "$ns" >/dev/null \
            || die "netlab $NETLAB has no namespace $ns: scripts/netlab.sh status --name $NETLAB"
        NODE_NS[$i]="$ns"
        NODE_ADDR[$i]="${addr[$i]}"  # the addresses netlab.sh gave its nodes (its record)
    done
}

# on_node NS cmd...: cmd in network namespace NS, /etc/netns/NS/hosts over /etc/hosts (if
# there) in a mount namespace of its own: `ip netns exec NS cmd` less its remount of /sys,
# which would hide /sys/fs/cgroup ("slurmd: error: No filesystem mounted on /sys/fs/cgroup").
on_node() {
    local ns="$1"; shift
    nsenter --net="/run/netns/$ns" -- unshare --mount --propagation slave -- \
        sh -c 'h="/etc/netns/$0/hosts"; if [ -f "$h" ]; then mount --bind "$h" /etc/hosts || exit 1; fi; exec "$@"' "$ns" "$@"
}

# ---------------------------------------------------------------------------------------
# munge
# ---------------------------------------------------------------------------------------
munge_ok() { timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then log "munge: already running"; return 0; fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
    chmod 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        log "munge: creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key --force >/dev/null 2>&1 || true
        fi
        [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    # a stale pid/socket from a killed munged makes the new one refuse to start
    local old; old="$(pidfile_pid /run/munge/munged.pid)"
    if ! pid_alive "$old"; then rm -f /run/munge/munged.pid /run/munge/munge.socket.2*; fi
    log "munge: starting munged as user munge"
    # stdio to /dev/null: a daemon must not hold the caller's pipe (`$(... up)` would hang);
    # 9>&-: nor the machine lock (a munged holding it would block every later up/down)
    timeout 15 su munge -s /bin/sh -c 'munged' </dev/null >>"$STATE_DIR/log/munged.out" 2>&1 9>&- \
        || timeout 15 su munge -s /bin/sh -c 'munged --force' </dev/null >>"$STATE_DIR/log/munged.out" 2>&1 9>&- \
        || true
    local i
    for i in $(seq 1 20); do
        if munge_ok; then
            pidfile_pid /run/munge/munged.pid >"$MACHINE_DIR/munged.started-by-us" || true
            log "munge: ok"; return 0
        fi
        sleep 0.5
    done
    die "munged did not come up (see $STATE_DIR/log/munged.out, /var/log/munge/munged.log)"
}

user_entry() { echo "$MACHINE_DIR/users/$(printf %s "$STATE_DIR" | md5sum | cut -c1-16)"; }

# stop munged if one of these clusters started it and the last of them goes down
stop_munge_if_ours() {
    local f="$MACHINE_DIR/munged.started-by-us" pid u users=()
    rm -f "$(user_entry)"
    for u in "$MACHINE_DIR"/users/*; do
        [ -f "$u" ] || continue
        # a cluster whose state dir is gone (removed by hand), or whose slurmctld is dead
        # (killed with its test run) and which is not just coming up (its entry is written
        # before its daemons start), no longer needs munge
        if [ -f "$(cat "$u")/$MARKER" ] && { pid_alive "$(pidfile_pid "$(cat "$u")/run/slurmctld.pid")" \
                || [ -n "$(find "$u" -mmin -5)" ]; }; then
            users+=("$(cat "$u")")
        else
            rm -f "$u"
        fi
    done
    if [ ${#users[@]} -gt 0 ]; then
        [ -f "$f" ] && log "munge: left running for ${#users[@]} other cluster(s): ${users[*]}"
        return 0
    fi
    [ -f "$f" ] || return 0
    pid="$(pidfile_pid "$f")"
    if pid_alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ]; then
        log "munge: stopping munged (pid $pid, started by up)"
        kill "$pid" 2>/dev/null
        local i; for i in $(seq 1 20); do pid_alive "$pid" || break; sleep 0.25; done
        pid_alive "$pid" && kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$f"
}

machine_locked() {  # run "$@" holding the machine lock (bounded wait); returns its status
    mkdir -p "$MACHINE_DIR/users" || die "cannot create $MACHINE_DIR"
    ( flock -w 60 9 || die "no lock on $MACHINE_DIR/lock within 60 s"; "$@" ) 9>"$MACHINE_DIR/lock"
}

setup_machine() {  # the shared part of `up`: munged, node names; this cluster counted as a user
    start_munge
    [ -n "$NETLAB" ] || ensure_hosts  # on a lab, the nodes' names are the lab's hosts files
    echo "$STATE_DIR" >"$(user_entry)"
}

# ---------------------------------------------------------------------------------------
# /etc/hosts
# ---------------------------------------------------------------------------------------
append_hosts() {  # append, never rewrite: /etc/hosts is often a bind mount (sed -i fails there)
    local nl=""
    [ -s /etc/hosts ] && [ "$(tail -c1 /etc/hosts | od -An -c | tr -d ' ')" != '\n' ] && nl=$'\n'
    printf '%s%s  # added by ddp_lab scripts/slurm_cluster.sh\n' "$nl" "$1" >>/etc/hosts
}

ensure_hosts() {
    local n missing=()
    for n in "${NODES[@]}"; do
        getent hosts "$n" 2>/dev/null | grep '^127\.0\.0\.1\b' >/dev/null || missing+=("$n")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    for n in "${missing[@]}"; do
        getent hosts "$n" >/dev/null 2>&1 && die "$n resolves to something other than 127.0.0.1 ($(getent hosts "$n")); fix /etc/hosts"
    done
    log "adding '127.0.0.1 ${missing[*]}' to /etc/hosts"
    append_hosts "127.0.0.1 ${missing[*]}" || die "cannot write /etc/hosts; add '127.0.0.1 ${NODES[*]}' yourself"
}

# ---------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------
write_conf() {
    local host; host="$(hostname -s)"
    [ -n "$host" ] || die "hostname -s is empty"
    getent hosts "$host" >/dev/null 2>&1 || {
        log "adding '127.0.0.1 $host' to /etc/hosts (own hostname did not resolve)"
        append_hosts "127.0.0.1 $host" || true
    }
    mkdir -p "$STATE_DIR"/{log,run,state,spool}
    cat >"$CONF" <<EOF
# generated by ddp_lab scripts/slurm_cluster.sh -- 2 virtual nodes $([ -n "$NETLAB" ] && echo "in netlab $NETLAB's namespaces ${NODE_NS[*]}" || echo "on loopback")
ClusterName=ddplab
SlurmctldHost=$host($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=${NODE_PORT[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=5
StateSaveLocation=$STATE_DIR/state
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$STATE_DIR/run/slurmctld.pid
SlurmdPidFile=$STATE_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=node1 NodeHostname=$host NodeAddr=${NODE_ADDR[0]} Port=${NODE_PORT[0]} CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=node2 NodeHostname=$host NodeAddr=${NODE_ADDR[1]} Port=${NODE_PORT[1]} CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    local n
    for n in "${NODES[@]}"; do mkdir -p "$STATE_DIR/spool/$n"; done
    # slurmstepd puts unix sockets "<spool>/<node>_<jobid>.<stepid>" there: max 107 bytes
    local sock="$STATE_DIR/spool/node1/node1_4294967294.4294967294"
    [ ${#sock} -le 107 ] || die "STATE_DIR too long for unix sockets (${#sock} > 107): use a shorter path"
}

# ---------------------------------------------------------------------------------------
# up / down / status
# ---------------------------------------------------------------------------------------
kill_pids() {  # pids... ; TERM, wait up to 5 s, KILL
    local p alive i
    [ $# -gt 0 ] || return 0
    kill "$@" 2>/dev/null
    for i in $(seq 1 20); do
        alive=0
        for p in "$@"; do pid_alive "$p" && alive=1; done
        [ $alive -eq 0 ] && return 0
        sleep 0.25
    done
    kill -9 "$@" 2>/dev/null
    sleep 0.2
}

do_down() {
    if [ ! -d "$STATE_DIR" ]; then
        log "down: nothing at $STATE_DIR (not up)"
        return 0
    fi
    if [ ! -f "$STATE_DIR/$MARKER" ] && [ -n "$(ls -A "$STATE_DIR" 2>/dev/null)" ]; then
        die "$STATE_DIR is not a slurm_cluster state dir (no $MARKER); refusing to touch it"
    fi
    local t0=$SECONDS pids p
    if [ -f "$CONF" ] && pid_alive "$(pidfile_pid "$STATE_DIR/run/slurmctld.pid")"; then
        local jobs; jobs="$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')"
        if [ -n "${jobs// /}" ]; then
            log "down: cancelling jobs $jobs"
            timeout 10 scancel $jobs 2>/dev/null || true
            for _ in $(seq 1 20); do
                [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
                sleep 0.5
            done
        fi
        log "down: scontrol shutdown"
        timeout 15 scontrol shutdown >/dev/null 2>&1 || log "down: scontrol shutdown failed (killing)"
    fi
    # wait (bounded) for daemons to exit by themselves
    local daemon_pids=()
    for f in "$STATE_DIR"/run/*.pid; do
        [ -f "$f" ] || continue
        p="$(pidfile_pid "$f")"
        pid_alive "$p" || continue
        case "$(cat "/proc/$p/comm" 2>/dev/null)" in slurmctld|slurmd) daemon_pids+=("$p") ;; esac
    done
    for _ in $(seq 1 40); do
        local alive=0
        for p in "${daemon_pids[@]}"; do pid_alive "$p" && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.25
    done
    # leftovers: daemons that did not exit, slurmstepd, job processes of this cluster
    pids="$( { for p in "${daemon_pids[@]}"; do pid_alive "$p" && echo "$p"; done; cluster_pids; } | sort -u)"
    if [ -n "$pids" ]; then
        log "down: killing leftovers: $(echo $pids)"
        kill_pids $pids
    fi
    machine_locked stop_munge_if_ours
    if [ "${SLURM_CLUSTER_KEEP_STATE:-0}" = 1 ]; then
        log "down: keeping $STATE_DIR (SLURM_CLUSTER_KEEP_STATE=1)"
        rm -f "$STATE_DIR"/run/*.pid
    else
        rm -rf -- "$STATE_DIR"
    fi
    log "down: done in $((SECONDS - t0)) s"
}

do_up() {
    check_tools
    local t0=$SECONDS
    if is_up; then
        log "up: already up ($STATE_DIR)"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    # start from an empty state folder (stale state/spool breaks restarts)
    if [ -d "$STATE_DIR" ]; then
        log "up: cleaning stale state in $STATE_DIR"
        do_down
    fi
    [ -z "$NETLAB" ] || read_netlab
    # another cluster (other STATE_DIR) or something else on our ports?
    local port
    for port in "$CTLD_PORT" "${NODE_PORT[@]}"; do
        port_in_use "$port" && die "port $port already in use: set SLURM_CLUSTER_CTLD_PORT / SLURM_CLUSTER_NODE_PORTS to free ones (or run 'down' on the STATE_DIR of the cluster using it)"
    done
    mkdir -p "$STATE_DIR"/{log,run} || die "cannot create $STATE_DIR"
    touch "$STATE_DIR/$MARKER"
    machine_locked setup_machine || { do_down; die "machine setup (munge, /etc/hosts) failed"; }
    write_conf

    log "up: starting slurmctld"
    # -c: cold start (no old jobs/nodes); stdio detached so `$(... up)` never hangs
    timeout 30 slurmctld -c -f "$CONF" </dev/null >>"$STATE_DIR/log/slurmctld.out" 2>&1 \
        || { tail -20 "$STATE_DIR/log/slurmctld.log" "$STATE_DIR/log/slurmctld.out" >&2 2>/dev/null; do_down; die "slurmctld failed to start"; }
    local i
    for i in $(seq 1 40); do
        timeout 5 scontrol ping 2>/dev/null | grep 'is UP' >/dev/null && break
        sleep 0.25
    done
    local n i
    for i in 0 1; do
        n="${NODES[$i]}"
        local on=()  # on a lab: in the node's network namespace (and its /etc/hosts)
        [ -n "${NODE_NS[$i]}" ] && on=(on_node "${NODE_NS[$i]}")
        log "up: starting ${on[*]}${on[*]:+ }slurmd -N $n"
        "${on[@]}" timeout 30 slurmd -N "$n" -f "$CONF" </dev/null >>"$STATE_DIR/log/slurmd-$n.out" 2>&1 \
            || { tail -20 "$STATE_DIR/log/slurmd-$n.log" >&2 2>/dev/null; do_down; die "slurmd -N $n failed to start"; }
    done

    local deadline=$((SECONDS + UP_TIMEOUT)) st="" resumed=0
    while [ $SECONDS -lt $deadline ]; do
        st="$(sinfo_states)"
        if grep -q '^node1 idle' <<<"$st" && grep -q '^node2 idle' <<<"$st"; then
            log "up: node1, node2 idle after $((SECONDS - t0)) s$([ -n "$NETLAB" ] && echo " (in netlab $NETLAB: ${NODE_ADDR[*]}, slurmctld at $CTLD_ADDR:$CTLD_PORT)")"
            echo "export SLURM_CONF=$CONF"
            return 0
        fi
        # nodes registering as down/drained (e.g. after an unclean restart): resume once
        if [ $resumed -eq 0 ] && grep -Eq '^node[12] (down|drain|drng)' <<<"$st"; then
            timeout 10 scontrol update nodename=node1,node2 state=resume >/dev/null 2>&1 || true
            resumed=1
        fi
        sleep 0.5
    done
    log "up: nodes not idle within ${UP_TIMEOUT} s; sinfo says: $(echo $st)"
    tail -5 "$STATE_DIR"/log/*.log >&2 2>/dev/null
    SLURM_CLUSTER_KEEP_STATE=1 do_down
    die "cluster did not come up (logs kept in $STATE_DIR/log)"
}

do_status() {
    if is_up; then
        echo "up: $STATE_DIR" >&2
        echo "export SLURM_CONF=$CONF" >&2
        timeout 10 sinfo >&2 2>/dev/null
        timeout 10 squeue >&2 2>/dev/null
        return 0
    fi
    local p any=0 f
    for f in "$STATE_DIR"/run/*.pid; do
        [ -f "$f" ] || continue
        p="$(pidfile_pid "$f")"
        pid_alive "$p" && { any=1; log "status: $(basename "$f" .pid) running (pid $p)"; }
    done
    if [ $any -eq 1 ]; then echo "partially up: $STATE_DIR (run 'down' then 'up')" >&2
    else echo "down: $STATE_DIR" >&2; fi
    return 1
}

case "$CMD" in
    up) do_up ;;
    down) do_down ;;
    status) do_status ;;
    *) usage ;;
esac
