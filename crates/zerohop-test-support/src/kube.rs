//! A real Kubernetes control plane for tests: Debian's etcd and a kube-apiserver built from
//! source by `cargo xtask kube` (into `target/kube/bin`, with kubectl), on free ports, in a
//! scratch folder, stopped and removed on drop.
//!
//! RBAC and admission policies are on. Three bearer-token users stand for the parts of an
//! installation: [`User::Admin`] (`system:masters`, what the test itself uses) and the service
//! accounts of `deploy/kubernetes/20-rbac.yaml`, so that the controller runs with exactly the
//! rights the manifests give it. A node's daemon runs with what its DaemonSet pod would get
//! ([`ControlPlane::node_kubeconfig`]): a service-account token bound to a pod on its node,
//! which the API server resolves to the node's name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::{free_port, wait_until, ChildGuard, TempDir};

/// Who a kubeconfig authenticates as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    /// Cluster admin.
    Admin,
    /// `system:serviceaccount:zerohop-system:zerohop-controller`.
    Controller,
    /// `system:serviceaccount:zerohop-system:zerohop-node` with a credential that names no
    /// node (as a long-lived Secret token would): a daemon's own is
    /// [`ControlPlane::node_kubeconfig`].
    Node,
}

impl User {
    fn token(self) -> &'static str {
        match self {
            User::Admin => "zerohop-test-admin",
            User::Controller => "zerohop-test-controller",
            User::Node => "zerohop-test-node",
        }
    }
}

/// etcd and kube-apiserver, running.
pub struct ControlPlane {
    // Dropped in this order: the API server, its etcd, then their folder.
    apiserver: ChildGuard,
    etcd: ChildGuard,
    dir: TempDir,
    host: String,
    port: u16,
}

/// The folder `cargo xtask kube` builds into.
pub fn kube_bin(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = root.join("target/kube/bin").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build the Kubernetes control plane with `cargo xtask kube` (`cargo xtask \
         test` does it)",
        bin.display()
    );
    bin
}

fn etcd_path() -> PathBuf {
    let p = PathBuf::from("/usr/bin/etcd");
    assert!(
        p.is_file(),
        "etcd is missing: `apt-get install etcd-server` (.ci/run installs it)"
    );
    p
}

impl ControlPlane {
    /// Starts etcd on loopback and the API server on `host` (an address of this namespace the
    /// test's nodes can reach); returns once `/readyz` answers.
    pub fn start(host: &str) -> Self {
        let dir = TempDir::new("kube");
        let d = dir.path();
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("openssl");
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(d.join("sa.key"))
            .arg("2048"));
        run(Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(d.join("sa.key"))
            .arg("-out")
            .arg(d.join("sa.pub")));
        let sa = |name: &str| {
            format!(
                "system:serviceaccount:zerohop-system:{name},{name},\"system:serviceaccounts,system:serviceaccounts:zerohop-system\""
            )
        };
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "{},admin,admin,system:masters\n{},{}\n{},{}\n",
                User::Admin.token(),
                User::Controller.token(),
                sa("zerohop-controller"),
                User::Node.token(),
                sa("zerohop-node"),
            ),
        )
        .expect("write tokens");
        let (client, peer) = (free_port(), free_port());
        let log = |name: &str| std::fs::File::create(d.join(name)).expect("create a log file");
        let etcd = ChildGuard::new(
            Command::new(etcd_path())
                .arg("--data-dir")
                .arg(d.join("etcd"))
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                ])
                .args([
                    "--initial-cluster",
                    &format!("default=http://127.0.0.1:{peer}"),
                ])
                .stdout(Stdio::null())
                .stderr(log("etcd.log"))
                .spawn()
                .expect("start etcd"),
        );
        let port = free_port();
        let apiserver = ChildGuard::new(
            Command::new(kube_bin("kube-apiserver"))
                .args(["--etcd-servers", &format!("http://127.0.0.1:{client}")])
                .args(["--bind-address", host, "--advertise-address", host])
                .args(["--secure-port", &port.to_string()])
                .arg("--cert-dir")
                .arg(d.join("certs"))
                .arg("--token-auth-file")
                .arg(d.join("tokens.csv"))
                .args(["--authorization-mode", "RBAC"])
                .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                .arg("--service-account-key-file")
                .arg(d.join("sa.pub"))
                .arg("--service-account-signing-key-file")
                .arg(d.join("sa.key"))
                .args(["--service-cluster-ip-range", "10.96.0.0/16"])
                .stdout(Stdio::null())
                .stderr(log("apiserver.log"))
                .spawn()
                .expect("start kube-apiserver"),
        );
        let plane = Self {
            dir,
            apiserver,
            etcd,
            host: host.to_owned(),
            port,
        };
        let ready = wait_until(Duration::from_secs(60), || {
            plane.kubectl(&["get", "--raw", "/readyz"]).status.success()
        });
        assert!(
            ready,
            "kube-apiserver not ready within 60 s; its log:\n{}",
            plane.log_tail()
        );
        plane
    }

    /// The last lines of the API server's and etcd's logs (for failure messages).
    pub fn log_tail(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        format!("{}\n--- etcd:\n{}", tail("apiserver.log"), tail("etcd.log"))
    }

    /// Pids of the API server and of etcd.
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver.pid(), self.etcd.pid())
    }

    /// `https://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}:{}", self.host, self.port)
    }

    /// A kubeconfig for `user` (written once, in the scratch folder).
    pub fn kubeconfig(&self, user: User) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("{user:?}.kubeconfig").to_lowercase());
        if !path.exists() {
            self.write_kubeconfig(&path, user.token());
        }
        path
    }

    /// A kubeconfig for the zerohop daemon of node `node` (a Node object the test made), with
    /// the credential its DaemonSet pod would get: a token of the service account
    /// `zerohop-node` bound to a pod on `node`. The pod is made here (`zerohop-node-NODE` in
    /// `zerohop-system`; no kubelet runs it) and the token by a TokenRequest bound to it, so
    /// that the API server authenticates the daemon as a kubelet's pod would be, with
    /// `authentication.kubernetes.io/node-name` = `node` in its user's extra. Needs the
    /// manifests installed (the service account). Written once.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        let path = self.dir.path().join(format!("node-{node}.kubeconfig"));
        if path.exists() {
            return path;
        }
        let pod = format!("zerohop-node-{node}");
        self.kubectl_ok(
            &["apply", "-f", "-"],
            Some(&format!(
                "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{pod}\",\
                 \"namespace\":\"zerohop-system\"}},\"spec\":{{\"nodeName\":\"{node}\",\
                 \"serviceAccountName\":\"zerohop-node\",\"automountServiceAccountToken\":false,\
                 \"containers\":[{{\"name\":\"zerohop\",\"image\":\"zerohop:0.1.0\"}}]}}}}"
            )),
        );
        let token = self.kubectl_ok(
            &[
                "-n",
                "zerohop-system",
                "create",
                "token",
                "zerohop-node",
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                &pod,
                "--duration",
                "24h",
            ],
            None,
        );
        self.write_kubeconfig(&path, token.trim());
        path
    }

    fn write_kubeconfig(&self, path: &Path, token: &str) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: test\n  context: {{cluster: test, user: u}}\ncurrent-context: test\n",
                self.url(),
                token
            ),
        )
        .expect("write a kubeconfig");
    }

    /// Runs kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(User::Admin, args, None)
    }

    /// Runs kubectl as `user`, with `stdin` fed to it when given.
    pub fn kubectl_as(&self, user: User, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl_with(&self.kubeconfig(user), args, stdin)
    }

    /// Runs kubectl with the credentials of `kubeconfig` (e.g. a node's,
    /// [`ControlPlane::node_kubeconfig`]), with `stdin` fed to it when given.
    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(kube_bin("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--request-timeout", "20s"])
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(text) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(text.as_bytes()).expect("write to kubectl");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// kubectl as the admin, which must succeed; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_as(User::Admin, args, stdin);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
