#!/usr/bin/env python3
"""Wake-ups between the hello chain's processes: count, share across cores, and the time
from sched_wakeup to the wakee running (sched_switch in). usage: wake.py PIDS WAKE_TXT"""
import re, sys, collections, statistics
pids = open(sys.argv[1]).read().split()
names = {"zerohop", "gateway-1", "upper", "exclaim", "wrk"}
pending = {}
rows = collections.defaultdict(list)
for line in open(sys.argv[2]):
    m = re.match(r"\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)", line)
    if not m: continue
    comm, tid, cpu, t, ev, rest = m.groups(); cpu = int(cpu); t = float(t)
    if ev == "sched_wakeup":
        w = re.match(r"comm=(\S+) pid=(\d+) prio=\d+ target_cpu=(\d+)", rest)
        if not w: continue
        tcomm, tpid, tcpu = w.group(1), w.group(2), int(w.group(3))
        if comm.strip() in names and tcomm in names:
            pending[tpid] = (comm.strip(), tcomm, cpu != tcpu, t)
    else:
        s = re.search(r"==> next_comm=(\S+) next_pid=(\d+)", rest)
        if s and s.group(2) in pending:
            wc, tc, cross, t0 = pending.pop(s.group(2))
            rows[(wc, tc)].append((cross, (t - t0) * 1e6))
print("| waker -> wakee | wake-ups | across cores | wake-up to running, p50 us (same core / across) |")
print("|---|---|---|---|")
for k, v in sorted(rows.items(), key=lambda x: -len(x[1])):
    cr = [d for c, d in v if c]; sm = [d for c, d in v if not c]
    f = lambda x: f"{statistics.median(x):.1f}" if x else "-"
    print(f"| {k[0]} -> {k[1]} | {len(v)} | {100*len(cr)/len(v):.0f}% | {f(sm)} / {f(cr)} |")
