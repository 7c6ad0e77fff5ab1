//! `cargo xtask image`: the container image the Kubernetes manifests run, `zerohop:VERSION`,
//! built from this machine's release binaries and their shared libraries as an OCI image
//! layout (`target/image/oci`) and the same layout as one archive
//! (`target/image/zerohop-VERSION.oci.tar`). The same inputs give the same digests.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::builds::build_bins;
use crate::cmd::{run, workspace_root};

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
pub fn image(args: &[String]) -> Result<()> {
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
