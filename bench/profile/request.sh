#!/bin/bash
# Where one hello request's time goes (bench/README.md, "Where one request's time goes").
#
#   bench/profile/request.sh BIN_DIR OUT_DIR [CONNECTIONS] [SECONDS]
#
# BIN_DIR holds a build's `zerohop`, `upper` and `exclaim` (as for bench/ab.sh). Brings the
# hello chain up on a free port (one instance per function), then, under wrk with
# CONNECTIONS (32) keep-alive connections:
#   1. SECONDS (10) of load: CPU per request of each process (utime + stime from
#      /proc/PID/stat over the window, divided by the requests wrk counted) -> cpu.txt;
#   2. SECONDS more with `perf record -e cpu-clock --call-graph dwarf` on the three processes
#      for SECONDS - 2 -> perf.data, script.txt;
#   3. with WAKE=1, 2 s of sched_wakeup/sched_switch over the whole machine -> wake.txt, and
#      the wake-ups between the processes (wakeups.py) -> wakeups.md.
# Then buckets.py splits each process's CPU per request by component -> table.md.
# Needs wrk, curl, perf (apt-get install linux-perf), python3; runs as root (the agent
# confines the instances). Software events only: no hardware counters on this VM.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 BIN_DIR OUT_DIR [CONNECTIONS] [SECONDS]" >&2
    exit 2
fi
D=$(realpath "$1"); OUT=$(mkdir -p "$2" && realpath "$2"); C=${3:-32}; S=${4:-10}
HERE=$(dirname "$(realpath "$0")")
cat >"$OUT/chain.yaml" <<Y
name: profile
pool: { slots: 1024, slot_size: 64KiB }
timeout: 10s
functions:
  upper:   { command: ["$D/upper"], instances: 1 }
  exclaim: { command: ["$D/exclaim"], instances: 1 }
routes:
  - http: POST /hello
    sequence: [upper, exclaim]
Y
printf 'wrk.method = "POST"\nwrk.body = "hello world"\n' >"$OUT/post.lua"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port/hello
"$D/zerohop" up "$OUT/chain.yaml" --listen "127.0.0.1:$port" >"$OUT/up.out" 2>"$OUT/up.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; timeout 30 tail --pid=$pid -f /dev/null' EXIT
up=
for _ in $(seq 100); do
    if curl -s -m 1 -d 'hello world' "$url" | grep -q 'HELLO WORLD!'; then up=1; break; fi
    sleep 0.1
done
[ -n "$up" ] || { echo "$0: the chain did not answer; its log:" >&2; cat "$OUT/up.err" >&2; exit 1; }
# The instances: descendants of the zerohop process named upper and exclaim.
desc() { for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; desc "$c"; done; }
fu=; fe=
for p in $(desc $pid); do
    case $(cat /proc/"$p"/comm) in upper) fu=$p ;; exclaim) fe=$p ;; esac
done
echo "gateway $pid upper $fu exclaim $fe" >"$OUT/pids"
ticks() { awk '{ print $14 + $15 }' /proc/"$1"/stat; }
wrk -t1 -c"$C" -d1s -s "$OUT/post.lua" "$url" >/dev/null

# 1. CPU per request, nothing else attached.
g0=$(ticks $pid); u0=$(ticks $fu); e0=$(ticks $fe)
wrk -t1 -c"$C" -d"${S}s" --latency -s "$OUT/post.lua" "$url" >"$OUT/wrk.txt"
g1=$(ticks $pid); u1=$(ticks $fu); e1=$(ticks $fe)
n=$(awk '/requests in/ { print $1 }' "$OUT/wrk.txt")
hz=$(getconf CLK_TCK)
{
    echo "requests $n"
    python3 -c "
n, hz = $n, $hz
for name, t in (('gateway', $g1 - $g0), ('upper', $u1 - $u0), ('exclaim', $e1 - $e0)):
    print(f'{name}: {t / hz * 1e6 / n:.2f} us/request')"
} >"$OUT/cpu.txt"

# 2. The profile, in a second window.
wrk -t1 -c"$C" -d"${S}s" -s "$OUT/post.lua" "$url" >"$OUT/wrk-perf.txt" &
w=$!
sleep 1
perf record -q -e cpu-clock -F 1999 --call-graph dwarf,16384 -p "$pid,$fu,$fe" \
    -o "$OUT/perf.data" -- sleep $((S - 2)) 2>/dev/null
wait $w
perf script -i "$OUT/perf.data" -F comm,pid,tid,period,ip,sym,dso >"$OUT/script.txt" 2>/dev/null

# 3. Wake-ups between the processes.
if [ -n "${WAKE:-}" ]; then
    wrk -t1 -c"$C" -d4s -s "$OUT/post.lua" "$url" >/dev/null &
    w=$!
    sleep 1
    perf record -q -a -e sched:sched_wakeup -e sched:sched_switch -o "$OUT/wake.data" -- sleep 2 2>/dev/null
    wait $w
    perf script -i "$OUT/wake.data" -F comm,tid,cpu,time,event,trace >"$OUT/wake.txt" 2>/dev/null
    python3 "$HERE/wakeups.py" "$OUT/pids" "$OUT/wake.txt" >"$OUT/wakeups.md"
fi
python3 "$HERE/buckets.py" "$OUT/pids" "$OUT/script.txt" "$OUT/cpu.txt" >"$OUT/table.md"
cat "$OUT/cpu.txt" "$OUT/table.md"
grep -E "Requests/sec|^ +50%|^ +99%" "$OUT/wrk.txt"
[ -z "${WAKE:-}" ] || cat "$OUT/wakeups.md"
