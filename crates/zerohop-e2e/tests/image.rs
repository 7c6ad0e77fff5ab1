//! The container image the Kubernetes manifests run (`cargo xtask image`, which `cargo xtask
//! test` runs first): its OCI layout holds together, and the image runs a chain under runc
//! with only the capabilities the DaemonSet grants, a read-only root and the host's network,
//! as its pod would.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use zerohop_test_support::{free_port, wait_until, ChildGuard, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn layout() -> PathBuf {
    let dir = repo().join("target/image/oci");
    assert!(
        dir.join("index.json").is_file(),
        "{} is missing: build the image with `cargo xtask image` (`cargo xtask test` does it)",
        dir.display()
    );
    dir
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The blob a digest names, checked against its digest.
fn blob(digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout().join("blobs/sha256").join(hex);
    let out = Command::new("sha256sum").arg(&path).output().unwrap();
    let sum = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        sum.split_whitespace().next(),
        Some(hex),
        "{} is corrupt",
        path.display()
    );
    path
}

/// The capabilities `deploy/kubernetes/30-daemonset.yaml` adds, as `CAP_*` names.
fn daemonset_caps() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/30-daemonset.yaml")).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("add: ["))
        .expect("the DaemonSet adds capabilities");
    line.trim()
        .trim_start_matches("add: [")
        .trim_end_matches(']')
        .split(',')
        .map(|c| format!("CAP_{}", c.trim()))
        .collect()
}

#[test]
fn the_image_runs_a_chain_under_runc_with_the_daemonsets_privileges() {
    // The layout: index -> manifest -> config and one layer, every digest right.
    let index = json(&layout().join("index.json"));
    let entry = &index["manifests"][0];
    assert_eq!(
        entry["annotations"]["io.containerd.image.name"],
        format!("docker.io/library/zerohop:{}", env!("CARGO_PKG_VERSION"))
    );
    let manifest = json(&blob(entry["digest"].as_str().unwrap()));
    let config = json(&blob(manifest["config"]["digest"].as_str().unwrap()));
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/local/bin/zerohop");
    let layer = blob(manifest["layers"][0]["digest"].as_str().unwrap());

    // Unpacked into a runc bundle.
    let dir = TempDir::new("image");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(st.success());
    for f in [
        "usr/local/bin/zerohop",
        "opt/zerohop/bin/upper",
        "opt/zerohop/bin/exclaim",
        "etc/passwd",
    ] {
        assert!(rootfs.join(f).is_file(), "{f} is not in the image");
    }
    // The chain lives on a volume, as a user's functions would (the root is read-only).
    let specs = dir.path().join("specs");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(
        specs.join("hello.yaml"),
        "name: hello\ngateway_threads: 1\nfunctions:\n  upper: { command: [/opt/zerohop/bin/upper] }\n  \
         exclaim: { command: [/opt/zerohop/bin/exclaim] }\nroutes:\n  - http: POST /hello\n    \
         sequence: [upper, exclaim]\n",
    )
    .unwrap();
    let spec = Command::new("runc")
        .arg("spec")
        .current_dir(dir.path())
        .status();
    assert!(
        spec.is_ok_and(|s| s.success()),
        "runc spec failed: install runc (`apt-get install runc`; .ci/run does)"
    );
    let port = free_port();
    let mut c = json(&dir.path().join("config.json"));
    c["process"]["args"] = serde_json::json!([
        "/usr/local/bin/zerohop",
        "up",
        "/specs/hello.yaml",
        "--listen",
        format!("127.0.0.1:{port}")
    ]);
    c["process"]["terminal"] = false.into();
    c["root"]["readonly"] = true.into();
    let caps = daemonset_caps();
    assert!(caps.contains(&"CAP_SETUID".to_string()), "{caps:?}");
    for k in ["bounding", "effective", "permitted"] {
        c["process"]["capabilities"][k] = serde_json::json!(caps);
    }
    for k in ["inheritable", "ambient"] {
        c["process"]["capabilities"]
            .as_object_mut()
            .unwrap()
            .remove(k);
    }
    // The host's network, as hostNetwork: true.
    let ns: Vec<serde_json::Value> = c["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["type"] != "network")
        .cloned()
        .collect();
    c["linux"]["namespaces"] = ns.into();
    let mounts = c["mounts"].as_array_mut().unwrap();
    mounts.retain(|m| m["destination"] != "/sys/fs/cgroup");
    mounts.push(serde_json::json!({"destination": "/sys/fs/cgroup", "type": "bind", "source": "/sys/fs/cgroup", "options": ["rbind", "rw"]}));
    mounts.push(serde_json::json!({"destination": "/run/zerohop", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=700"]}));
    mounts.push(serde_json::json!({"destination": "/specs", "type": "bind", "source": specs, "options": ["rbind", "ro"]}));
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec_pretty(&c).unwrap(),
    )
    .unwrap();

    let id = format!("zerohop-image-test-{}", std::process::id());
    let log = std::fs::File::create(dir.path().join("run.log")).unwrap();
    let container = ChildGuard::new(
        Command::new("runc")
            .args(["run", "--bundle"])
            .arg(dir.path())
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("runc run"),
    );
    struct Delete(String);
    impl Drop for Delete {
        fn drop(&mut self) {
            let _ = Command::new("runc")
                .args(["delete", "--force", &self.0])
                .status();
        }
    }
    let _delete = Delete(id.clone());
    let url = format!("http://127.0.0.1:{port}/hello");
    let mut answer = String::new();
    let ok = wait_until(Duration::from_secs(20), || {
        match ureq::post(&url)
            .timeout(Duration::from_secs(2))
            .send_string("hello world")
        {
            Ok(r) => {
                answer = r.into_string().unwrap_or_default();
                true
            }
            Err(_) => false,
        }
    });
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap_or_default();
    assert!(
        ok,
        "the chain in the container did not answer; its output:\n{log}"
    );
    assert_eq!(answer, "HELLO WORLD!", "{log}");
    // Without CAP_SYS_ADMIN the instances share the agent's IPC namespace, and the log says
    // so (an IPC namespace each needs it; asking for one anyway failed every start).
    assert!(
        log.contains("the agent's IPC namespace (no CAP_SYS_ADMIN"),
        "{log}"
    );
    // Stopped the way the kubelet stops it: SIGTERM, and the chain leaves nothing.
    let _ = Command::new("runc").args(["kill", &id, "TERM"]).status();
    let mut container = container;
    let code = container.wait_timeout(Duration::from_secs(20));
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(dir.path().join("run.log")).unwrap_or_default()
    );
}
