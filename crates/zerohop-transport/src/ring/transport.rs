//! Creating and attaching the ring regions (outboxes and inboxes).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use zerohop_pool::region::{self, Region};
use zerohop_pool::sync::{AtomicU32, AtomicU64, Ordering};

use super::{RingReceiver, RingSender, Spsc};
use crate::{
    Backend, Descriptor, Options, PartyId, Policy, Receiver, Sender, Transport, TransportError,
};

const OUTBOX_MAGIC: [u8; 8] = *b"ZHOUTBOX";
const INBOX_MAGIC: [u8; 8] = *b"ZHINBOX\0";
const VERSION: u32 = 2;
const HEADER: usize = 64;
const LINE: usize = 64;

/// Header of an outbox or inbox (64 bytes, written once by the agent before sharing).
#[repr(C)]
#[derive(Clone, Copy)]
struct RegionHeader {
    magic: [u8; 8],
    version: u32,
    party: u32,
    /// Queues in an outbox, heads in an inbox.
    count: u32,
    /// Entries per queue (outbox), 0 in an inbox.
    capacity: u32,
    _pad: [u8; 40],
}
const _: () = assert!(core::mem::size_of::<RegionHeader>() == HEADER);

fn queue_stride(capacity: u32) -> usize {
    LINE + capacity as usize * 16
}

fn outbox_len(queues: usize, capacity: u32) -> usize {
    HEADER + queues * queue_stride(capacity)
}

fn inbox_len(senders: usize) -> usize {
    HEADER + LINE + senders * LINE
}

/// One mapped region.
struct Mapped {
    region: Region,
}

impl Mapped {
    fn word32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= self.region.len() && offset.is_multiple_of(4));
        // SAFETY: offsets come from the geometry checked at create/attach, so they are inside
        // the mapping and 4-aligned; AtomicU32 has the layout of u32 and any bit pattern is
        // valid; the region lives as long as &self. A read-only mapping is only loaded from
        // (the callers write only the regions this party maps writable).
        unsafe { &*self.region.base().add(offset).cast::<AtomicU32>() }
    }

    fn words64(&self, offset: usize, n: usize) -> &[AtomicU64] {
        debug_assert!(offset + n * 8 <= self.region.len() && offset.is_multiple_of(8));
        // SAFETY: as in word32, for n 8-aligned u64 words inside the mapping.
        unsafe { std::slice::from_raw_parts(self.region.base().add(offset).cast::<AtomicU64>(), n) }
    }
}

/// The mapped regions plus the chain's edges; shared by the sender and receiver handles.
pub(crate) struct RingShared {
    pub(crate) policy: Policy,
    capacity: u32,
    /// Outbox of each party (`None` where this process does not map it).
    outboxes: Vec<Option<Mapped>>,
    /// Inbox of each party.
    inboxes: Vec<Option<Mapped>>,
    pub(crate) opts: Options,
}

impl RingShared {
    fn outbox(&self, p: PartyId) -> &Mapped {
        self.outboxes[p as usize]
            .as_ref()
            .expect("the handles only ask for regions this party maps")
    }

    fn inbox(&self, p: PartyId) -> &Mapped {
        self.inboxes[p as usize]
            .as_ref()
            .expect("the handles only ask for regions this party maps")
    }

    /// Whether `receiver` sleeps (in its inbox; read by its senders).
    pub(crate) fn sleeping(&self, receiver: PartyId) -> &AtomicU32 {
        self.inbox(receiver).word32(HEADER)
    }

    /// The tail of the `i`-th queue of `sender`'s outbox (the futex word of that queue).
    pub(crate) fn tail(&self, sender: PartyId, i: usize) -> &AtomicU32 {
        self.outbox(sender)
            .word32(HEADER + i * queue_stride(self.capacity))
    }

    /// The queue from `sender` (its `out`-th target) into `receiver` (whose `in_`-th sender
    /// it is).
    pub(crate) fn queue(
        &self,
        sender: PartyId,
        out: usize,
        receiver: PartyId,
        in_: usize,
    ) -> Spsc<'_> {
        let q = HEADER + out * queue_stride(self.capacity);
        let entries = self
            .outbox(sender)
            .words64(q + LINE, self.capacity as usize * 2);
        let head = self.inbox(receiver).word32(HEADER + LINE + in_ * LINE);
        Spsc::new(head, self.tail(sender, out), entries)
    }
}

fn create_region(name: String, header: RegionHeader, len: usize) -> Result<Mapped, TransportError> {
    let region = Region::create(&name, len, false)?;
    // SAFETY: fresh mapping of at least HEADER bytes, not yet shared; the rest is zero,
    // which is the empty state of every queue, head and flag.
    unsafe { region.base().cast::<RegionHeader>().write(header) };
    Ok(Mapped { region })
}

/// What a region handed to a party must look like.
struct Expected {
    what: &'static str,
    magic: [u8; 8],
    party: PartyId,
    count: usize,
    capacity: u32,
    len: usize,
    writable: bool,
}

impl Expected {
    /// The outbox of `party`, which has `count` queues (its targets).
    fn outbox(party: PartyId, count: usize, capacity: u32, writable: bool) -> Self {
        Self {
            what: "outbox",
            magic: OUTBOX_MAGIC,
            party,
            count,
            capacity,
            len: outbox_len(count, capacity),
            writable,
        }
    }

    /// The inbox of `party`, which has `count` heads (its senders).
    fn inbox(party: PartyId, count: usize, writable: bool) -> Self {
        Self {
            what: "inbox",
            magic: INBOX_MAGIC,
            party,
            count,
            capacity: 0,
            len: inbox_len(count),
            writable,
        }
    }
}

fn attach_region(fd: OwnedFd, e: Expected) -> Result<Mapped, TransportError> {
    let Expected {
        what,
        magic,
        party,
        count,
        capacity,
        len,
        writable,
    } = e;
    let region = Region::attach(fd)?;
    if region.len() != len {
        return Err(TransportError::Layout(format!(
            "{what} of party {party} is {} bytes, expected {len}",
            region.len()
        )));
    }
    if region.writable() != writable {
        return Err(TransportError::Layout(format!(
            "{what} of party {party} is handed over {}, expected {}",
            if region.writable() {
                "writable"
            } else {
                "read-only"
            },
            if writable { "writable" } else { "read-only" }
        )));
    }
    // SAFETY: at least HEADER bytes are mapped (len checked); plain data written before
    // sharing, valid for any bit pattern.
    let h = unsafe { region.base().cast::<RegionHeader>().read() };
    if h.magic != magic
        || h.version != VERSION
        || h.party != party as u32
        || h.count as usize != count
        || h.capacity != capacity
    {
        return Err(TransportError::Layout(format!(
            "{what} of party {party} is not a zerohop ring region of protocol version {VERSION} \
             for this chain"
        )));
    }
    Ok(Mapped { region })
}

/// Read-only views of regions, by party.
type Views = Vec<Option<Mapped>>;

/// Every party's queues, built once from the policy on the agent's side, which looks at all
/// of them (queue depths, published descriptors, hand-overs): asking the policy each time
/// costs a scan of the sending function's instances per receiver, which with a thousand
/// instances made every look of the scaler quadratic.
struct Lanes {
    /// Per party, its targets in ascending order (the queues of its outbox), each with the
    /// index of its head in the target's inbox.
    targets: Vec<Vec<(PartyId, u32)>>,
    /// Per party, its senders in ascending order (the heads of its inbox), each with the
    /// index of the queue in the sender's outbox.
    senders: Vec<Vec<(PartyId, u32)>>,
}

impl Lanes {
    /// O(edges): each party's targets from the policy, the senders by inverting them (a
    /// receiver's senders come out in ascending order, as [`Policy::senders`] lists them).
    fn new(policy: &Policy) -> Self {
        let n = usize::from(policy.parties());
        let mut targets: Vec<Vec<(PartyId, u32)>> = Vec::with_capacity(n);
        let mut senders: Vec<Vec<(PartyId, u32)>> = vec![Vec::new(); n];
        for p in 0..n as PartyId {
            let to = policy.targets(p);
            for (out, &t) in to.iter().enumerate() {
                senders[t as usize].push((p, out as u32));
            }
            targets.push(to.into_iter().map(|t| (t, 0)).collect());
        }
        for from in &senders {
            for (in_, &(s, out)) in from.iter().enumerate() {
                targets[s as usize][out as usize].1 = in_ as u32;
            }
        }
        Self { targets, senders }
    }

    fn targets(&self, p: PartyId) -> &[(PartyId, u32)] {
        &self.targets[p as usize]
    }

    fn senders(&self, p: PartyId) -> &[(PartyId, u32)] {
        &self.senders[p as usize]
    }
}

/// The agent's descriptors of the regions it created but does not map (see
/// [`Transport::act_only_as`]), per party.
struct Unmapped {
    lanes: Lanes,
    outboxes: Vec<Option<OwnedFd>>,
    inboxes: Vec<Option<OwnedFd>>,
    /// Read-only views of bare regions, made the first time [`Transport::queued`] reads
    /// them: (outboxes, inboxes) by party.
    views: std::sync::Mutex<(Views, Views)>,
}

impl Unmapped {
    /// Party `p`'s outbox: the agent's own mapping, else a read-only view made once
    /// (`None` if it cannot be made).
    fn outbox<'a>(
        &self,
        s: &'a RingShared,
        views: &'a mut Views,
        p: PartyId,
    ) -> Option<&'a Mapped> {
        let expected = Expected::outbox(p, self.lanes.targets(p).len(), s.capacity, false);
        view(&s.outboxes, views, &self.outboxes, p, expected)
    }

    /// Party `p`'s inbox, as [`Unmapped::outbox`].
    fn inbox<'a>(&self, s: &'a RingShared, views: &'a mut Views, p: PartyId) -> Option<&'a Mapped> {
        let expected = Expected::inbox(p, self.lanes.senders(p).len(), false);
        view(&s.inboxes, views, &self.inboxes, p, expected)
    }
}

/// Party `p`'s region from `mapped`, else from `views`, where a read-only view of its bare
/// descriptor is made the first time.
fn view<'a>(
    mapped: &'a [Option<Mapped>],
    views: &'a mut Views,
    bare: &[Option<OwnedFd>],
    p: PartyId,
    expected: Expected,
) -> Option<&'a Mapped> {
    if let Some(m) = &mapped[p as usize] {
        return Some(m);
    }
    if views[p as usize].is_none() {
        let fd = bare[p as usize].as_ref()?;
        let ro = region::reopen_readonly(fd.as_fd()).ok()?;
        views[p as usize] = Some(attach_region(ro, expected).ok()?);
    }
    views[p as usize].as_ref()
}

/// The first index [`Transport::published`] reads, for a queue last seen at `seen` whose
/// tail is now `tail`: `seen`, or the oldest of the last `capacity - 1` entries when more
/// were published since (the ring holds no more, and the slot of the entry at
/// `tail - capacity` is the one the sender writes next).
fn published_from(seen: u32, tail: u32, capacity: u32) -> u32 {
    if tail.wrapping_sub(seen) >= capacity {
        tail.wrapping_sub(capacity - 1)
    } else {
        seen
    }
}

/// How many entries from index `start` on the sender may have overwritten (or be writing)
/// by the time its tail reads `now`: index `j` shares its place with `j + capacity`, which
/// the sender writes once its tail reached `j + capacity`. A tail that moved back counts as
/// everything overwritten.
fn overwritten(start: u32, now: u32, capacity: u32) -> usize {
    let ahead = now.wrapping_sub(start);
    if ahead > u32::MAX / 2 {
        return usize::MAX;
    }
    (ahead + 1).saturating_sub(capacity) as usize
}

/// The agent's descriptor of party `p`'s region: it holds every region, mapped or bare.
fn held<'a>(
    mapped: &'a [Option<Mapped>],
    bare: &'a [Option<OwnedFd>],
    p: PartyId,
) -> BorrowedFd<'a> {
    mapped[p as usize]
        .as_ref()
        .map(|m| m.region.fd())
        .or_else(|| bare[p as usize].as_ref().map(AsFd::as_fd))
        .expect("the agent holds every region")
}

/// The ring transport of one chain.
pub struct RingTransport {
    shared: Arc<RingShared>,
    /// `Some` on the agent's side (which hands regions out), `None` on a party's.
    unmapped: Option<Unmapped>,
}

impl RingTransport {
    /// Creates every party's outbox and inbox for the edges of `policy` (agent side).
    pub fn create(name: &str, policy: &Policy, opts: Options) -> Result<Self, TransportError> {
        let parties = policy.parties();
        if parties == 0 {
            return Err(TransportError::Layout(
                "a chain needs at least one party".into(),
            ));
        }
        let capacity = opts.queue_capacity.clamp(2, 1 << 16).next_power_of_two();
        let lanes = Lanes::new(policy);
        let mut outboxes = Vec::new();
        let mut inboxes = Vec::new();
        for p in 0..parties {
            let header = |magic, count: usize, capacity| RegionHeader {
                magic,
                version: VERSION,
                party: p as u32,
                count: count as u32,
                capacity,
                _pad: [0; 40],
            };
            let targets = lanes.targets(p).len();
            let senders = lanes.senders(p).len();
            outboxes.push(Some(create_region(
                format!("zerohop-outbox:{name}:{p}"),
                header(OUTBOX_MAGIC, targets, capacity),
                outbox_len(targets, capacity),
            )?));
            inboxes.push(Some(create_region(
                format!("zerohop-inbox:{name}:{p}"),
                header(INBOX_MAGIC, senders, 0),
                inbox_len(senders),
            )?));
        }
        Ok(Self {
            shared: Arc::new(RingShared {
                policy: policy.clone(),
                capacity,
                outboxes,
                inboxes,
                opts,
            }),
            unmapped: Some(Unmapped {
                lanes,
                outboxes: (0..parties).map(|_| None).collect(),
                inboxes: (0..parties).map(|_| None).collect(),
                views: std::sync::Mutex::new((
                    (0..parties).map(|_| None).collect(),
                    (0..parties).map(|_| None).collect(),
                )),
            }),
        })
    }

    /// Maps the regions of party `me` from the fds [`Transport::fds_for`] handed out, in
    /// that order: own outbox and inbox (read-write), the inboxes of its targets and the
    /// outboxes of its senders (read-only).
    pub fn attach(
        policy: &Policy,
        me: PartyId,
        fds: Vec<OwnedFd>,
        opts: Options,
    ) -> Result<Self, TransportError> {
        let parties = policy.parties();
        if me >= parties {
            return Err(TransportError::NoSuchParty { party: me, parties });
        }
        let (targets, senders) = (policy.targets(me), policy.senders(me));
        let want = 2 + targets.len() + senders.len();
        if fds.len() != want {
            return Err(TransportError::Layout(format!(
                "ring expects {want} fds for party {me}, got {}",
                fds.len()
            )));
        }
        let capacity = opts.queue_capacity.clamp(2, 1 << 16).next_power_of_two();
        let mut outboxes: Vec<Option<Mapped>> = (0..parties).map(|_| None).collect();
        let mut inboxes: Vec<Option<Mapped>> = (0..parties).map(|_| None).collect();
        let mut fds = fds.into_iter();
        let mut next = || fds.next().expect("count checked");
        // The queues of the regions this party maps: its own, its targets' heads, its
        // senders' queues (a few scans of the neighbouring functions' instances, once).
        let out = |p, fd, writable| {
            let count = policy.targets(p).len();
            attach_region(fd, Expected::outbox(p, count, capacity, writable))
        };
        let inb = |p, fd, writable| {
            let count = policy.senders(p).len();
            attach_region(fd, Expected::inbox(p, count, writable))
        };
        outboxes[me as usize] = Some(out(me, next(), true)?);
        inboxes[me as usize] = Some(inb(me, next(), true)?);
        for t in targets {
            if t != me {
                inboxes[t as usize] = Some(inb(t, next(), false)?);
            } else {
                drop(next());
            }
        }
        for s in senders {
            if s != me {
                outboxes[s as usize] = Some(out(s, next(), false)?);
            } else {
                drop(next());
            }
        }
        Ok(Self {
            shared: Arc::new(RingShared {
                policy: policy.clone(),
                capacity,
                outboxes,
                inboxes,
                opts,
            }),
            unmapped: None,
        })
    }

    fn check(&self, p: PartyId) -> Result<(), TransportError> {
        let parties = self.shared.policy.parties();
        if p >= parties {
            return Err(TransportError::NoSuchParty { party: p, parties });
        }
        Ok(())
    }

    fn mapped(&self, p: PartyId) -> Result<(), TransportError> {
        self.check(p)?;
        let s = &self.shared;
        let writable = |m: &Option<Mapped>| m.as_ref().is_some_and(|m| m.region.writable());
        let readable = |m: &Option<Mapped>| m.is_some();
        let ok = writable(&s.outboxes[p as usize])
            && writable(&s.inboxes[p as usize])
            && s.policy
                .targets(p)
                .iter()
                .all(|&t| readable(&s.inboxes[t as usize]))
            && s.policy
                .senders(p)
                .iter()
                .all(|&f| readable(&s.outboxes[f as usize]));
        if !ok {
            return Err(TransportError::Layout(format!(
                "this process does not hold party {p}'s ring regions"
            )));
        }
        Ok(())
    }
}

impl Transport for RingTransport {
    fn backend(&self) -> Backend {
        if self.shared.opts.poll {
            Backend::Poll
        } else {
            Backend::Ring
        }
    }

    fn parties(&self) -> u16 {
        self.shared.policy.parties()
    }

    fn fds_for(&self, party: PartyId) -> Result<Vec<OwnedFd>, TransportError> {
        self.check(party)?;
        let Some(unmapped) = &self.unmapped else {
            return Err(TransportError::Layout(
                "only the agent hands out ring regions".into(),
            ));
        };
        let s = &self.shared;
        let outbox = |p| held(&s.outboxes, &unmapped.outboxes, p);
        let inbox = |p| held(&s.inboxes, &unmapped.inboxes, p);
        let dup = |fd: BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|source| TransportError::Syscall {
                    call: "dup",
                    source,
                })
        };
        // Read-only descriptors are opened for each hand-over, not kept: the agent would
        // otherwise hold two descriptors per region, and every spawned instance inherits
        // (and closes at exec) all the agent's descriptors.
        let mut v = vec![dup(outbox(party))?, dup(inbox(party))?];
        for &(t, _) in unmapped.lanes.targets(party) {
            v.push(region::reopen_readonly(inbox(t))?);
        }
        for &(f, _) in unmapped.lanes.senders(party) {
            v.push(region::reopen_readonly(outbox(f))?);
        }
        Ok(v)
    }

    fn queued(&self, party: PartyId) -> usize {
        let (Ok(()), Some(unmapped)) = (self.check(party), &self.unmapped) else {
            return 0;
        };
        let s = &self.shared;
        let mut views = unmapped.views.lock().unwrap_or_else(|p| p.into_inner());
        let (out_views, in_views) = &mut *views;
        let Some(inbox) = unmapped.inbox(s, in_views, party) else {
            return 0;
        };
        let mut total = 0usize;
        for (in_, &(sender, out)) in unmapped.lanes.senders(party).iter().enumerate() {
            let out = out as usize;
            let Some(outbox) = unmapped.outbox(s, out_views, sender) else {
                continue;
            };
            // SYNC POINT: Acquire pairs with the Release stores of tails and heads in
            // `Spsc`; a snapshot, any value is input.
            let tail = outbox
                .word32(HEADER + out * queue_stride(s.capacity))
                .load(Ordering::Acquire);
            // SYNC POINT: as above.
            let head = inbox
                .word32(HEADER + LINE + in_ * LINE)
                .load(Ordering::Acquire);
            let lag = tail.wrapping_sub(head);
            if lag <= s.capacity {
                total += lag as usize;
            }
        }
        total
    }

    fn published(
        &self,
        sender: PartyId,
        seen: &mut Vec<u32>,
        out: &mut Vec<(PartyId, Descriptor)>,
    ) -> bool {
        let (Ok(()), Some(unmapped)) = (self.check(sender), &self.unmapped) else {
            return false;
        };
        let s = &self.shared;
        let mut views = unmapped.views.lock().unwrap_or_else(|p| p.into_inner());
        let Some(outbox) = unmapped.outbox(s, &mut views.0, sender) else {
            return false;
        };
        let targets = unmapped.lanes.targets(sender);
        let fresh = seen.len() != targets.len();
        if fresh {
            seen.clear();
        }
        let cap = s.capacity;
        for (i, &(receiver, _)) in targets.iter().enumerate() {
            let q = HEADER + i * queue_stride(cap);
            let tail_word = outbox.word32(q);
            // SYNC POINT: Acquire pairs with the producer's Release store of its tail in
            // `Spsc`: entries below it were written before. Any value is input.
            let tail = tail_word.load(Ordering::Acquire);
            if fresh {
                seen.push(tail);
                continue;
            }
            let new = tail.wrapping_sub(seen[i]);
            let start = published_from(seen[i], tail, cap);
            seen[i] = tail;
            if new == 0 || new > u32::MAX / 2 {
                // Nothing new, or the tail moved back (the sender's own queue garbled).
                continue;
            }
            let entries = outbox.words64(q + LINE, cap as usize * 2);
            let first = out.len();
            let mut at = start;
            while at != tail {
                let e = (at & (cap - 1)) as usize * 2;
                out.push((
                    receiver,
                    Descriptor::from_words([
                        entries[e].load(Ordering::Relaxed),
                        entries[e + 1].load(Ordering::Relaxed),
                    ]),
                ));
                at = at.wrapping_add(1);
            }
            // SYNC POINT: Acquire, as above: the sender may have moved on while we read, and
            // an entry it has begun to overwrite may be torn; those are left out.
            let now = tail_word.load(Ordering::Acquire);
            let torn = overwritten(start, now, cap).min(out.len() - first);
            out.drain(first..first + torn);
        }
        true
    }

    fn act_only_as(&mut self, parties: &[PartyId]) -> Result<(), TransportError> {
        let Some(unmapped) = &mut self.unmapped else {
            return Err(TransportError::Layout(
                "only the agent creates ring regions".into(),
            ));
        };
        let Some(s) = Arc::get_mut(&mut self.shared) else {
            return Err(TransportError::Layout(
                "act_only_as must come before any sender or receiver is made".into(),
            ));
        };
        let n = s.policy.parties() as usize;
        let (mut keep_out, mut keep_in) = (vec![false; n], vec![false; n]);
        for &me in parties {
            if me as usize >= n {
                return Err(TransportError::NoSuchParty {
                    party: me,
                    parties: n as u16,
                });
            }
            keep_out[me as usize] = true;
            keep_in[me as usize] = true;
            for &(t, _) in unmapped.lanes.targets(me) {
                keep_in[t as usize] = true;
            }
            for &(f, _) in unmapped.lanes.senders(me) {
                keep_out[f as usize] = true;
            }
        }
        let unmap =
            |mapped: &mut Vec<Option<Mapped>>, bare: &mut Vec<Option<OwnedFd>>, keep: &[bool]| {
                for (p, keep) in keep.iter().enumerate() {
                    if !keep {
                        if let Some(m) = mapped[p].take() {
                            bare[p] = Some(m.region.into_fd());
                        }
                    }
                }
            };
        unmap(&mut s.outboxes, &mut unmapped.outboxes, &keep_out);
        unmap(&mut s.inboxes, &mut unmapped.inboxes, &keep_in);
        Ok(())
    }

    fn sender(&self, me: PartyId) -> Result<Box<dyn Sender>, TransportError> {
        self.mapped(me)?;
        Ok(Box::new(RingSender::new(self.shared.clone(), me)))
    }

    fn receiver(&self, me: PartyId) -> Result<Box<dyn Receiver>, TransportError> {
        self.mapped(me)?;
        Ok(Box::new(RingReceiver::new(self.shared.clone(), me)))
    }
}

#[cfg(test)]
mod tests;
