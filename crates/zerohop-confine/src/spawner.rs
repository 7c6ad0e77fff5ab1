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
//!
//! Spawns are pipelined: the agent may send the next requests before the answer to the
//! first ([`Spawner::submit`], then [`Pending::wait`]), and the spawner forks the next
//! child while the ones before it are still confining themselves and exec'ing (each child
//! tells it through a pipe of its own, which it polls beside the socket). Every request
//! and answer carries the request's number, so an answer (and a failure) always reaches
//! the request it belongs to, whatever order the children reach `execve` in.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
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
    channel: Mutex<Channel>,
    pid: Pid,
}

/// The agent's end of the socket, and what it knows of the requests on it.
#[derive(Debug)]
struct Channel {
    sock: OwnedFd,
    /// The number of the last request sent (answers carry it back).
    last: u32,
    /// Answers read while waiting for another request's.
    early: HashMap<u32, Answer>,
    /// Requests whose wait timed out: whatever they start runs unsupervised, so it goes.
    abandoned: HashSet<u32>,
}

/// The spawner's answer to one request: the pid, and 0 or the encoded error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    pid: u32,
    code: i32,
}

/// What the answer to request `waited` means for the agent, given one just read (`number`).
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// The one waited for.
    Mine(Answer),
    /// Another's, to be kept until it is waited for.
    Early(u32, Answer),
    /// A request given up: its child (if it started one) must be killed and reaped.
    Abandoned(Answer),
}

impl Channel {
    /// Sorts an answer just read: a pure decision, unit-tested.
    fn sort(&mut self, waited: u32, number: u32, answer: Answer) -> Read {
        if number == waited {
            Read::Mine(answer)
        } else if self.abandoned.remove(&number) {
            Read::Abandoned(answer)
        } else {
            Read::Early(number, answer)
        }
    }
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
            channel: Mutex::new(Channel {
                sock: agent,
                last: 0,
                early: HashMap::new(),
                abandoned: HashSet::new(),
            }),
            pid,
        })
    }

    /// Sends the request for an instance and returns without waiting for it to start;
    /// [`Pending::wait`] does. The caller bounds how many it leaves pending (each is a
    /// child the spawner watches, and an answer the agent has not read).
    pub fn submit(&self, req: Request<'_>) -> io::Result<Pending<'_>> {
        let mut ch = self.lock();
        let number = ch.last.wrapping_add(1);
        ch.last = number;
        let mut payload = Vec::with_capacity(4096);
        put_u32(&mut payload, number);
        encode(&req, &mut payload);
        let fds: Vec<RawFd> = req
            .fds
            .iter()
            .chain(req.stdio.iter().flatten())
            .map(AsRawFd::as_raw_fd)
            .collect();
        send_request(ch.sock.as_raw_fd(), &payload, &fds).map_err(gone)?;
        Ok(Pending {
            spawner: self,
            number,
            waited: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Channel> {
        self.channel.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to request `number`, read from the socket (answers to other requests read
    /// on the way are kept for their waits, or acted on if abandoned).
    fn answer(&self, number: u32) -> io::Result<Answer> {
        let mut ch = self.lock();
        loop {
            if let Some(a) = ch.early.remove(&number) {
                return Ok(a);
            }
            let mut buf = [0u8; 12];
            let n = match nix::sys::socket::recv(ch.sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                // A signal (SIGCHLD of a dying instance) interrupted the wait: wait on.
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => {
                    ch.abandoned.insert(number);
                    return Err(io::Error::other(format!(
                        "the spawner did not answer within {ANSWER_TIMEOUT:?}"
                    )));
                }
                Err(e) => return Err(gone(e.into())),
            };
            if n != 12 {
                return Err(gone(io::Error::from(io::ErrorKind::UnexpectedEof)));
            }
            let word = |i: usize| u32::from_ne_bytes(buf[i..i + 4].try_into().expect("4"));
            let answer = Answer {
                pid: word(4),
                code: word(8) as i32,
            };
            match ch.sort(number, word(0), answer) {
                Read::Mine(a) => return Ok(a),
                Read::Early(k, a) => {
                    ch.early.insert(k, a);
                }
                Read::Abandoned(a) => kill_and_reap(a.pid),
            }
        }
    }
}

fn gone(e: io::Error) -> io::Error {
    io::Error::other(format!("the spawner process is gone ({e})"))
}

/// Kills and reaps a child the agent will not supervise (0: none was started).
fn kill_and_reap(pid: u32) {
    if pid != 0 {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = waitpid(Pid::from_raw(pid as i32), None);
    }
}

/// A request sent to the spawner whose answer was not read yet. Dropped without
/// [`wait`](Self::wait), it still waits for the answer, and kills and reaps what started:
/// nothing runs that the agent does not supervise.
#[derive(Debug)]
pub(crate) struct Pending<'a> {
    spawner: &'a Spawner,
    number: u32,
    waited: bool,
}

impl Pending<'_> {
    /// Waits until the instance's program runs (or its start failed: the error names the
    /// confinement step, see [`explain`](crate::explain)).
    pub fn wait(mut self) -> io::Result<Child> {
        self.waited = true;
        let Answer { pid, code } = self.spawner.answer(self.number)?;
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

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.waited {
            if let Ok(a) = self.spawner.answer(self.number) {
                kill_and_reap(a.pid);
            }
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // Closing the socket ends the spawner; it is this process's child.
        let ch = self.channel.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = nix::sys::socket::shutdown(ch.sock.as_raw_fd(), nix::sys::socket::Shutdown::Both);
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

/// Most children the spawner watches at once (forked, not yet exec'd); beyond it, the
/// next request waits in the socket. The agent keeps fewer pending than this.
const MAX_FORKED: usize = 16;

/// The spawner's life: requests forked as they come, each answered once its child has
/// called `execve` (or failed), until the agent closes the socket.
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
    // Children forked and not yet exec'd, in the order forked, with their request's number.
    let mut forked: Vec<(u32, sys::Forked)> = Vec::new();
    loop {
        let more = forked.len() < MAX_FORKED;
        let (done, request) = {
            let mut polled: Vec<PollFd<'_>> = forked
                .iter()
                .map(|(_, f)| PollFd::new(f.pipe(), PollFlags::POLLIN))
                .chain(more.then(|| PollFd::new(sock.as_fd(), PollFlags::POLLIN)))
                .collect();
            match poll(&mut polled, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => sys::exit_now(0),
            }
            let ready: Vec<bool> = polled
                .iter()
                .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            let request = more && ready.last() == Some(&true);
            (ready, request)
        };
        // Children that exec'd or failed: answered in the order forked.
        let (finished, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut forked)
            .into_iter()
            .zip(&done)
            .partition(|(_, &d)| d);
        forked = waiting.into_iter().map(|(f, _)| f).collect();
        for ((number, child), _) in finished {
            let (pid, code) = match child.outcome() {
                Ok(pid) => (pid, 0),
                Err(failed) => failed,
            };
            answer(&sock, number, pid, code);
        }
        if request {
            let (payload, fds) = match recv_request(sock.as_raw_fd(), &mut buf) {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => quit(forked),
            };
            let number = payload
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            let started = match (decode(payload.get(4..).unwrap_or(&[]), fds), &devnull) {
                // The launch (and its descriptors) goes once the child has its copies.
                (Some(launch), Ok(null)) => {
                    sys::fork_instance(&launch, null.as_fd(), scope.as_ref().map(AsFd::as_fd))
                }
                (None, _) => Err((0, libc::EINVAL)),
                (_, Err(e)) => Err((0, *e as i32)),
            };
            match started {
                Ok(child) => forked.push((number, child)),
                Err((pid, code)) => answer(&sock, number, pid, code),
            }
        }
    }
}

/// Sends the answer to request `number`; ends the spawner if the agent is gone.
fn answer(sock: &OwnedFd, number: u32, pid: u32, code: i32) {
    let mut out = [0u8; 12];
    out[..4].copy_from_slice(&number.to_ne_bytes());
    out[4..8].copy_from_slice(&pid.to_ne_bytes());
    out[8..].copy_from_slice(&code.to_ne_bytes());
    if nix::sys::socket::send(sock.as_raw_fd(), &out, MsgFlags::MSG_NOSIGNAL).is_err() {
        sys::exit_now(0);
    }
}

/// The agent closed the socket: what it will never hear of is killed (it waits for every
/// answer it asked for, so this is only what it gave up on), then the spawner ends.
fn quit(forked: Vec<(u32, sys::Forked)>) -> ! {
    for (_, child) in forked {
        if let Ok(pid) = child.outcome() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
    sys::exit_now(0)
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
mod tests;
