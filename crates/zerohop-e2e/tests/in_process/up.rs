//! `zerohop up` as a real process for the tests of this binary: the chain's URL from its
//! ready line, its log (stderr) collected, SIGTERM to stop it.

use std::io::BufRead;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{client, post};
use zerohop_test_support::{
    instances, spawn_with_fds, target_bin, wait_until, ChildGuard, Signal, TempDir,
};

/// `zerohop up` with its stderr (the log) collected; killed (SIGKILL) on drop, after which
/// the reaper takes its instances down.
pub struct Agent {
    pub guard: ChildGuard,
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
    _dir: TempDir,
}

impl Agent {
    pub fn start(spec: &str) -> Agent {
        Self::start_with(spec, &[], Vec::new())
    }

    /// Starts with extra environment variables and extra inherited descriptors (mapped to
    /// 3, 4, ... in the agent, not close-on-exec: what a careless parent leaves open).
    pub fn start_with(spec: &str, env: &[(&str, &str)], fds: Vec<OwnedFd>) -> Agent {
        let dir = TempDir::new("up");
        let file = dir.path().join("chain.yaml");
        std::fs::write(&file, spec).unwrap();
        let mut cmd = Command::new(target_bin("zerohop"));
        cmd.arg("up")
            .arg(&file)
            .args(["--listen", "127.0.0.1:0"])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = spawn_with_fds(cmd, fds);
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = guard.child_mut().stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("agent: {line}");
                sink.lock().unwrap().push(line);
            }
        });
        let stdout = guard.child_mut().stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no ready line; log: {:?}", log.lock().unwrap()));
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .to_owned();
        Agent {
            guard,
            url,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The instances (the agent's children but the spawner; the reaper is nobody's child).
    pub fn instances(&self) -> Vec<u32> {
        instances(self.pid())
    }

    pub fn call(&self, function: &str, body: &str) -> crate::common::Answer {
        post(&client(), &format!("{}/{function}", self.url), body)
    }

    /// Log lines containing every one of `needles`.
    pub fn lines(&self, needles: &[&str]) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .cloned()
            .collect()
    }

    /// Waits (bounded) for a log line containing every one of `needles`.
    pub fn log_line(&self, needles: &[&str], timeout: Duration) -> Option<String> {
        let mut found = None;
        wait_until(timeout, || {
            found = self.lines(needles).into_iter().next();
            found.is_some()
        });
        found
    }

    /// SIGTERM, as `zerohop down` ends a chain; the exit code if it ended within 30 s.
    pub fn stop(mut self) -> Option<i32> {
        self.guard.signal(Signal::SIGTERM);
        self.guard.wait_timeout(Duration::from_secs(30))
    }
}
