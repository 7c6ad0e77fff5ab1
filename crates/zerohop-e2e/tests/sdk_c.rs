//! The C SDK end to end: C functions (compiled here with the system's `cc` against
//! `target/release/libzerohop.a` and `sdk/c/include/zerohop.h`) in a chain run by the real
//! `zerohop up`, with Rust functions beside them, answered over real HTTP.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{client, post, testfn};
use zerohop_test_support::{target_bin, ChainProcess, TempDir};

/// Compiles `source` (relative to the repository) into `dir`; the program's path.
fn compile(source: &str, dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = target_bin("libzerohop.a");
    assert!(
        lib.exists(),
        "{} is missing: `cargo build --release -p zerohop-c` (cargo xtask test does)",
        lib.display()
    );
    let out = dir.join(Path::new(source).file_stem().expect("a file name"));
    let status = Command::new("cc")
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(root.join("sdk/c/include"))
        .arg(root.join(source))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed on {source}");
    out
}

#[test]
fn c_functions_work_in_place_beside_rust_ones_and_fail_clearly() {
    let dir = TempDir::new("sdk-c");
    let upper = compile("examples/c/upper.c", dir.path());
    let cfn = compile("sdk/c/tests/cfn.c", dir.path());
    let t = testfn();
    let c = |name: &str, mode: &str| {
        format!(
            "  {name}: {{ command: [\"{}\"], env: {{ CFN_MODE: {mode} }} }}\n",
            cfn.display()
        )
    };
    let spec = format!(
        "name: sdkc\npool: {{ slots: 64, slot_size: 4KiB }}\nfunctions:\n\
         \x20 upper: {{ command: [\"{}\"] }}\n\
         \x20 exclaim: {{ command: [\"{t}\"], env: {{ TESTFN_MODE: exclaim }} }}\n{}{}{}\
         routes:\n\
         \x20 - http: POST /hello\n    sequence: [upper, exclaim]\n\
         \x20 - http: POST /wrap\n    sequence: [exclaim, wrap]\n\
         \x20 - http: POST /big\n    sequence: [big]\n\
         \x20 - http: POST /no\n    sequence: [no]\n",
        upper.display(),
        c("wrap", "wrap"),
        c("big", "oversize"),
        c("no", "fail"),
    );
    let chain = ChainProcess::start(&spec, &[]);
    let url = chain.url.clone();
    let http = client();
    let r = post(&http, &format!("{url}/hello"), "hello from c");
    assert_eq!((r.status, r.body.as_str()), (200, "HELLO FROM C!"));
    let r = post(&http, &format!("{url}/wrap"), "x");
    assert_eq!((r.status, r.body.as_str()), (200, "<x!>"));
    // Growing past the slot: a clear error naming the room, nothing written, the function
    // serving on.
    let r = post(&http, &format!("{url}/big"), "abc");
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            500,
            "function 'big': output of 4065 bytes exceeds the slot capacity of 4064 bytes; \
             raise pool.slot_size\n"
        )
    );
    let r = post(&http, &format!("{url}/no"), "this");
    assert_eq!(
        (r.status, r.body.as_str()),
        (422, "function 'no': refusing this\n")
    );
    for _ in 0..3 {
        let r = post(&http, &format!("{url}/hello"), "again");
        assert_eq!((r.status, r.body.as_str()), (200, "AGAIN!"));
    }
    assert_eq!(chain.stop(), Some(0), "zerohop up exits 0 on SIGTERM");
}
