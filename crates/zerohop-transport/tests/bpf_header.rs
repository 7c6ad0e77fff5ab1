//! `bpf/zerohop.h` is the single source of truth of what the eBPF programs and Rust share:
//! this compiles it with the C compiler and checks every size, offset and constant that
//! `sockmap::abi` mirrors.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use zerohop_test_support::TempDir;
use zerohop_transport::sockmap::abi::*;

/// What C says, as `name value` lines.
fn from_c() -> HashMap<String, u64> {
    let dir = TempDir::new("bpf-header");
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
    let src = dir.path().join("probe.c");
    std::fs::write(
        &src,
        r#"
#include <stddef.h>
#include <stdio.h>
#include "zerohop.h"
#define P(name, v) printf("%s %llu\n", name, (unsigned long long)(v))
#define S(t) P("sizeof " #t, sizeof(struct t))
#define O(t, f) P("offsetof " #t "." #f, offsetof(struct t, f))
#define C(c) P(#c, c)
int main(void) {
    S(zh_trailer); O(zh_trailer, party); O(zh_trailer, verdict); O(zh_trailer, reserved);
    S(zh_sender); O(zh_sender, party); O(zh_sender, function); O(zh_sender, reserved);
    S(zh_config); O(zh_config, gateways); O(zh_config, parties);
    S(zh_fn_stats); O(zh_fn_stats, sent); O(zh_fn_stats, received); O(zh_fn_stats, dropped);
    C(ZH_DESC_LEN); C(ZH_MSG_LEN); C(ZH_DESC_NEXT); C(ZH_DESC_REQUEST); C(ZH_GATEWAY_FN);
    C(ZH_UNKNOWN_SENDER); C(ZH_STAT_ROWS); C(ZH_MAX_INSTANCES);
    C(ZH_VERDICT_DELIVERED); C(ZH_VERDICT_REFUSED_EDGE);
    C(ZH_DROP_MALFORMED); C(ZH_DROP_EDGE); C(ZH_DROP_NO_INSTANCE); C(ZH_DROP_NO_SOCKET);
    C(ZH_DROP_UNKNOWN); C(ZH_DROPS);
    P("zh_edge_key(3,7)", zh_edge_key(3, 7));
    P("zh_edge_key(255,0)", zh_edge_key(255, 0));
    P("zh_instance_key(2,5)", zh_instance_key(2, 5));
    return 0;
}
"#,
    )
    .expect("write probe.c");
    let exe = dir.path().join("probe");
    let cc = Command::new("cc")
        .arg("-I")
        .arg(&header)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc (install gcc)");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().expect("run probe");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("name value");
            (k.to_owned(), v.parse().expect("number"))
        })
        .collect()
}

#[test]
fn header_matches() {
    let c = from_c();
    let rust: Vec<(&str, u64)> = vec![
        ("sizeof zh_trailer", size_of::<Trailer>() as u64),
        (
            "offsetof zh_trailer.party",
            offset_of!(Trailer, party) as u64,
        ),
        (
            "offsetof zh_trailer.verdict",
            offset_of!(Trailer, verdict) as u64,
        ),
        (
            "offsetof zh_trailer.reserved",
            offset_of!(Trailer, reserved) as u64,
        ),
        ("sizeof zh_sender", size_of::<SenderEntry>() as u64),
        (
            "offsetof zh_sender.party",
            offset_of!(SenderEntry, party) as u64,
        ),
        (
            "offsetof zh_sender.function",
            offset_of!(SenderEntry, function) as u64,
        ),
        (
            "offsetof zh_sender.reserved",
            offset_of!(SenderEntry, reserved) as u64,
        ),
        ("sizeof zh_config", size_of::<Config>() as u64),
        (
            "offsetof zh_config.gateways",
            offset_of!(Config, gateways) as u64,
        ),
        (
            "offsetof zh_config.parties",
            offset_of!(Config, parties) as u64,
        ),
        ("sizeof zh_fn_stats", size_of::<FnStats>() as u64),
        (
            "offsetof zh_fn_stats.sent",
            offset_of!(FnStats, sent) as u64,
        ),
        (
            "offsetof zh_fn_stats.received",
            offset_of!(FnStats, received) as u64,
        ),
        (
            "offsetof zh_fn_stats.dropped",
            offset_of!(FnStats, dropped) as u64,
        ),
        ("ZH_DESC_LEN", DESC_LEN as u64),
        ("ZH_MSG_LEN", MSG_LEN as u64),
        ("ZH_DESC_NEXT", DESC_NEXT as u64),
        ("ZH_DESC_REQUEST", DESC_REQUEST as u64),
        ("ZH_GATEWAY_FN", u64::from(GATEWAY_FN)),
        ("ZH_UNKNOWN_SENDER", u64::from(UNKNOWN_SENDER)),
        ("ZH_STAT_ROWS", u64::from(STAT_ROWS)),
        ("ZH_MAX_INSTANCES", u64::from(MAX_INSTANCES)),
        ("ZH_VERDICT_DELIVERED", u64::from(VERDICT_DELIVERED)),
        ("ZH_VERDICT_REFUSED_EDGE", u64::from(VERDICT_REFUSED_EDGE)),
        ("ZH_DROP_MALFORMED", DROP_MALFORMED as u64),
        ("ZH_DROP_EDGE", DROP_EDGE as u64),
        ("ZH_DROP_NO_INSTANCE", DROP_NO_INSTANCE as u64),
        ("ZH_DROP_NO_SOCKET", DROP_NO_SOCKET as u64),
        ("ZH_DROP_UNKNOWN", DROP_UNKNOWN as u64),
        ("ZH_DROPS", DROPS as u64),
        ("zh_edge_key(3,7)", u64::from(edge_key(3, 7))),
        ("zh_edge_key(255,0)", u64::from(edge_key(255, 0))),
        ("zh_instance_key(2,5)", u64::from(instance_key(2, 5))),
    ];
    let mut wrong = Vec::new();
    for (name, r) in &rust {
        match c.get(*name) {
            Some(v) if v == r => {}
            other => wrong.push(format!("{name}: C {other:?}, Rust {r}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "header and abi.rs disagree:\n{}",
        wrong.join("\n")
    );
    assert_eq!(c.len(), rust.len(), "every C value is checked");
    // The wire layout of the trailer as the program writes it.
    let t = Trailer {
        party: 0x0102,
        verdict: VERDICT_REFUSED_EDGE,
        reserved: 0,
    };
    assert_eq!(t.to_bytes(), [0x02, 0x01, 1, 0]);
    assert_eq!(Trailer::from_bytes(t.to_bytes()), t);
}
