//! Compiles the sockmap transport's eBPF programs (`bpf/*.bpf.c`) with clang into
//! `$OUT_DIR`, where `src/sockmap/kernel.rs` embeds them.
//!
//! Without clang the build goes on with an empty object, and the sockmap transport then
//! refuses to start, naming the reason; `ZEROHOP_REQUIRE_BPF=1` (set in CI) makes a missing
//! clang an error instead. A program that does not compile is always an error.
//!
//! A build without clang asks cargo to run this script again when `PATH` or any folder on
//! it changes, so installing clang afterwards (`apt-get install clang`) is noticed by the
//! next `cargo build`: no `cargo clean` needed.

use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAMS: [&str; 1] = ["sockmap"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = Path::new("bpf");
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=ZEROHOP_REQUIRE_BPF");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let target_arch = match arch.as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        other => other,
    };
    for name in PROGRAMS {
        let src = dir.join(format!("{name}.bpf.c"));
        let obj = out.join(format!("{name}.bpf.o"));
        let mut cmd = Command::new(&clang);
        cmd.args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-D__TARGET_ARCH_{target_arch}"))
            .arg("-I")
            .arg(dir)
            // Debian keeps asm/types.h under the multiarch include directory.
            .arg("-I")
            .arg(format!("/usr/include/{arch}-linux-gnu"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj);
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                let helpers = Path::new("/usr/include/bpf/bpf_helpers.h");
                let hint = if helpers.exists() {
                    ""
                } else {
                    " (libbpf's headers are missing: `apt-get install libbpf-dev`)"
                };
                panic!("clang failed to compile {} ({s}){hint}", src.display())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::env::var_os("ZEROHOP_REQUIRE_BPF").is_some_and(|v| v != "0") {
                    panic!("ZEROHOP_REQUIRE_BPF is set but `{clang}` was not found: install clang");
                }
                println!(
                    "cargo:warning=`{clang}` not found: built without the sockmap transport's \
                     eBPF programs (install clang to have them; the next build notices it)"
                );
                std::fs::write(&obj, []).expect("write an empty object");
                rerun_when_path_changes();
            }
            Err(e) => panic!("running `{clang}`: {e}"),
        }
    }
}

/// Makes cargo run this script again when `PATH` or one of its folders changes (a program
/// installed there, clang among them). Only after clang was not found: with clang, the
/// objects depend on `bpf/` alone.
fn rerun_when_path_changes() {
    println!("cargo:rerun-if-env-changed=PATH");
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.is_absolute() && dir.is_dir() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }
}
