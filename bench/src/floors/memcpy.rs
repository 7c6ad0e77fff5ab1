//! `memcpy_64KiB`, `memcpy_1MiB`: what the gateway's one copy in costs. One thread copies
//! one warm buffer into another (`copy_from_slice`, which is libc `memcpy`), each copy timed.
//!
//! Both buffers are page aligned. Alignment matters more than one would guess: on this
//! machine (AMD EPYC guest, glibc 2.36) a 16 or 64 KiB copy whose destination lies 8 to 24
//! bytes past its source modulo 4096 takes ~15x longer (1.4 us becomes 22 us), which is
//! exactly what two back-to-back heap allocations give; 1 MiB copies take another path and
//! do not care.

use std::hint::black_box;
use std::time::Instant;

use anyhow::Result;

use super::{Counts, Floor, Pinning};

/// Both buffers start on a page boundary, as a pool slot does.
const PAGE: usize = 4096;

pub(super) fn measure(name: &str, bytes: usize, counts: Counts, pinning: Pinning) -> Result<Floor> {
    pinning.pin_parent()?;
    // Filled, not zeroed: every page is really there before the first copy.
    let mut src_buf = vec![0x5au8; bytes + PAGE];
    let mut dst_buf = vec![0xa5u8; bytes + PAGE];
    let src = page_aligned(&mut src_buf, bytes);
    let dst = page_aligned(&mut dst_buf, bytes);
    for _ in 0..counts.warmup {
        dst.copy_from_slice(black_box(&*src));
        black_box(&mut *dst);
    }
    let mut samples = Vec::with_capacity(counts.samples);
    for _ in 0..counts.samples {
        let start = Instant::now();
        dst.copy_from_slice(black_box(&*src));
        black_box(&mut *dst);
        samples.push(start.elapsed().as_nanos() as u64);
    }
    Ok(Floor::from_samples(
        name,
        format!(
            "copy of a warm, page-aligned {} buffer into another (copy_from_slice = libc \
             memcpy), each copy timed; GB/s from the median; {}",
            human(bytes),
            pinning.one_thread()
        ),
        &mut samples,
        Some(bytes),
    ))
}

/// The first `len` bytes of `buf` that start on a page boundary (`buf` holds `len + PAGE`).
fn page_aligned(buf: &mut [u8], len: usize) -> &mut [u8] {
    let off = buf.as_ptr().align_offset(PAGE);
    &mut buf[off..off + len]
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}
