//! What the protocol's vector tests share: loading (and, with `ZEROHOP_BLESS=1`, rewriting)
//! a file of `protocol/vectors/`, hex, the report of differences, a memfd read and written
//! as shared memory, and the descriptor's fields as the files write them.
//!
//! Included by crates/zerohop-pool/tests/vectors.rs (`#[macro_use] mod vectors_support;`)
//! and by crates/zerohop-transport/tests/vectors.rs (with a `#[path]`). It holds only what
//! both use, so that neither test crate has dead code; what one test alone needs stays in it.

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::Serialize;
use zerohop_pool::{Descriptor, PROTOCOL_VERSION};

/// The command that rewrites this crate's vector files.
pub const REGENERATE: &str = concat!(
    "ZEROHOP_BLESS=1 cargo test -p ",
    env!("CARGO_PKG_NAME"),
    " --test vectors"
);

/// The test that checks this crate's vector files (the crate's folder is named after it).
const TEST: &str = concat!("crates/", env!("CARGO_PKG_NAME"), "/tests/vectors.rs");

fn path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../protocol/vectors")
        .join(file)
}

fn blessing() -> bool {
    std::env::var("ZEROHOP_BLESS").is_ok_and(|v| v == "1")
}

/// The parsed file; when blessing, first rewritten as `make` builds it from the file as it
/// was (`None` if missing or no longer parsing).
pub fn load<T: Serialize + DeserializeOwned>(file: &str, make: impl FnOnce(Option<T>) -> T) -> T {
    let p = path(file);
    if blessing() {
        let old = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok());
        let doc = make(old);
        let mut text = serde_json::to_string_pretty(&doc).expect("serialize");
        text.push('\n');
        std::fs::create_dir_all(p.parent().expect("dir")).expect("create protocol/vectors");
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        return doc;
    }
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "protocol/vectors/{file}: cannot read {}: {e}\nGenerate it with `{REGENERATE}`.",
            p.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "protocol/vectors/{file} does not parse as this test expects: {e}\nIf the protocol \
             changed on purpose, regenerate it with `{REGENERATE}`."
        )
    })
}

/// A file's `about` text: the protocol version, the section of docs/protocol.md (quoted by
/// the caller, with anything it adds), what the file holds, and how it is checked.
pub fn about(section: &str, what: &str) -> String {
    format!(
        "zerohop shared-memory protocol version {PROTOCOL_VERSION}, docs/protocol.md section \
         {section}. {what} Checked both ways by {TEST}; regenerate with `{REGENERATE}`."
    )
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str, len: usize) -> Result<Vec<u8>, String> {
    if s.len() != 2 * len {
        return Err(format!(
            "{s:?} has {} hex digits, expected {}",
            s.len(),
            2 * len
        ));
    }
    (0..len)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| format!("{s:?}: {e}")))
        .collect()
}

/// Differences found in one file; fails the test at the end with all of them.
pub struct Report {
    file: &'static str,
    failures: Vec<String>,
}

impl Report {
    /// The report on `file`, starting with what every file has: the code's `about` text and
    /// protocol version.
    pub fn new(file: &'static str, about: &str, want_about: &str, version: u32) -> Self {
        let mut r = Self {
            file,
            failures: Vec::new(),
        };
        r.eq("(file)", "protocol_version", PROTOCOL_VERSION, version);
        r.eq("(file)", "about", want_about, about);
        r
    }

    pub fn fail(&mut self, case: &str, msg: impl std::fmt::Display) {
        self.failures.push(format!("case {case:?}: {msg}"));
    }

    pub fn eq<T: PartialEq + std::fmt::Debug>(&mut self, case: &str, what: &str, code: T, file: T) {
        if code != file {
            self.fail(
                case,
                format!("{what}: the code gives {code:?}, the file has {file:?}"),
            );
        }
    }

    /// The code's bytes against the file's hex (in either case).
    pub fn eq_hex(&mut self, case: &str, what: &str, code: &[u8], file: &str) {
        self.eq(case, what, hex(code), file.to_lowercase());
    }

    /// The file's hex `what` as `len` bytes, or a failure.
    pub fn bytes(&mut self, case: &str, what: &str, s: &str, len: usize) -> Option<Vec<u8>> {
        unhex(s, len)
            .map_err(|e| self.fail(case, format!("{what}: {e}")))
            .ok()
    }

    /// Every case's name is used once, and every seed case of the test is in the file.
    pub fn seeds_present<C>(&mut self, cases: &[C], seeds: &[C], name: impl Fn(&C) -> &str) {
        let names: Vec<&str> = cases.iter().map(&name).collect();
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                self.fail(n, "the name is used twice");
            }
        }
        for s in seeds.iter().map(&name) {
            if !names.contains(&s) {
                self.fail(
                    s,
                    "missing (every seed case of the test must stay in the file)",
                );
            }
        }
    }

    pub fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "protocol/vectors/{} does not match the code:\n  {}\n\nIf the protocol changed \
                 on purpose, regenerate the vectors with `{REGENERATE}`, review the diff and bump \
                 the version; otherwise the code broke the protocol (or the file was edited by \
                 hand).",
                self.file,
                self.failures.join("\n  ")
            );
        }
    }
}

/// A memfd (a pool's or a ring region's), read and written with pread/pwrite: the bytes
/// every process mapping it sees.
pub struct Shm(File);

impl Shm {
    pub fn of(fd: BorrowedFd<'_>) -> Self {
        Shm(File::from(fd.try_clone_to_owned().expect("dup")))
    }
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.0.read_exact_at(&mut b, offset).expect("pread");
        b
    }
    pub fn write(&self, offset: u64, bytes: &[u8]) {
        self.0.write_all_at(bytes, offset).expect("pwrite");
    }
    pub fn u32_at(&self, offset: u64) -> u32 {
        u32::from_le_bytes(self.read(offset, 4).try_into().expect("4"))
    }
    pub fn len(&self) -> u64 {
        self.0.metadata().expect("fstat").len()
    }
}

/// Defines `$json`, a struct of the files with the named fields of the code's `$code`, and
/// the conversions both ways; `$code`'s fields that the files leave out take the values after
/// `+`. (The pool's test, which includes this module with `#[macro_use]`, uses it too.)
macro_rules! json_mirror {
    ($json:ident <-> $code:ident { $($f:ident: $t:ty),* $(,)? } $(+ { $($x:ident: $v:expr),* })?) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $json {
            $(pub $f: $t),*
        }

        impl From<$json> for $code {
            fn from(j: $json) -> Self {
                $code {
                    $($f: j.$f,)*
                    $($($x: $v,)*)?
                }
            }
        }

        impl From<$code> for $json {
            fn from(c: $code) -> Self {
                $json {
                    $($f: c.$f),*
                }
            }
        }
    };
}

json_mirror!(DescFields <-> Descriptor {
    slot: u32,
    next: u8,
    len: u32,
    request: u32,
    generation: u32,
});

impl DescFields {
    pub fn new(slot: u32, next: u8, len: u32, request: u32, generation: u32) -> Self {
        DescFields {
            slot,
            next,
            len,
            request,
            generation,
        }
    }
}
