//! The seccomp allow-list every instance runs under.
//!
//! Built once per function in the agent (a BPF program per function), installed by the
//! child as the very last step before `execve`. Anything not on the list fails with
//! `EPERM` rather than killing the process: ordinary runtimes probe for system calls and
//! handle a refusal, a kill would turn a harmless probe into a crash that looks like a bug
//! in the function. The list follows the spirit of Docker's default profile (what Rust std,
//! glibc, Python, Go, Node and the JVM use) and leaves out everything that reaches beyond
//! the process: debugging other processes (`ptrace`, `process_vm_*`, `pidfd_getfd`), the
//! kernel's own state (`bpf`, modules, `kexec`, `reboot`, swap, clocks, keyrings,
//! `perf_event_open`, `io_uring`), mounts and namespaces (`mount`, `pivot_root`, `unshare`,
//! `setns`, and `clone` with a namespace flag), leaving the instance's process group
//! (`setsid`, `setpgid`), handles that bypass path checks (`open_by_handle_at`),
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

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
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
    /// seccompiler refused the rules.
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
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

/// The compiled filters of one function, installed in order.
#[derive(Clone, Debug)]
pub(crate) struct Filters {
    pub programs: Vec<BpfProgram>,
}

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Arch(std::env::consts::ARCH))
}

/// Builds the filters for a function that may also use `extra` (names checked by the spec),
/// for instances of this agent (with or without an IPC namespace each).
pub(crate) fn build(extra: &[String]) -> Result<Filters, SeccompError> {
    build_for(extra, !super::sys::ipc_namespaces())
}

/// [`build`] for instances that share an IPC namespace (`shared_ipc`) or have one each.
fn build_for(extra: &[String], shared_ipc: bool) -> Result<Filters, SeccompError> {
    let arch = arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &(_, nr) in ALLOWED.iter().chain(ALLOWED_ARCH) {
        rules.insert(nr, Vec::new());
    }
    let widened: Vec<i64> = extra
        .iter()
        .map(|n| number(n).ok_or_else(|| SeccompError::Unknown(n.clone())))
        .collect::<Result<_, _>>()?;
    if shared_ipc {
        rules.remove(&libc::SYS_mq_open);
    }
    for &nr in &widened {
        rules.insert(nr, Vec::new());
    }
    if let std::collections::btree_map::Entry::Vacant(clone) = rules.entry(libc::SYS_clone) {
        // clone without namespace flags only (unless widened to any clone).
        let no_namespaces = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(CLONE_NAMESPACES),
            0,
        )?;
        clone.insert(vec![SeccompRule::new(vec![no_namespaces])?]);
    }
    let main = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )?;
    let mut programs = vec![BpfProgram::try_from(main)?];
    if !widened.contains(&libc::SYS_clone3) {
        // Installed last, so its ENOSYS wins over the first filter's EPERM for clone3.
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )?;
        programs.push(BpfProgram::try_from(clone3)?);
    }
    Ok(Filters { programs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_with_and_without_widening() {
        assert_eq!(build(&[]).unwrap().programs.len(), 2);
        assert_eq!(
            build(&["ptrace".into(), "clone3".into()])
                .unwrap()
                .programs
                .len(),
            1
        );
        assert!(matches!(
            build(&["ptracee".into()]),
            Err(SeccompError::Unknown(n)) if n == "ptracee"
        ));
        assert_eq!(number("bpf"), Some(libc::SYS_bpf));
        assert_eq!(number("clone"), Some(libc::SYS_clone));
    }

    #[test]
    fn a_shared_ipc_namespace_refuses_message_queues_unless_widened() {
        let own = build_for(&[], false).unwrap().programs;
        let shared = build_for(&[], true).unwrap().programs;
        assert_ne!(own[0], shared[0], "mq_open is still allowed");
        let widened = build_for(&["mq_open".into()], true).unwrap().programs;
        assert_eq!(own[0], widened[0]);
    }
}
