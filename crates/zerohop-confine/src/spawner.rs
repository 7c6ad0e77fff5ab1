//! The spawner: a small process, forked from the agent before any pool or ring exists,
//! that starts every instance.
//!
//! Forking the agent itself gets dearer as the chain grows: the child copies the agent's
//! memory map (a mapping per ring region the gateway reads) and its descriptor table (a
//! memfd per ring region and a pidfd per instance), and `execve` then tears all of it down
//! again. With a thousand instances that was three quarters of the start-up time. The
//! spawner has a few dozen mappings and six descriptors (stdio, its socket, `/dev/null`
//! and the instances' Landlock ruleset), so the same fork and `execve`
//! cost next to nothing.
//!
//! The agent sends the spawner one request per instance over a `SOCK_SEQPACKET` pair
//! (program, arguments, environment, ids, seccomp programs, and as `SCM_RIGHTS` the
//! hand-over descriptors and the write ends of the instance's output pipes). The spawner
//! forks with `CLONE_PARENT`, so the instance is the agent's child as before (the agent
//! waits for it through a pidfd, and the instance's parent-death signal follows the
//! agent), runs the same confinement steps in the child, and answers with the pid once
//! `execve` succeeded, or with the step that failed. The spawner exits when the agent
//! closes the socket or dies.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use seccompiler::sock_filter;
use tokio::io::unix::AsyncFd;

use super::seccomp::Filters;
use super::sys::{self, ChildIds, ChildPlan, Launch};

/// Descriptors per message (the kernel takes at most 253 per `SCM_RIGHTS`).
const FDS_PER_MESSAGE: usize = 250;
/// Payload bytes per message (a request larger than this goes in several).
const BYTES_PER_MESSAGE: usize = 32 * 1024;
/// First byte of a message: more of this request follows, or this was the last.
const MORE: u8 = 1;
const LAST: u8 = 0;
/// How long the agent waits for the spawner's answer (it comes once the child has called
/// `execve`).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// One instance to start, as the agent describes it.
pub(crate) struct Request<'a> {
    /// What to `execve`, as the child sees it.
    pub program: &'a std::path::Path,
    pub argv: Vec<&'a std::ffi::OsStr>,
    pub env: &'a [(std::ffi::OsString, std::ffi::OsString)],
    /// Placed at `FIRST_FD`, `FIRST_FD + 1`, ... in the child.
    pub fds: Vec<OwnedFd>,
    /// Placed at 1 and 2 in the child (the write ends of its output pipes); `None`: the
    /// agent's own standard output and error are inherited. Closed here once the request is
    /// sent, and in the spawner once the child has its copies.
    pub stdio: Option<[OwnedFd; 2]>,
    pub ids: &'a ChildIds,
    /// Descriptors (in the child) of the instance's groups' `cgroup.procs`, one per
    /// hierarchy, at most [`MAX_CGROUPS`](sys::MAX_CGROUPS).
    pub cgroup_procs: Vec<RawFd>,
    pub agent_pid: i32,
    pub first_private_fd: u32,
    pub filters: &'a Filters,
}

/// The agent's handle on its spawner.
#[derive(Debug)]
pub(crate) struct Spawner {
    /// The socket, and the number of the last request sent on it (answers carry it back).
    sock: Mutex<(OwnedFd, u32)>,
    pid: Pid,
}

impl Spawner {
    /// Forks the spawner. Call it before the chain's pools and rings exist, from a thread
    /// that lives as long as the chain: the parent-death signal of the spawner and of every
    /// instance (`CLONE_PARENT` gives them the spawner's parent) follows that thread.
    pub fn start() -> io::Result<Spawner> {
        let (agent, spawner) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as _, 0);
        setsockopt(&agent, sockopt::ReceiveTimeout, &timeout)?;
        let pid = sys::fork_spawner(spawner, spawner_main)?;
        Ok(Spawner {
            sock: Mutex::new((agent, 0)),
            pid,
        })
    }

    /// Starts an instance; returns it once its program runs.
    pub fn spawn(&self, req: Request<'_>) -> io::Result<Child> {
        let mut guard = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let (sock, number) = &mut *guard;
        *number = number.wrapping_add(1);
        let mut payload = Vec::with_capacity(4096);
        put_u32(&mut payload, *number);
        encode(&req, &mut payload);
        let fds: Vec<RawFd> = req
            .fds
            .iter()
            .chain(req.stdio.iter().flatten())
            .map(AsRawFd::as_raw_fd)
            .collect();
        let fd = sock.as_raw_fd();
        let dead = |e: io::Error| io::Error::other(format!("the spawner process is gone ({e})"));
        send_request(fd, &payload, &fds).map_err(dead)?;
        let (pid, code) = loop {
            let mut answer = [0u8; 12];
            let n = match nix::sys::socket::recv(fd, &mut answer, MsgFlags::empty()) {
                Ok(n) => n,
                // A signal (SIGCHLD of a dying instance) interrupted the wait: wait on.
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => {
                    return Err(io::Error::other(format!(
                        "the spawner did not answer within {ANSWER_TIMEOUT:?}"
                    )))
                }
                Err(e) => return Err(dead(e.into())),
            };
            if n != 12 {
                return Err(dead(io::Error::from(io::ErrorKind::UnexpectedEof)));
            }
            let word = |i: usize| u32::from_ne_bytes(answer[i..i + 4].try_into().expect("4"));
            let (pid, code) = (word(4), word(8) as i32);
            if word(0) == *number {
                break (pid, code);
            }
            // The answer to an earlier request whose wait timed out: whatever it started runs
            // unsupervised, so it goes.
            if pid != 0 {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                let _ = waitpid(Pid::from_raw(pid as i32), None);
            }
        };
        drop(guard);
        if code != 0 {
            if pid != 0 {
                // The child failed before execve and is exiting; it is ours to reap.
                let _ = waitpid(Pid::from_raw(pid as i32), None);
            }
            return Err(io::Error::from_raw_os_error(code));
        }
        Child::adopt(pid)
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // Closing the socket ends the spawner; it is this process's child.
        let (sock, _) = self.sock.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = nix::sys::socket::shutdown(sock.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        let _ = waitpid(self.pid, None);
    }
}

fn send_request(sock: RawFd, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let chunks = payload
        .len()
        .div_ceil(BYTES_PER_MESSAGE)
        .max(fds.len().div_ceil(FDS_PER_MESSAGE))
        .max(1);
    for i in 0..chunks {
        let bytes = payload
            .get(i * BYTES_PER_MESSAGE..)
            .map_or(&[][..], |b| &b[..b.len().min(BYTES_PER_MESSAGE)]);
        let these = fds
            .get(i * FDS_PER_MESSAGE..)
            .map_or(&[][..], |f| &f[..f.len().min(FDS_PER_MESSAGE)]);
        let mark = [if i + 1 == chunks { LAST } else { MORE }];
        let iov = [io::IoSlice::new(&mark), io::IoSlice::new(bytes)];
        let cmsg = [ControlMessage::ScmRights(these)];
        let cmsgs: &[ControlMessage<'_>] = if these.is_empty() { &[] } else { &cmsg };
        loop {
            match sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => {
                    r?;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Reads one request: its payload and descriptors. `None` at end of file.
fn recv_request(sock: RawFd, buf: &mut [u8]) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut payload = Vec::new();
    let mut fds = Vec::new();
    loop {
        let mut space = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
        let mut iov = [io::IoSliceMut::new(buf)];
        let msg = match recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let n = msg.bytes;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = c {
                fds.extend(received.into_iter().map(sys::own_received));
            }
        }
        if n == 0 {
            return Ok(None);
        }
        payload.extend_from_slice(&iov[0][1..n]);
        if iov[0][0] == LAST {
            return Ok(Some((payload, fds)));
        }
    }
}

/// The spawner's life: one request after another until the agent closes the socket.
fn spawner_main(sock: OwnedFd) -> ! {
    let devnull = nix::fcntl::open(
        c"/dev/null",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    );
    // One ruleset for every instance (each that enforces it gets a domain of its own);
    // none on a kernel without Landlock scopes, as the agent says in its log.
    let scope = sys::scope_ruleset().ok();
    let mut buf = vec![0u8; BYTES_PER_MESSAGE + 1];
    loop {
        let (payload, fds) = match recv_request(sock.as_raw_fd(), &mut buf) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => sys::exit_now(0),
        };
        let number = payload
            .get(..4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let answer = match (decode(payload.get(4..).unwrap_or(&[]), fds), &devnull) {
            (Some(launch), Ok(null)) => {
                sys::launch(&launch, null.as_fd(), scope.as_ref().map(AsFd::as_fd))
            }
            (None, _) => Err((0, libc::EINVAL)),
            (_, Err(e)) => Err((0, *e as i32)),
        };
        let (pid, code) = match answer {
            Ok(pid) => (pid, 0),
            Err((pid, code)) => (pid, code),
        };
        let mut out = [0u8; 12];
        out[..4].copy_from_slice(&number.to_ne_bytes());
        out[4..8].copy_from_slice(&pid.to_ne_bytes());
        out[8..].copy_from_slice(&code.to_ne_bytes());
        if nix::sys::socket::send(sock.as_raw_fd(), &out, MsgFlags::MSG_NOSIGNAL).is_err() {
            sys::exit_now(0);
        }
    }
}

// The request's encoding: little-endian u32 counts and lengths, then the bytes. Only the
// agent and the spawner it forked speak it, so it has no version.

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

fn encode(req: &Request<'_>, out: &mut Vec<u8>) {
    put_bytes(out, req.program.as_os_str().as_bytes());
    put_u32(out, req.argv.len() as u32);
    for a in &req.argv {
        put_bytes(out, a.as_bytes());
    }
    put_u32(out, req.env.len() as u32);
    for (k, v) in req.env {
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        put_bytes(out, &kv);
    }
    match req.ids {
        ChildIds::Uid {
            uid,
            gid,
            real_gid,
            ipc_ns,
        } => {
            put_u32(out, 0);
            put_u32(out, *uid);
            put_u32(out, *gid);
            put_u32(out, *real_gid);
            put_u32(out, u32::from(*ipc_ns));
        }
        ChildIds::UserNs { uid_map, gid_map } => {
            put_u32(out, 1);
            put_bytes(out, uid_map);
            put_bytes(out, gid_map);
        }
    }
    put_u32(out, req.cgroup_procs.len() as u32);
    for &fd in &req.cgroup_procs {
        put_u32(out, fd as u32);
    }
    put_u32(out, req.agent_pid as u32);
    put_u32(out, req.first_private_fd);
    put_u32(out, req.filters.programs.len() as u32);
    for p in &req.filters.programs {
        put_u32(out, p.len() as u32);
        for f in p {
            out.extend_from_slice(&f.code.to_le_bytes());
            out.push(f.jt);
            out.push(f.jf);
            out.extend_from_slice(&f.k.to_le_bytes());
        }
    }
    put_u32(out, req.fds.len() as u32);
    put_u32(out, if req.stdio.is_some() { 2 } else { 0 });
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }

    fn cstring(&mut self) -> Option<CString> {
        CString::new(self.bytes()?).ok()
    }

    fn cstrings(&mut self) -> Option<Vec<CString>> {
        let n = self.u32()?;
        (0..n).map(|_| self.cstring()).collect()
    }
}

fn decode(payload: &[u8], mut fds: Vec<OwnedFd>) -> Option<Launch> {
    let mut r = Reader(payload);
    let program = r.cstring()?;
    let argv = r.cstrings()?;
    let env = r.cstrings()?;
    let ids = match r.u32()? {
        0 => ChildIds::Uid {
            uid: r.u32()?,
            gid: r.u32()?,
            real_gid: r.u32()?,
            ipc_ns: r.u32()? != 0,
        },
        1 => ChildIds::UserNs {
            uid_map: r.bytes()?,
            gid_map: r.bytes()?,
        },
        _ => return None,
    };
    let joins = r.u32()? as usize;
    if joins > sys::MAX_CGROUPS {
        return None;
    }
    let cgroup_procs = (0..joins)
        .map(|_| r.u32().map(|fd| fd as RawFd))
        .collect::<Option<Vec<_>>>()?;
    let agent_pid = r.u32()? as i32;
    let first_private_fd = r.u32()?;
    let mut programs = Vec::new();
    for _ in 0..r.u32()? {
        let n = r.u32()? as usize;
        let mut p = Vec::with_capacity(n);
        for _ in 0..n {
            let b = r.take(8)?;
            p.push(sock_filter {
                code: u16::from_le_bytes([b[0], b[1]]),
                jt: b[2],
                jf: b[3],
                k: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            });
        }
        programs.push(p);
    }
    let handed = r.u32()? as usize;
    let stdio = r.u32()? as usize;
    if handed.checked_add(stdio)? != fds.len() || !r.0.is_empty() {
        return None;
    }
    // The output pipes travel after the hand-over set.
    let stdio = match stdio {
        0 => None,
        2 => {
            let err = fds.pop()?;
            let out = fds.pop()?;
            Some([out, err])
        }
        _ => return None,
    };
    Some(Launch {
        program,
        argv,
        env,
        fds,
        stdio,
        plan: ChildPlan {
            cgroup_procs,
            ids,
            agent_pid,
            first_private_fd,
            filters: Arc::new(Filters { programs }),
        },
    })
}

/// A started instance's leader: a child of the agent, waited for through its pidfd. Killed
/// (and reaped) when dropped before it was waited for.
#[derive(Debug)]
pub struct Child {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl Child {
    fn adopt(pid: u32) -> io::Result<Child> {
        let fd = sys::pidfd_open(pid).inspect_err(|_| {
            // Without a pidfd it cannot be supervised: stop it now.
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid as i32), None);
        })?;
        Ok(Child {
            pid,
            pidfd: sys::async_fd(fd)?,
            status: None,
        })
    }

    /// The process id (= its process group id).
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// The exit status if it has exited (and reaps it), without waiting.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let Some(status) = self.look(WaitPidFlag::empty())? else {
            return Ok(None);
        };
        self.status = Some(status);
        Ok(Some(status))
    }

    /// How it ended if it has, without waiting and without reaping it (see
    /// [`exited`](Self::exited)).
    pub fn peek(&self) -> io::Result<Option<ExitStatus>> {
        match self.status {
            Some(s) => Ok(Some(s)),
            None => self.look(WaitPidFlag::WNOWAIT),
        }
    }

    /// Whether it was reaped (by [`wait`](Self::wait), [`try_wait`](Self::try_wait) or
    /// [`kill`](Self::kill)): its pid may then be another process's.
    pub fn reaped(&self) -> bool {
        self.status.is_some()
    }

    /// How it ended, if it has (`waitid` without waiting, with `extra` flags: `WNOWAIT`
    /// leaves it unreaped).
    fn look(&self, extra: WaitPidFlag) -> io::Result<Option<ExitStatus>> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | extra;
        Ok(
            match waitid(Id::PIDFd(self.pidfd.get_ref().as_fd()), flags)? {
                WaitStatus::Exited(_, code) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
                WaitStatus::Signaled(_, sig, core) => Some(ExitStatus::from_raw(
                    sig as i32 | if core { 0x80 } else { 0 },
                )),
                _ => None,
            },
        )
    }

    /// Waits until it exits and says how, WITHOUT reaping it: until [`wait`](Self::wait)
    /// reaps it, the process is a zombie whose pid, which is also its process group's id,
    /// the kernel cannot give to another process. So what is left of its group can still be
    /// signalled by that id with no risk of hitting a stranger.
    pub async fn exited(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.status {
                return Ok(s);
            }
            if let Some(s) = self.look(WaitPidFlag::WNOWAIT)? {
                return Ok(s);
            }
            // A pidfd turns readable when its process exits.
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
    }

    /// Waits until it exits.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            // A pidfd turns readable when its process exits.
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
    }

    /// SIGKILL, then waits.
    pub async fn kill(&mut self) -> io::Result<()> {
        if self.status.is_none() {
            sys::pidfd_kill(self.pidfd.get_ref().as_fd(), Signal::SIGKILL)?;
        }
        self.wait().await.map(drop)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = sys::pidfd_kill(self.pidfd.get_ref().as_fd(), Signal::SIGKILL);
            let _ = waitid(
                Id::PIDFd(self.pidfd.get_ref().as_fd()),
                WaitPidFlag::WEXITED,
            );
        }
    }
}

#[cfg(test)]
mod tests {
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
}
