#!/usr/bin/env python3
"""Splits each process's CPU per request (cpu.txt) by component, in the shares of its
cpu-clock samples (perf script -F comm,pid,tid,period,ip,sym,dso of a dwarf call-graph
profile): a sample in the kernel counts for the system call it is in (or irq, scheduler);
one in user space for the innermost frame that names a component below (so an allocation
counts for whoever allocates). Prints a Markdown table.

usage: buckets.py PIDS_FILE SCRIPT_TXT CPU_TXT   (the files bench/profile/request.sh writes)"""
import collections, os, re, sys

pids = open(sys.argv[1]).read().split()
role = {pids[1]: "gateway", pids[3]: "upper", pids[5]: "exclaim"}
cpu = {}
for line in open(sys.argv[3]):
    m = re.match(r"(gateway|upper|exclaim)\S*.*: ([\d.]+) us/request", line)
    if m: cpu[m.group(1)] = float(m.group(2))

SYSCALL = re.compile(r"__(?:x64|se|do)_sys_(\w+)")
KGROUP = [
    ("epoll", r"epoll"), ("futex", r"futex"), ("io_uring", r"io_uring"),
    ("read", r"^(read|readv|recvfrom|recvmsg)$"), ("write", r"^(write|writev|sendto|sendmsg)$"),
    ("sched_yield", r"sched_yield"),
]
# Innermost matching frame wins. (bucket, regex on the symbol)
USER = {
 "gateway": [
  ("tracing", r"tracing_subscriber|tracing_core"),
  ("HTTP read + parse", r"hyper::proto::h1::(role::Server as .*parse|io::Buffered.*parse|io::Buffered.*poll_read_from_io|decode)|httparse|hyper::proto::h1::conn::Conn.*poll_read_head|hyper::proto::h1::role::parse_headers|http::header::map"),
  ("response build + write", r"ingress::.*Gateway.*::reply|Reply.*into_http|role::Server as .*encode|hyper::proto::h1::(io::.*(flush|WriteBuf|buffer)|conn::Conn.*(write|flush|end_body))|Dispatcher.*poll_write|Dispatcher.*poll_flush|stall::Watched|AnswerBody|response::response_headers|h1::encode|bytes::bytes::.*(copy_from_slice|from_owner)"),
  ("answer receive", r"zerohop_gateway::egress|zerohop_transport::.*(recv|Receiver)|oneshot|Gateway.*complete|zerohop_pool.*(take|validate)"),
  ("hop send", r"zerohop_transport::.*(send|Sender)|picker|pick_state|Gateway.*send_and_wait|futex_wake|wake_party"),
  ("route, metadata, slot, copy in", r"Gateway.*fill|Filled::|Gateway.*meta|router::|zerohop_pool::.*alloc|Gateway.*handle_inner|Gateway.*handle\b|access::|cloudevents|content_length|Gateway.*defer|body::sink|Gateway>::handle::|grpc::Call::of"),
  ("connection driver, stall watch (serve, stall)", r"serve::.*drive|stall::|serve::Busy|ConnState"),
  ("hyper connection, service call", r"hyper::|hyper_util::|serve::.*Service|serve::.*accepted|Gateway.*submit"),
  ("tokio runtime, timers", r"tokio::|mio::|parking"),
 ],
 "upper": [
  ("the request's tracing span (runtime)", r"tracing_subscriber|tracing_core|logging::request_span|nu_ansi_term"),
  ("handler", r"upper::|exclaim::|zerohop_example|to_ascii_uppercase|core::fmt"),
  ("runtime receive, take, send", r"zerohop_runtime|zerohop_transport|zerohop_pool"),
 ],
}
USER["exclaim"] = USER["upper"]

def kbucket(frames):
    for s, _ in frames:
        m = SYSCALL.search(s)
        if m:
            name = m.group(1)
            if "futex" in name:
                if any("futex_wake" in f for f, _ in frames): return "kernel: futex wake (waking the next party)"
                return "kernel: futex wait (going to sleep, woken)"
            for g, rx in KGROUP:
                if re.search(rx, name): return "kernel: " + g
            return "kernel: other syscalls (" + name + ")"
    for s, _ in frames:
        if re.search(r"do_writev|ksys_write|__sys_sendto|__sys_sendmsg", s): return "kernel: write"
        if re.search(r"ksys_read|__sys_recvfrom|__sys_recvmsg", s): return "kernel: read"
        if "page_fault" in s: return "kernel: page faults"
        if "exit_to_user_mode" in s: return "kernel: irq, softirq, scheduler"
        if s.startswith("do_syscall_64") or "syscall_trace" in s or "x64_sys_call" in s: return "kernel: syscall entry and exit"
    return "kernel: irq, softirq, scheduler"

counts = collections.defaultdict(collections.Counter)
unk = collections.defaultdict(collections.Counter)
def flush(comm_pid, frames):
    if not frames: return
    pid = comm_pid
    r = role.get(pid)
    if r is None: return
    if frames[0][1] == "[kernel.kallsyms]":
        b = kbucket(frames)
    else:
        b = None
        for s, _ in frames:
            for name, rx in USER[r]:
                if re.search(rx, s):
                    b = name; break
            if b: break
        if b is None:
            b = "other user code"
            unk[r][frames[0][0]] += 1
    counts[r][b] += 1

cur = None; frames = []
for line in open(sys.argv[2], errors="replace"):
    if not line.strip():
        flush(cur, frames); cur = None; frames = []; continue
    if not line.startswith(("\t", " ")):
        m = re.match(r"\S.*?\s+(\d+)/(\d+)\s", line)
        cur = m.group(1) if m else None; frames = []
        continue
    m = re.match(r"\s*[0-9a-f]+ (.*) \((.*)\)$", line.rstrip())
    if m: frames.append((m.group(1), m.group(2)))
flush(cur, frames)

total_us = sum(cpu.values())
print(f"| process | component | us per request | % of total |")
print(f"|---|---|---|---|")
for r in ("gateway", "upper", "exclaim"):
    n = sum(counts[r].values())
    for b, c in sorted(counts[r].items(), key=lambda x: -x[1]):
        us = cpu[r] * c / n
        print(f"| {r} | {b} | {us:.2f} | {100*us/total_us:.1f}% |")
    print(f"| {r} | **all** | **{cpu[r]:.2f}** | **{100*cpu[r]/total_us:.1f}%** |")
print(f"| all | **total** | **{total_us:.2f}** | 100% |")
if os.environ.get("UNMATCHED"):
    for r in unk:
        print(r, unk[r].most_common(25), file=sys.stderr)
