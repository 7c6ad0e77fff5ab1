//! `sdk/c/include/zerohop.h` is what cbindgen makes of this crate now: a C ABI change
//! without a new header fails here. `ZEROHOP_BLESS=1 cargo test -p zerohop-c --test header`
//! writes the header anew.

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed = krate.join("../../sdk/c/include/zerohop.h");
    let mut generated = Vec::new();
    cbindgen::generate(krate)
        .expect("cbindgen reads the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("a UTF-8 header");
    if std::env::var_os("ZEROHOP_BLESS").is_some() {
        std::fs::write(&committed, &generated).expect("write the header");
        return;
    }
    let current = std::fs::read_to_string(&committed).unwrap_or_default();
    assert!(
        current == generated,
        "{} is stale: `ZEROHOP_BLESS=1 cargo test -p zerohop-c --test header` writes it anew",
        committed.display()
    );
}
