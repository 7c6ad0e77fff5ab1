//! A real Kubernetes control plane for tests: Debian's etcd and a kube-apiserver built from
//! source by `cargo xtask kube` (into `target/kube/bin`), on free ports, in a scratch folder,
//! stopped and removed on drop; and a client of its REST API, as each user of the test.
//!
//! RBAC and admission policies are on. Three bearer-token users stand for the parts of an
//! installation: [`User::Admin`] (`system:masters`, what the test itself uses) and the service
//! accounts of `deploy/kubernetes/20-rbac.yaml`, so that the controller runs with exactly the
//! rights the manifests give it. A node's daemon runs with what its DaemonSet pod would get
//! ([`ControlPlane::node_token`], [`ControlPlane::node_kubeconfig`]): a service-account token
//! bound to a pod on its node, which the API server resolves to the node's name.
//!
//! The tests speak to the API server as kubectl would, without kubectl (building it costs
//! minutes): [`ControlPlane::apply`] is a server-side apply (`kubectl apply --server-side`),
//! [`ControlPlane::create`] the create a client-side `kubectl apply` makes of an object that
//! does not exist yet (with `fieldValidation=Strict`, kubectl's default), both optionally as a
//! server dry run (`dryRun=All`: admission and validation run, nothing is stored). Every
//! answer keeps the API server's status code and body ([`Answer`]), so a refusal is checked by
//! the status the server gave that user's credential and the reason it wrote.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saphyr::{LoadableYamlNode, Yaml};

use crate::{free_port, wait_until, ChildGuard, TempDir};

/// Who a request or a kubeconfig authenticates as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    /// Cluster admin.
    Admin,
    /// `system:serviceaccount:zerohop-system:zerohop-controller`.
    Controller,
    /// `system:serviceaccount:zerohop-system:zerohop-node` with a credential that names no
    /// node (as a long-lived Secret token would): a daemon's own is
    /// [`ControlPlane::node_token`].
    Node,
}

impl User {
    /// Its bearer token (the API server's token file names it).
    pub fn token(self) -> &'static str {
        match self {
            User::Admin => "zerohop-test-admin",
            User::Controller => "zerohop-test-controller",
            User::Node => "zerohop-test-node",
        }
    }
}

/// What the API server answered: its HTTP status (0 when no answer came: the connection
/// failed or timed out, `body` then says why) and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// A 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// Whether the API server refused the request with 403 Forbidden by its admission policy
    /// `policy` (a `ValidatingAdmissionPolicy`), not by RBAC, which answers 403 too.
    pub fn refused_by_policy(&self, policy: &str) -> bool {
        self.status == 403
            && self
                .body
                .contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
    }
}

/// How [`ControlPlane::apply`] applies: `kubectl apply --server-side
/// --field-manager=MANAGER [--force-conflicts] [--dry-run=server] [--subresource=status]`.
#[derive(Clone, Copy, Debug)]
pub struct Apply<'a> {
    pub field_manager: &'a str,
    /// Takes the fields other managers own (`force=true`).
    pub force: bool,
    /// A server dry run: admission and validation run, nothing is stored.
    pub dry_run: bool,
    /// The subresource applied to (`status`), or the object itself.
    pub subresource: Option<&'a str>,
}

impl Apply<'_> {
    /// What the test applies as the admin: its own field manager, forcing conflicts.
    pub const TEST: Apply<'static> = Apply {
        field_manager: "zerohop-test",
        force: true,
        dry_run: false,
        subresource: None,
    };
}

/// One document of a manifest: its identity and its text as written.
#[derive(Clone, Debug)]
pub struct Doc {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// `metadata.namespace`, when it gives one.
    pub namespace: Option<String>,
    pub text: String,
}

impl Doc {
    /// The documents of `text` (YAML, or JSON: one document), in order; those without a kind
    /// (empty, only comments) are left out. Panics on what is not YAML, or on an object
    /// without `apiVersion`, `kind` or `metadata.name`.
    pub fn parse_all(text: &str) -> Vec<Doc> {
        let mut docs = Vec::new();
        let mut chunk = String::new();
        let lines = text.lines().chain(std::iter::once("---"));
        for line in lines {
            let rest = line.strip_prefix("---").map(str::trim_start);
            if rest.is_some_and(|r| r.is_empty() || r.starts_with('#')) {
                if let Some(d) = Doc::parse(&chunk) {
                    docs.push(d);
                }
                chunk.clear();
            } else {
                chunk.push_str(line);
                chunk.push('\n');
            }
        }
        docs
    }

    /// The one object of `text` (no `---` in it), `None` when it holds none.
    fn parse(text: &str) -> Option<Doc> {
        let yaml = Yaml::load_from_str(text).unwrap_or_else(|e| panic!("not YAML: {e}\n{text}"));
        let doc = yaml.into_iter().next()?;
        if doc.is_null() || doc.is_badvalue() {
            return None;
        }
        // A string at `path` (saphyr's indexing panics on a missing key).
        let at = |path: &[&str]| {
            let mut v = &doc;
            for key in path {
                v = v.as_mapping_get(key)?;
            }
            v.as_str().map(str::to_owned)
        };
        let field = |path: &[&str]| {
            at(path).unwrap_or_else(|| panic!("an object without {}:\n{text}", path.join(".")))
        };
        Some(Doc {
            api_version: field(&["apiVersion"]),
            kind: field(&["kind"]),
            name: field(&["metadata", "name"]),
            namespace: at(&["metadata", "namespace"]),
            text: text.to_owned(),
        })
    }

    /// The documents of the `.yaml` file `path`, or of every `.yaml` file in the folder
    /// `path` (not below it), in file name order, as `kubectl apply -f PATH` takes them.
    pub fn read(path: &Path) -> Vec<Doc> {
        let files = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml"))
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_owned()]
        };
        files
            .iter()
            .flat_map(|f| {
                let text =
                    std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                Doc::parse_all(&text)
            })
            .collect()
    }

    /// How kubectl names it: `KIND.GROUP/NAME` in lower case (`daemonset.apps/zerohop-node`),
    /// `KIND/NAME` for the core group (`serviceaccount/zerohop-node`).
    pub fn label(&self) -> String {
        match self.api_version.split_once('/') {
            Some((group, _)) => format!("{}.{group}/{}", self.kind.to_lowercase(), self.name),
            None => format!("{}/{}", self.kind.to_lowercase(), self.name),
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
    http: ureq::Agent,
    /// What discovery said of each (apiVersion, kind): its resource and whether it lives in
    /// a namespace.
    resources: Mutex<HashMap<(String, String), (String, bool)>>,
    /// The bound tokens of node daemons, by node.
    node_tokens: Mutex<HashMap<String, String>>,
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

/// How long one request may take, as kubectl's `--request-timeout 20s` allowed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `cond` every 100 ms (a pace kubectl's start-up set before) until it holds or
/// `within` passed; whether it held.
pub fn poll(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_until(within, || {
        let held = cond();
        if !held {
            std::thread::sleep(Duration::from_millis(100));
        }
        held
    })
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
            http: ureq::AgentBuilder::new()
                .tls_config(Arc::new(any_server_certificate()))
                .timeout(REQUEST_TIMEOUT)
                .build(),
            resources: Mutex::new(HashMap::new()),
            node_tokens: Mutex::new(HashMap::new()),
        };
        let ready = poll(Duration::from_secs(60), || {
            plane.get("/readyz").status == 200
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

    /// The credential the zerohop daemon of node `node` (a Node object the test made) gets
    /// from its DaemonSet pod: a token of the service account `zerohop-node` bound to a pod on
    /// `node`. The pod is made here (`zerohop-node-NODE` in `zerohop-system`; no kubelet runs
    /// it) and the token by a TokenRequest bound to it (`kubectl create token
    /// --bound-object-kind Pod`), so that the API server authenticates the daemon as a
    /// kubelet's pod would be, with `authentication.kubernetes.io/node-name` = `node` in its
    /// user's extra. Needs the manifests installed (the service account). Made once.
    pub fn node_token(&self, node: &str) -> String {
        if let Some(t) = self.node_tokens.lock().unwrap().get(node) {
            return t.clone();
        }
        let pod = format!("zerohop-node-{node}");
        self.apply_ok(&format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{pod}\",\
             \"namespace\":\"zerohop-system\"}},\"spec\":{{\"nodeName\":\"{node}\",\
             \"serviceAccountName\":\"zerohop-node\",\"automountServiceAccountToken\":false,\
             \"containers\":[{{\"name\":\"zerohop\",\"image\":\"zerohop:0.1.0\"}}]}}}}"
        ));
        let answer = self.request(
            User::Admin.token(),
            "POST",
            "/api/v1/namespaces/zerohop-system/serviceaccounts/zerohop-node/token",
            Some((
                "application/json",
                &format!(
                    "{{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenRequest\",\
                     \"spec\":{{\"expirationSeconds\":86400,\"boundObjectRef\":{{\
                     \"apiVersion\":\"v1\",\"kind\":\"Pod\",\"name\":\"{pod}\"}}}}}}"
                ),
            )),
        );
        let token = answer.json()["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {pod}: {answer:?}"))
            .to_owned();
        self.node_tokens
            .lock()
            .unwrap()
            .insert(node.to_owned(), token.clone());
        token
    }

    /// A kubeconfig with [`ControlPlane::node_token`] of `node`, for its daemon. Written once.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        let path = self.dir.path().join(format!("node-{node}.kubeconfig"));
        if !path.exists() {
            self.write_kubeconfig(&path, &self.node_token(node));
        }
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

    /// `METHOD PATH` (with its query) with bearer `token` and, when given, a body of a content
    /// type: the API server's answer, whatever its status.
    pub fn request(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<(&str, &str)>,
    ) -> Answer {
        let req = self
            .http
            .request(method, &format!("{}{path}", self.url()))
            .set("Authorization", &format!("Bearer {token}"))
            .set("Accept", "application/json");
        let sent = match body {
            Some((content_type, text)) => req.set("Content-Type", content_type).send_string(text),
            None => req.call(),
        };
        let (status, response) = match sent {
            Ok(r) => (r.status(), r),
            Err(ureq::Error::Status(status, r)) => (status, r),
            Err(e) => {
                return Answer {
                    status: 0,
                    body: format!("{method} {path}: {e}"),
                }
            }
        };
        Answer {
            status,
            body: response
                .into_string()
                .unwrap_or_else(|e| format!("(unreadable body: {e})")),
        }
    }

    /// `GET PATH` as the admin.
    pub fn get(&self, path: &str) -> Answer {
        self.request(User::Admin.token(), "GET", path, None)
    }

    /// `GET PATH` as the admin, which must succeed: its JSON.
    pub fn get_ok(&self, path: &str) -> serde_json::Value {
        let a = self.get(path);
        assert!(a.ok(), "GET {path}: {a:?}");
        a.json()
    }

    /// A JSON merge patch (`kubectl patch --type=merge`) of `path` as the admin, which must
    /// succeed.
    pub fn merge_patch_ok(&self, path: &str, patch: &str) {
        let a = self.request(
            User::Admin.token(),
            "PATCH",
            path,
            Some(("application/merge-patch+json", patch)),
        );
        assert!(a.ok(), "PATCH {path} {patch}: {a:?}");
    }

    /// `DELETE PATH` with bearer `token`.
    pub fn delete(&self, token: &str, path: &str) -> Answer {
        self.request(token, "DELETE", path, None)
    }

    /// The path of `doc`'s object (with `/SUBRESOURCE`), its resource found by discovery;
    /// namespaced objects without a namespace are in `default`.
    pub fn path_of(&self, doc: &Doc, subresource: Option<&str>) -> String {
        let (resource, namespaced) = self.resource(&doc.api_version, &doc.kind);
        let base = self.collection(&doc.api_version, &resource, namespaced, doc);
        let sub = subresource.map(|s| format!("/{s}")).unwrap_or_default();
        format!("{base}/{}{sub}", doc.name)
    }

    fn collection(&self, api_version: &str, resource: &str, namespaced: bool, doc: &Doc) -> String {
        let group = if api_version.contains('/') {
            format!("/apis/{api_version}")
        } else {
            format!("/api/{api_version}")
        };
        if namespaced {
            let ns = doc.namespace.as_deref().unwrap_or("default");
            format!("{group}/namespaces/{ns}/{resource}")
        } else {
            format!("{group}/{resource}")
        }
    }

    /// The resource of `kind` in `api_version` and whether it is namespaced, from discovery
    /// (`GET /apis/GROUP/VERSION`), remembered once found.
    fn resource(&self, api_version: &str, kind: &str) -> (String, bool) {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(r) = self.resources.lock().unwrap().get(&key) {
            return r.clone();
        }
        let path = if api_version.contains('/') {
            format!("/apis/{api_version}")
        } else {
            format!("/api/{api_version}")
        };
        let list = self.get_ok(&path);
        let mut found = None;
        let mut known = self.resources.lock().unwrap();
        for r in list["resources"].as_array().into_iter().flatten() {
            let (Some(name), Some(k)) = (r["name"].as_str(), r["kind"].as_str()) else {
                continue;
            };
            if name.contains('/') {
                continue; // a subresource
            }
            let value = (name.to_owned(), r["namespaced"].as_bool().unwrap_or(false));
            if k == kind {
                found = Some(value.clone());
            }
            known.insert((api_version.to_owned(), k.to_owned()), value);
        }
        found.unwrap_or_else(|| panic!("the API server serves no {kind} in {api_version}: {list}"))
    }

    /// Server-side apply of `doc` with bearer `token`, as `how` says.
    pub fn apply(&self, token: &str, doc: &Doc, how: Apply<'_>) -> Answer {
        let mut query = format!("fieldManager={}", how.field_manager);
        if how.force {
            query.push_str("&force=true");
        }
        if how.dry_run {
            query.push_str("&dryRun=All");
        }
        let path = format!("{}?{query}", self.path_of(doc, how.subresource));
        self.request(
            token,
            "PATCH",
            &path,
            Some(("application/apply-patch+yaml", &doc.text)),
        )
    }

    /// Every object of `docs` applied as the admin ([`Apply::TEST`]), in order, each of which
    /// must pass.
    pub fn apply_docs_ok(&self, docs: &[Doc]) {
        for d in docs {
            let a = self.apply(User::Admin.token(), d, Apply::TEST);
            assert!(a.ok(), "apply {}: {a:?}", d.label());
        }
    }

    /// Every object of `text` (YAML or JSON) applied as the admin, each of which must pass.
    pub fn apply_ok(&self, text: &str) {
        self.apply_docs_ok(&Doc::parse_all(text));
    }

    /// Every object of the file or folder `path` applied as the admin (`kubectl apply -f
    /// PATH`), each of which must pass.
    pub fn apply_path_ok(&self, path: &Path) {
        self.apply_docs_ok(&Doc::read(path));
    }

    /// Creates `doc`'s object with bearer `token` (`POST` of its text, `fieldValidation=Strict`
    /// so that an unknown field is an error, as kubectl asks), as a server dry run when
    /// `dry_run`: 201 when it would be made, otherwise the API server's refusal.
    pub fn create(&self, token: &str, doc: &Doc, dry_run: bool) -> Answer {
        let (resource, namespaced) = self.resource(&doc.api_version, &doc.kind);
        let mut path = format!(
            "{}?fieldValidation=Strict",
            self.collection(&doc.api_version, &resource, namespaced, doc)
        );
        if dry_run {
            path.push_str("&dryRun=All");
        }
        self.request(token, "POST", &path, Some(("application/yaml", &doc.text)))
    }
}

/// TLS that takes whatever certificate the API server shows (the kubeconfigs' own
/// `insecure-skip-tls-verify`: it made a self-signed one at start), still checking that the
/// server holds its key.
fn any_server_certificate() -> rustls::ClientConfig {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("rustls's default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_split_into_their_objects_named_as_kubectl_names_them() {
        let text = "# a comment\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  \
                    namespace: ns\n---\n# only a comment\n--- # a comment after\napiVersion: \
                    apps/v1\nkind: DaemonSet\nmetadata: { name: b }\nspec: {}\n---\n";
        let docs = Doc::parse_all(text);
        let labels: Vec<String> = docs.iter().map(Doc::label).collect();
        assert_eq!(labels, ["serviceaccount/a", "daemonset.apps/b"]);
        assert_eq!(docs[0].namespace.as_deref(), Some("ns"));
        assert_eq!(docs[1].namespace, None);
        assert!(
            docs[1].text.starts_with("apiVersion: apps/v1\n"),
            "{:?}",
            docs[1].text
        );
        let json = Doc::parse_all(
            "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"n\"}}",
        );
        assert_eq!(json.len(), 1);
        assert_eq!(json[0].label(), "node/n");
    }

    #[test]
    fn a_refusal_counts_only_as_the_named_policy_s_403() {
        let body = "{\"message\":\"leases.coordination.k8s.io \\\"x\\\" is forbidden: \
                    ValidatingAdmissionPolicy 'zerohop-node' with binding 'zerohop-node' denied \
                    request\"}";
        let a = |status| Answer {
            status,
            body: body.to_owned(),
        };
        assert!(a(403).refused_by_policy("zerohop-node"));
        assert!(!a(403).refused_by_policy("other"));
        assert!(!a(422).refused_by_policy("zerohop-node"));
        let rbac = Answer {
            status: 403,
            body: "leases is forbidden: User cannot patch resource".to_owned(),
        };
        assert!(!rbac.refused_by_policy("zerohop-node"));
    }
}
