# tests/netns/lib.sh: sourced. N "hosts" on this machine, each a network
# namespace with one link (eth0, SUBNET.(I+1)/24) to a bridge that lives in
# a namespace of its own, so the main namespace gets no interface, address
# or route of the test's except a blackhole route for SUBNET.0/24: traffic
# to a test address can only ever leave from inside a namespace (without
# it, the main namespace would send such packets out of its default route).
# A host's incoming link can be made slow (nfq_delay, a netfilter-queue
# helper: this kernel has no tc netem) and lossy (iptables' statistic match).
#
#   source tests/netns/lib.sh
#   trap 'nn_down' EXIT; trap 'exit 143' TERM; trap 'exit 130' INT
#   nn_up 10.200.0 4 || { echo "skip: $NN_WHY"; exit 0; }   # rc 2: unsupported here
#   nn_exec 1 downpour-ps ...            # runs in host 1 (address $(nn_addr 1))
#   nn_delay 3 40 5; nn_loss 3 0.02      # host 3: +40..45 ms in, 2% dropped
#   nn_down                              # everything gone (safe to call twice)
#
# Run nn_delay and nn_bg in the test's own shell, never in $(...) or a pipe:
# their helpers die with the shell that started them (PR_SET_PDEATHSIG).
# Namespaces are named dpn<octet>-<pid>-h<I> (and -sw for the bridge):
# nn_up first removes those whose test process is gone (a run killed with
# SIGKILL), with the processes still inside them.
# shellcheck shell=bash

NN_NAMES=()  # namespaces made by nn_up, the bridge's first
NN_PIDS=()   # helpers (nfq_delay) and processes started with nn_bg
NN_STARTED=() # the same, never cleared: nn_leftovers checks they are gone
NN_NET=""    # SUBNET.0/24 while its blackhole route is ours
NN_SUBNET="" # the first three octets
NN_WHY=""    # why the last nn_* call failed, one line
NN_NFQ=${NN_NFQ:-${BIN:-$PWD/build}/tests/nfq_delay}
NN_IPT=""    # iptables-legacy if present (the NFQUEUE target without nft_queue), else iptables
NN_NEXT_QUEUE=1
NN_FILES=()  # files of the helpers (their stderr), removed by nn_down

# s_nn_try CMD...: run CMD; when it fails NN_WHY names it and quotes what it
# said (the actual refusal: a missing capability, module or package).
s_nn_try() {
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    [ $rc = 0 ] && return 0
    NN_WHY="\`$*\` failed (status $rc): ${out:-no output}"
    NN_WHY=${NN_WHY//$'\n'/ }
    return 1
}

nn_name() { echo "dpn${NN_SUBNET##*.}-$$-h$1"; }
nn_addr() { echo "$NN_SUBNET.$(($1 + 1))"; }
nn_netns() { echo "/run/netns/$(nn_name "$1")"; }
# nn_exec I CMD...: CMD in host I's network namespace (nsenter, not
# `ip netns exec`, which remounts /sys and breaks daemons such as slurmd).
nn_exec() { local i=$1; shift; nsenter --net="$(nn_netns "$i")" -- "$@"; }
# nn_bg I CMD...: the same in the background, killed by nn_down; sets NN_LAST_PID.
nn_bg() { local i=$1; shift; nsenter --net="$(nn_netns "$i")" -- "$@" & NN_LAST_PID=$!; NN_PIDS+=("$NN_LAST_PID"); NN_STARTED+=("$NN_LAST_PID"); }

# Remove namespaces of earlier runs whose process is gone, and the processes
# left inside them (only ours: they are in a namespace named after a run).
nn_reap_stale() {
    local ns pid p
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^dpn[0-9]+-[0-9]+-(h[0-9]+|sw)$'); do
        pid=${ns#dpn*-}; pid=${pid%%-*}
        kill -0 "$pid" 2>/dev/null && continue
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
}

# The blackhole route for SUBNET.0/24. A subnet this machine reaches by any
# route but the default one (an address, a LAN, a VPN) is refused, not shadowed.
s_nn_blackhole() {
    local net=$NN_SUBNET.0/24 routes live
    routes=$(ip -4 route show match "$NN_SUBNET.1" | grep -v '^default' | xargs) # one line, no trailing blank
    if [ "$routes" = "blackhole $net" ]; then
        live=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^dpn${NN_SUBNET##*.}-")
        [ "$live" = 0 ] || { NN_WHY="$net is taken by another test run (its namespaces exist)"; return 1; }
        ip route del blackhole "$net" # left by a run that was killed
    elif [ -n "$routes" ]; then
        NN_WHY="$net is routed on this machine ($routes): pick another subnet"; return 1
    fi
    s_nn_try ip route add blackhole "$net" || return 1
    NN_NET=$net
}

# One host: namespace, veth pair (eth0 inside, v<I> on the bridge), address.
s_nn_host() {
    local i=$1 sw=${NN_NAMES[0]} ns
    ns=$(nn_name "$i")
    s_nn_try ip netns add "$ns" || return 2
    NN_NAMES+=("$ns")
    s_nn_try ip -n "$ns" link set lo up || return 1
    s_nn_try ip -n "$sw" link add "v$i" type veth peer name eth0 netns "$ns" || return 2
    ip -n "$sw" link set "v$i" master br0 up &&
        ip -n "$ns" addr add "$(nn_addr "$i")/24" dev eth0 &&
        ip -n "$ns" link set eth0 up || { NN_WHY="configuring host $i's link"; return 1; }
}

# nn_up SUBNET N: hosts 0..N-1 at SUBNET.1 .. SUBNET.N. 0 when up; 2 when
# this machine cannot (NN_WHY says why: the test skips); 1 on other errors.
# Either way nn_down removes what was made.
nn_up() {
    NN_SUBNET=$1
    local n=$2 i rc sw
    [ "$(id -u)" = 0 ] || { NN_WHY="network namespaces need root"; return 2; }
    command -v ip >/dev/null && command -v nsenter >/dev/null || { NN_WHY="needs ip (iproute2) and nsenter (util-linux)"; return 2; }
    nn_reap_stale
    s_nn_blackhole || return 2
    sw="dpn${NN_SUBNET##*.}-$$-sw"
    s_nn_try ip netns add "$sw" || return 2
    NN_NAMES+=("$sw")
    s_nn_try ip -n "$sw" link add br0 type bridge || return 2
    ip -n "$sw" link set br0 up || { NN_WHY="bridge up"; return 1; }
    for ((i = 0; i < n; i++)); do
        s_nn_host "$i" || { rc=$?; return $rc; }
    done
    # Both links up takes a moment (the bridge's port state): wait for a path.
    nn_wait_link 0 "$((n - 1))"
}

# nn_wait_link I J: host I reaches host J, at most ~5 s (the bridge's ports
# take a moment). A refused connection to port 9 proves the path too.
nn_wait_link() {
    local t out
    for ((t = 0; t < 50; t++)); do
        out=$(nn_exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$(nn_addr "$2")/9" 2>&1) && return 0
        case $out in *refused*) return 0 ;; esac
        sleep 0.1
    done
    NN_WHY="host $1 cannot reach host $2 over the bridge"
    return 1
}

# The iptables that has the NFQUEUE target here (nf_tables may lack nft_queue).
s_nn_iptables() {
    [ -n "$NN_IPT" ] && return 0
    local c
    for c in iptables-legacy iptables; do
        command -v "$c" >/dev/null && { NN_IPT=$c; return 0; }
    done
    NN_WHY="no iptables (Debian's iptables package)"
    return 2
}

# nn_loss I FRACTION: drop FRACTION (0.02 = 2%) of what reaches host I's eth0.
nn_loss() {
    s_nn_iptables || return
    s_nn_try nn_exec "$1" "$NN_IPT" -I INPUT 1 -i eth0 -m statistic --mode random --probability "$2" -j DROP || return 2
}

# nn_delay I MS [JITTER_MS]: hold what reaches host I's eth0 MS (+0..JITTER)
# ms. Starts the helper, waits until it has bound its queue, then adds the
# rule (--queue-bypass: no helper, no delay, never a black hole).
nn_delay() {
    local i=$1 ms=$2 jit=${3:-0} q=$NN_NEXT_QUEUE t ready
    [ -x "$NN_NFQ" ] || { NN_WHY="$NN_NFQ not built (needs libnetfilter-queue-dev)"; return 2; }
    s_nn_iptables || return
    NN_NEXT_QUEUE=$((q + 1))
    ready=$(mktemp -u /tmp/downpour-nfq.XXXXXX)
    nn_bg "$i" "$NN_NFQ" --queue "$q" --delay-ms "$ms" --jitter-ms "$jit" --ready-file "$ready" 2>"$ready.err"
    for ((t = 0; t < 50; t++)); do
        [ -s "$ready" ] && break
        kill -0 "$NN_LAST_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ ! -s "$ready" ]; then
        NN_WHY="$NN_NFQ --queue $q did not bind its queue in 5 s: $(tail -2 "$ready.err" 2>/dev/null | tr '\n' ' ')"
        rm -f "$ready" "$ready.err"
        return 2
    fi
    rm -f "$ready"
    NN_FILES+=("$ready.err") # its stderr from now on: removed by nn_down
    s_nn_try nn_exec "$i" "$NN_IPT" -A INPUT -i eth0 -j NFQUEUE --queue-num "$q" --queue-bypass || return 2
}

# nn_down: helpers stopped (TERM, then KILL), namespaces deleted (their
# links, bridge and iptables rules go with them), the blackhole route
# removed. Safe to call twice, and after a partial nn_up.
nn_down() {
    local p ns t alive
    for p in "${NN_PIDS[@]+"${NN_PIDS[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
    for ((t = 0; t < 20; t++)); do
        alive=0
        for p in "${NN_PIDS[@]+"${NN_PIDS[@]}"}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${NN_PIDS[@]+"${NN_PIDS[@]}"}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    NN_PIDS=()
    # Anything else still inside (a daemon the test forgot) would keep the
    # namespace alive after its name is gone.
    for ns in "${NN_NAMES[@]+"${NN_NAMES[@]}"}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    NN_NAMES=()
    rm -f "${NN_FILES[@]+"${NN_FILES[@]}"}"
    NN_FILES=()
    if [ -n "$NN_NET" ]; then ip route del blackhole "$NN_NET" 2>/dev/null; NN_NET=""; fi
    return 0
}

# nn_leftovers: prints what this process left behind (nothing when clean):
# its namespaces, its blackhole route, processes it started still running.
nn_leftovers() {
    local p
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^dpn[0-9]+-$$-" || true
    [ -z "$NN_SUBNET" ] || ip -4 route list exact "$NN_SUBNET.0/24"
    for p in "${NN_STARTED[@]+"${NN_STARTED[@]}"}"; do
        [ -e "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && echo "pid $p"
    done
    return 0
}
