//! The compiled program against the filters seccompiler built before it (the reference:
//! the same list as one comparison per call, plus a second filter for `clone3`), both run
//! by a small classic-BPF interpreter with the kernel's rule for several filters.

use std::collections::BTreeMap;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

use super::*;

/// The filters as seccompiler built them before (two programs, installed in this order).
fn reference(extra: &[String], shared_ipc: bool) -> Vec<BpfProgram> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &(_, nr) in ALLOWED.iter().chain(ALLOWED_ARCH) {
        rules.insert(nr, Vec::new());
    }
    let widened: Vec<i64> = extra.iter().map(|n| number(n).unwrap()).collect();
    if shared_ipc {
        rules.remove(&libc::SYS_mq_open);
    }
    for &nr in &widened {
        rules.insert(nr, Vec::new());
    }
    if let std::collections::btree_map::Entry::Vacant(clone) = rules.entry(libc::SYS_clone) {
        let no_namespaces = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(CLONE_NAMESPACES),
            0,
        )
        .unwrap();
        clone.insert(vec![SeccompRule::new(vec![no_namespaces]).unwrap()]);
    }
    let main = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .unwrap();
    let mut programs = vec![BpfProgram::try_from(main).unwrap()];
    if !widened.contains(&libc::SYS_clone3) {
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .unwrap();
        programs.push(BpfProgram::try_from(clone3).unwrap());
    }
    programs
}

/// `struct seccomp_data` for a call.
fn data(nr: u32, arch: u32, arg0: u64) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[0..4].copy_from_slice(&nr.to_ne_bytes());
    d[4..8].copy_from_slice(&arch.to_ne_bytes());
    d[16..24].copy_from_slice(&arg0.to_ne_bytes());
    d
}

/// Runs one classic-BPF program (the instructions seccompiler and `compile` use).
fn run(p: &[sock_filter], d: &[u8; 64]) -> u32 {
    let (mut pc, mut a) = (0usize, 0u32);
    loop {
        let i = &p[pc];
        pc += 1;
        match i.code {
            LD_W_ABS => {
                let k = i.k as usize;
                a = u32::from_ne_bytes(d[k..k + 4].try_into().unwrap());
            }
            0x54 => a &= i.k, // BPF_ALU | BPF_AND | BPF_K
            JMP_JA => pc += i.k as usize,
            JMP_JEQ_K | 0x25 | JMP_JGE_K | JMP_JSET_K => {
                let taken = match i.code {
                    JMP_JEQ_K => a == i.k,
                    0x25 => a > i.k, // BPF_JGT
                    JMP_JGE_K => a >= i.k,
                    _ => a & i.k != 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            RET_K => return i.k,
            c => panic!("instruction {c:#x} at {}", pc - 1),
        }
    }
}

/// What the kernel returns for several filters: the most restrictive action, the most
/// recently installed filter's on a tie (`seccomp_run_filters`).
fn run_all(programs: &[BpfProgram], d: &[u8; 64]) -> u32 {
    let action = |r: u32| (r & 0xffff_0000) as i32;
    let mut ret = RET_ALLOW;
    for p in programs.iter().rev() {
        let r = run(p, d);
        if action(r) < action(ret) {
            ret = r;
        }
    }
    ret
}

fn numbers() -> Vec<u32> {
    let mut n: Vec<u32> = (0..1100).collect();
    n.extend([
        4095,
        4096,
        0x4000_0000,
        0x4000_0001,
        0x4000_0038,
        0x7fff_ffff,
    ]);
    n.extend([0x8000_0000, u32::MAX - 1, u32::MAX]);
    n
}

#[test]
fn the_program_answers_every_call_as_the_reference_filters_did() {
    let native = audit_arch().unwrap();
    let args = [
        0,
        libc::SIGCHLD as u64,
        (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64,
        libc::CLONE_NEWUSER as u64,
        libc::CLONE_NEWNET as u64 | libc::SIGCHLD as u64,
        libc::CLONE_NEWNS as u64,
        1 << 32,
        (1 << 40) | libc::CLONE_NEWPID as u64,
        u64::MAX,
    ];
    let extras: [&[&str]; 6] = [
        &[],
        &["clone"],
        &["clone3"],
        &["ptrace", "mq_open"],
        &["unshare", "setns", "bpf"],
        &["clone", "clone3"],
    ];
    for extra in extras {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for shared_ipc in [false, true] {
            let new = build_for(&extra, shared_ipc).unwrap().programs;
            assert_eq!(new.len(), 1, "one filter");
            let old = reference(&extra, shared_ipc);
            for arch in [native, 0x4000_0003 /* i386 */, 0] {
                for nr in numbers() {
                    for &arg0 in &args {
                        let d = data(nr, arch, arg0);
                        assert_eq!(
                            run_all(&new, &d),
                            run_all(&old, &d),
                            "nr {nr} arch {arch:#x} arg0 {arg0:#x} extra {extra:?} shared \
                             {shared_ipc}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_default_program_is_short_and_shallow() {
    let p = &build_for(&[], false).unwrap().programs[0];
    let old: usize = reference(&[], false).iter().map(Vec::len).sum();
    assert!(p.len() * 4 < old, "{} instructions against {old}", p.len());
    assert!(p.len() < 400, "{} instructions", p.len());
}

#[test]
fn runs_cover_the_list_and_merge_neighbours() {
    use Verdict::*;
    let v = Verdicts::from([(0, Allow), (1, Allow), (3, NoSys), (4, Allow), (9, Allow)]);
    assert_eq!(
        runs(&v),
        [
            (0, Allow),
            (2, Refuse),
            (3, NoSys),
            (4, Allow),
            (5, Refuse),
            (9, Allow),
            (10, Refuse)
        ]
    );
    assert_eq!(runs(&Verdicts::new()), [(0, Refuse)]);
    let top = Verdicts::from([(u32::MAX, Allow)]);
    assert_eq!(runs(&top), [(0, Refuse), (u32::MAX, Allow)]);
}

#[test]
fn a_tree_too_wide_for_short_jumps_still_decides_every_number() {
    // Every other number allowed: 1,200 runs, so the low halves near the root are far more
    // than 255 instructions long.
    let v: Verdicts = (0..1200).step_by(2).map(|n| (n, Verdict::Allow)).collect();
    let p = compile(&v, 7).unwrap();
    assert!(p.iter().any(|i| i.code == JMP_JA), "long jumps used");
    for nr in (0..1300).chain([u32::MAX]) {
        let want = if nr < 1200 && nr % 2 == 0 {
            RET_ALLOW
        } else {
            RET_ERRNO | libc::EPERM as u32
        };
        assert_eq!(run(&p, &data(nr, 7, 0)), want, "nr {nr}");
    }
    assert_eq!(
        run(&p, &data(0, 8, 0)),
        RET_KILL_PROCESS,
        "another architecture"
    );
    let too_many: Verdicts = (0..10_000)
        .step_by(2)
        .map(|n| (n, Verdict::Allow))
        .collect();
    assert!(matches!(
        compile(&too_many, 7),
        Err(SeccompError::TooLarge(_))
    ));
}

#[test]
fn builds_with_and_without_widening() {
    assert_eq!(build(&[]).unwrap().programs.len(), 1);
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
    assert_ne!(own, shared, "mq_open is still allowed");
    let widened = build_for(&["mq_open".into()], true).unwrap().programs;
    assert_eq!(own, widened);
    let mq = libc::SYS_mq_open as u32;
    let arch = audit_arch().unwrap();
    assert_eq!(
        run(&shared[0], &data(mq, arch, 0)),
        RET_ERRNO | libc::EPERM as u32
    );
    assert_eq!(run(&own[0], &data(mq, arch, 0)), RET_ALLOW);
}
