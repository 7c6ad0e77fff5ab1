use super::*;
use crate::policy::GATEWAY_FN;

fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("maps")
        .lines()
        .filter(|l| l.contains("zerohop-outbox:act-only") || l.contains("zerohop-inbox:act-only"))
        .count()
}

#[test]
fn act_only_as_unmaps_the_rest_and_still_hands_everything_out() {
    // Gateway 0 -> f0 (parties 1, 2) -> f1 (parties 3, 4) -> gateway.
    let policy = Policy::new(
        vec![GATEWAY_FN, 0, 0, 1, 1],
        [(GATEWAY_FN, 0), (0, 1), (1, GATEWAY_FN)],
    )
    .expect("policy");
    let mut t = RingTransport::create("act-only", &policy, Options::default()).expect("create");
    assert_eq!(
        memfd_mappings(),
        10,
        "every outbox and inbox mapped at first"
    );
    t.act_only_as(&[0]).expect("act only as the gateway");
    // Party 0 keeps its own two regions, the inboxes of 1 and 2, the outboxes of 3 and 4.
    assert_eq!(memfd_mappings(), 6);
    assert!(t.sender(0).is_ok() && t.receiver(0).is_ok());
    assert!(
        t.sender(1).is_err(),
        "party 1's outbox is no longer mapped here"
    );
    // Every party's hand-over still works, and attaches on the other side.
    for p in 1..5 {
        let fds = t.fds_for(p).expect("fds");
        let attached = RingTransport::attach(&policy, p, fds, Options::default())
            .unwrap_or_else(|e| panic!("party {p} attaches: {e}"));
        assert!(attached.sender(p).is_ok());
    }
    // Once a handle exists the mappings are in use and stay.
    let _rx = t.receiver(0).expect("receiver");
    assert!(t.act_only_as(&[]).is_err());
}

#[test]
fn the_agent_reads_what_a_sender_published_and_no_more() {
    // Gateway 0 -> f0 (party 1) -> f1 (party 2) -> gateway.
    let policy = Policy::new(
        vec![GATEWAY_FN, 0, 1],
        [(GATEWAY_FN, 0), (0, 1), (1, GATEWAY_FN)],
    )
    .expect("policy");
    let opts = Options {
        queue_capacity: 8,
        ..Options::default()
    };
    let mut t = RingTransport::create("published", &policy, opts).expect("create");
    t.act_only_as(&[0]).expect("act only as the gateway");
    let attach = |p| RingTransport::attach(&policy, p, t.fds_for(p).unwrap(), opts);
    let (one, two) = (attach(1).expect("party 1"), attach(2).expect("party 2"));
    let tx = one.sender(1).expect("sender");
    let mut rx = two.receiver(2).expect("receiver");
    let desc = |request| Descriptor {
        slot: 1,
        len: 2,
        request,
        generation: 3,
        next: 1,
    };
    // A predecessor's entries, before the agent first looks: never read.
    tx.try_send(2, desc(100)).expect("send");
    let (mut seen, mut out) = (Vec::new(), Vec::new());
    assert!(t.published(1, &mut seen, &mut out));
    assert!(out.is_empty(), "a fresh look only learns the tails");
    assert_eq!(seen.len(), 1, "one queue (to party 2)");
    for r in 0..3 {
        tx.try_send(2, desc(r)).expect("send");
    }
    assert!(t.published(1, &mut seen, &mut out));
    assert_eq!(out, [(2, desc(0)), (2, desc(1)), (2, desc(2))]);
    // More than the ring holds since the last look (the receiver drains): the last
    // capacity - 1 only.
    for r in 3..40 {
        while tx.try_send(2, desc(r)).is_err() {
            rx.recv();
        }
    }
    out.clear();
    assert!(t.published(1, &mut seen, &mut out));
    let got: Vec<u32> = out.iter().map(|(_, d)| d.request).collect();
    assert_eq!(got, (33..40).collect::<Vec<_>>());
    out.clear();
    assert!(t.published(1, &mut seen, &mut out));
    assert!(out.is_empty(), "nothing new");
    assert!(!t.published(9, &mut seen, &mut out), "no such party");
}

#[test]
fn only_entries_the_sender_cannot_be_overwriting_are_read() {
    // Capacity 8: from a look at 10 with the tail at 30, the last 7 (23..30).
    assert_eq!(published_from(10, 30, 8), 23);
    assert_eq!(published_from(10, 17, 8), 10, "7 new: all of them");
    assert_eq!(published_from(10, 18, 8), 11, "8 new: the last 7");
    assert_eq!(
        published_from(u32::MAX - 2, 2, 8),
        u32::MAX - 2,
        "across the wrap"
    );
    // Read from 23; the tail still at 30: none overwritten. At 31 the sender may write
    // index 31, whose place is 23's.
    assert_eq!(overwritten(23, 30, 8), 0);
    assert_eq!(overwritten(23, 31, 8), 1);
    assert_eq!(overwritten(23, 40, 8), 10);
    assert_eq!(overwritten(23, 5, 8), usize::MAX, "the tail moved back");
}

#[test]
fn the_agents_lane_table_is_the_policys_edges() {
    // Capped edges (many instances on both sides), uncapped ones (the gateway's) and a
    // function that sends to itself.
    let mut party_function = vec![GATEWAY_FN, GATEWAY_FN];
    party_function.extend(std::iter::repeat_n(0u8, 37));
    party_function.extend(std::iter::repeat_n(1u8, 61));
    party_function.extend(std::iter::repeat_n(2u8, 5));
    let policy = Policy::new(
        party_function,
        [(GATEWAY_FN, 0), (0, 1), (1, 1), (1, 2), (2, GATEWAY_FN)],
    )
    .expect("policy");
    let lanes = Lanes::new(&policy);
    for p in 0..policy.parties() {
        let targets: Vec<PartyId> = lanes.targets(p).iter().map(|l| l.0).collect();
        let senders: Vec<PartyId> = lanes.senders(p).iter().map(|l| l.0).collect();
        assert_eq!(targets, policy.targets(p), "targets of {p}");
        assert_eq!(senders, policy.senders(p), "senders of {p}");
        for &(t, in_) in lanes.targets(p) {
            assert_eq!(policy.sender_index(p, t), Some(in_ as usize), "{p} -> {t}");
        }
        for &(f, out) in lanes.senders(p) {
            assert_eq!(policy.target_index(f, p), Some(out as usize), "{f} -> {p}");
        }
    }
}
