use super::*;

/// Runs wake-ups of kind `why` every `every` for `span`, the scaler looking as
/// [`look_at`] says (a wake-up that comes while it waits to look is absorbed, as the
/// `Notify` keeps one permit); returns how many looks.
fn looks(why: Wake, every: Duration, span: Duration) -> u32 {
    let t0 = Instant::now();
    let (mut t, mut last, mut n) = (t0, None, 0);
    while t < t0 + span {
        let at = look_at(last, t, why);
        last = Some(at);
        n += 1;
        t = at + every;
    }
    n
}

#[test]
fn looks_take_a_bounded_share_of_a_core() {
    assert_eq!(busy_pause(Duration::ZERO), TICK, "cheap looks: every tick");
    assert_eq!(busy_pause(Duration::from_micros(150)), TICK);
    // A look of 2 ms (a thousand instances): every 100 ms, 2% of a core.
    assert_eq!(
        busy_pause(Duration::from_millis(2)),
        Duration::from_millis(100)
    );
    assert_eq!(busy_pause(Duration::MAX), Duration::MAX, "no overflow");
}

#[test]
fn a_wake_word_bumped_in_a_loop_costs_one_look_per_tick() {
    let span = Duration::from_millis(100);
    // A bump every microsecond: 100,000 wake-ups, 10 ticks.
    let n = looks(Wake::Instance, Duration::from_micros(1), span);
    assert!(n <= 11, "{n} looks in {span:?}");
    // Rare wake-ups are looked at at once.
    let t = Instant::now();
    assert_eq!(look_at(None, t, Wake::Instance), t);
    assert_eq!(look_at(Some(t - TICK), t, Wake::Instance), t);
    assert_eq!(look_at(Some(t - TICK / 2), t, Wake::Instance), t + TICK / 2);
}

#[test]
fn the_gateways_and_the_timers_wake_ups_are_not_delayed() {
    let t = Instant::now();
    for why in [Wake::Gateway, Wake::Timer] {
        assert_eq!(look_at(Some(t), t, why), t, "{why:?}");
    }
}

#[test]
fn forged_queue_depth_counts_for_no_more_than_the_requests_in_flight() {
    // (party serves?, descriptors queued) per party of one function, requests in
    // flight, what the scaler believes.
    type Case<'a> = (&'a str, &'a [(bool, usize)], usize, &'a [usize]);
    let cases: [Case<'_>; 7] = [
        ("honest", &[(true, 3), (true, 2)], 10, &[3, 2]),
        (
            "every queue at its capacity, two requests in flight",
            &[(true, 1024), (true, 1024), (false, 1024), (false, 1024)],
            2,
            &[0, 0, 2, 0],
        ),
        (
            "nothing in flight: one descriptor's worth, to drain what a timed-out \
             request left",
            &[(false, 1024), (false, 1024)],
            0,
            &[1, 0],
        ),
        (
            "a stranded party is credited before inflated serving ones",
            &[(true, 1024), (false, 1)],
            1,
            &[0, 1],
        ),
        ("empty", &[(true, 0), (false, 0)], 5, &[0, 0]),
        ("no parties", &[], 5, &[]),
        (
            "the rest of the credit goes to the serving parties",
            &[(true, 4), (false, 1), (true, 4)],
            6,
            &[4, 1, 1],
        ),
    ];
    for (what, queued, inflight, want) in cases {
        assert_eq!(credit(queued, inflight), want, "{what}");
    }
}

/// A function's bounds: `min`..=`max`, one request per instance, `parked` waiting,
/// a cooldown of 10 s and zero after 60 s.
fn bounds(min: u16, max: u16, parked: u16) -> ScaleSpec {
    ScaleSpec {
        min,
        max,
        initial: min,
        target: 1,
        parked,
        cooldown: Duration::from_secs(10),
        zero_after: Duration::from_secs(60),
    }
}

/// Party `party` (1-based, as the gateway is 0) wanting `want`, in `state`, `queued`
/// descriptors believed.
fn party(party: PartyId, want: Want, state: PartyState, queued: usize) -> Seen {
    Seen {
        party,
        want,
        state,
        queued,
    }
}

fn memory(last_demand: Option<Instant>) -> Memory {
    Memory {
        low: None,
        last_demand,
    }
}

const S: Want = Want::Stop;
const R: Want = Want::Run;
const P: Want = Want::Park;

#[test]
fn out_at_once_the_stranded_party_first_then_the_parked_then_the_lowest() {
    let t = Instant::now();
    let seen = [
        party(1, P, PartyState::Parked, 0),
        party(2, S, PartyState::Empty, 2),
        party(3, S, PartyState::Empty, 0),
        party(4, S, PartyState::Empty, 0),
    ];
    let mut mem = memory(None);
    // 2 queued + 1 busy: 3 wanted of 4; one parked kept with what `max` leaves.
    let d = decide(&bounds(0, 4, 1), &mut mem, &seen, 1, t);
    assert_eq!(d.activate, [2, 1, 3]);
    assert_eq!(d.wants, [(4, P)]);
    assert_eq!(mem.last_demand, Some(t));
    assert_eq!(
        d.next,
        Some(t + Duration::from_secs(60)),
        "zero_after's deadline"
    );
}

#[test]
fn a_stranded_party_is_activated_even_when_enough_serve() {
    let t = Instant::now();
    let seen = [
        party(1, R, PartyState::Ready, 0),
        party(2, S, PartyState::Empty, 1),
    ];
    // One busy and one queued, max 1: wanted is 1 and 1 serves, but what waits in
    // party 2's queue has nobody else to take it.
    let d = decide(&bounds(1, 1, 0), &mut memory(Some(t)), &seen, 1, t);
    assert_eq!(d.activate, [2]);
}

#[test]
fn in_after_a_whole_cooldown_down_to_the_most_wanted_meanwhile() {
    let t0 = Instant::now();
    let ready = |p| party(p, R, PartyState::Ready, 0);
    let seen = [ready(1), ready(2), ready(3), ready(4)];
    let b = bounds(1, 4, 0);
    let mut mem = memory(Some(t0));
    let s = Duration::from_secs;
    // 1 busy: 1 wanted of 4 serving; nothing changes before the cooldown.
    let d = decide(&b, &mut mem, &seen, 1, t0);
    assert_eq!((d.activate.len(), d.wants.len()), (0, 0));
    assert_eq!(d.next, Some(t0 + s(10)));
    // 2 busy for a moment: the most wanted during the cooldown is 2.
    assert_eq!(decide(&b, &mut mem, &seen, 2, t0 + s(5)).wants, []);
    // The cooldown is over: down to 2, the highest parties first.
    let d = decide(&b, &mut mem, &seen, 1, t0 + s(10));
    assert_eq!(d.wants, [(4, S), (3, S)]);
    // Still more than the 1 wanted now: another cooldown from here.
    assert_eq!(mem.low, Some((t0 + s(10), 1)));
    assert_eq!(d.next, Some(t0 + s(20)));
}

#[test]
fn a_party_with_something_queued_holds_the_scale_in_and_no_lower_one_stops_for_it() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut seen = [
        party(1, R, PartyState::Ready, 0),
        party(2, R, PartyState::Ready, 1),
        party(3, R, PartyState::Ready, 0),
    ];
    let b = bounds(1, 3, 0);
    let mut mem = memory(Some(t0));
    decide(&b, &mut mem, &seen, 0, t0);
    let d = decide(&b, &mut mem, &seen, 0, t0 + s(10));
    // 1 queued: 1 wanted. Party 3 goes; party 2 has something queued, so it stays, and
    // party 1 is not stopped in its place: a look again soon, not a whole cooldown.
    assert_eq!(d.wants, [(3, S)]);
    assert_eq!(d.next, Some(t0 + s(10) + HELD_LOOK));
    assert_eq!(
        mem.low,
        Some((t0, 1)),
        "the cooldown that ran out still counts"
    );
    // Drained: party 2 goes at the next look.
    seen[1].queued = 0;
    seen[2].want = S;
    let d = decide(&b, &mut mem, &seen, 0, t0 + s(10) + HELD_LOOK);
    assert_eq!(d.wants, [(2, S)]);
}

#[test]
fn garbage_queued_for_a_spare_party_stops_no_serving_instance() {
    // A fixed count of 1 (party 1) and the spare party 2, whose queue another function
    // keeps full of garbage (credited one, as a request is in flight).
    let t = Instant::now();
    let mut seen = [
        party(1, R, PartyState::Ready, 0),
        party(2, S, PartyState::Stopped, 1),
    ];
    let b = bounds(1, 1, 0);
    let mut mem = memory(Some(t));
    // It looks stranded: activated (one instance more, for as long as it has work).
    let d = decide(&b, &mut mem, &seen, 1, t);
    assert_eq!(d.activate, [2]);
    // Two serve, one is wanted: party 2 still has something queued, so nothing stops
    // (party 1 is not stopped in its place).
    seen[1].want = R;
    seen[1].state = PartyState::Ready;
    let d = decide(&b, &mut mem, &seen, 1, t + TICK);
    assert_eq!((d.activate.len(), d.wants.len()), (0, 0));
    // The garbage is gone (dropped by party 2's instance): party 2 stops.
    seen[1].queued = 0;
    let d = decide(&b, &mut mem, &seen, 1, t + TICK + HELD_LOOK);
    assert_eq!(d.wants, [(2, S)]);
}

#[test]
fn to_zero_only_after_zero_after_without_demand() {
    let t = Instant::now();
    let seen = [party(1, R, PartyState::Ready, 0)];
    let b = bounds(0, 1, 0);
    let s = Duration::from_secs;
    let d = decide(&b, &mut memory(Some(t - s(30))), &seen, 0, t);
    assert_eq!(d.wants, [], "demand 30 s ago keeps one instance");
    assert_eq!(d.next, Some(t + s(30)));
    let d = decide(&b, &mut memory(Some(t - s(60))), &seen, 0, t);
    assert_eq!(d.wants, [(1, S)], "none for zero_after: to zero at once");
    let d = decide(&b, &mut memory(None), &seen, 0, t);
    assert_eq!(d.wants, [(1, S)], "never any demand");
}

#[test]
fn a_fixed_count_or_a_lowered_max_applies_at_once() {
    let t = Instant::now();
    let ready = |p| party(p, R, PartyState::Ready, 0);
    let seen = [ready(1), ready(2), ready(3)];
    // `zerohop scale` made it 1: no cooldown.
    let d = decide(&bounds(1, 1, 0), &mut memory(Some(t)), &seen, 3, t);
    assert_eq!(d.wants, [(3, S), (2, S)]);
    // A scaling function whose max fell to 2 under load.
    let d = decide(&bounds(0, 2, 0), &mut memory(Some(t)), &seen, 3, t);
    assert_eq!(d.wants, [(3, S)]);
}

#[test]
fn parked_instances_fill_what_max_leaves_and_no_more() {
    let t = Instant::now();
    let seen = [
        party(1, R, PartyState::Ready, 0),
        party(2, P, PartyState::Parked, 0),
        party(3, P, PartyState::Parked, 0),
        party(4, S, PartyState::Empty, 0),
    ];
    // 1 serving and 1 wanted; max 3 leaves 2 to park: as many as are parked.
    let d = decide(&bounds(1, 3, 2), &mut memory(Some(t)), &seen, 1, t);
    assert_eq!(d.wants, []);
    // max 2 leaves 1: the highest parked goes.
    let d = decide(&bounds(1, 2, 2), &mut memory(Some(t)), &seen, 1, t);
    assert_eq!(d.wants, [(3, S)]);
    // 3 asked, max 4 leaves 3: party 4 parks too.
    let d = decide(&bounds(1, 4, 3), &mut memory(Some(t)), &seen, 1, t);
    assert_eq!(d.wants, [(4, P)]);
}

#[test]
fn forged_depth_cannot_scale_a_function_past_the_requests_in_flight() {
    // A function with target 1 and 8 parties, every queue forged full, 3 requests in
    // flight: it wants 3 instances, not 8.
    let queued = [(false, 1024); 8];
    let believed: usize = credit(&queued, 3).iter().sum();
    let target = 1;
    assert_eq!(believed.div_ceil(target), 3);
}
