#!/bin/bash
# Two builds of zerohop side by side on the hello chain: what a change costs.
#
#   bench/ab.sh OLD_DIR NEW_DIR [ROUNDS]
#
# Each DIR holds a build's `zerohop`, `upper` and `exclaim` (from `target/release`). Each round
# runs both builds, in the order old-new then new-old (ABBA, so that a drift of the machine
# falls on both): the chain comes up on a free port, answers one request, gets 1 s of warm-up,
# then wrk measures requests/s at 32 connections (5 s) and the latency at one connection (3 s).
# Prints each run and, at the end, the ratios new/old per round with their median and
# geometric mean: on a shared machine single runs swing, ratios of neighbours do much less.
# Needs wrk and curl; runs as root (the agent confines the instances).
#
# The same build twice compares two specs instead: AB_INSTANCES (default 1) instances of each
# function on both sides, and AB_OLD_SPEC / AB_NEW_SPEC add top-level lines to one side's
# spec. Core-affine pipelines against the same chain unpinned, on a 2-CPU machine:
#
#   AB_INSTANCES=2 AB_NEW_SPEC='cpus: "0-1"' bench/ab.sh target/release target/release
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 OLD_DIR NEW_DIR [ROUNDS]" >&2
    exit 2
fi
ROUNDS=${3:-10}
INSTANCES=${AB_INSTANCES:-1}
declare -A EXTRA=([old]=${AB_OLD_SPEC:-} [new]=${AB_NEW_SPEC:-})
for dir in "$1" "$2"; do
    for bin in zerohop upper exclaim; do
        [ -x "$dir/$bin" ] || { echo "$0: no executable $dir/$bin" >&2; exit 2; }
    done
done
for tool in wrk curl python3; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is needed (apt-get install $tool)" >&2; exit 2; }
done

work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && timeout 30 tail --pid="$pid" -f /dev/null
    rm -rf "$work"
}
trap cleanup EXIT
printf 'wrk.method = "POST"\nwrk.body = "hello world"\n' >"$work/post.lua"

declare -A DIR=([old]=$(realpath "$1") [new]=$(realpath "$2"))
for which in old new; do
    d=${DIR[$which]}
    cat >"$work/$which.yaml" <<EOF
name: ab-$which
pool: { slots: 1024, slot_size: 64KiB }
timeout: 10s
${EXTRA[$which]}
functions:
  upper:   { command: ["$d/upper"], instances: $INSTANCES }
  exclaim: { command: ["$d/exclaim"], instances: $INSTANCES }
routes:
  - http: POST /hello
    sequence: [upper, exclaim]
EOF
done

# One run of build `$1`: prints "BUILD RPS P50_US P99_US".
run() {
    local which=$1 port url rps lat
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    url=http://127.0.0.1:$port/hello
    "${DIR[$which]}/zerohop" up "$work/$which.yaml" --listen "127.0.0.1:$port" \
        >"$work/up.out" 2>"$work/up.err" &
    pid=$!
    local up=
    for _ in $(seq 1 100); do
        if curl -s -m 1 -d 'hello world' "$url" 2>/dev/null | grep -q 'HELLO WORLD!'; then
            up=1
            break
        fi
        sleep 0.1
    done
    if [ -z "$up" ]; then
        echo "$0: the $which build's chain did not answer within 10 s; its log:" >&2
        cat "$work/up.err" >&2
        exit 1
    fi
    wrk -t2 -c32 -d1s -s "$work/post.lua" "$url" >/dev/null 2>&1
    rps=$(wrk -t2 -c32 -d5s -s "$work/post.lua" "$url" 2>&1 | awk '/Requests\/sec/ { print $2 }')
    lat=$(wrk -t1 -c1 -d3s --latency -s "$work/post.lua" "$url" 2>&1 |
        awk '/^ +50%/ { a = $2 } /^ +99%/ { b = $2 } END { print a, b }')
    kill -TERM "$pid"
    timeout 30 tail --pid="$pid" -f /dev/null
    pid=
    echo "$which $rps $lat"
}

results=$work/results
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for which in $order; do
        run "$which" | tee -a "$results"
    done
done

python3 - "$results" <<'EOF'
import statistics, sys

def us(v):
    # wrk prints 95.00us, 1.20ms, 2.00s
    for unit, f in (("us", 1), ("ms", 1e3), ("s", 1e6)):
        if v.endswith(unit):
            return float(v[: -len(unit)]) * f
    return float(v)

rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
rps, p50 = [], []
for a, b in zip(rows[::2], rows[1::2]):
    old, new = (a, b) if a[0] == "old" else (b, a)
    rps.append(float(new[1]) / float(old[1]))
    p50.append(us(new[2]) / us(old[2]))
for name, r in (("requests/s at c=32", rps), ("p50 latency at c=1", p50)):
    print(f"new/old {name}: median {statistics.median(r):.3f}, geometric mean "
          f"{statistics.geometric_mean(r):.3f}, rounds {min(r):.3f}..{max(r):.3f}")
EOF
