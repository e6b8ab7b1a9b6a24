#!/usr/bin/env bash
# A cluster on one machine with a real interconnect: N network namespaces ("nodes"), each
# joined by a veth pair to a bridge in the root namespace, each link shaped to a rate.
#
#   scripts/netlab.sh up     [--nodes N] [--link RATE] [--name NAME]   make it; prints the nodes
#   scripts/netlab.sh down   [--name NAME]    kill what runs in its nodes, remove everything
#   scripts/netlab.sh status [--name NAME]    exit 0 if up (prints the nodes), 1 if not
#   scripts/netlab.sh shape  --link RATE|none [--node I] [--name NAME]   change a live lab's
#                                             rate (--node: node I's link only); what runs in
#                                             its nodes keeps running
#
#   --nodes N     nodes, 1..253 (default 2)
#   --link RATE   a tc rate each way of every node's link (200mbit, 1gbit, 25mbps = 25 MB/s);
#                 `none` (the default) leaves the links unshaped (veth speed, ~2 GB/s here)
#   --name NAME   1-10 characters [a-z0-9], starting with a letter (default netlab): two labs
#                 with different names never collide (interfaces, namespaces, addresses)
#   --node I      (shape only) node I's link alone, e.g. one slow node among fast ones; the
#                 record keeps the lab's NETLAB_LINK and adds NETLAB_LINK_NODE<I>=RATE; a
#                 `shape` without --node sets every link again and drops those lines
#
# stdout of `up` and `status`: one line per node, space separated, nothing else:
#   NODE NAMESPACE ADDRESS IFNAME          e.g.   node1 netlab-n1 198.18.0.2 eth0
# Run a command on a node with `ip netns exec NAMESPACE cmd ...`; a process there sees `lo`
# (the ranks of one node talk over it) and IFNAME, its uplink.  IFNAME is eth0 on every node,
# as on a real cluster.
#
# Names, as on a real cluster: `up` writes /etc/netns/NAMESPACE/hosts, which `ip netns exec`
# binds over /etc/hosts for what runs on that node: node1..nodeN are the nodes' addresses and
# the machine's hostname (shared by every node: only the network is namespaced) is THAT
# node's own address.  So `node1` names the rendezvous host, and gloo (which uses the address
# the hostname resolves to) picks the uplink with no GLOO_SOCKET_IFNAME; `down` removes it.
#
# Addresses come only from the benchmarking range 198.18.0.0/15, one /24 per NAME: the bridge
# (NAME-br, in the root namespace, where e.g. slurmctld runs) is .1, node i is .(i+1).  The
# /24s in use are recorded under /run/ddp_lab_netlab/ (NAME.env: the lab's config in shell
# syntax, e.g. NETLAB_BRIDGE_ADDR, NETLAB_NODE<I>_ADDR, NETLAB_RATE_BYTES), read and written
# under its lock.
#
# Shaping: a tbf qdisc on both ends of every node's veth pair: eth0 inside the node shapes what
# the node sends, NAME-hI on the bridge what it receives.  Burst = 10 ms of the rate (at least
# 32 KiB), latency 50 ms: a long TCP transfer runs at the configured rate (200mbit: 24.2 MB/s
# of 25 measured, docs/network.md).  netem (delay, loss) does not exist in this kernel.
#
# Needs root, ip and tc (iproute2); installs nothing.  `up` on a lab already up with the same
# config prints its nodes again; `down` is idempotent and also cleans a half-made lab.
# Every wait is bounded; diagnostics go to stderr; a bad argument exits 2, a failure 1.
set -uo pipefail
# (so a pipe into grep reads to the end, `grep ... >/dev/null`: `grep -q` exits at the first
# match, and a writer still writing dies of SIGPIPE, which pipefail reports as the pipe's status)

MACHINE_DIR="/run/ddp_lab_netlab"
IFNAME="eth0"                  # the uplink's name inside every node
BURST_S_NUM=1; BURST_S_DEN=100 # burst = rate * 10 ms ...
MIN_BURST=32768                # ... but at least 32 KiB
LATENCY="50ms"
LOCK_WAIT_S=60

log() { echo "netlab: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
bad() { echo "netlab: $*" >&2; exit 2; }

usage() {
    echo "usage: $0 {up|down|status|shape} [--nodes N] [--link RATE|none] [--node I] [--name NAME]" >&2
    exit 2
}

# ---------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------
[ $# -ge 1 ] || usage
CMD="$1"; shift
case "$CMD" in up|down|status|shape) ;; -h|--help) usage ;; *) bad "unknown command '$CMD': use up, down, status or shape" ;; esac
NODES=2; LINK=none; NAME=netlab; GOT_NODES=0; GOT_LINK=0; SHAPE_NODE=
while [ $# -gt 0 ]; do
    opt="$1"; val=""
    case "$opt" in
        --*=*) val="${opt#*=}"; opt="${opt%%=*}" ;;
        --nodes|--link|--name|--node)
            [ $# -ge 2 ] || bad "$opt needs a value (e.g. $opt $(case $opt in --nodes|--node) echo 2;; --link) echo 200mbit;; *) echo netlab;; esac))"
            val="$2"; shift ;;
    esac
    case "$opt" in
        --nodes) NODES="$val"; GOT_NODES=1 ;;
        --link) LINK="$val"; GOT_LINK=1 ;;
        --name) NAME="$val" ;;
        --node) SHAPE_NODE="$val" ;;
        *) bad "unknown option '$opt': the options are --nodes N, --link RATE|none, --node I, --name NAME" ;;
    esac
    shift
done
[[ "$NAME" =~ ^[a-z][a-z0-9]{0,9}$ ]] \
    || bad "--name '$NAME': use 1-10 characters a-z 0-9, starting with a letter (interface names are limited to 15)"
if [ "$CMD" != up ]; then
    [ $GOT_NODES -eq 0 ] || bad "--nodes is for 'up' only: '$CMD' needs just --name (the lab remembers its nodes)"
    if [ "$CMD" = shape ]; then
        [ $GOT_LINK -eq 1 ] || bad "shape needs --link RATE|none (e.g. --link 200mbit)"
    else
        [ $GOT_LINK -eq 0 ] || bad "--link is for 'up' and 'shape' only: '$CMD' needs just --name (the lab remembers its link)"
    fi
fi
if [ -n "$SHAPE_NODE" ]; then
    [ "$CMD" = shape ] || bad "--node is for 'shape' only (one node's link: shape --node 2 --link 50mbit)"
    [[ "$SHAPE_NODE" =~ ^[0-9]+$ ]] && [ "$SHAPE_NODE" -ge 1 ] && [ "$SHAPE_NODE" -le 253 ] \
        || bad "--node '$SHAPE_NODE': use a node's number, 1 to 253 (node1 is 1)"
    SHAPE_NODE=$((10#$SHAPE_NODE))
fi
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 253 ] \
    || bad "--nodes '$NODES': use a whole number from 1 to 253 (one /24 per lab)"
NODES=$((10#$NODES))
[ -z "$LINK" ] && LINK=none
RATE_BYTES=0
if [ "$LINK" != none ]; then
    [[ "$LINK" =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$ ]] \
        || bad "--link '$LINK': use a tc rate such as 200mbit, 1gbit or 25mbps (bytes/s), or none"
    num="${BASH_REMATCH[1]}"; unit="${BASH_REMATCH[3]}"
    case "$unit" in  # tc's rate units are decimal (k = 1000); *bit is bits, *bps bytes
        bit) mult=0.125 ;; kbit) mult=125 ;; mbit) mult=125000 ;; gbit) mult=125000000 ;;
        tbit) mult=125000000000 ;; bps) mult=1 ;; kbps) mult=1000 ;; mbps) mult=1000000 ;;
        gbps) mult=1000000000 ;; tbps) mult=1000000000000 ;;
    esac
    RATE_BYTES="$(awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f", n * m }')"
    [ "$RATE_BYTES" -ge 1000 ] || bad "--link '$LINK' is below 1 KB/s: use a larger rate (e.g. 200mbit), or none"
fi

BURST=""  # tbf's burst in bytes; empty: unshaped
if [ "$RATE_BYTES" -gt 0 ]; then
    BURST=$((RATE_BYTES * BURST_S_NUM / BURST_S_DEN))
    [ $BURST -ge $MIN_BURST ] || BURST=$MIN_BURST
fi

BRIDGE="$NAME-br"
RECORD="$MACHINE_DIR/$NAME.env"
ETC_NETNS="/etc/netns"  # ip netns exec binds $ETC_NETNS/<ns>/hosts over /etc/hosts
ns_of() { echo "$NAME-n$1"; }     # node i's namespace
hostif_of() { echo "$NAME-h$1"; } # node i's veth end on the bridge

# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
check_tools() {
    local t missing=()
    for t in ip tc flock awk; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
    [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: install iproute2 (ip, tc) and util-linux (flock)"
    [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, veth pairs, qdiscs)"
}

# run a command; on failure show it and its stderr, return 1
must() {
    local err
    if ! err="$(timeout 20 "$@" 2>&1 >/dev/null)"; then
        log "failed: $* : $err"
        return 1
    fi
}

locked() {  # run "$@" holding the machine lock (bounded wait); returns its status
    mkdir -p "$MACHINE_DIR" || die "cannot create $MACHINE_DIR"
    ( flock -w "$LOCK_WAIT_S" 9 || die "no lock on $MACHINE_DIR/lock within $LOCK_WAIT_S s"; "$@" ) 9>"$MACHINE_DIR/lock"
}

our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-n[0-9]+\$"; }
our_links() {  # this lab's links in the root namespace: host veth ends, then the bridge
    ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' \
        | grep -E "^$NAME-(h[0-9]+|br)\$" | sort -r
}
our_etc() {  # this lab's per-node /etc folders (hosts files)
    local d
    for d in "$ETC_NETNS/$NAME"-n*; do
        [ -d "$d" ] && [[ "${d##*/}" =~ ^$NAME-n[0-9]+$ ]] && echo "$d"
    done
}
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }
ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -xF "$1" >/dev/null; }

read_record() {  # REC_* from a record file; 1 if missing or unreadable
    local f="$1" line key val
    REC_NODES=""; REC_LINK=""; REC_INDEX=""; REC_NAME=""
    [ -f "$f" ] || return 1
    while IFS= read -r line; do
        key="${line%%=*}"; val="${line#*=}"
        case "$key" in
            NETLAB_NAME) REC_NAME="$val" ;; NETLAB_NODES) REC_NODES="$val" ;;
            NETLAB_LINK) REC_LINK="$val" ;; NETLAB_INDEX) REC_INDEX="$val" ;;
        esac
    done <"$f"
    [[ "$REC_INDEX" =~ ^[0-9]+$ ]] && [[ "$REC_NODES" =~ ^[0-9]+$ ]]
}

# /24 number k (0..511) of 198.18.0.0/15 -> "198.18.k.0" prefix parts
net_prefix() { echo "198.$((18 + $1 / 256)).$(($1 % 256))"; }

node_addr() { echo "$2.$(($1 + 1))"; }  # i prefix -> node i's address (the bridge is .1)

node_line() {  # i prefix -> the stdout line of node i
    echo "node$1 $(ns_of "$1") $(node_addr "$1" "$2") $IFNAME"
}

is_up() {  # the record's lab is fully there: bridge, every namespace and veth, uplinks up
    read_record "$RECORD" || return 1
    link_exists "$BRIDGE" || return 1
    local i
    for i in $(seq 1 "$REC_NODES"); do
        ns_exists "$(ns_of "$i")" || return 1
        link_exists "$(hostif_of "$i")" || return 1
        ip -n "$(ns_of "$i")" link show dev "$IFNAME" 2>/dev/null | grep 'state UP' >/dev/null || return 1
    done
}

pid_alive() {  # exists and is not a zombie
    kill -0 "$1" 2>/dev/null || return 1
    [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

wait_gone() {  # PIDS TRIES PAUSE: 0 once every pid has ended, 1 if some live after TRIES waits
    local pids="$1" tries="$2" pause="$3" p i alive
    for i in $(seq 1 "$tries"); do
        alive=0
        for p in $pids; do pid_alive "$p" && alive=1; done
        [ $alive -eq 0 ] && return 0
        sleep "$pause"
    done
    return 1
}

kill_in_namespace() {  # TERM every process in namespace $1, wait up to 5 s, then KILL
    local ns="$1" pids
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    [ -n "${pids// /}" ] || return 0
    log "down: killing the processes in $ns: $pids"
    kill $pids 2>/dev/null
    wait_gone "$pids" 20 0.25 && return 0
    kill -9 $pids 2>/dev/null
    wait_gone "$pids" 20 0.1 && return 0
    log "down: still alive after SIGKILL in $ns: $pids"
}

write_record() {  # index nodes: the lab's record, with the current LINK (a new file, then mv)
    local k="$1" p i; p="$(net_prefix "$1")"
    { cat <<EOF
NETLAB_NAME=$NAME
NETLAB_NODES=$2
NETLAB_LINK=$LINK
NETLAB_RATE_BYTES=$RATE_BYTES
NETLAB_INDEX=$k
NETLAB_SUBNET=$p.0/24
NETLAB_BRIDGE=$BRIDGE
NETLAB_BRIDGE_ADDR=$p.1
NETLAB_IFNAME=$IFNAME
EOF
      for i in $(seq 1 "$2"); do echo "NETLAB_NODE${i}_ADDR=$(node_addr "$i" "$p")"; done
    } >"$RECORD.tmp" || return 1
    mv -f "$RECORD.tmp" "$RECORD"
}

write_hosts() {  # i prefix: node i's /etc/hosts (its own address is also the machine's hostname)
    local i="$1" p="$2" j dir host short names
    dir="$ETC_NETNS/$(ns_of "$i")"
    host="$(hostname 2>/dev/null)"; short="${host%%.*}"
    mkdir -p "$dir" || { log "cannot create $dir"; return 1; }
    {
        echo "# node$i of netlab $NAME (scripts/netlab.sh): ip netns exec $(ns_of "$i") sees this as /etc/hosts"
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        for j in $(seq 1 "$NODES"); do
            names="node$j"
            if [ "$j" = "$i" ] && [ -n "$host" ]; then
                names+=" $host"; [ "$short" != "$host" ] && names+=" $short"
            fi
            echo "$(node_addr "$j" "$p") $names"
        done
    } >"$dir/hosts" || { log "cannot write $dir/hosts"; return 1; }
}

shape_dev() {  # dev [netns]: tbf at LINK on dev (in netns if given); LINK none: no qdisc
    if [ -n "$BURST" ]; then
        must tc ${2:+-n "$2"} qdisc replace dev "$1" root tbf rate "$LINK" burst "$BURST" latency "$LATENCY"
    elif tc ${2:+-n "$2"} qdisc show dev "$1" 2>/dev/null | grep '^qdisc tbf' >/dev/null; then
        must tc ${2:+-n "$2"} qdisc del dev "$1" root
    fi
}

# ---------------------------------------------------------------------------------------
# down / up / status / shape (all but status run under the machine lock)
# ---------------------------------------------------------------------------------------
down_locked() {
    local ns l found=0
    for ns in $(our_namespaces); do found=1; kill_in_namespace "$ns"; done
    # the host ends first: deleting one deletes its pair, even in a namespace something
    # still holds open (then `ip netns del` below frees only the name)
    for l in $(our_links); do
        found=1
        if ! ip link del dev "$l" 2>/dev/null && link_exists "$l"; then log "down: could not delete link $l"; fi
    done
    for ns in $(our_namespaces); do
        ip netns del "$ns" 2>/dev/null || log "down: could not delete namespace $ns"
    done
    for l in $(our_etc); do found=1; rm -rf -- "$l" || log "down: could not remove $l"; done
    rmdir "$ETC_NETNS" 2>/dev/null || true  # only when no other lab's is left there
    [ -f "$RECORD" ] && found=1
    rm -f "$RECORD"
    local left; left="$( { our_namespaces; our_links; our_etc; } | tr '\n' ' ')"
    [ -z "${left// /}" ] || { log "down: left behind: $left"; return 1; }
    if [ $found -eq 1 ]; then log "down: $NAME removed"; else log "down: nothing named $NAME (not up)"; fi
}

allocate_index() {  # the lowest /24 of 198.18.0.0/15 no other lab and no root-ns address uses
    local used=" " f k addr
    for f in "$MACHINE_DIR"/*.env; do
        [ -f "$f" ] && [ "$f" != "$RECORD" ] || continue
        if ! read_record "$f"; then log "up: ignoring unreadable record $f"; continue; fi
        # a record without its bridge and namespaces is a lab killed mid-way: free its /24
        if ! link_exists "$REC_NAME-br" && ! ip netns list 2>/dev/null | grep -E "^$REC_NAME-n[0-9]+( |\$)" >/dev/null; then
            log "up: removing the stale record $f (no bridge, no namespaces)"; rm -f "$f"; continue
        fi
        used+="$REC_INDEX "
    done
    for addr in $(ip -4 -o addr show 2>/dev/null | awk '{print $4}' | grep -E '^198\.1[89]\.'); do
        k="$(awk -F'[./]' '{print ($2 - 18) * 256 + $3}' <<<"$addr")"
        used+="$k "
    done
    for k in $(seq 0 511); do
        case "$used" in *" $k "*) continue ;; esac
        echo "$k"; return 0
    done
    return 1
}

up_locked() {
    if is_up; then
        if [ "$REC_NODES" = "$NODES" ] && [ "$REC_LINK" = "$LINK" ]; then
            log "up: $NAME already up ($NODES nodes, link $LINK)"
            local i p; p="$(net_prefix "$REC_INDEX")"
            for i in $(seq 1 "$NODES"); do node_line "$i" "$p"; done
            return 0
        fi
        log "ERROR: $NAME is already up with --nodes $REC_NODES --link $REC_LINK: run 'down --name $NAME' first, or choose another --name"
        return 3  # left as it is
    fi
    if [ -f "$RECORD" ] || [ -n "$( { our_namespaces; our_links; our_etc; } )" ]; then
        log "up: cleaning a half-made $NAME first"
        down_locked || die "could not clean the half-made $NAME"
    fi
    local k p i ns hif
    k="$(allocate_index)" || die "no free /24 left in 198.18.0.0/15 (512 labs up?): run 'down' on some"
    p="$(net_prefix "$k")"
    # the record first: a failure below leaves something `down` knows about
    write_record "$k" "$NODES" || return 1
    must ip link add "$BRIDGE" type bridge \
        && must ip addr add "$p.1/24" dev "$BRIDGE" \
        && must ip link set dev "$BRIDGE" up || return 1
    for i in $(seq 1 "$NODES"); do
        ns="$(ns_of "$i")"; hif="$(hostif_of "$i")"
        must ip netns add "$ns" \
            && must ip link add "$hif" type veth peer name "$IFNAME" netns "$ns" \
            && must ip link set dev "$hif" master "$BRIDGE" \
            && must ip link set dev "$hif" up \
            && must ip -n "$ns" link set dev lo up \
            && must ip -n "$ns" addr add "$(node_addr "$i" "$p")/24" dev "$IFNAME" \
            && must ip -n "$ns" link set dev "$IFNAME" up \
            && write_hosts "$i" "$p" \
            && { [ -z "$BURST" ] || { shape_dev "$IFNAME" "$ns" && shape_dev "$hif"; }; } || return 1
        # one address on the uplink (no IPv6 link-local): what gloo finds there is unambiguous
        ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$IFNAME.disable_ipv6=1" >/dev/null 2>&1 || true
    done
    local deadline=$((SECONDS + 10))
    until is_up; do
        [ $SECONDS -lt $deadline ] || { log "up: links not up within 10 s"; return 1; }
        sleep 0.1
    done
    log "up: $NAME: $NODES nodes on $p.0/24, bridge $BRIDGE $p.1, link $LINK$([ -n "$BURST" ] && echo " (tbf burst ${BURST}b latency $LATENCY, both ways)"), names in $ETC_NETNS/$NAME-nI/hosts"
    for i in $(seq 1 "$NODES"); do node_line "$i" "$p"; done
}

shape_node_locked() {  # node SHAPE_NODE's link alone to LINK; the record gets its line
    local ns; ns="$(ns_of "$SHAPE_NODE")"
    [ "$SHAPE_NODE" -le "$REC_NODES" ] || { log "ERROR: --node $SHAPE_NODE: $NAME has $REC_NODES nodes"; return 1; }
    shape_dev "$IFNAME" "$ns" && shape_dev "$(hostif_of "$SHAPE_NODE")" || return 1
    { grep -v "^NETLAB_LINK_NODE$SHAPE_NODE=" "$RECORD"; echo "NETLAB_LINK_NODE$SHAPE_NODE=$LINK"; } \
        >"$RECORD.tmp" && mv -f "$RECORD.tmp" "$RECORD" || return 1
    log "shape: $NAME: node$SHAPE_NODE's link -> $LINK (the others as they were)"
}

shape_locked() {  # a live lab's links to LINK, both ends of every node; the record follows
    is_up || { log "ERROR: $NAME is not up: 'up --name $NAME --link $LINK' makes it"; return 1; }
    [ -z "$SHAPE_NODE" ] || { shape_node_locked; return; }
    local i ns
    for i in $(seq 1 "$REC_NODES"); do
        ns="$(ns_of "$i")"
        shape_dev "$IFNAME" "$ns" && shape_dev "$(hostif_of "$i")" || return 1
    done
    write_record "$REC_INDEX" "$REC_NODES" || return 1
    log "shape: $NAME: link $REC_LINK -> $LINK$([ -n "$BURST" ] && echo " (tbf burst ${BURST}b latency $LATENCY, both ways)")"
}

do_shape() { check_tools; locked shape_locked || die "shape failed (run 'status --name $NAME')"; }

do_up() {
    check_tools
    # stdout only once everything is made: a failure prints no node lines
    local out rc
    out="$(locked up_locked)"; rc=$?
    [ $rc -eq 3 ] && exit 1
    if [ $rc -ne 0 ]; then
        locked down_locked >/dev/null || true
        die "up failed (nothing left behind)"
    fi
    printf '%s\n' "$out"
}

do_down() { check_tools; locked down_locked; }

do_status() {
    check_tools
    if is_up; then
        local p i; p="$(net_prefix "$REC_INDEX")"
        log "status: $NAME up: $REC_NODES nodes on $p.0/24, bridge $BRIDGE $p.1, link $REC_LINK ($RECORD)"
        for i in $(seq 1 "$REC_NODES"); do node_line "$i" "$p"; done
        return 0
    fi
    if [ -f "$RECORD" ] || [ -n "$( { our_namespaces; our_links; } )" ]; then
        log "status: $NAME partially up: run 'down --name $NAME' then 'up'"
    else
        log "status: $NAME down"
    fi
    return 1
}

case "$CMD" in
    up) do_up ;;
    down) do_down ;;
    status) do_status ;;
    shape) do_shape ;;
esac
