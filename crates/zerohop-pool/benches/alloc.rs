//! Slot alloc/free on one thread, and alloc + hand-over + free between two owners.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use zerohop_pool::{Owner, Pool, PoolGeometry};

fn bench(c: &mut Criterion) {
    let pool = Arc::new(
        Pool::create(
            "bench",
            &PoolGeometry {
                slots: 4096,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 4,
                hugepages: false,
                release: false,
            },
        )
        .expect("pool"),
    );
    let me = Owner::party(0);
    c.bench_function("slot_alloc_free", |b| {
        b.iter(|| {
            let s = pool.alloc(me).expect("free slot");
            drop(s);
        })
    });
    // Keep half the pool busy so the next-fit scan has to skip owned slots.
    let held: Vec<_> = (0..2048).map(|_| pool.alloc(me).expect("slot")).collect();
    c.bench_function("slot_alloc_free_half_full", |b| {
        b.iter(|| drop(pool.alloc(me).expect("free slot")))
    });
    drop(held);
    let other = Owner::party(1);
    c.bench_function("slot_alloc_take_free", |b| {
        b.iter(|| {
            let s = pool.alloc(me).expect("free slot");
            let d = s.descriptor(0, 0, 0);
            s.into_sent();
            let (_, taken, _) = pool.take(&d, other, |o| o == me).expect("take");
            drop(taken);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
