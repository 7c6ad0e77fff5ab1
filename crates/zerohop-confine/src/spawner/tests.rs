//! The spawner's tests: the encoding, a leader's wait, and pipelined spawns.

use super::*;

/// The state letter of `pid` in /proc (`None` once it is reaped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn an_exited_leader_stays_a_zombie_holding_its_pid_until_it_is_waited_for() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A child of this process, as instances are of the agent (std's handle is left
        // alone: `Child` reaps it).
        let pid = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap()
            .id();
        let mut child = Child::adopt(pid).unwrap();
        let status = tokio::time::timeout(std::time::Duration::from_secs(10), child.exited())
            .await
            .expect("it exits")
            .unwrap();
        assert_eq!(status.code(), Some(7));
        assert!(!child.reaped());
        assert_eq!(proc_state(pid), Some('Z'), "exited() must not reap");
        assert_eq!(child.peek().unwrap().and_then(|s| s.code()), Some(7));
        assert_eq!(proc_state(pid), Some('Z'), "peek() must not reap");
        assert_eq!(child.wait().await.unwrap().code(), Some(7));
        assert!(child.reaped());
        assert_eq!(proc_state(pid), None, "wait() reaps");
    });
}

#[test]
fn requests_survive_the_encoding() {
    let filters = super::super::seccomp::build(&[]).expect("filters");
    let env = vec![("A".into(), "1".into()), ("PATH".into(), "/bin".into())];
    let ids = ChildIds::UserNs {
        uid_map: b"0 1000 1".to_vec(),
        gid_map: b"0 1000 1".to_vec(),
    };
    let req = Request {
        program: std::path::Path::new("/bin/true"),
        argv: vec!["true".as_ref(), "x".as_ref()],
        env: &env,
        fds: Vec::new(),
        stdio: None,
        ids: &ids,
        cgroup_procs: vec![7, 9],
        agent_pid: 42,
        first_private_fd: 6,
        filters: &filters,
    };
    let mut out = Vec::new();
    encode(&req, &mut out);
    let l = decode(&out, Vec::new()).expect("decodes");
    assert_eq!(l.program.as_bytes(), b"/bin/true");
    assert_eq!(l.argv.len(), 2);
    assert_eq!(l.env[1].as_bytes(), b"PATH=/bin");
    assert_eq!(l.plan.cgroup_procs, [7, 9]);
    assert_eq!((l.plan.agent_pid, l.plan.first_private_fd), (42, 6));
    assert!(matches!(l.plan.ids, ChildIds::UserNs { .. }));
    assert_eq!(l.plan.filters.programs, filters.programs);
    // Truncated, padded, or with a wrong descriptor count: refused.
    assert!(decode(&out[..out.len() - 1], Vec::new()).is_none());
    let mut longer = out.clone();
    longer.push(0);
    assert!(decode(&longer, Vec::new()).is_none());
    let one = nix::unistd::dup(std::io::stdin()).expect("dup");
    assert!(decode(&out, vec![one]).is_none());
}

#[test]
fn output_pipes_travel_after_the_handover_set() {
    let filters = super::super::seccomp::build(&[]).expect("filters");
    let ids = ChildIds::Uid {
        uid: 1,
        gid: 1,
        real_gid: 1,
        ipc_ns: true,
    };
    let (r0, w0) = nix::unistd::pipe().expect("pipe");
    let (r1, w1) = nix::unistd::pipe().expect("pipe");
    let handed = nix::unistd::dup(std::io::stdin()).expect("dup");
    let (out_raw, err_raw) = (w0.as_raw_fd(), w1.as_raw_fd());
    let req = Request {
        program: std::path::Path::new("/bin/true"),
        argv: vec!["true".as_ref()],
        env: &[],
        fds: vec![handed],
        stdio: Some([w0, w1]),
        ids: &ids,
        cgroup_procs: Vec::new(),
        agent_pid: 1,
        first_private_fd: 4,
        filters: &filters,
    };
    let mut out = Vec::new();
    encode(&req, &mut out);
    let Request { fds, stdio, .. } = req;
    let mut all = fds;
    all.extend(stdio.into_iter().flatten());
    let l = decode(&out, all).expect("decodes");
    assert_eq!(l.fds.len(), 1);
    assert!(matches!(l.plan.ids, ChildIds::Uid { ipc_ns: true, .. }));
    let [o, e] = l.stdio.as_ref().expect("output pipes");
    assert_eq!((o.as_raw_fd(), e.as_raw_fd()), (out_raw, err_raw));
    drop(l);
    // Descriptors beyond what the request declares: refused.
    let mut plain = Vec::new();
    let req = Request {
        program: std::path::Path::new("/bin/true"),
        argv: vec!["true".as_ref()],
        env: &[],
        fds: Vec::new(),
        stdio: None,
        ids: &ids,
        cgroup_procs: Vec::new(),
        agent_pid: 1,
        first_private_fd: 3,
        filters: &filters,
    };
    encode(&req, &mut plain);
    assert!(decode(&plain, vec![r0, r1]).is_none());
}

/// Ids the test's instances take: a uid of their own as root, else the caller's in a
/// user namespace (as `identity::acquire` picks them).
fn test_ids() -> ChildIds {
    if nix::unistd::geteuid().is_root() {
        return ChildIds::Uid {
            uid: 65534,
            gid: 65534,
            real_gid: 65534,
            ipc_ns: sys::ipc_namespaces(),
        };
    }
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    ChildIds::UserNs {
        uid_map: format!("{uid} {uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {gid} 1\n").into_bytes(),
    }
}

fn request<'a>(
    program: &'a std::path::Path,
    argv: &'a [String],
    ids: &'a ChildIds,
    filters: &'a Filters,
) -> Request<'a> {
    Request {
        program,
        argv: argv.iter().map(std::ffi::OsStr::new).collect(),
        env: &[],
        fds: Vec::new(),
        stdio: None,
        ids,
        cgroup_procs: Vec::new(),
        agent_pid: std::process::id() as i32,
        first_private_fd: 3,
        filters,
    }
}

#[test]
fn answers_are_sorted_to_the_request_they_belong_to() {
    let mut ch = Channel {
        sock: nix::unistd::dup(std::io::stdin()).expect("dup"),
        last: 9,
        early: HashMap::new(),
        abandoned: HashSet::from([4]),
    };
    let a = Answer { pid: 77, code: 0 };
    assert_eq!(ch.sort(7, 7, a), Read::Mine(a));
    assert_eq!(ch.sort(7, 8, a), Read::Early(8, a));
    assert_eq!(ch.sort(7, 4, a), Read::Abandoned(a));
    // Abandoned once: a second answer with that number (after the numbers wrapped) is
    // an ordinary one.
    assert_eq!(ch.sort(7, 4, a), Read::Early(4, a));
}

#[test]
fn pipelined_spawns_each_get_their_own_answer_in_any_order() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let spawner = Spawner::start().expect("spawner");
        let filters = super::super::seccomp::build(&[]).expect("filters");
        let ids = test_ids();
        let sh = std::path::Path::new("/bin/sh");
        let codes = [3, 4, 5];
        let argvs: Vec<Vec<String>> = codes
            .iter()
            .map(|c| vec!["sh".into(), "-c".into(), format!("exit {c}")])
            .collect();
        let mut pending = Vec::new();
        for argv in &argvs {
            pending.push(spawner.submit(request(sh, argv, &ids, &filters)).unwrap());
        }
        let nowhere = std::path::Path::new("/nonexistent/zerohop-test");
        let argv = vec!["nowhere".to_owned()];
        let missing = spawner
            .submit(request(nowhere, &argv, &ids, &filters))
            .unwrap();
        // The last one's failure first, then the others from the last: each answer
        // reaches its own request.
        let e = missing.wait().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        for (p, code) in pending.into_iter().zip(codes).rev() {
            let mut child = p.wait().expect("started");
            let status = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait())
                .await
                .expect("it exits")
                .unwrap();
            assert_eq!(status.code(), Some(code));
        }
    });
}

#[test]
fn a_spawn_given_up_before_its_answer_is_killed_and_reaped() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let spawner = Spawner::start().expect("spawner");
        let filters = super::super::seccomp::build(&[]).expect("filters");
        let ids = test_ids();
        let marker = format!("zerohop-given-up-{}", std::process::id());
        let argv = vec![marker.clone(), "1000".into()];
        let sleep = std::path::Path::new("/bin/sleep");
        let pending = spawner
            .submit(request(sleep, &argv, &ids, &filters))
            .unwrap();
        drop(pending);
        let running = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .any(|c| c.starts_with(marker.as_bytes()));
        assert!(!running, "the given-up instance still runs");
        // The spawner still serves.
        let argv = vec!["sh".into(), "-c".into(), "exit 6".into()];
        let sh = std::path::Path::new("/bin/sh");
        let mut child = spawner
            .submit(request(sh, &argv, &ids, &filters))
            .unwrap()
            .wait()
            .unwrap();
        let status = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait())
            .await
            .expect("it exits")
            .unwrap();
        assert_eq!(status.code(), Some(6));
    });
}
