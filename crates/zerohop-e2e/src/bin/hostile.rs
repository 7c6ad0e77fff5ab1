//! A hostile function for the isolation tests: what it tries is chosen by `HOSTILE_MODE`.
//! Every answer is plain text, one fact per line, so the tests can assert on each.
//!
//! * `grandchild`: forks a grandchild that tries `setsid` (to leave the instance's process
//!   group) and then sleeps forever; answers `grandchild PID` and `setsid ERRNO|ok` (the
//!   grandchild's attempt). Given the body `crash`, the instance aborts instead.
//! * `pdeathsig`: clears its own parent-death signal; answers `pdeathsig N` (now).
//! * `procfd`: given a victim pid as the request body, tries to open `/proc/PID/fd/3`,
//!   `/proc/PID/mem` and `/proc/PID/environ`, to ptrace-attach it, to read its memory with
//!   `process_vm_readv`, to SIGKILL it (its process group, itself, through a pidfd), to
//!   signal the agent (signal 0) and to SIGKILL a child of its own; answers `NAME ERRNO|ok`
//!   per attempt.
//! * `hang`: given the body `hang`, never answers (sleeps in the handler); else answers
//!   `alive`.
//! * `env`: answers its environment (`env KEY`, and `handover_fds N` from `ZEROHOP_FDS`),
//!   open descriptors (`fd N TARGET`), ids
//!   (`uid R E S`, `gid R E S`, `groups ...`), `no_new_privs`, `dumpable`, `seccomp`
//!   (mode from /proc/self/status), `session_leader 1|0` (it leads a session of its own),
//!   `tty ERRNO|ok` (opening `/dev/tty`, its controlling terminal), and probes of system calls (`call NAME ERRNO|ok`):
//!   `bpf`, `setpgid`, `ptrace`, `personality`, `fchmod` (of a memfd of its own), `unshare`.
//!
//! * `chaos`: from the start, background threads attack the chain's shared memory through the
//!   descriptors the agent handed over: random writes into the pool (owner words, party
//!   table, slot headers and bytes), random tails, entries and forged descriptors in its own
//!   outbox (with futex wakes), random heads and flags in its own inbox, `status = 101` and
//!   `meta_len = 0xFFFF` over every slot it owns, and garbage over the first bytes of every
//!   slot another party holds; it also tries to map each read-only descriptor writable and
//!   to reopen it read-write through `/proc/self/fd`. Answers `pool NAME` per pool it was
//!   handed, and `rw_map FD ERRNO|ok` and `reopen FD ERRNO|ok` per read-only descriptor.
//!
//! * `header`: given the body `scribble`, rewrites its first pool's `slots_offset` (as a
//!   later party reading it would put its slots outside the mapping) and aborts, so the agent
//!   starts it again; given `poison`, rewrites `slot_count`, `slot_size` and `slots_offset`
//!   and passes the request on, alive (the next party takes it from a poisoned header);
//!   given anything else, passes the request on unchanged.
//!
//! * `owners`: given the body `forge`, starts a thread that for `HOSTILE_FORGE_MS` (default
//!   5000) keeps every other owner word of its first pool naming another party of the chain
//!   (each party number but its own, in turn) as the holder of that slot, unchanged, as a
//!   party stuck on it would look; answers `forging N` (how many words) at once. Given
//!   anything else, answers `alive`.
//!
//! * `leftovers`: given the body `leave`, makes a SysV shared memory segment and files in
//!   `/tmp` and `/dev/shm` (mode 0644) and answers `shm ID` and `file PATH` per file;
//!   given anything else, answers `alive`.
//!
//! * `forge` (sockmap transport): writes a message of its own to its socket, sending this
//!   request's descriptor to function index `HOSTILE_TARGET_FN`, instance `HOSTILE_TARGET_PARTY`
//!   (an edge the chain should not declare), past the SDK's own check; answers `forged ok`
//!   or `forged ERRNO` (what `send` said) after 300 ms.
//!
//! `unsafe` for the raw system calls it abuses; this is a test fixture, never a function to
//! copy.

use std::fmt::Write as _;
use std::time::Duration;

use zerohop_runtime::{run, HandlerError, Next, Request};
use zerohop_transport::handover;
use zerohop_transport::sockmap::abi::{Trailer, DESC_LEN, MSG_LEN};

fn errno_of(rc: i64) -> String {
    if rc >= 0 {
        "ok".into()
    } else {
        std::io::Error::last_os_error()
            .raw_os_error()
            .map_or("?".into(), |e| format!("{e}"))
    }
}

fn grandchild() -> String {
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: pipe writes two descriptors into the array.
    unsafe { libc::pipe(pipe.as_mut_ptr()) };
    // SAFETY: the forked child only calls setsid, write and pause (async-signal-safe) and
    // never returns into Rust code of the parent.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; `rc` is a local.
        unsafe {
            let rc: i32 = if libc::setsid() < 0 {
                *libc::__errno_location()
            } else {
                0
            };
            libc::write(pipe[1], (&rc as *const i32).cast(), 4);
            loop {
                libc::pause();
            }
        }
    }
    let mut rc: i32 = -1;
    // SAFETY: reads 4 bytes into a local, then closes our ends.
    unsafe {
        libc::close(pipe[1]);
        libc::read(pipe[0], (&mut rc as *mut i32).cast(), 4);
        libc::close(pipe[0]);
    }
    let setsid = if rc == 0 { "ok".into() } else { rc.to_string() };
    format!("grandchild {pid}\nsetsid {setsid}\n")
}

fn pdeathsig() -> String {
    // SAFETY: prctl with integer arguments; the second call writes to a local int.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, 0, 0, 0, 0);
        let mut now: libc::c_int = -1;
        libc::prctl(
            libc::PR_GET_PDEATHSIG,
            &mut now as *mut libc::c_int,
            0,
            0,
            0,
        );
        format!("pdeathsig {now}\n")
    }
}

fn procfd(victim: i32) -> String {
    let mut out = String::new();
    for what in ["fd/3", "mem", "environ"] {
        let r = std::fs::File::open(format!("/proc/{victim}/{what}"));
        let _ = writeln!(
            out,
            "open_{} {}",
            what.replace('/', ""),
            match r {
                Ok(_) => "ok".into(),
                Err(e) => e.raw_os_error().map_or("?".into(), |e| e.to_string()),
            }
        );
    }
    // SAFETY: ptrace attach to a pid; no memory passed.
    let rc = unsafe { libc::ptrace(libc::PTRACE_ATTACH, victim, 0, 0) };
    let _ = writeln!(out, "ptrace {}", errno_of(rc));
    if rc == 0 {
        // SAFETY: detach what was attached.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, victim, 0, 0) };
    }
    let mut buf = [0u8; 64];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Somewhere mapped in every x86_64 process is not knowable; the stack of any process
    // is near the top, but EFAULT vs EPERM is all the test needs: permission is checked
    // before the address.
    let remote = libc::iovec {
        iov_base: 0x1000 as *mut libc::c_void,
        iov_len: 64,
    };
    // SAFETY: `local` points at `buf`, valid for 64 bytes; the kernel checks `remote`.
    let rc = unsafe { libc::process_vm_readv(victim, &local, 1, &remote, 1, 0) };
    let _ = writeln!(out, "process_vm_readv {}", errno_of(rc as i64));
    // SAFETY: kill with integer arguments (the victim leads its own process group).
    let rc = unsafe { libc::kill(-victim, libc::SIGKILL) };
    let _ = writeln!(out, "killpg {}", errno_of(rc as i64));
    // SAFETY: as above.
    let rc = unsafe { libc::kill(victim, libc::SIGKILL) };
    let _ = writeln!(out, "kill {}", errno_of(rc as i64));
    // SAFETY: pidfd_open and pidfd_send_signal with integer arguments and a NULL siginfo.
    let rc = unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, victim, 0);
        if fd < 0 {
            fd
        } else {
            let rc = libc::syscall(libc::SYS_pidfd_send_signal, fd, libc::SIGKILL, 0usize, 0);
            libc::close(fd as i32);
            rc
        }
    };
    let _ = writeln!(out, "pidfd_send_signal {}", errno_of(rc));
    // Signal 0: only whether it could (the agent is this instance's parent).
    // SAFETY: kill and getppid with integer arguments.
    let rc = unsafe { libc::kill(libc::getppid(), 0) };
    let _ = writeln!(out, "kill_agent {}", errno_of(rc as i64));
    // What it may still do: stop a process of its own.
    // SAFETY: the forked child only calls pause (async-signal-safe) and never returns.
    let child = unsafe { libc::fork() };
    if child == 0 {
        loop {
            // SAFETY: pause has no arguments.
            unsafe { libc::pause() };
        }
    }
    // SAFETY: kill and waitpid on the child just forked; `status` is a local.
    let rc = unsafe {
        let rc = libc::kill(child, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(child, &mut status, 0);
        rc
    };
    let _ = writeln!(out, "kill_own_child {}", errno_of(rc as i64));
    out
}

fn leave() -> String {
    let mut out = String::new();
    // SAFETY: shmget with integer arguments.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o644) };
    let _ = writeln!(
        out,
        "shm {}",
        if id < 0 { errno_of(-1) } else { id.to_string() }
    );
    for dir in ["/tmp", "/dev/shm"] {
        let path = format!("{dir}/zerohop-leftover-{}", std::process::id());
        match std::fs::write(&path, b"a secret for the next chain of this uid") {
            Ok(()) => {
                let _ = writeln!(out, "file {path}");
            }
            Err(e) => {
                let _ = writeln!(out, "file_error {path} {e}");
            }
        }
    }
    out
}

fn env_report() -> String {
    let mut out = String::new();
    for (k, v) in std::env::vars_os() {
        let _ = writeln!(out, "env {}", k.to_string_lossy());
        if k == "ZEROHOP_FDS" {
            let _ = writeln!(out, "handover_fds {}", v.to_string_lossy());
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for e in dir.flatten() {
            let target = std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let _ = writeln!(out, "fd {} {target}", e.file_name().to_string_lossy());
        }
    }
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: writes three ids into locals.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    let _ = writeln!(out, "uid {r} {e} {s}");
    // SAFETY: as above.
    unsafe { libc::getresgid(&mut r, &mut e, &mut s) };
    let _ = writeln!(out, "gid {r} {e} {s}");
    let mut groups = [0 as libc::gid_t; 64];
    // SAFETY: room for 64 groups.
    let n = unsafe { libc::getgroups(64, groups.as_mut_ptr()) };
    let list: Vec<String> = groups[..n.max(0) as usize]
        .iter()
        .map(|g| g.to_string())
        .collect();
    let _ = writeln!(out, "groups {}", list.join(" "));
    // SAFETY: prctl queries with integer arguments.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    // SAFETY: as above.
    let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    let _ = writeln!(out, "no_new_privs {nnp}\ndumpable {dumpable}");
    // Its own session, with no controlling terminal: `/dev/tty` must not open.
    // SAFETY: plain system calls; a descriptor that opens (it must not) is leaked on purpose.
    let (sid, pid, tty) = unsafe {
        let tty = libc::open(c"/dev/tty".as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        (libc::getsid(0), libc::getpid(), errno_of(tty as i64))
    };
    let _ = writeln!(out, "session_leader {}\ntty {tty}", u8::from(sid == pid));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .unwrap_or("?")
        .trim();
    let _ = writeln!(out, "seccomp {seccomp}");
    // SAFETY: bpf with a null attribute pointer and size 0: the kernel rejects it without
    // touching memory (EFAULT/EINVAL when allowed, EPERM when filtered).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, 0, std::ptr::null::<u8>(), 0) };
    let _ = writeln!(out, "call bpf {}", errno_of(rc));
    // SAFETY: integer arguments. The instance already leads its group, so the kernel
    // would accept this no-op (0); only the filter refuses it.
    let rc = unsafe { libc::syscall(libc::SYS_setpgid, 0, 0) };
    let _ = writeln!(out, "call setpgid {}", errno_of(rc));
    // SAFETY: an invalid request on pid 0: ESRCH/EIO when allowed, EPERM when filtered.
    let rc = unsafe { libc::syscall(libc::SYS_ptrace, 0x7fff, 0, 0, 0) };
    let _ = writeln!(out, "call ptrace {}", errno_of(rc));
    // SAFETY: 0xffffffff only queries the current persona.
    let rc = unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) };
    let _ = writeln!(out, "call personality {}", errno_of(rc));
    // SAFETY: a memfd of our own, then fchmod of it; closed right after.
    unsafe {
        let fd = libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC);
        let rc = libc::fchmod(fd, 0o400) as i64;
        let _ = writeln!(out, "call fchmod {}", errno_of(rc));
        libc::close(fd);
    }
    // SAFETY: unshare of a UTS namespace: EPERM unprivileged or filtered; if it ever
    // worked it only affects this process.
    let rc = unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS) };
    let _ = writeln!(out, "call unshare {}", errno_of(rc));
    out
}

/// A tiny xorshift generator: chaos needs no quality, only variety.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A shared mapping of a duplicate of inherited descriptor `fd`, read-write.
fn map_rw(fd: i32) -> Option<(*mut u8, usize)> {
    // SAFETY: plain syscalls on a descriptor this process inherited; the mapping is fresh and
    // aliases no Rust object (this fixture only ever touches it through raw volatile writes).
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) < 0 || st.st_size <= 0 {
            return None;
        }
        let len = st.st_size as usize;
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        (p != libc::MAP_FAILED).then_some((p.cast(), len))
    }
}

fn read_u32(base: *mut u8, off: usize) -> u32 {
    // SAFETY: callers pass offsets inside the mapping, 4-aligned.
    unsafe { base.add(off).cast::<u32>().read_volatile() }
}

fn read_u64(base: *mut u8, off: usize) -> u64 {
    // SAFETY: as read_u32, 8-aligned.
    unsafe { base.add(off).cast::<u64>().read_volatile() }
}

fn write_u32(base: *mut u8, off: usize, v: u32) {
    // SAFETY: as read_u32; other processes use these words too, which is the point.
    unsafe { base.add(off).cast::<u32>().write_volatile(v) }
}

fn write_u64(base: *mut u8, off: usize, v: u64) {
    // SAFETY: as read_u64.
    unsafe { base.add(off).cast::<u64>().write_volatile(v) }
}

/// Keeps every other owner word of the pool at `base` naming another party (not `me`) for
/// `ms` milliseconds, from a thread of its own; returns how many words it forges.
fn forge_owners(base: usize, me: u32, ms: u64) -> usize {
    let base = base as *mut u8;
    // The header's own words (docs/protocol.md): slot_count @12, max_parties @20,
    // owners_offset @40. A hostile party believes them; nobody else needs to.
    let (slots, parties, owners) = (
        read_u32(base, 12) as usize,
        read_u32(base, 20),
        read_u64(base, 40) as usize,
    );
    let victims: Vec<u32> = (0..parties).filter(|&p| p != me).collect();
    let words: Vec<(usize, u64)> = (1..slots)
        .step_by(2)
        .zip(victims.iter().cycle())
        .map(|(i, &v)| {
            let generation = read_u64(base, owners + 8 * i) >> 32;
            (owners + 8 * i, generation << 32 | u64::from(v + 1))
        })
        .collect();
    let n = words.len();
    let base = base as usize;
    std::thread::spawn(move || {
        let until = std::time::Instant::now() + Duration::from_millis(ms);
        while std::time::Instant::now() < until {
            for &(off, word) in &words {
                write_u64(base as *mut u8, off, word);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    n
}

fn futex_wake(addr: *mut u8) {
    // SAFETY: FUTEX_WAKE on an address of a live shared mapping; no memory is touched.
    unsafe { libc::syscall(libc::SYS_futex, addr, libc::FUTEX_WAKE, i32::MAX) };
}

/// Maps what `chaos` attacks (before the runtime takes the inherited descriptors over) and
/// probes the read-only descriptors; returns the report and a starter for the attack, run at
/// the first request (attacking the party table before the agent saw the instance ready
/// would only keep the chain from starting).
fn chaos() -> (String, impl FnOnce() + Send) {
    let me: u32 = std::env::var("ZEROHOP_PARTY")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let nfds: i32 = std::env::var("ZEROHOP_FDS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let mut report = String::new();
    // First the pools of our security domains, then our progress records, then our own
    // outbox and inbox (read-write), then the read-only rest.
    let link = |fd: i32| {
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map(|l| l.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let pools: Vec<i32> = (3..3 + nfds)
        .take_while(|&fd| link(fd).contains("zerohop-pool:"))
        .collect();
    for &fd in &pools {
        let _ = writeln!(report, "pool {}", link(fd));
    }
    let own = 3 + pools.len() as i32 + 1;
    for fd in own + 2..3 + nfds {
        // SAFETY: plain syscalls; a mapping that succeeds (it must not) is left in place.
        let rc = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(fd, &mut st);
            let p = libc::mmap(
                std::ptr::null_mut(),
                st.st_size.max(1) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                -1
            } else {
                0
            }
        };
        let _ = writeln!(report, "rw_map {fd} {}", errno_of(rc));
        let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
        // SAFETY: a valid path; a descriptor that opens (it must not) is leaked on purpose.
        let rc = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
        let _ = writeln!(report, "reopen {fd} {}", errno_of(rc as i64));
    }
    let regions: Vec<(Region, *mut u8, usize)> = pools
        .iter()
        .map(|&fd| (Region::Pool, fd))
        .chain([(Region::Outbox, own), (Region::Inbox, own + 1)])
        .filter_map(|(what, fd)| {
            // SAFETY: dup of an inherited descriptor.
            let d = unsafe { libc::dup(fd) };
            map_rw(d).map(|(p, len)| (what, p, len))
        })
        .collect();
    let regions: Vec<(Region, usize, usize)> = regions
        .into_iter()
        .map(|(what, p, len)| (what, p as usize, len))
        .collect();
    let start = move || {
        for (i, (what, base, len)) in regions.into_iter().enumerate() {
            attack(me, what, i as u64, base, len);
        }
    };
    (report, start)
}

/// What one attacking thread garbles.
#[derive(Clone, Copy)]
enum Region {
    Pool,
    Outbox,
    Inbox,
}

/// One attacking thread on one mapped region.
fn attack(me: u32, what: Region, seed: u64, base: usize, len: usize) {
    {
        std::thread::spawn(move || {
            let base = base as *mut u8;
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
            loop {
                match what {
                    // The pool: owner words, party table, slot headers and bytes.
                    Region::Pool => {
                        let slots = read_u32(base, 12) as usize;
                        let slot_size = read_u32(base, 16) as usize;
                        let owners = read_u64(base, 40) as usize;
                        let first = read_u64(base, 48) as usize;
                        if slots == 0 || first + slots * slot_size > len {
                            // We garbled the header ourselves; garble anywhere.
                            let off = (rng.next() as usize % (len / 8)) * 8;
                            write_u64(base, off, rng.next());
                        } else {
                            for s in 0..slots {
                                let word = read_u64(base, owners + 8 * s);
                                let slot = first + s * slot_size;
                                if word as u32 == me + 1 {
                                    // A slot we hold: a status no client may get, and a
                                    // meta_len far beyond the slot.
                                    write_u32(base, slot + 8, 101 | (0xFFFF << 16));
                                } else if word as u32 != 0 {
                                    // A request another party holds right now: its bytes.
                                    write_u64(base, slot + 32, rng.next());
                                }
                            }
                            let r = rng.next();
                            let s = r as usize % slots;
                            // Owner words rarely (each garbled one can leak a slot of this
                            // chain for good), headers and the party table often.
                            match (r >> 32) % 64 {
                                0 => write_u64(base, owners + 8 * s, rng.next() % 8),
                                1..=20 => write_u64(base, first + s * slot_size, rng.next()),
                                21..=40 => write_u64(base, first + s * slot_size + 8, rng.next()),
                                41..=44 => write_u64(base, 128 + 64 * (r as usize % 4), rng.next()),
                                _ => write_u64(base, first + s * slot_size + 64, rng.next()),
                            }
                        }
                    }
                    // Our outbox: forged descriptors, random tails, wakes.
                    Region::Outbox => {
                        let queues = read_u32(base, 16) as usize;
                        let cap = read_u32(base, 20) as usize;
                        let stride = 64 + cap * 16;
                        if queues > 0 && cap > 0 && 64 + queues * stride <= len {
                            let q = 64 + (rng.next() as usize % queues) * stride;
                            let tail = read_u32(base, q);
                            let e = q + 64 + (tail as usize % cap) * 16;
                            write_u64(base, e, rng.next());
                            write_u64(base, e + 8, rng.next());
                            let new_tail = if rng.next().is_multiple_of(16) {
                                rng.next() as u32
                            } else {
                                tail.wrapping_add(1)
                            };
                            write_u32(base, q, new_tail);
                            futex_wake(base.wrapping_add(q));
                        }
                    }
                    // Our inbox: heads and flags.
                    Region::Inbox => {
                        let off = 64 + (rng.next() as usize % ((len - 64) / 4)) * 4;
                        write_u32(base, off, rng.next() as u32);
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
    }
}

/// The sockmap message for this request's descriptor to `HOSTILE_TARGET_FN`, written
/// straight to the party's socket (its last inherited descriptor).
fn forge(req: &Request<'_>) -> String {
    let num = |k: &str| -> u32 {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} must be a number"))
    };
    let (slot, generation) = req.slot_and_generation();
    let desc = zerohop_pool::Descriptor {
        slot,
        next: num("HOSTILE_TARGET_FN") as u8,
        len: req.body().len() as u32,
        request: req.id(),
        generation,
    };
    let trailer = Trailer {
        party: num("HOSTILE_TARGET_PARTY") as u16,
        ..Trailer::default()
    };
    let mut msg = [0u8; MSG_LEN];
    msg[..DESC_LEN].copy_from_slice(&desc.to_bytes());
    msg[DESC_LEN..].copy_from_slice(&trailer.to_bytes());
    let fd = handover::FIRST_FD + num("ZEROHOP_FDS") as i32 - 1;
    // SAFETY: sends MSG_LEN bytes from a local buffer on an inherited descriptor.
    let rc = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
    let said = errno_of(rc as i64);
    std::thread::sleep(Duration::from_millis(300));
    format!("forged {said}\n")
}

fn main() {
    let mode = std::env::var("HOSTILE_MODE").unwrap_or_else(|_| "env".into());
    // Before `run` takes the inherited descriptors over.
    let (chaos_report, chaos_start) = if mode == "chaos" {
        let (report, start) = chaos();
        (report, Some(Box::new(start) as Box<dyn FnOnce() + Send>))
    } else {
        (String::new(), None)
    };
    let chaos_start = std::sync::Mutex::new(chaos_start);
    // Its first pool (the first handed-over descriptor), mapped before `run` takes it over.
    let header_pool = (mode == "header" || mode == "owners")
        .then(|| map_rw(handover::FIRST_FD))
        .flatten()
        .map(|(base, _)| base as usize);
    run(move |req: &mut Request<'_>| {
        let out = match mode.as_str() {
            "grandchild" if req.body() == b"crash" => std::process::abort(),
            "grandchild" => grandchild(),
            "pdeathsig" => pdeathsig(),
            "procfd" => {
                let victim: i32 = String::from_utf8_lossy(req.body())
                    .trim()
                    .parse()
                    .map_err(|_| HandlerError::new(400, "body: a victim pid"))?;
                procfd(victim)
            }
            "hang" if req.body() == b"hang" => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            "hang" => "alive\n".to_owned(),
            "env" => env_report(),
            "leftovers" if req.body() == b"leave" => leave(),
            "leftovers" => "alive\n".to_owned(),
            "forge" => forge(req),
            "header" if req.body() == b"scribble" => {
                let base = header_pool.expect("the pool is mapped") as *mut u8;
                // `slots_offset`, at 48 in the pool header (docs/protocol.md).
                write_u64(base, 48, u64::MAX - 4095);
                std::process::abort()
            }
            // Rewrites the geometry and passes the request on, alive: the next party (a relay
            // in the agent, for a split chain) takes it with the header still poisoned.
            "header" if req.body() == b"poison" => {
                let base = header_pool.expect("the pool is mapped") as *mut u8;
                // slot_count @12, slot_size @16, slots_offset @48 (docs/protocol.md).
                write_u32(base, 12, u32::MAX);
                write_u32(base, 16, 0xffff_ffc0);
                write_u64(base, 48, u64::MAX - 4095);
                return Ok(Next::Continue);
            }
            "header" => return Ok(Next::Continue),
            "owners" if req.body() == b"forge" => {
                let me: u32 = std::env::var("ZEROHOP_PARTY")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .expect("ZEROHOP_PARTY");
                let ms = std::env::var("HOSTILE_FORGE_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(5000);
                let base = header_pool.expect("the pool is mapped");
                format!("forging {}\n", forge_owners(base, me, ms))
            }
            "owners" => "alive\n".to_owned(),
            "chaos" => {
                let start = chaos_start.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(start) = start {
                    // Let this first answer out first: the test reads the report from it.
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(300));
                        start();
                    });
                }
                chaos_report.clone()
            }
            other => {
                return Err(HandlerError::internal(format!(
                    "unknown HOSTILE_MODE {other}"
                )))
            }
        };
        req.set_body(out.as_bytes())?;
        Ok(Next::Continue)
    })
}
