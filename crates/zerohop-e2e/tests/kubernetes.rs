//! zerohop on Kubernetes, against a real control plane (etcd and a kube-apiserver built from
//! source by `cargo xtask kube`) with RBAC and the manifests' admission policy on, spoken to
//! through its REST API as each user (`zerohop_test_support::kube`). Nodes are
//! network namespaces on one machine, each running `zerohop agent --kube-node` with the
//! credential its DaemonSet pod would have: a token of the node service account bound to a pod
//! on its node, which the API server resolves to that node (the code path is the same); the
//! controllers run with the controller service account's. Clients reach the replicas through
//! the addresses the Chain's EndpointSlices publish, as a Service proxy would.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use zerohop_test_support::kube::{poll, Answer, Apply, ControlPlane, Doc, User};
use zerohop_test_support::netns::{Host, Network};
use zerohop_test_support::{target_bin, wait_until, ChildGuard, ChildLines, Signal, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifests() -> PathBuf {
    repo().join("deploy/kubernetes")
}

/// The hello chain as a Chain resource.
fn hello(replicas: u32) -> String {
    format!(
        "apiVersion: zerohop.dev/v1alpha1
kind: Chain
metadata: {{ name: hello, namespace: default }}
spec:
  replicas: {replicas}
  timeout: 10s
  gateway_threads: 1
  functions:
    upper:   {{ command: [bin/upper] }}
    exclaim: {{ command: [bin/exclaim] }}
  routes:
    - http: POST /hello
      sequence: [upper, exclaim]
"
    )
}

/// Installs the manifests (namespace first: the rest lives in it) and waits for the CRDs and
/// for the admission policy to be in force.
fn install(plane: &ControlPlane) {
    plane.apply_path_ok(&manifests().join("00-namespace.yaml"));
    plane.apply_path_ok(&manifests());
    for crd in ["chains.zerohop.dev", "chainparts.zerohop.dev"] {
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}");
        let mut last = None;
        let established = poll(Duration::from_secs(30), || {
            let a = plane.get(&path);
            let held = a.json()["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True");
            last = Some(a);
            held
        });
        assert!(established, "{crd} not established within 30 s: {last:?}");
    }
    // The API server loads a new policy in the background: until then it lets everything
    // through. A credential of the node service account that names no node is refused once
    // it is loaded (a server dry run runs admission, and changes nothing).
    let probe = one(&lease("zerohop-node-node-0", "node-0", "127.0.0.1"));
    let mut out = None;
    let loaded = poll(Duration::from_secs(20), || {
        let a = plane.apply(User::Node.token(), &probe, node_apply(true));
        let refused = a.refused_by_policy("zerohop-node");
        out = Some(a);
        refused
    });
    assert!(
        loaded,
        "the admission policy zerohop-node is not in force: {:?}",
        out
    );
}

/// The one object of `text`.
fn one(text: &str) -> Doc {
    let mut docs = Doc::parse_all(text);
    assert_eq!(docs.len(), 1, "not one object: {text}");
    docs.remove(0)
}

/// How a node's daemon writes its objects: server-side apply as `zerohop-node`, forcing
/// conflicts (`kubectl apply --server-side --force-conflicts --field-manager=zerohop-node`).
fn node_apply(dry_run: bool) -> Apply<'static> {
    Apply {
        field_manager: "zerohop-node",
        force: true,
        dry_run,
        subresource: None,
    }
}

/// The API server's message in a refusal (its `Status`), or the whole answer.
fn message(a: &Answer) -> String {
    a.json()["message"].as_str().map_or_else(
        || format!("{} {}", a.status, a.body),
        |m| format!("{} {m}", a.status),
    )
}

/// A heartbeat lease as a daemon writes it (server-side apply): `name`, held by `holder`, with
/// `address` as the node's address.
fn lease(name: &str, holder: &str, address: &str) -> String {
    format!(
        "{{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{{\
         \"name\":\"{name}\",\"namespace\":\"zerohop-system\",\"annotations\":{{\
         \"zerohop.dev/address\":\"{address}\"}}}},\"spec\":{{\"holderIdentity\":\"{holder}\",\
         \"leaseDurationSeconds\":3600}}}}"
    )
}

#[test]
fn the_manifests_pass_a_server_dry_run_and_a_wrong_chain_is_refused_with_its_field_path() {
    let plane = ControlPlane::start("127.0.0.1");
    // The objects of deploy/kubernetes live in zerohop-system, which a dry run does not make.
    plane.apply_path_ok(&manifests().join("00-namespace.yaml"));
    // Each object passes a server dry run (a server-side apply, as the daemons and the
    // controller write): 201 for those it would make.
    let dry = Apply {
        dry_run: true,
        ..Apply::TEST
    };
    let dry_run = |docs: Vec<Doc>| -> Vec<String> {
        docs.iter()
            .map(|d| {
                let a = plane.apply(User::Admin.token(), d, dry);
                assert!(
                    a.ok(),
                    "{} fails a server dry run: {}",
                    d.label(),
                    message(&a)
                );
                format!(
                    "{} {} (server dry run)",
                    d.label(),
                    if a.status == 201 {
                        "created"
                    } else {
                        "unchanged"
                    }
                )
            })
            .collect()
    };
    let out = dry_run(Doc::read(&manifests())).join("\n");
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/chains.zerohop.dev",
        "customresourcedefinition.apiextensions.k8s.io/chainparts.zerohop.dev",
        "clusterrole.rbac.authorization.k8s.io/zerohop-controller",
        "clusterrole.rbac.authorization.k8s.io/zerohop-node",
        "serviceaccount/zerohop-node",
        "validatingadmissionpolicy.admissionregistration.k8s.io/zerohop-node",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/zerohop-node",
        "daemonset.apps/zerohop-node",
        "deployment.apps/zerohop-controller",
    ] {
        assert!(
            out.contains(&format!("{object} created (server dry run)")),
            "{object} missing from the dry run:\n{out}"
        );
    }
    install(&plane);

    // The example Chains pass.
    let out = dry_run(Doc::read(&manifests().join("examples"))).join("\n");
    assert!(
        out.contains("chain.zerohop.dev/hello created (server dry run)"),
        "{out}"
    );

    // A valid Chain passes; each wrong one is refused naming its field (the create a
    // client-side `kubectl apply --dry-run=server` makes of a new object).
    let create = |doc: &str| plane.create(User::Admin.token(), &one(doc), true);
    let a = create(&hello(3));
    assert_eq!(a.status, 201, "a valid Chain: {}", message(&a));
    let cases: &[(&str, &str, &str)] = &[
        (
            "    upper:   { command: [bin/upper] }",
            "    upper:   { command: [bin/upper], instances: 100 }",
            "spec.functions.upper.instances",
        ),
        ("  timeout: 10s", "  timeout: 10 parsecs", "spec.timeout"),
        (
            "  gateway_threads: 1",
            "  gateway_threads: 99",
            "spec.gateway_threads",
        ),
        ("  replicas: 3", "  replicas: -1", "spec.replicas"),
        (
            "    - http: POST /hello",
            "    - http: hello",
            "spec.routes[0].http",
        ),
        (
            "    upper:   { command: [bin/upper] }",
            "    upper:   { runtime: ruby, handler: x }",
            "spec.functions.upper.runtime",
        ),
        (
            "    exclaim: { command: [bin/exclaim] }",
            "    exclaim: { command: [bin/exclaim], calls: [nobody] }",
            "spec.functions",
        ),
        (
            "  timeout: 10s",
            "  timeout: 10s\n  placement: { parts: [[nobody]] }",
            "spec.placement.parts",
        ),
        (
            "  timeout: 10s",
            "  timeout: 10s\n  pool: { slotz: 4 }",
            "spec.pool.slotz",
        ),
        (
            "    - http: POST /hello",
            "    - http: POST /hello\n      grpc: a.B/C",
            "spec.routes[0]",
        ),
        (
            "      sequence: [upper, exclaim]",
            "      sequence: [upper, exclaim]\n      retry: { statuses: [200] }",
            "spec.routes[0].retry.statuses[0]",
        ),
        (
            "      sequence: [upper, exclaim]",
            "      sequence: [upper, exclaim]\n      rate_limit: { per: 1s }",
            "spec.routes[0].rate_limit.requests",
        ),
    ];
    for (from, to, field) in cases {
        let doc = hello(3).replace(from, to);
        assert_ne!(doc, hello(3), "case {field} changed nothing");
        let a = create(&doc);
        // 422 Invalid or 400 BadRequest (an unknown field), never a failure elsewhere.
        assert!(
            a.status == 422 || a.status == 400,
            "{field}: not refused as invalid:\n{doc}\n{}",
            message(&a)
        );
        let err = message(&a);
        assert!(err.contains(field), "{field}: not named in: {err}");
    }

    // Every chain spec the project ships (without MQTT or CoAP ingress, which a Chain does not
    // carry) passes the schema as the spec of a Chain.
    let mut checked = 0;
    for file in shipped_specs() {
        let text = std::fs::read_to_string(&file).expect("read a spec");
        if ["mqtt:", "coap:", "listen:"]
            .iter()
            .any(|k| text.lines().any(|l| l.trim_start().starts_with(k)))
        {
            continue;
        }
        let mut doc = String::from(
            "apiVersion: zerohop.dev/v1alpha1\nkind: Chain\nmetadata: { name: shipped }\nspec:\n",
        );
        for line in text.lines().filter(|l| !l.starts_with("name:")) {
            doc.push_str("  ");
            doc.push_str(line);
            doc.push('\n');
        }
        let a = create(&doc);
        assert_eq!(
            a.status,
            201,
            "{} is refused as a Chain: {}",
            file.display(),
            message(&a)
        );
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} shipped specs checked");
}

/// The chain specs under examples/ and apps/.
fn shipped_specs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![repo().join("examples"), repo().join("apps")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("node_modules") && !p.ends_with("target") {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml")
                && std::fs::read_to_string(&p)
                    .is_ok_and(|t| t.contains("\nfunctions:") && t.contains("\nroutes:"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A node: a network namespace running a daemon that takes part in the cluster.
struct Node {
    name: String,
    host: Host,
    /// Its daemon's credential: a token bound to a pod on this node, and a kubeconfig with it.
    token: String,
    kubeconfig: PathBuf,
    daemon: Option<ChildGuard>,
    /// Its standard output, read on (a reader dropped would leave its later lines to EPIPE).
    _lines: Option<ChildLines>,
}

/// Nodes, controllers and their control plane.
struct Cluster {
    nodes: Vec<Node>,
    controllers: Vec<Option<ChildGuard>>,
    plane: ControlPlane,
    net: Network,
    dir: TempDir,
}

impl Cluster {
    fn start(nodes: usize, controllers: usize) -> Self {
        let net = Network::create(nodes);
        let plane = ControlPlane::start(&net.gateway_ip());
        install(&plane);
        let dir = TempDir::new("cluster");
        // The programs folder of every node: `bin` is this build's binaries.
        let programs = dir.path().join("programs");
        std::fs::create_dir_all(&programs).unwrap();
        let release = target_bin("zerohop").parent().unwrap().to_owned();
        std::os::unix::fs::symlink(&release, programs.join("bin")).unwrap();
        // What the daemons authenticate each other with (a mounted Secret in a cluster).
        std::fs::write(
            dir.path().join("peer-secret"),
            "a shared secret of the test cluster\n",
        )
        .unwrap();
        let mut cluster = Self {
            nodes: Vec::new(),
            controllers: Vec::new(),
            plane,
            net,
            dir,
        };
        for (i, host) in cluster.net.hosts().to_vec().into_iter().enumerate() {
            let name = format!("node-{i}");
            cluster.plane.apply_ok(&format!(
                "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{name}\"}}}}"
            ));
            cluster.plane.merge_patch_ok(
                &format!("/api/v1/nodes/{name}/status"),
                &format!(
                        "{{\"status\":{{\"addresses\":[{{\"type\":\"InternalIP\",\"address\":\"{}\"}}],\
                         \"conditions\":[{{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\
                         \"message\":\"test\",\"lastHeartbeatTime\":\"2026-01-01T00:00:00Z\",\
                         \"lastTransitionTime\":\"2026-01-01T00:00:00Z\"}}]}}}}",
                    host.ip
                ),
            );
            let token = cluster.plane.node_token(&name);
            let kubeconfig = cluster.plane.node_kubeconfig(&name);
            cluster.nodes.push(Node {
                name,
                host,
                token,
                kubeconfig,
                daemon: None,
                _lines: None,
            });
        }
        for i in 0..cluster.nodes.len() {
            cluster.start_daemon(i);
        }
        for i in 0..controllers {
            let c = cluster.start_controller(i);
            cluster.controllers.push(Some(c));
        }
        cluster
    }

    fn start_daemon(&mut self, i: usize) {
        let node = &self.nodes[i];
        let log =
            std::fs::File::create(self.dir.path().join(format!("{}.log", node.name))).unwrap();
        let mut child = ChildGuard::new(
            node.host
                .command(target_bin("zerohop"))
                .arg("agent")
                .arg("--socket")
                .arg(self.dir.path().join(format!("{}.sock", node.name)))
                .args(["--metrics", "none", "--kube-node", &node.name])
                .args(["--node-address", &node.host.ip, "--heartbeat", "2s"])
                .arg("--kubeconfig")
                .arg(&node.kubeconfig)
                .arg("--programs")
                .arg(self.dir.path().join("programs"))
                .arg("--peer-secret")
                .arg(self.dir.path().join("peer-secret"))
                .env("ZEROHOP_LOG", "info")
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .expect("start a node daemon"),
        );
        let lines = ChildLines::new(&mut child);
        lines.wait_for(&node.name, "daemon ready", Duration::from_secs(20));
        self.nodes[i].daemon = Some(child);
        self.nodes[i]._lines = Some(lines);
    }

    fn start_controller(&self, i: usize) -> ChildGuard {
        let log =
            std::fs::File::create(self.dir.path().join(format!("controller-{i}.log"))).unwrap();
        ChildGuard::new(
            Command::new(target_bin("zerohop"))
                .arg("controller")
                .arg("--kubeconfig")
                .arg(self.plane.kubeconfig(User::Controller))
                .args(["--identity", &format!("controller-{i}"), "--lease", "3s"])
                .env("ZEROHOP_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start a controller"),
        )
    }

    /// Every log of the cluster's processes, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                out.push_str(&format!(
                    "--- {}\n{}\n",
                    e.path().display(),
                    lines[lines.len().saturating_sub(25)..].join("\n")
                ));
            }
        }
        out.push_str(&format!("--- control plane\n{}", self.plane.log_tail()));
        out
    }

    /// The Chain's endpoints from its EndpointSlices: (address:port, node, ready).
    fn endpoints(&self, chain: &str) -> Vec<(String, String, bool)> {
        endpoints_of(&self.plane, chain)
    }

    fn chain(&self, chain: &str) -> serde_json::Value {
        self.plane
            .get_ok(&format!("{CHAINS}/namespaces/default/chains/{chain}"))
    }

    /// Waits until the Chain has `n` ready endpoints on nodes passing `nodes_ok`.
    fn wait_ready(
        &self,
        chain: &str,
        n: usize,
        nodes_ok: impl Fn(&[String]) -> bool,
        within: Duration,
    ) -> Vec<String> {
        let mut last = Vec::new();
        let ok = poll(within, || {
            last = self.endpoints(chain);
            let ready: Vec<_> = last.iter().filter(|e| e.2).collect();
            let nodes: Vec<String> = ready.iter().map(|e| e.1.clone()).collect();
            ready.len() == n && last.len() == n && nodes_ok(&nodes)
        });
        assert!(
            ok,
            "chain {chain}: not {n} ready endpoints within {within:?}: {last:?}\nstatus: {}\n{}",
            self.chain(chain)["status"],
            self.logs()
        );
        last.into_iter().map(|e| e.0).collect()
    }
}

/// The API group and version of Chains and ChainParts.
const CHAINS: &str = "/apis/zerohop.dev/v1alpha1";

fn endpoints_of(plane: &ControlPlane, chain: &str) -> Vec<(String, String, bool)> {
    let a = plane.get(&format!(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices\
         ?labelSelector=kubernetes.io%2Fservice-name%3D{chain}"
    ));
    parse_slices(&a.json())
}

/// A list of EndpointSlices as (address:port, node, ready), sorted; empty when it is not
/// such a list.
fn parse_slices(list: &serde_json::Value) -> Vec<(String, String, bool)> {
    let mut all = Vec::new();
    for s in list["items"].as_array().into_iter().flatten() {
        let port = s["ports"][0]["port"].as_u64().unwrap_or(0);
        for e in s["endpoints"].as_array().into_iter().flatten() {
            all.push((
                format!("{}:{port}", e["addresses"][0].as_str().unwrap_or("")),
                e["nodeName"].as_str().unwrap_or("").to_owned(),
                e["conditions"]["ready"].as_bool().unwrap_or(false),
            ));
        }
    }
    all.sort();
    all
}

/// The hello chain with `exclaim` in a part of its own: a replica spans two nodes.
const SPLIT: &str = "apiVersion: zerohop.dev/v1alpha1
kind: Chain
metadata: { name: split, namespace: default }
spec:
  replicas: 1
  timeout: 5s
  gateway_threads: 1
  placement: { parts: [[exclaim]] }
  functions:
    upper:   { command: [bin/upper] }
    exclaim: { command: [bin/exclaim] }
  routes:
    - http: POST /hello
      sequence: [upper, exclaim]
";

/// One request on a connection of its own: the status and body, `Err(true)` when the
/// connection was refused, `Err(false)` when it was accepted but not answered.
fn post(addr: &str, body: &str) -> Result<(u16, String), (bool, String)> {
    let a: SocketAddr = addr
        .parse()
        .map_err(|_| (true, format!("bad address {addr}")))?;
    let mut s = TcpStream::connect_timeout(&a, Duration::from_secs(2))
        .map_err(|e| (true, format!("{addr}: {e}")))?;
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let req = format!(
        "POST /hello HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| (false, format!("{addr}: write: {e}")))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| (false, format!("{addr}: read: {e}")))?;
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| (false, format!("{addr}: answered {answer:?}")))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}

/// The node of ChainPart `REPLICA-PART`, empty while the part does not exist (a moved part is
/// deleted, then made anew).
fn part_node(plane: &ControlPlane, replica: &str, part: u32) -> String {
    let a = plane.get(&format!(
        "{CHAINS}/namespaces/default/chainparts/{replica}-{part}"
    ));
    if a.ok() {
        a.json()["spec"]["node"].as_str().unwrap_or("").to_owned()
    } else {
        String::new()
    }
}

/// `post` of "hello world", which must come back as 200 `HELLO WORLD!`.
fn post_hello(addr: &str) -> Result<(), (bool, String)> {
    match post(addr, "hello world")? {
        (200, body) if body == "HELLO WORLD!" => Ok(()),
        (status, body) => Err((false, format!("{addr}: answered {status} {body:?}"))),
    }
}

/// Sets the flag that stops a test's load threads when dropped: at the end of the load, or
/// when an assertion fails first (the thread scope then joins them before the panic goes on).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        // Relaxed: the threads only poll it; their joins order what they counted.
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Node B's daemon's own credential against node A's objects and the controller's: the API
/// server refuses every write with 403 (its admission policy, not RBAC, which allows the verbs)
/// and A's objects stay as they were; B's writes to its own objects pass (a server dry run,
/// which runs admission too); each daemon's start-up check found its credential names its node.
fn nodes_write_only_their_own_objects(cluster: &Cluster) {
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let plane = &cluster.plane;
    let parts = plane.get_ok(&format!("{CHAINS}/chainparts"));
    let part_on = |node: &str| {
        parts["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["spec"]["node"] == node)
            .map(|p| {
                (
                    p["metadata"]["namespace"].as_str().unwrap().to_owned(),
                    p["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .unwrap_or_else(|| panic!("no part on {node}: {parts}"))
    };
    let status = |(ns, name): &(String, String)| {
        one(&format!(
            "{{\"apiVersion\":\"zerohop.dev/v1alpha1\",\"kind\":\"ChainPart\",\"metadata\":{{\
             \"name\":\"{name}\",\"namespace\":\"{ns}\"}},\"status\":{{\"phase\":\"Failed\",\
             \"ready\":false,\"message\":\"forged\"}}}}"
        ))
    };
    let (on_a, on_b) = (part_on(&a.name), part_on(&b.name));
    let a_lease = format!("zerohop-node-{}", a.name);
    let leases = "/apis/coordination.k8s.io/v1/namespaces/zerohop-system/leases";
    let apply_status = |dry_run| Apply {
        subresource: Some("status"),
        ..node_apply(dry_run)
    };
    // What B's credential tries: a server-side apply of an object as the daemon writes its
    // own, or a delete.
    enum Write {
        Apply(Doc, Apply<'static>),
        Delete(String),
    }
    let forged = [
        (
            "rewrite A's heartbeat (its address)",
            Write::Apply(
                one(&lease(&a_lease, &a.name, &b.host.ip)),
                node_apply(false),
            ),
        ),
        (
            "delete A's heartbeat",
            Write::Delete(format!("{leases}/{a_lease}")),
        ),
        (
            "make a heartbeat for a node that is not its own",
            Write::Apply(
                one(&lease("zerohop-node-node-9", "node-9", &b.host.ip)),
                node_apply(false),
            ),
        ),
        (
            "take the controller's leader lease",
            Write::Apply(
                one(&lease("zerohop-controller", &b.name, &b.host.ip)),
                node_apply(false),
            ),
        ),
        (
            "delete the controller's leader lease",
            Write::Delete(format!("{leases}/zerohop-controller")),
        ),
        (
            "flip the status of A's part",
            Write::Apply(status(&on_a), apply_status(false)),
        ),
    ];
    for (what, write) in &forged {
        let answer = match write {
            Write::Apply(doc, how) => plane.apply(&b.token, doc, *how),
            Write::Delete(path) => plane.delete(&b.token, path),
        };
        assert!(
            answer.refused_by_policy("zerohop-node"),
            "{} could {what}: {}",
            b.name,
            message(&answer)
        );
    }
    // A's objects are as A and the controllers wrote them.
    let a_address = plane.get_ok(&format!("{leases}/{a_lease}"))["metadata"]["annotations"]
        ["zerohop.dev/address"]
        .clone();
    assert_eq!(a_address, a.host.ip.as_str(), "{a_lease} was rewritten");
    let holder = plane.get_ok(&format!("{leases}/zerohop-controller"))["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        holder.starts_with("controller-"),
        "the leader is {holder:?}"
    );
    let phase = plane.get_ok(&format!(
        "{CHAINS}/namespaces/{}/chainparts/{}",
        on_a.0, on_a.1
    ))["status"]["phase"]
        .clone();
    assert_eq!(phase, "Running", "A's part {on_a:?}");
    // What is B's own passes the same policy.
    let own = [
        (
            "renew its own heartbeat",
            one(&lease(
                &format!("zerohop-node-{}", b.name),
                &b.name,
                &b.host.ip,
            )),
            node_apply(true),
        ),
        (
            "report its own part's status",
            status(&on_b),
            apply_status(true),
        ),
    ];
    for (what, doc, how) in own {
        let answer = plane.apply(&b.token, &doc, how);
        assert!(
            answer.ok(),
            "{} cannot {what}: {}",
            b.name,
            message(&answer)
        );
    }
    // Each daemon checked at start whom its credential names.
    for n in &cluster.nodes {
        let log = std::fs::read_to_string(cluster.dir.path().join(format!("{}.log", n.name)))
            .unwrap_or_default();
        let said = format!(
            "the API server knows this daemon as \
             system:serviceaccount:zerohop-system:zerohop-node on node {}",
            n.name
        );
        assert!(
            log.contains(&said),
            "{}: no {said:?} in its log:\n{log}",
            n.name
        );
    }
}

#[test]
fn three_nodes_serve_a_chain_move_a_lost_replica_and_answer_every_accepted_request() {
    let mut cluster = Cluster::start(3, 2);
    cluster.plane.apply_ok(&hello(3));
    let all = |n: &[String]| n.iter().collect::<BTreeSet<_>>().len() == 3;
    let addrs = cluster.wait_ready("hello", 3, all, Duration::from_secs(60));
    for a in &addrs {
        post_hello(a).unwrap_or_else(|e| panic!("{e:?}\n{}", cluster.logs()));
    }
    let status = cluster.chain("hello")["status"].clone();
    assert_eq!(status["readyReplicas"], 3, "{status}");
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready["status"], "True", "{status}");
    // The Service exists, selector-less, for a proxy to route by the slices.
    let svc = cluster
        .plane
        .get_ok("/api/v1/namespaces/default/services/hello");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80, "{svc}");

    nodes_write_only_their_own_objects(&cluster);

    // Load through the published endpoints while node-1's daemon stops.
    // Relaxed everywhere: flags and counters that order nothing; the final counts are read
    // after the threads are joined, which orders them.
    let stop = AtomicBool::new(false);
    let current = Mutex::new(addrs.clone());
    let (ok, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    let failures = Mutex::new(Vec::<String>::new());
    let (lost, before, moved) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let plane = &cluster.plane;
        let (stop, current, ok, refused, failures) = (&stop, &current, &ok, &refused, &failures);
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let now: Vec<String> = endpoints_of(plane, "hello")
                    .into_iter()
                    .filter(|e| e.2)
                    .map(|e| e.0)
                    .collect();
                if !now.is_empty() {
                    *current.lock().unwrap() = now;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        for t in 0..2 {
            s.spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let target = {
                        let c = current.lock().unwrap();
                        c[i % c.len()].clone()
                    };
                    i += 1;
                    match post_hello(&target) {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err((true, _)) => refused.fetch_add(1, Ordering::Relaxed),
                        Err((false, e)) => {
                            failures.lock().unwrap().push(e);
                            0
                        }
                    };
                }
            });
        }
        // The load is answered before the daemon stops.
        assert!(
            wait_until(Duration::from_secs(30), || ok.load(Ordering::Relaxed) > 0),
            "the load through the endpoints never had an answer within 30 s\n{}",
            cluster.logs()
        );
        let before = ok.load(Ordering::Relaxed);
        let lost = cluster.nodes[1].name.clone();
        let mut daemon = cluster.nodes[1].daemon.take().unwrap();
        daemon.signal(Signal::SIGTERM);
        assert_eq!(
            daemon.wait_timeout(Duration::from_secs(30)),
            Some(0),
            "node-1's daemon did not stop cleanly\n{}",
            cluster.logs()
        );
        // It left by deleting its heartbeat (its parts move at once, not when it lapses).
        let log = std::fs::read_to_string(cluster.dir.path().join(format!("{lost}.log")))
            .unwrap_or_default();
        assert!(
            log.contains("heartbeat lease deleted"),
            "{lost} did not delete its heartbeat lease:\n{log}"
        );
        // Its replica moved: three ready endpoints again, none on the stopped node.
        let moved = cluster.wait_ready("hello", 3, |n| !n.contains(&lost), Duration::from_secs(30));
        // And the load is answered after its replica moved.
        let at_move = ok.load(Ordering::Relaxed);
        let answered_since = || ok.load(Ordering::Relaxed) > at_move;
        assert!(
            wait_until(Duration::from_secs(30), answered_since),
            "the load had no answer within 30 s after the replica moved off {lost}\n{}",
            cluster.logs()
        );
        (lost, before, moved)
    });
    let failures = failures.lock().unwrap().clone();
    let (ok, refused) = (ok.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    assert!(
        failures.is_empty(),
        "{} accepted requests were not answered right ({ok} were, {refused} refused): {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        cluster.logs()
    );
    assert!(
        ok > before && before > 0,
        "load: {before} then {ok} answered"
    );
    eprintln!(
        "while {lost}'s daemon stopped: {ok} requests answered, {refused} connections refused, \
         0 accepted and unanswered; endpoints then {addrs:?}, now {moved:?}"
    );
    for a in &moved {
        post_hello(a).unwrap_or_else(|e| panic!("{e:?}"));
    }
    let events = cluster
        .plane
        .get_ok("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dhello")
        .to_string();
    assert!(
        events.contains("\"Moved\"") && events.contains(&lost),
        "no Moved event naming {lost}: {events}"
    );

    // A daemon killed outright: its heartbeat lapses and its replica moves too.
    let killed = cluster.nodes[2].name.clone();
    assert!(
        cluster.endpoints("hello").iter().any(|e| e.1 == killed),
        "{killed} serves no replica to lose"
    );
    cluster.nodes[2]
        .daemon
        .take()
        .unwrap()
        .signal(Signal::SIGKILL);
    let survivors = cluster.wait_ready(
        "hello",
        3,
        |n| n.iter().all(|x| x == &cluster.nodes[0].name),
        Duration::from_secs(30),
    );
    for a in &survivors {
        post_hello(a).unwrap_or_else(|e| panic!("{e:?}"));
    }

    // The leading controller dies; the other takes over and scales the Chain down.
    let leader = cluster
        .plane
        .get_ok("/apis/coordination.k8s.io/v1/namespaces/zerohop-system/leases/zerohop-controller")
        ["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let index: usize = leader
        .trim_start_matches("controller-")
        .parse()
        .expect("a controller leads");
    cluster.controllers[index]
        .take()
        .unwrap()
        .signal(Signal::SIGKILL);
    // `kubectl scale`: the Chain's scale subresource.
    cluster.plane.merge_patch_ok(
        &format!("{CHAINS}/namespaces/default/chains/hello/scale"),
        r#"{"spec":{"replicas":2}}"#,
    );
    cluster.wait_ready("hello", 2, |_| true, Duration::from_secs(30));

    // An edit rolls out while both replicas stay in the Service: every look at the slices
    // until the Chain reports both replicas on the new spec finds both serving.
    let before = cluster.chain("hello")["metadata"]["generation"]
        .as_i64()
        .expect("a generation");
    cluster.plane.merge_patch_ok(
        &format!("{CHAINS}/namespaces/default/chains/hello"),
        r#"{"spec":{"timeout":"20s"}}"#,
    );
    let mut looks = 0;
    let rolled = poll(Duration::from_secs(30), || {
        let serving = cluster.endpoints("hello").iter().filter(|e| e.2).count();
        assert_eq!(
            serving,
            2,
            "a replica left the Service during an edit (look {looks})\nstatus: {}",
            cluster.chain("hello")["status"]
        );
        looks += 1;
        let status = &cluster.chain("hello")["status"];
        status["observedGeneration"].as_i64() > Some(before) && status["readyReplicas"] == 2
    });
    assert!(
        rolled,
        "the edit did not roll out: {}\n{}",
        cluster.chain("hello")["status"],
        cluster.logs()
    );
    for a in cluster.wait_ready("hello", 2, |_| true, Duration::from_secs(5)) {
        post_hello(&a).unwrap_or_else(|e| panic!("{e:?}"));
    }

    // Deleting the Chain removes its parts, Service and slices.
    let deleted = cluster.plane.delete(
        User::Admin.token(),
        &format!("{CHAINS}/namespaces/default/chains/hello"),
    );
    assert!(deleted.ok(), "delete the Chain: {}", message(&deleted));
    let gone = poll(Duration::from_secs(20), || {
        let parts = cluster.plane.get_ok(&format!("{CHAINS}/chainparts"));
        let svc = cluster
            .plane
            .get("/api/v1/namespaces/default/services/hello");
        parts["items"].as_array().is_some_and(Vec::is_empty)
            && svc.status == 404
            && cluster.endpoints("hello").is_empty()
    });
    assert!(gone, "the Chain's objects outlived it\n{}", cluster.logs());
}

#[test]
fn a_chain_split_over_two_nodes_answers_through_the_hop_and_every_request_once_when_a_node_dies() {
    let mut cluster = Cluster::start(3, 1);
    cluster.plane.apply_ok(SPLIT);
    let addr = cluster.wait_ready("split", 1, |_| true, Duration::from_secs(60))[0].clone();
    let node_of = |part: u32| part_node(&cluster.plane, "split-0", part);
    let (gateway_node, exclaim_node) = (node_of(0), node_of(1));
    assert_ne!(
        gateway_node, exclaim_node,
        "a split replica spans two nodes"
    );
    // `exclaim` runs only on the other node: the `!` crossed the hop and came back.
    for i in 0..20 {
        let r = post(&addr, &format!("hello {i}"));
        assert_eq!(r, Ok((200, format!("HELLO {i}!"))), "{}", cluster.logs());
    }

    // Load on the gateway's node while the node that runs `exclaim` dies (its daemon killed
    // outright): every accepted request gets one answer, a success or a clear 5xx, and the
    // part moves to the third node. Relaxed: counters read after the threads are joined.
    let stop = AtomicBool::new(false);
    let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let problems = Mutex::new(Vec::<String>::new());
    let (before_kill, recovered) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let (stop, ok, failed, problems, addr) = (&stop, &ok, &failed, &problems, &addr);
        for t in 0..3 {
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match post(addr, &format!("t{t} {i}")) {
                        Ok((200, body)) if body == format!("T{t} {i}!") => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((502..=504, _)) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((s, body)) => problems.lock().unwrap().push(format!("{s} {body}")),
                        Err((true, _)) => std::thread::sleep(Duration::from_millis(20)),
                        Err((false, e)) => problems.lock().unwrap().push(e),
                    }
                }
            });
        }
        // The load is answered before the kill.
        assert!(
            wait_until(Duration::from_secs(30), || ok.load(Ordering::Relaxed) > 0),
            "the load on the split chain never had an answer within 30 s\n{}",
            cluster.logs()
        );
        let victim = cluster
            .nodes
            .iter()
            .position(|n| n.name == exclaim_node)
            .unwrap();
        let before_kill = ok.load(Ordering::Relaxed);
        cluster.nodes[victim]
            .daemon
            .as_mut()
            .unwrap()
            .signal(Signal::SIGKILL);
        // The part moves (a new node, the replica ready again) and requests succeed again.
        let moved = poll(Duration::from_secs(60), || {
            let n = part_node(&cluster.plane, "split-0", 1);
            !n.is_empty() && n != exclaim_node && n != gateway_node
        });
        assert!(
            moved,
            "part 1 did not move off {exclaim_node}\n{}",
            cluster.logs()
        );
        cluster.wait_ready("split", 1, |_| true, Duration::from_secs(60));
        let after_move = ok.load(Ordering::Relaxed);
        let recovered = wait_until(Duration::from_secs(30), || {
            ok.load(Ordering::Relaxed) > after_move + 20
        });
        (before_kill, recovered)
    });
    let problems = problems.lock().unwrap().clone();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "split chain under a node's death: {ok} answered, {failed} failed with 502-504 \
         ({before_kill} answered before the kill)"
    );
    assert!(
        problems.is_empty(),
        "unanswered or wrong answers: {problems:?}\n{}",
        cluster.logs()
    );
    assert!(before_kill > 0, "nothing answered before the kill");
    assert!(
        recovered,
        "requests did not succeed again after the part moved ({ok} ok, {failed} failed)\n{}",
        cluster.logs()
    );
}
