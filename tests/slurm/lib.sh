# tests/slurm/lib.sh: sourced. A throwaway SLURM cluster on this machine,
# started as root without systemd and without touching /etc: munged (as the
# munge user, its socket in a directory of the cluster's own, mode 0755),
# one slurmctld and one slurmd per node, all configured by one slurm.conf
# made from tests/slurm/slurm.conf.in; a node may live in a network
# namespace (tests/netns/lib.sh), which makes it a host of its own.
#
#   source tests/slurm/lib.sh
#   sl_init DIR || skip ...              # DIR: a fresh directory
#   sl_node n1 127.0.0.1                 # NAME ADDR [NETNS-PATH], before sl_conf
#   sl_conf CTLD_ADDR && sl_start [CTLD_NETNS]
#   sl_run [NETNS] sbatch ...            # a client, SLURM_CONF set
#   sl_stop                              # jobs cancelled, daemons stopped by pid file
#   sl_leftovers                         # prints any process still marked as ours
#
# Every process the cluster starts (daemons, step daemons, the job's tasks)
# inherits DP_SLURM_CLUSTER=DIR and DP_SLURM_OWNER=<the test's pid>, so
# sl_leftovers finds whatever survived sl_stop, and sl_init kills what a
# test killed outright (SIGKILL: no trap runs) left behind.
# shellcheck shell=bash

SL_DIR=""      # the cluster's directory (config, key, state, logs, pid files)
SL_NODES=()    # "NAME ADDR NETNS" per node (NETNS empty: this namespace)
SL_CPUS=${SL_CPUS:-8} # CPUs each node claims (config_overrides): tasks beyond the cores
SL_WHY=""      # why the last sl_* call failed, one line
SL_CTLD_NS=""

# sl_in NETNS CMD...: CMD in that network namespace (empty: here).
sl_in() {
    local ns=$1; shift
    if [ -n "$ns" ]; then nsenter --net="$ns" -- "$@"; else "$@"; fi
}

# sl_run NETNS CMD...: a SLURM client command against this cluster.
sl_run() { local ns=$1; shift; SLURM_CONF=$SL_DIR/slurm.conf DP_SLURM_CLUSTER=$SL_DIR DP_SLURM_OWNER=$$ sl_in "$ns" "$@"; }

# sl_reap_stale: kill what clusters of earlier runs left when their test
# was killed outright: processes with DP_SLURM_OWNER=PID in the environment,
# and step daemons (slurmd clears their environment) working in DIR/log of
# a cluster whose DIR/owner names that PID, when that PID is gone.
sl_reap_stale() {
    local f owner p dir
    # One grep over every environment: "/proc/PID/environ:DP_SLURM_OWNER=N".
    while IFS=: read -r f owner; do
        owner=${owner#DP_SLURM_OWNER=}
        p=${f#/proc/}; p=${p%/environ}
        kill -0 "$owner" 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done < <(grep -aozH '^DP_SLURM_OWNER=[0-9]*' /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n')
    for p in $(pgrep -x slurmstepd); do
        dir=$(readlink "/proc/$p/cwd" 2>/dev/null)
        [ "${dir##*/}" = log ] && owner=$(cat "${dir%/log}/owner" 2>/dev/null) || continue
        case $owner in '' | *[!0-9]*) continue ;; esac
        kill -0 "$owner" 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    return 0
}

# sl_init DIR: 0 when the daemons and clients are installed and DIR is set up.
sl_init() {
    local b
    for b in munged slurmctld slurmd sbatch srun scontrol setpriv; do
        command -v "$b" >/dev/null || { SL_WHY="$b not installed (Debian's slurmctld slurmd slurm-client munge: make deps-test)"; return 2; }
    done
    [ "$(id -u)" = 0 ] || { SL_WHY="the daemons need root"; return 2; }
    id munge >/dev/null 2>&1 || { SL_WHY="no munge user (Debian's munge package)"; return 2; }
    # slurmd loads its cgroup plugin whatever ProctrackType says (Slurm
    # 22.05): it needs a cgroup file system at /sys/fs/cgroup (a chroot or
    # container that does not mount one cannot run it).
    local fs; fs=$(stat -f -c %T /sys/fs/cgroup 2>&1)
    case $fs in
    cgroup2fs | tmpfs) ;;
    *) SL_WHY="\`stat -f /sys/fs/cgroup\` says '$fs', not a cgroup file system: slurmd cannot load its cgroup plugin"; return 2 ;;
    esac
    SL_DIR=$1
    SL_NODES=()
    sl_reap_stale
    # munged insists that no directory on its paths is writable by others.
    mkdir -p "$SL_DIR"/{munge,state,log,run,spool} && chmod 0755 "$SL_DIR" "$SL_DIR/munge" || return 1
    echo $$ >"$SL_DIR/owner"
    chown munge:munge "$SL_DIR/munge"
    head -c 1024 /dev/urandom >"$SL_DIR/munge/munge.key"
    chown munge:munge "$SL_DIR/munge/munge.key" && chmod 0400 "$SL_DIR/munge/munge.key"
    setpriv --reuid=munge --regid=munge --clear-groups test -r "$SL_DIR/munge/munge.key" ||
        { SL_WHY="the munge user cannot reach $SL_DIR (each directory above it needs mode o+x)"; return 1; }
}

# sl_node NAME ADDR [NETNS]: a node of the cluster, before sl_conf.
sl_node() { SL_NODES+=("$1 $2 ${3:-}"); }

# sl_conf CTLD_ADDR [PORT]: slurm.conf for the nodes given. The controller
# keeps this machine's host name (slurmctld checks it) at CTLD_ADDR.
sl_conf() {
    local addr=$1 port=${2:-$((20000 + RANDOM % 20000))} node name naddr nodes="" names=""
    for node in "${SL_NODES[@]}"; do
        read -r name naddr _ <<<"$node"
        nodes+="NodeName=$name NodeAddr=$naddr CPUs=$SL_CPUS RealMemory=1000 State=UNKNOWN"$'\n'
        names+="${names:+,}$name"
    done
    sed -e "s|@DIR@|$SL_DIR|g" -e "s|@CTLD_HOST@|$(hostname -s)|g" -e "s|@CTLD_ADDR@|$addr|g" \
        -e "s|@CTLD_PORT@|$port|g" -e "s|@SLURMD_PORT@|$((port + 1))|g" -e "s|@NODE_NAMES@|$names|g" \
        tests/slurm/slurm.conf.in >"$SL_DIR/slurm.conf" || return 1
    printf '%s' "$nodes" >>"$SL_DIR/slurm.conf"
}

# s_sl_wait_file FILE SECONDS: until FILE exists and is not empty.
s_sl_wait_file() {
    local t
    for ((t = 0; t < $2 * 10; t++)); do [ -s "$1" ] && return 0; sleep 0.1; done
    return 1
}

# s_sl_logs: the last lines of the daemons' logs, on one line (for SL_WHY).
s_sl_logs() {
    local f
    for f in "$SL_DIR"/munge/munged.log "$SL_DIR"/log/slurmctld.log "$SL_DIR"/log/slurmd-*.log; do
        [ -s "$f" ] && printf ' [%s: %s]' "${f##*/}" "$(tail -n 3 "$f" | tr '\n' ' ')"
    done
}

# s_sl_idle: 0 when every node is idle.
s_sl_idle() { [ "$(sl_run "$SL_CTLD_NS" sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle')" = "${#SL_NODES[@]}" ]; }

# sl_start [CTLD_NETNS]: munged, slurmctld (-c: no state of an earlier run),
# a slurmd per node (-N NAME); waits until every node is idle. Nothing here
# needs the host's name to resolve (a fresh chroot's /etc/hosts may not name
# it, and its resolver may time out; both tried: the cluster came up):
# munged's origin is the loopback address (no lookup of the name), the
# controller is reached at its address, and each step waits for the state
# it needs: slurmctld answering a ping before any slurmd starts, then every
# node idle, with a reconfigure (every slurmd registers again) when one is
# not after 10 s and 30 s. When it fails, SL_WHY carries the daemons' last
# log lines.
sl_start() {
    SL_CTLD_NS=${1:-}
    local d=$SL_DIR node name naddr ns t
    DP_SLURM_CLUSTER=$d DP_SLURM_OWNER=$$ setpriv --reuid=munge --regid=munge --init-groups munged --socket="$d/munge/munge.socket.2" \
        --origin=127.0.0.1 --key-file="$d/munge/munge.key" --pid-file="$d/munge/munged.pid" \
        --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed" ||
        { SL_WHY="munged did not start: $(tail -1 "$d/munge/munged.log" 2>/dev/null)"; return 1; }
    s_sl_wait_file "$d/munge/munged.pid" 10 || { SL_WHY="munged wrote no pid file"; return 1; }
    DP_SLURM_CLUSTER=$d DP_SLURM_OWNER=$$ sl_in "$SL_CTLD_NS" slurmctld -c -f "$d/slurm.conf" ||
        { SL_WHY="slurmctld did not start: $(tail -2 "$d/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"; return 1; }
    for ((t = 0; t < 600; t++)); do
        sl_run "$SL_CTLD_NS" timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break
        sleep 0.1
    done
    [ $t -lt 600 ] || { SL_WHY="slurmctld did not answer scontrol ping in 60 s:$(s_sl_logs)"; return 1; }
    for node in "${SL_NODES[@]}"; do
        read -r name naddr ns <<<"$node"
        DP_SLURM_CLUSTER=$d DP_SLURM_OWNER=$$ sl_in "$ns" slurmd -N "$name" -f "$d/slurm.conf" ||
            { SL_WHY="slurmd $name did not start: $(tail -2 "$d/log/slurmd-$name.log" 2>/dev/null | tr '\n' ' ')"; return 1; }
    done
    for ((t = 0; t < 600; t++)); do
        s_sl_idle && return 0
        # Not idle after 10 s, and again after 30: every slurmd registers anew.
        [ $t = 100 ] || [ $t = 300 ] && sl_run "$SL_CTLD_NS" timeout 10 scontrol reconfigure >/dev/null 2>&1
        sleep 0.1
    done
    SL_WHY="the nodes did not come up idle in 60 s: $(sl_run "$SL_CTLD_NS" sinfo -h -N -o '%N %T %E' 2>&1 | tr '\n' ';')$(s_sl_logs)"
    return 1
}

# s_sl_alive PID: running (a daemon's zombie, which this machine's init
# may take seconds to reap, counts as gone).
s_sl_alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# s_sl_kill_pidfiles FILE...: TERM to each, up to 5 s, then KILL; the files go.
s_sl_kill_pidfiles() {
    local f pid pids=() t alive
    for f in "$@"; do
        [ -s "$f" ] && pid=$(cat "$f") || continue
        rm -f "$f"
        case $pid in '' | *[!0-9]*) continue ;; esac
        kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    done
    for ((t = 0; t < 50; t++)); do
        alive=0
        for pid in "${pids[@]+"${pids[@]}"}"; do s_sl_alive "$pid" && alive=1; done
        [ $alive = 0 ] && return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
}

# sl_stop: the jobs cancelled, then the daemons stopped by their pid files
# (slurmds first, then slurmctld, then munged), then whatever still carries
# the cluster's mark. Safe to call twice.
sl_stop() {
    local d=$SL_DIR t
    [ -n "$d" ] || return 0
    if [ -s "$d/run/slurmctld.pid" ]; then
        sl_run "$SL_CTLD_NS" timeout 10 scancel --quiet --user=root 2>/dev/null
        for ((t = 0; t < 50; t++)); do
            [ -z "$(sl_run "$SL_CTLD_NS" timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    s_sl_kill_pidfiles "$d"/run/slurmd-*.pid
    s_sl_kill_pidfiles "$d/run/slurmctld.pid"
    s_sl_kill_pidfiles "$d/munge/munged.pid"
    sl_kill_leftovers
    return 0
}

# sl_leftovers: the pids of processes that carry the cluster's mark
# (DP_SLURM_CLUSTER=DIR in their environment, or a step daemon's working
# directory DIR/log), this shell's aside.
sl_leftovers() {
    local f p
    [ -n "$SL_DIR" ] || return 0
    for f in $(grep -alzxF "DP_SLURM_CLUSTER=$SL_DIR" /proc/[0-9]*/environ 2>/dev/null); do
        p=${f#/proc/}; p=${p%/environ}
        [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] || echo "$p"
    done
    for p in $(pgrep -x slurmstepd); do
        [ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$SL_DIR/log" ] && echo "$p"
    done
    return 0
}

sl_kill_leftovers() {
    local p
    for p in $(sl_leftovers); do kill -KILL "$p" 2>/dev/null; done
}
