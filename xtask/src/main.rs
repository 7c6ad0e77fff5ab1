//! `cargo xtask`: the one entry point for what plain cargo does not do in one step.
//!
//! * `cargo xtask demo`: builds the release binaries and runs the hello chain
//!   (`zerohop up examples/hello/chain.yaml`) until Ctrl-C.
//! * `cargo xtask polyglot`: builds the five functions of `examples/polyglot` (Python, Go,
//!   Rust, Node.js, C) and runs its chain until Ctrl-C.
//! * `cargo xtask kube`: builds kube-apiserver and kubectl (the Kubernetes tests' control
//!   plane) from the Go module proxy into `target/kube/bin` (`xtask/kube` pins the version).
//! * `cargo xtask image`: builds the release binaries and the container image the Kubernetes
//!   manifests run, `zerohop:VERSION`, as an OCI image layout: `target/image/oci/` and the
//!   same as one archive, `target/image/zerohop-VERSION.oci.tar` (see `docs/kubernetes.md`).
//! * `cargo xtask test`: installs the system packages the tests need (as root with apt;
//!   otherwise it names each missing program with the command that installs it and stops
//!   before building; see `prereqs`), builds the binaries the end-to-end tests start,
//!   kube-apiserver and kubectl (`cargo xtask kube`, beside the Rust builds), the container
//!   image, every SDK (the C SDK in `target/c-sdk`, the Python SDK in `target/python-sdk`,
//!   the Node.js addon) and the polyglot example's functions, runs every test binary of the
//!   workspace (side by side where they do not compete, see `testrun`), the doc tests, the Go
//!   SDK's tests (`go test` in `sdk/go`), the Node.js SDK's (`node --test`) and the Python
//!   SDK's (pytest), zerohop-pool's and zerohop-transport's tests once more in debug (their
//!   `debug_assert!`s and overflow checks), then the loom model checks of the allocator and the
//!   ring (failing if the filter ran none), and prints where the time went (`phases`).
//! * `cargo xtask lint`: installs what the build needs (clang and libbpf's headers for the
//!   eBPF programs), then `cargo fmt --check` and `cargo clippy -D warnings` over the
//!   workspace and the Python and Node.js SDK crates.
//! * `cargo xtask phases`: prints the phases every task since `target/xtask/phases.tsv` was
//!   last emptied spent (`.ci/run` prints it at its end).
//! * `cargo xtask bench [--quick] [--no-scale] [--no-apps] [--no-activation] [--no-languages]
//!   [ARGS]`: builds everything, runs `zerohop-bench` (every system side by side, see
//!   `bench/README.md`) into `results/`, draws the plots, then runs the scale point
//!   (`zerohop-bench-scale`; `--no-scale` skips it), the applications beside their HTTP
//!   deployments (`zerohop-bench-apps`; `--no-apps` skips it), activation from zero, parked
//!   next to cold (`zerohop-bench-activation`; `--no-activation` skips it) and functions in
//!   each language (`zerohop-bench-languages`; `--no-languages` skips it).
//! * `cargo xtask c-sdk [--prefix DIR]`: builds the C SDK's library and installs it with its
//!   header and a pkg-config file under DIR (default `target/c-sdk`; see `docs/sdk-c.md`).
//! * `cargo xtask fuzz [--seconds N] [TARGET...]`: installs cargo-fuzz if it is missing, builds
//!   the fuzz targets of `fuzz/` and runs each (or the named ones) for N seconds (default 30),
//!   two at a time; fails naming the saved input if any target crashes (see `fuzz/README.md`).

#![forbid(unsafe_code)]

mod fuzz;
mod phases;
mod prereqs;
mod testrun;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    std::env::set_current_dir(&root).context("cd to the workspace root")?;
    match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("lint") => lint(&args[1..]),
        Some("phases") => phases::print_file(&root),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("c-sdk") => c_sdk(&args[1..]),
        Some("polyglot") => polyglot(&args[1..]),
        Some("kube") => kube(&args[1..]),
        Some("image") => image(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 demo [ARGS]   build and run the hello chain (extra ARGS go to `zerohop up`)\n  \
                 polyglot [ARGS]\n                \
                 build and run examples/polyglot (Python -> Go -> Rust -> Node.js -> C)\n  \
                 image         build the container image (an OCI layout) into target/image\n  \
                 kube          build kube-apiserver and kubectl (the Kubernetes tests' control\n                \
                 plane) from the Go module proxy into target/kube/bin\n  \
                 test [ARGS]   install what the tests need, build, run all tests (ARGS go to\n                \
                 `cargo test`, ARGS after `--` to each test binary), then loom checks\n  \
                 lint          install what the build needs, cargo fmt --check and clippy\n  \
                 phases        print how long each phase of the last tasks took\n  \
                 bench [ARGS]  build, benchmark zerohop against the baselines (ARGS go to\n                \
                 zerohop-bench, e.g. --quick), write results/ and its plots, then the\n                \
                 scale point (--no-scale skips it), the applications (--no-apps),\n                \
                 activation from zero (--no-activation) and the languages (--no-languages)\n  \
                 fuzz [--seconds N] [TARGET...]\n                \
                 run the fuzz targets (all, or the named ones) for N seconds each (default 30)\n  \
                 c-sdk [--prefix DIR]\n                \
                 build the C SDK and install it (header, libraries, pkg-config file) under\n                \
                 DIR (default target/c-sdk)"
            );
            bail!("no task given");
        }
    }
}

/// `cargo xtask c-sdk [--prefix DIR]`.
fn c_sdk(args: &[String]) -> Result<()> {
    let prefix = match args {
        [] => workspace_root().join("target/c-sdk"),
        [flag, dir] if flag == "--prefix" => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir()?.join(dir)
            }
        }
        _ => bail!("usage: cargo xtask c-sdk [--prefix DIR]"),
    };
    if !WORKSPACE_BUILT.load(std::sync::atomic::Ordering::Relaxed) {
        run(
            "building the C SDK (libzerohop.so, libzerohop.a)",
            cargo().args(["build", "--release", "-p", "zerohop-c"]),
        )?;
    }
    let (include, lib) = (prefix.join("include"), prefix.join("lib"));
    let pkgconfig = lib.join("pkgconfig");
    for d in [&include, &pkgconfig] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let copy = |from: &str, to: &Path| -> Result<()> {
        std::fs::copy(from, to)
            .with_context(|| format!("copying {from} to {}", to.display()))
            .map(drop)
    };
    copy("sdk/c/include/zerohop.h", &include.join("zerohop.h"))?;
    copy("target/release/libzerohop.a", &lib.join("libzerohop.a"))?;
    copy("target/release/libzerohop.so", &lib.join("libzerohop.so"))?;
    for name in ["zerohop", "zerohop-static"] {
        let template = format!("sdk/c/{name}.pc.in");
        let pc = std::fs::read_to_string(&template)
            .context(template)?
            .replace("@PREFIX@", &prefix.display().to_string())
            .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
        std::fs::write(pkgconfig.join(format!("{name}.pc")), pc)
            .with_context(|| format!("writing {name}.pc"))?;
    }
    eprintln!(
        "xtask: the C SDK is in {p}; build a function with\n  \
         PKG_CONFIG_PATH={p}/lib/pkgconfig cc f.c $(pkg-config --cflags --libs zerohop-static) -o f\n\
         (libzerohop.a linked in), or with `zerohop` instead of `zerohop-static` (libzerohop.so \
         from {p}/lib at run time)",
        p = prefix.display()
    );
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(step: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {step}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` as [`run`] does, its standard output echoed as it comes and returned.
fn run_echoed(step: &str, cmd: &mut Command) -> Result<String> {
    use std::io::BufRead;
    eprintln!("xtask: {step}");
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let mut out = String::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = Vec::new();
    while lines
        .read_until(b'\n', &mut line)
        .context("reading its output")?
        > 0
    {
        let text = String::from_utf8_lossy(&line);
        print!("{text}");
        out.push_str(&text);
        line.clear();
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(out)
}

/// The Kubernetes release the tests run against: `xtask/kube/go.mod` pins the same.
const KUBE_VERSION: &str = "v1.34.4";
/// Its major and minor version, as the binaries report them.
const KUBE_MAJOR_MINOR: (&str, &str) = ("1", "34");

/// Builds kube-apiserver and kubectl from the Go module proxy (`xtask/kube`, k8s.io/kubernetes
/// at [`KUBE_VERSION`]) into `target/kube/bin`, unless they are there already in that version.
/// The Go caches (about 3 GB, in `target/kube` while it builds) are removed once it built; a
/// failed build keeps them for the next try.
fn kube(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("cargo xtask kube takes no arguments (got `{a}`)");
    }
    let root = workspace_root();
    let dir = root.join("target/kube");
    let bin = dir.join("bin");
    let stamp = bin.join("VERSION");
    let have = std::fs::read_to_string(&stamp).unwrap_or_default();
    if have.trim() == KUBE_VERSION
        && ["kube-apiserver", "kubectl"]
            .iter()
            .all(|b| bin.join(b).is_file())
    {
        eprintln!("xtask: kube-apiserver and kubectl {KUBE_VERSION} are built (target/kube/bin)");
        return Ok(());
    }
    let (major, minor) = KUBE_MAJOR_MINOR;
    // Go with its caches in target/kube, in the module that pins Kubernetes.
    let go = || {
        let mut c = Command::new("go");
        c.current_dir(root.join("xtask/kube"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOCACHE", dir.join("go-cache"))
            .env("GOMODCACHE", dir.join("go-mod"));
        c
    };
    let ldflags = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={KUBE_VERSION} \
         -X k8s.io/component-base/version.gitMajor={major} \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/client-go/pkg/version.gitVersion={KUBE_VERSION} \
         -X k8s.io/client-go/pkg/version.gitMajor={major} \
         -X k8s.io/client-go/pkg/version.gitMinor={minor}"
    );
    for cmd in ["kube-apiserver", "kubectl"] {
        let started = Instant::now();
        run(
            &format!(
                "building {cmd} {KUBE_VERSION} from the Go module proxy into target/kube/bin \
                 (about 5 minutes the first time)"
            ),
            go().args(["build", "-p", "2", "-o"])
                .arg(bin.join(cmd))
                .args(["-ldflags", &ldflags])
                .arg(format!("k8s.io/kubernetes/cmd/{cmd}")),
        )
        .with_context(|| {
            format!(
                "building {cmd} with `go` (it needs Go 1.24 or newer on PATH and the Go module \
                 proxy reachable; see the output above)"
            )
        })?;
        eprintln!("xtask: {cmd} built in {:.0?}", started.elapsed());
    }
    std::fs::write(&stamp, format!("{KUBE_VERSION}\n"))
        .context("writing target/kube/bin/VERSION")?;
    // The stamp makes a rebuild rare; the Go caches (about 3 GB) are not worth their disk.
    // The module cache is read-only, which only `go clean` removes; the build cache is a
    // plain folder.
    let cleaned = go().args(["clean", "-modcache"]).status();
    let cache = std::fs::remove_dir_all(dir.join("go-cache"));
    if !matches!(cleaned, Ok(s) if s.success()) || cache.is_err() {
        eprintln!("xtask: warning: could not remove the Go caches under target/kube");
    }
    Ok(())
}

/// The files of the image: (path in the image, file on this machine, strip it).
fn image_files(root: &Path) -> Result<Vec<(String, PathBuf, bool)>> {
    let release = root.join("target/release");
    let mut files = vec![(
        "usr/local/bin/zerohop".to_owned(),
        release.join("zerohop"),
        true,
    )];
    for f in ["upper", "exclaim"] {
        files.push((format!("opt/zerohop/bin/{f}"), release.join(f), true));
    }
    // Their shared libraries, where the dynamic loader looks for them.
    let mut libs = std::collections::BTreeSet::new();
    for (_, path, _) in &files {
        let out = Command::new("ldd")
            .arg(path)
            .output()
            .with_context(|| format!("ldd {}", path.display()))?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let lib = match line.split("=>").nth(1) {
                Some(rest) => rest.split_whitespace().next(),
                None => line
                    .split_whitespace()
                    .next()
                    .filter(|w| w.starts_with('/')),
            };
            if let Some(lib) = lib.filter(|l| l.starts_with('/')) {
                libs.insert(lib.to_owned());
            }
        }
    }
    for lib in libs {
        files.push((
            lib.trim_start_matches('/').to_owned(),
            PathBuf::from(&lib),
            false,
        ));
    }
    Ok(files)
}

/// Builds the container image as an OCI image layout (`target/image/oci`) and the same as
/// one archive (`target/image/zerohop-VERSION.oci.tar`).
fn image(args: &[String]) -> Result<()> {
    use sha2::Digest;
    if let Some(a) = args.first() {
        bail!("cargo xtask image takes no arguments (got `{a}`)");
    }
    build_bins()?;
    let root = workspace_root();
    let version = env!("CARGO_PKG_VERSION");
    let out = root.join("target/image");
    let layout = out.join("oci");
    let _ = std::fs::remove_dir_all(&layout);
    std::fs::create_dir_all(layout.join("blobs/sha256")).context("creating target/image/oci")?;
    eprintln!("xtask: building the image zerohop:{version} (target/image)");
    // The image's platform is this machine's (its binaries are this build's), in OCI's names.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    // One layer: every file owned by root, time 0, in name order (the same inputs give the
    // same digest).
    let mut layer = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    let add_dir = |layer: &mut tar::Builder<Vec<u8>>, dir: &str, mode: u32| -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_size(0);
        layer.append_data(&mut h, format!("{dir}/"), std::io::empty())?;
        Ok(())
    };
    let mut entries = image_files(&root)?;
    entries.sort();
    let etc = [
        ("etc/passwd", "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n"),
        ("etc/group", "root:x:0:\nnonroot:x:65532:\nnogroup:x:65534:\n"),
    ];
    for dir in ["etc", "run", "run/zerohop", "tmp", "opt/zerohop/functions"] {
        dirs.insert(dir.to_owned());
    }
    for (path, _, _) in &entries {
        let mut p = Path::new(path).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(d.display().to_string());
            p = d.parent();
        }
    }
    for d in &dirs {
        add_dir(&mut layer, d, if d == "tmp" { 0o1777 } else { 0o755 })?;
    }
    for (path, text) in etc {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_size(text.len() as u64);
        layer.append_data(&mut h, path, text.as_bytes())?;
    }
    let scratch = out.join("stripped");
    std::fs::create_dir_all(&scratch)?;
    for (path, source, strip) in &entries {
        let file = if *strip {
            // Without debug information: the release profile keeps line tables.
            let to = scratch.join(source.file_name().expect("a file name"));
            run(
                &format!("strip --strip-debug {}", source.display()),
                Command::new("strip")
                    .arg("--strip-debug")
                    .arg("-o")
                    .arg(&to)
                    .arg(source),
            )?;
            to
        } else {
            source.clone()
        };
        let data = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        layer.append_data(&mut h, path, data.as_slice())?;
    }
    let tar_bytes = layer.into_inner()?;
    let diff_id = format!("sha256:{:x}", sha2::Sha256::digest(&tar_bytes));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar_bytes)?;
    let gz = gz.finish()?;
    let blob = |bytes: &[u8]| -> Result<(String, usize)> {
        let hex = format!("{:x}", sha2::Sha256::digest(bytes));
        std::fs::write(layout.join("blobs/sha256").join(&hex), bytes)?;
        Ok((format!("sha256:{hex}"), bytes.len()))
    };
    let (layer_digest, layer_size) = blob(&gz)?;
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/local/bin/zerohop"],
            "Cmd": ["--help"],
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/opt/zerohop/bin"],
            "WorkingDir": "/opt/zerohop",
            "Labels": {
                "org.opencontainers.image.title": "zerohop",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created_by": "cargo xtask image" }],
    });
    let (config_digest, config_size) = blob(&serde_json::to_vec(&config)?)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": layer_digest,
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = blob(&serde_json::to_vec(&manifest)?)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": { "architecture": arch, "os": "linux" },
            "annotations": {
                "org.opencontainers.image.ref.name": version,
                "io.containerd.image.name": format!("docker.io/library/zerohop:{version}"),
            },
        }],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec_pretty(&index)?,
    )?;
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    // The same layout as one archive, for `ctr images import`, `podman load`, `skopeo copy
    // oci-archive:...`.
    let archive = out.join(format!("zerohop-{version}.oci.tar"));
    let mut tar = tar::Builder::new(std::fs::File::create(&archive)?);
    for name in ["oci-layout", "index.json"] {
        tar.append_path_with_name(layout.join(name), name)?;
    }
    let mut blobs: Vec<_> = std::fs::read_dir(layout.join("blobs/sha256"))?
        .flatten()
        .map(|e| e.path())
        .collect();
    blobs.sort();
    for b in blobs {
        let name = format!(
            "blobs/sha256/{}",
            b.file_name().expect("a name").to_string_lossy()
        );
        tar.append_path_with_name(&b, name)?;
    }
    tar.finish()?;
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!(
        "xtask: image zerohop:{version} ({:.1} MiB compressed) in {} and {}",
        layer_size as f64 / (1 << 20) as f64,
        layout.display(),
        archive.display()
    );
    Ok(())
}

/// Set once `cargo xtask test` has built every library, binary and test of the workspace in
/// one build ([`build_workspace`]): the steps after it (the image, the C SDK) use what it
/// built. A build of the binaries alone, or of one package, resolves the dependencies'
/// features otherwise (without the dev-dependencies, or without the other packages), and
/// cargo would compile much of the workspace a second time.
static WORKSPACE_BUILT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn build_bins() -> Result<()> {
    if WORKSPACE_BUILT.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    run(
        "building release binaries (zerohop, example functions)",
        cargo().args(["build", "--release", "--workspace", "--bins"]),
    )
}

/// Builds the libraries (the C SDK's among them), binaries and test binaries of the
/// workspace in one build, with one feature resolution; see [`WORKSPACE_BUILT`].
fn build_workspace() -> Result<()> {
    run(
        "building the workspace: libraries, binaries and tests in one build",
        cargo().args([
            "build",
            "--release",
            "--workspace",
            "--lib",
            "--bins",
            "--tests",
        ]),
    )?;
    WORKSPACE_BUILT.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

fn demo(extra: &[String]) -> Result<()> {
    prereqs::demo_note();
    build_bins()?;
    eprintln!("xtask: starting the hello chain; try it with:");
    eprintln!("  curl -s -X POST --data 'hello world' http://127.0.0.1:8080/hello");
    eprintln!("xtask: zerohop up examples/hello/chain.yaml");
    // Become the chain's agent, so Ctrl-C reaches exactly one process, which stops the chain
    // and everything it started.
    let err = Command::new("target/release/zerohop")
        .args(["up", "examples/hello/chain.yaml"])
        .args(extra)
        .exec();
    Err(err).context("starting target/release/zerohop")
}

/// The Python the SDK is built and tested with: Debian's, which the chains' uids can run and
/// `zerohop new` picks for the Python starter (the same interpreter keeps pip's in-tree
/// build of the SDK in `sdk/python/target` warm for both), else `python3` on PATH.
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// `pip install --upgrade --target FOLDER WHAT` with [`python`]: into a folder of its own (a
/// system Python, PEP 668, refuses installs into its own environment, not into a folder).
fn pip_install(step: &str, folder: &str, what: &str) -> Result<()> {
    run(
        step,
        Command::new(python()).args([
            "-m",
            "pip",
            "install",
            "-q",
            "--upgrade",
            "--target",
            folder,
            what,
        ]),
    )
}

/// Installs the Python SDK into `target/python-sdk` (pip builds it with maturin).
fn python_sdk() -> Result<()> {
    pip_install(
        "installing the Python SDK into target/python-sdk (pip builds it with maturin)",
        "target/python-sdk",
        "sdk/python",
    )
    .context("the Python SDK needs Python 3.11 or newer with pip (`python3` on PATH)")
}

/// Builds the Node.js SDK's native addon (`sdk/node/zerohop.node`, `npm run build`).
fn node_sdk() -> Result<()> {
    run(
        "building the Node.js SDK's addon (npm run build in sdk/node)",
        Command::new("npm")
            .args(["run", "--silent", "build"])
            .current_dir("sdk/node"),
    )
    .context("the Node.js SDK needs Node.js 18 or newer with npm (`npm` on PATH)")
}

/// Builds every SDK and the functions of `examples/polyglot` (after [`build_bins`], which
/// builds its Rust step): the C SDK, the C step (`target/polyglot/step-c`), the Go step
/// (`target/polyglot/step-go`), the Python SDK, the Node.js addon and the example's
/// `node_modules`.
fn polyglot_build() -> Result<()> {
    c_sdk(&[])?;
    let pkgconfig = workspace_root().join("target/c-sdk/lib/pkgconfig");
    let out = workspace_root().join("target/polyglot");
    std::fs::create_dir_all(&out)?;
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "zerohop-static"])
        .env("PKG_CONFIG_PATH", &pkgconfig)
        .output()
        .context("running pkg-config (Debian: apt-get install pkg-config)")?;
    if !flags.status.success() {
        bail!(
            "pkg-config found no zerohop-static in {}",
            pkgconfig.display()
        );
    }
    let flags = String::from_utf8(flags.stdout)?;
    run(
        "compiling the C step of examples/polyglot",
        Command::new("cc")
            .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg("examples/polyglot/step.c")
            .arg("-o")
            .arg(out.join("step-c"))
            .args(flags.split_whitespace()),
    )?;
    let stamp = go_sdk_stamp()?;
    run(
        "building the Go step of examples/polyglot",
        Command::new("go")
            .args(["build", "-buildvcs=false", &stamp, "-o"])
            .arg(out.join("step-go"))
            .arg(".")
            .current_dir("examples/polyglot/go")
            .env("PKG_CONFIG_PATH", &pkgconfig),
    )
    .context("the Go step needs Go 1.22 or newer (`go` on PATH)")?;
    python_sdk()?;
    node_sdk()?;
    run(
        "linking the Node.js SDK into examples/polyglot/node_modules",
        Command::new("npm")
            .args([
                "install",
                "--offline",
                "--no-audit",
                "--no-fund",
                "--silent",
            ])
            .current_dir("examples/polyglot"),
    )
}

/// `cargo xtask polyglot`: builds the polyglot example's five functions and runs its chain
/// until Ctrl-C.
fn polyglot(extra: &[String]) -> Result<()> {
    build_bins()?;
    polyglot_build()?;
    eprintln!("xtask: starting the polyglot chain; try it with:");
    eprintln!("  curl -s -X POST --data 'hello' http://127.0.0.1:8080/polyglot");
    let err = Command::new("target/release/zerohop")
        .args(["up", "examples/polyglot/chain.yaml"])
        .args(extra)
        .exec();
    Err(err).context("starting target/release/zerohop")
}

/// `cargo xtask test`: the README's test command. Installs what the tests need (or stops
/// before building, saying what is missing), builds everything once (the control plane from
/// Go beside the Rust builds), runs every test binary of the workspace (side by side where
/// they do not compete, see [`testrun`]), the Go, Node.js and Python SDKs' tests, the pool's
/// and transport's tests in debug and the loom model checks, and prints where the time went.
fn test(extra: &[String]) -> Result<()> {
    let mut phases = phases::Phases::new(&workspace_root(), "test");
    let result = test_phases(extra, &mut phases);
    phases.print();
    result
}

fn test_phases(extra: &[String], ph: &mut phases::Phases) -> Result<()> {
    use prereqs::Need;
    ph.time("system packages", || {
        prereqs::ensure("cargo xtask test", &[Need::Build, Need::Tests])
    })?;
    if !prereqs::is_root() {
        bail!(
            "cargo xtask test runs as root: its tests run chains under uids of their own, load \
             eBPF programs and make network namespaces (try `sudo -E cargo xtask test`)"
        );
    }
    // ARGS go to cargo (which packages, features), ARGS after `--` to every test binary.
    let (cargo_args, bin_args) = match extra.iter().position(|a| a == "--") {
        Some(i) => (&extra[..i], &extra[i + 1..]),
        None => (extra, &[][..]),
    };
    // The Kubernetes tests' control plane builds from Go beside the Rust builds: each leaves
    // a core idle now and then (linking, the last crates of a build), the other fills it.
    let kube_build = std::thread::spawn(|| {
        let started = Instant::now();
        let r = kube(&[]);
        (started.elapsed(), r)
    });
    let built = (|| -> Result<Vec<testrun::TestBin>> {
        ph.time(
            "build: the workspace (libraries, binaries, tests)",
            build_workspace,
        )?;
        // The image test runs the container image.
        ph.time("build: container image", || image(&[]))?;
        // The C functions of the tests are built against the C SDK, as a user builds them;
        // the end-to-end tests (starters, the polyglot chain) use every SDK.
        ph.time("build: SDKs, polyglot example", polyglot_build)?;
        // Names the test binaries (the build above made them: nothing is compiled again).
        ph.time("build: test binaries", || testrun::build(cargo_args))
    })();
    let (took, kube_built) = kube_build
        .join()
        .map_err(|_| anyhow::anyhow!("the kube-apiserver build thread panicked"))?;
    ph.record(
        "build: kube-apiserver, kubectl (beside the above)",
        took,
        kube_built.is_ok(),
    );
    let bins = built?;
    kube_built?;
    // Every suite runs even when one fails; the run fails at the end naming each.
    let mut failed: Vec<String> = Vec::new();
    let mut suite = |name: &str, r: Result<()>| {
        if let Err(e) = r {
            eprintln!("xtask: {name} failed: {e:#}");
            failed.push(name.to_owned());
        }
    };
    let r = testrun::run(&bins, bin_args, ph);
    suite("the workspace's test binaries", r);
    let r = ph.time("tests: doc tests", || {
        run(
            "the workspace's doc tests",
            cargo()
                .args(["test", "--release", "--workspace", "--doc"])
                .args(cargo_args),
        )
    });
    suite("the doc tests", r);
    let pkgconfig = workspace_root().join("target/c-sdk/lib/pkgconfig");
    let r = ph.time("tests: Go SDK", || {
        run(
            "the Go SDK's tests (go test in sdk/go, over the C SDK just installed)",
            Command::new("go")
                .args(["test", "-count=1", &go_sdk_stamp()?, "./..."])
                .current_dir("sdk/go")
                .env("PKG_CONFIG_PATH", &pkgconfig),
        )
        .context("the Go SDK's tests need Go 1.22 or newer (`go` on PATH)")
    });
    suite("the Go SDK's tests", r);
    let r = ph.time("tests: Node.js SDK", || {
        run(
            "the Node.js SDK's tests (npm test: node --test in sdk/node)",
            Command::new("npm")
                .args(["test", "--silent"])
                .current_dir("sdk/node"),
        )
    });
    suite("the Node.js SDK's tests", r);
    let r = ph.time("tests: Python SDK", || {
        pip_install(
            "pytest for the tests of the Python SDK (into target/python-test)",
            "target/python-test",
            "pytest>=7",
        )?;
        run(
            "the Python SDK's tests (pytest in sdk/python/tests)",
            Command::new(python())
                .args(["-m", "pytest", "-q", "sdk/python/tests"])
                .env("PYTHONPATH", "target/python-sdk:target/python-test"),
        )
    });
    suite("the Python SDK's tests", r);
    // Every run above is a release build, without debug_assert! and overflow checks: the two
    // crates whose unsafe shared-memory code states its invariants in them run their library
    // and integration tests once more in debug, where those checks are on.
    let r = ph.time("tests: pool, transport in debug", || {
        run(
            "zerohop-pool's and zerohop-transport's tests in debug (debug_assert!, overflow \
             checks on)",
            cargo().args([
                "test",
                "-p",
                "zerohop-pool",
                "-p",
                "zerohop-transport",
                "--lib",
                "--tests",
            ]),
        )
    });
    suite("the debug tests of zerohop-pool and zerohop-transport", r);
    let r = ph.time("tests: loom", || loom("loom"));
    suite("the loom checks", r);
    if !failed.is_empty() {
        bail!("failed: {}", failed.join("; "));
    }
    eprintln!("xtask: all tests passed");
    Ok(())
}

/// The loom model checks of the slot allocator and the ring: the tests of zerohop-pool's and
/// zerohop-transport's libraries whose names contain `filter`, built with `--cfg loom`. Fails
/// when either library ran none (a filter that matches nothing passes in cargo).
fn loom(filter: &str) -> Result<()> {
    let out = run_echoed(
        "loom model checks of the slot allocator and the ring",
        cargo()
            .args([
                "test",
                "--release",
                "-p",
                "zerohop-pool",
                "-p",
                "zerohop-transport",
                "--lib",
                filter,
            ])
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", "target/loom"),
    )?;
    testrun::each_ran_tests(&testrun::passed_counts(&out), 2).with_context(|| {
        format!("the loom run filtered by `{filter}` (the tests are in `mod loom_tests`)")
    })
}

/// `cargo xtask lint`: what the build needs (clang for the eBPF programs), then `cargo fmt
/// --check` and `cargo clippy -D warnings` over the workspace and the two SDK crates that
/// live outside it.
fn lint(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("cargo xtask lint takes no arguments (got `{a}`)");
    }
    let mut ph = phases::Phases::new(&workspace_root(), "lint");
    let result = (|| -> Result<()> {
        ph.time("system packages", || {
            prereqs::ensure("cargo xtask lint", &[prereqs::Need::Build])
        })?;
        let manifests = ["Cargo.toml", "sdk/python/Cargo.toml", "sdk/node/Cargo.toml"];
        ph.time("cargo fmt --check", || {
            for m in manifests {
                let mut c = cargo();
                c.args(["fmt", "--manifest-path", m]);
                if m == "Cargo.toml" {
                    c.arg("--all");
                }
                run(
                    &format!("cargo fmt --check ({m})"),
                    c.args(["--", "--check"]),
                )?;
            }
            Ok(())
        })?;
        for m in manifests {
            ph.time(&format!("cargo clippy ({m})"), || {
                let mut c = cargo();
                c.args(["clippy", "--manifest-path", m]);
                if m == "Cargo.toml" {
                    c.arg("--workspace");
                }
                run(
                    &format!("cargo clippy ({m})"),
                    c.args(["--all-targets", "--release", "--", "-D", "warnings"]),
                )
            })?;
        }
        Ok(())
    })();
    ph.print();
    result
}

fn bench(extra: &[String]) -> Result<()> {
    // zerohop-bench starts this path (bench/src/systems.rs), not an nginx found on PATH.
    if !Path::new("/usr/sbin/nginx").is_file() {
        eprintln!(
            "xtask: nginx is not installed; the nginx-broker baseline will be reported as not run \
             (install it with `apt-get install -y nginx-light`)"
        );
    }
    build_bins()?;
    let out = extra
        .windows(2)
        .find(|w| w[0] == "--out")
        .map_or_else(|| PathBuf::from("results"), |w| PathBuf::from(&w[1]));
    // `--no-scale`, `--no-apps` and `--no-activation` are ours (skip the scale point, the
    // applications, activation); the rest goes to zerohop-bench.
    let ours = [
        "--no-scale",
        "--no-apps",
        "--no-activation",
        "--no-languages",
    ];
    let status = Command::new("target/release/zerohop-bench")
        .args(extra.iter().filter(|a| !ours.contains(&a.as_str())))
        .status()
        .context("running target/release/zerohop-bench")?;
    // Exit code 1 means some system misbehaved: the report is still written and plotted.
    if !status.success() && status.code() != Some(1) {
        bail!("zerohop-bench failed ({status})");
    }
    plot(&out)?;
    let scale_ok = if extra.iter().any(|a| a == "--smoke" || a == "--no-scale") {
        true
    } else {
        scale(&out, extra.iter().any(|a| a == "--quick"))?
    };
    if !scale_ok {
        bail!("the scale point failed; see {}/scale.md", out.display());
    }
    // The benchmarks beside the matrix: each skipped by `--smoke` or its `--no-NAME`.
    let quick = extra.iter().any(|a| a == "--quick");
    type Extra = fn(&Path, bool) -> Result<bool>;
    let others: [(&str, Extra, &str); 3] = [
        ("apps", apps, "an application run had errors"),
        (
            "activation",
            activation,
            "the activation benchmark had errors",
        ),
        ("languages", languages, "a language failed or had errors"),
    ];
    for (name, bench, failed) in others {
        let skip = format!("--no-{name}");
        if extra.iter().any(|a| a == "--smoke" || *a == skip) {
            continue;
        }
        if !bench(&out, quick)? {
            bail!("{failed}; see {}/{name}.md", out.display());
        }
    }
    if status.code() == Some(1) {
        bail!(
            "some systems failed or answered wrongly; see {}/summary.md",
            out.display()
        );
    }
    eprintln!("xtask: report in {}/summary.md", out.display());
    Ok(())
}

/// The applications of `apps/` (Online Boutique mix, IoT motion trace) on zerohop beside
/// their HTTP-microservice deployments, written to `out/apps.md` and `out/apps.json`.
/// Returns whether every run was free of errors.
fn apps(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: applications (Online Boutique, IoT motion) beside HTTP microservices");
    report_bench("zerohop-bench-apps", out, quick)
}

/// Activation of a function scaled to zero, a parked instance next to a cold start
/// (decision to first request taken, first request against warm ones), written to
/// `out/activation.md` and `out/activation.json`. Returns whether it ran without errors.
fn activation(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: activation from zero (parked instance beside a cold start)");
    report_bench("zerohop-bench-activation", out, quick)
}

/// Pass-through functions in Rust, C, Go, Python and Node.js on the same runtime (per-hop
/// cost against Rust's, CPU per hop, idle CPU, idle memory), written to `out/languages.md`
/// and `out/languages.json`. Returns whether it ran without errors; a language whose
/// toolchain is missing is reported as not run, not as an error.
fn languages(out: &Path, quick: bool) -> Result<bool> {
    // C and Go are built against the C SDK; Python and Node.js need theirs installed.
    c_sdk(&[])?;
    python_sdk()?;
    node_sdk()?;
    eprintln!("xtask: functions in each language (Rust, C, Go, Python, Node.js)");
    report_bench("zerohop-bench-languages", out, quick)
}

/// Runs the benchmark binary `name` writing into `out` (`--quick` if asked): `Ok(true)`
/// when it exits 0, `Ok(false)` when it exits 1 (some run had errors), else an error.
fn report_bench(name: &str, out: &Path, quick: bool) -> Result<bool> {
    let bin = format!("target/release/{name}");
    let mut cmd = Command::new(&bin);
    cmd.arg("--out").arg(out);
    if quick {
        cmd.arg("--quick");
    }
    let status = cmd.status().with_context(|| format!("running {bin}"))?;
    match status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => bail!("{name} failed ({status})"),
    }
}

/// The scale point: 10, 100 and 1,000 warm instances in one chain (ready time, memory per
/// instance, ring memory, idle CPU, RPS), written to `out/scale.json` and `out/scale.md`.
/// Returns whether every point succeeded.
fn scale(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: scale point (10, 100, 1000 instances in one chain)");
    let idle = if quick { "2" } else { "5" };
    let output = Command::new("target/release/zerohop-bench-scale")
        .args(["--markdown", "--idle-seconds", idle])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running target/release/zerohop-bench-scale")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // The JSON document first, then the markdown table after a blank line.
    let (json, table) = text.split_once("\n\n").unwrap_or((&text, ""));
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("scale.json"), json)?;
    std::fs::write(
        out.join("scale.md"),
        format!(
            "# Scale: many warm instances in one chain\n\n{table}\n\nGoals: 1,000 warm \
             instances at <= 1 MiB private memory each, ring memory proportional to the edges, \
             ready in <= 2 s, no idle CPU.\n"
        ),
    )?;
    Ok(output.status.success())
}

/// Draws the plots with matplotlib, installing it with pip when it is missing.
fn plot(out: &Path) -> Result<()> {
    let has_matplotlib = || {
        Command::new("python3")
            .args(["-c", "import matplotlib"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_matplotlib() {
        eprintln!("xtask: installing matplotlib for the plots (pip install --user matplotlib)");
        let _ = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--user", "matplotlib"])
            .status();
        if !has_matplotlib() {
            bail!(
                "matplotlib is missing and could not be installed; the numbers are in {}/results.json, \
                 install it with `python3 -m pip install matplotlib` and run `python3 bench/plot.py {}`",
                out.display(),
                out.display()
            );
        }
    }
    run(
        "drawing the plots",
        Command::new("python3").arg("bench/plot.py").arg(out),
    )
}

/// The `-ldflags` argument for a `go build` or `go test` that links the C SDK's static
/// library: Go's build cache does not look at the contents of a library cgo links in, so a
/// stamp of it in the link flags makes Go link again when the SDK changed (else a stale
/// program, speaking an older protocol, comes from the cache).
fn go_sdk_stamp() -> Result<String> {
    let lib = std::fs::metadata(workspace_root().join("target/c-sdk/lib/libzerohop.a"))
        .context("the C SDK's libzerohop.a")?;
    Ok(format!(
        "-ldflags=-X=main.zerohopSDK={}-{}",
        lib.len(),
        lib.modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ))
}
