//! The seccomp allow-list every instance runs under.
//!
//! Compiled once per function in the agent (one BPF program per function, see [`build`]),
//! installed by the child as the very last step before `execve`. Anything not on the list
//! fails with `EPERM` rather than killing the process: ordinary runtimes probe for system
//! calls and handle a refusal, a kill would turn a harmless probe into a crash that looks
//! like a bug in the function. The list follows the spirit of Docker's default profile
//! (what Rust std, glibc, Python, Go, Node and the JVM use) and leaves out everything that
//! reaches beyond the process: debugging other processes (`ptrace`, `process_vm_*`,
//! `pidfd_getfd`), the kernel's own state (`bpf`, modules, `kexec`, `reboot`, swap, clocks,
//! keyrings, `perf_event_open`, `io_uring`), mounts and namespaces (`mount`, `pivot_root`,
//! `unshare`, `setns`, and `clone` with a namespace flag), leaving the instance's process
//! group (`setsid`, `setpgid`), handles that bypass path checks (`open_by_handle_at`),
//! `userfaultfd`, and changing file modes (`chmod` family, and the `setxattr` family, since
//! a POSIX ACL is a mode change too: a memory file handed out read-only must stay
//! read-only, also in a user namespace where the instance owns it).
//!
//! `clone3` answers `ENOSYS` (its flags live in memory a filter cannot read, so it cannot be
//! checked for namespace flags; glibc then falls back to `clone`, which is checked).
//!
//! Where instances share the agent's IPC namespace (an agent without `CAP_SYS_ADMIN`, see
//! `sys::ipc_namespaces`), `mq_open` is refused too: a POSIX
//! message queue would outlive the instance where no sweep can find it (the uid's SysV
//! objects are removed before its next chain starts, see `leftovers`).
//!
//! A function can be given more with `syscalls: [name, ...]` in the spec; names come from
//! [`zerohop_spec::syscalls::known`].
//!
//! # The program
//!
//! The kernel checks, converts and JIT-compiles a filter at every install, and then runs it
//! once per system call number to find the numbers it always allows (its action cache): the
//! cost of an instance's start grows with the program's length. So the program is one
//! filter, a balanced tree of `jge` over the runs of numbers that get the same answer, not
//! a list of one comparison per allowed call (seccompiler's form, used before: two filters,
//! 1,396 instructions together, whose install cost 0.67 ms of every spawn against 0.07 ms
//! for this one on the 2-CPU test VM):
//!
//! ```text
//!   ld arch; jeq NATIVE, else: ret KILL_PROCESS
//!   ld nr
//!   jge K (first number of the middle run)? upper half's tree : lower half's tree
//!     ... (each half the same, down to one run)
//!   a run's leaf: ret ALLOW | ret ERRNO(EPERM) | ret ERRNO(ENOSYS) (clone3)
//!     | clone's: ld args[0] (each half); jset NAMESPACES? ret ERRNO(EPERM) : ret ALLOW
//! ```
//!
//! 164 instructions and eight comparisons deep for the default list on x86_64.

use std::collections::BTreeMap;

use seccompiler::{sock_filter, BpfProgram};
use zerohop_spec::syscalls::{number, ALLOWED, ALLOWED_ARCH};

/// Why a filter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A name that is no system call of this architecture.
    #[error("unknown system call `{0}`")]
    Unknown(String),
    /// This architecture has no filter support.
    #[error("seccomp filters are not supported on {0}")]
    Arch(&'static str),
    /// The program is longer than the kernel takes (`BPF_MAXINSNS`).
    #[error("the seccomp filter has {0} instructions, more than the kernel's 4096")]
    TooLarge(usize),
}

/// `clone` flags that create namespaces (`CLONE_NEWTIME` shares its bit with the exit
/// signal in `clone`'s first argument, and only `clone3` and `unshare` take it).
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// The compiled filters of one function, installed in order (one today).
#[derive(Clone, Debug)]
pub(crate) struct Filters {
    pub programs: Vec<BpfProgram>,
}

/// What the filter answers for one system call number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Allow,
    /// `EPERM`: not on the list.
    Refuse,
    /// `ENOSYS`: `clone3`, so that libc falls back to `clone`.
    NoSys,
    /// `clone`: allowed without a namespace flag in its first argument.
    CloneWithoutNamespaces,
}

/// Every number the list names and its verdict; any other number is refused.
type Verdicts = BTreeMap<u32, Verdict>;

/// `AUDIT_ARCH_*` of the architecture this agent runs on (seccomp_data.arch).
fn audit_arch() -> Result<u32, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xc000_003e),
        "aarch64" => Ok(0xc000_00b7),
        "riscv64" => Ok(0xc000_00f3),
        other => Err(SeccompError::Arch(other)),
    }
}

/// Builds the filters for a function that may also use `extra` (names checked by the spec),
/// for instances of this agent (with or without an IPC namespace each).
pub(crate) fn build(extra: &[String]) -> Result<Filters, SeccompError> {
    build_for(extra, !super::sys::ipc_namespaces())
}

/// [`build`] for instances that share an IPC namespace (`shared_ipc`) or have one each.
fn build_for(extra: &[String], shared_ipc: bool) -> Result<Filters, SeccompError> {
    let program = compile(&verdicts(extra, shared_ipc)?, audit_arch()?)?;
    Ok(Filters {
        programs: vec![program],
    })
}

/// The list: the default allow-list, less `mq_open` where the IPC namespace is shared,
/// plus `extra` (a widened `clone` is allowed with any flags, a widened `clone3` allowed).
fn verdicts(extra: &[String], shared_ipc: bool) -> Result<Verdicts, SeccompError> {
    let nr = |n: i64| u32::try_from(n).expect("system call numbers are small");
    let mut v: Verdicts = ALLOWED
        .iter()
        .chain(ALLOWED_ARCH)
        .map(|&(_, n)| (nr(n), Verdict::Allow))
        .collect();
    if shared_ipc {
        v.remove(&nr(libc::SYS_mq_open));
    }
    v.entry(nr(libc::SYS_clone))
        .or_insert(Verdict::CloneWithoutNamespaces);
    v.insert(nr(libc::SYS_clone3), Verdict::NoSys);
    for name in extra {
        let n = number(name).ok_or_else(|| SeccompError::Unknown(name.clone()))?;
        v.insert(nr(n), Verdict::Allow);
    }
    Ok(v)
}

// Classic BPF, as seccomp takes it (linux/filter.h, linux/seccomp.h).
/// `BPF_LD | BPF_W | BPF_ABS` (the first two are 0).
const LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA` (`BPF_JA` is 0).
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x05 | 0x10;
const JMP_JGE_K: u16 = 0x05 | 0x30;
const JMP_JSET_K: u16 = 0x05 | 0x40;
/// `BPF_RET | BPF_K` (`BPF_K` is 0).
const RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
/// Offsets in `struct seccomp_data`: nr, arch, then args[0] (two 32-bit halves).
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARG0_LOW: u32 = if cfg!(target_endian = "little") {
    16
} else {
    20
};
const OFFSET_ARG0_HIGH: u32 = if cfg!(target_endian = "little") {
    20
} else {
    16
};
/// The kernel's limit on a filter's length (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The runs of numbers with one verdict: `(first number, verdict)`, each run ending where
/// the next starts, the last one at `u32::MAX` (every number the list does not name,
/// including x32's and negative ones, is refused).
fn runs(v: &Verdicts) -> Vec<(u32, Verdict)> {
    fn set(runs: &mut Vec<(u32, Verdict)>, at: u32, verdict: Verdict) {
        let last = runs.last_mut().expect("never empty");
        if last.1 == verdict {
            return;
        }
        if last.0 == at {
            // Only at 0: the first run was the default one.
            last.1 = verdict;
            return;
        }
        runs.push((at, verdict));
    }
    let mut runs = vec![(0, Verdict::Refuse)];
    for (&nr, &verdict) in v {
        set(&mut runs, nr, verdict);
        if let Some(next) = nr.checked_add(1) {
            if !v.contains_key(&next) {
                set(&mut runs, next, Verdict::Refuse);
            }
        }
    }
    runs
}

/// Compiles the list into one program for architecture `arch` (`AUDIT_ARCH_*`); any other
/// architecture's calls kill the process.
fn compile(v: &Verdicts, arch: u32) -> Result<BpfProgram, SeccompError> {
    let mut p = vec![
        stmt(LD_W_ABS, OFFSET_ARCH),
        jump(JMP_JEQ_K, arch, 1, 0),
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, OFFSET_NR),
    ];
    p.extend(tree(&runs(v)));
    if p.len() > MAX_INSTRUCTIONS {
        return Err(SeccompError::TooLarge(p.len()));
    }
    Ok(p)
}

/// The decision over `runs` (non-empty, sorted, each covering up to the next one's start),
/// with the number in the accumulator.
fn tree(runs: &[(u32, Verdict)]) -> Vec<sock_filter> {
    let [(_, verdict)] = runs else {
        let mid = runs.len() / 2;
        let (low, high) = (tree(&runs[..mid]), tree(&runs[mid..]));
        let mut p = Vec::with_capacity(low.len() + high.len() + 2);
        match u8::try_from(low.len()) {
            // nr >= start of the middle run: over the low half.
            Ok(skip) => p.push(jump(JMP_JGE_K, runs[mid].0, skip, 0)),
            // Too far for a conditional jump (8 bits): through an unconditional one.
            Err(_) => {
                p.push(jump(JMP_JGE_K, runs[mid].0, 0, 1));
                p.push(stmt(JMP_JA, low.len() as u32));
            }
        }
        p.extend(low);
        p.extend(high);
        return p;
    };
    let errno = |e: i32| stmt(RET_K, RET_ERRNO | e as u32);
    match verdict {
        Verdict::Allow => vec![stmt(RET_K, RET_ALLOW)],
        Verdict::Refuse => vec![errno(libc::EPERM)],
        Verdict::NoSys => vec![errno(libc::ENOSYS)],
        Verdict::CloneWithoutNamespaces => vec![
            stmt(LD_W_ABS, OFFSET_ARG0_LOW),
            jump(JMP_JSET_K, CLONE_NAMESPACES as u32, 3, 0),
            stmt(LD_W_ABS, OFFSET_ARG0_HIGH),
            jump(JMP_JSET_K, (CLONE_NAMESPACES >> 32) as u32, 1, 0),
            stmt(RET_K, RET_ALLOW),
            errno(libc::EPERM),
        ],
    }
}

#[cfg(test)]
mod tests;
