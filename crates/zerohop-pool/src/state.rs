//! Chain state: a key-value store in a shared memfd that every instance of the chain's
//! stateful functions maps read-write. It lives in the agent, so it outlives any instance.
//!
//! ```text
//!  0        64                    entries_off
//!  +--------+---------------------+-----------------------------------------------+
//!  | header | stripe locks, 64 B  | entries, stripe after stripe (E per stripe)   |
//!  +--------+---------------------+-----------------------------------------------+
//!
//!  entry:  seq u64 | active u32 | pad u32 | record 0 | record 1
//!  record: state u32 | key_len u32 | value_len u32 | pad u32 | key (128 B) | value
//! ```
//!
//! **Where a key lives.** FNV-1a (64 bit) of the key picks a stripe (`h % stripes`) and a
//! first entry in it (`(h / stripes) % E`); the key sits in the first entry of the stripe,
//! probing forward and wrapping, that holds it. A never-used entry ends the probe; a
//! deleted one does not (it is reused by the next insert of the stripe).
//!
//! **Writes** (insert, replace, delete, read-modify-write) hold the stripe's lock, so two
//! writes of one key never interleave: an update is atomic per key. A writer fills the
//! entry's inactive record, then publishes it by storing `active` and bumping `seq`. A
//! writer killed at any instruction therefore leaves every entry with either its old or
//! its new record published, never a mix, and nothing to free: records are part of their
//! entry.
//!
//! **The lock** is a 32-bit word holding the holder's pid (bit 31: someone waits, wake on
//! release). A waiter sleeps on it with a futex; every few milliseconds it checks whether
//! the holder still exists (`kill(pid, 0)`) and takes the lock over from a dead one. After a
//! takeover it bumps every entry's `seq` in the stripe, so a reader that was copying a
//! record when the dead writer's successor starts rewriting it notices. A lock held past
//! [`LOCK_WAIT`] (a stuck or hostile holder) fails the write with [`StateError::Busy`]
//! rather than hanging the request.
//!
//! **Reads** take no lock: read `seq`, `active`, the record, then `seq` again; a changed
//! `seq` means a writer published meanwhile, and the read is retried (after 64 tries under
//! the lock). A read sees a whole published value, never a torn one.
//!
//! Every process that maps the store may write anything into it, so whatever is read back
//! is checked: lengths beyond their field are treated as a record that does not match, and
//! a lock word naming a live process that never lets go ends in `Busy`, not a hang. A
//! hostile writer can corrupt values, never another process's memory.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::region::Region;
use crate::{sys, PoolError};

/// Longest key, in bytes.
pub const KEY_MAX: usize = 128;
/// Largest value the store can be configured for (1 MiB).
pub const VALUE_MAX: u32 = 1 << 20;
/// Most entries a store can be configured for.
pub const ENTRIES_MAX: u32 = 1 << 20;
/// Entries per stripe (fewer when the store is smaller).
pub const STRIPE_ENTRIES: u32 = 256;
/// How long a write waits for its stripe's lock before it fails with [`StateError::Busy`].
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

const MAGIC: u64 = u64::from_le_bytes(*b"ZHSTATE1");
const VERSION: u32 = 1;
const HEADER: usize = 64;
const ENTRY_HEAD: usize = 16;
const RECORD_HEAD: usize = 16;
/// Record states.
const EMPTY: u32 = 0;
const USED: u32 = 1;
const DELETED: u32 = 2;
/// Lock word bit: a waiter sleeps on the futex.
const WAITERS: u32 = 1 << 31;
/// Lock-free read attempts of one entry before reading it under the lock.
const READ_TRIES: u32 = 64;

/// How big a store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateConfig {
    /// Keys it can hold at most (rounded up to whole stripes).
    pub entries: u32,
    /// Largest value, in bytes.
    pub value_size: u32,
}

/// Why a state operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The key is empty or longer than [`KEY_MAX`].
    #[error("state key of {len} bytes; keys are 1 to {KEY_MAX} bytes")]
    BadKey {
        /// Its length.
        len: usize,
    },
    /// The value is longer than the store's `value_size`.
    #[error("state value of {len} bytes exceeds the store's value_size of {max} bytes")]
    ValueTooLarge {
        /// Its length.
        len: usize,
        /// The store's limit.
        max: usize,
    },
    /// No room for a new key.
    #[error(
        "the state store is full: no free entry for this key among the {stripe} of its stripe \
         ({used} of {capacity} entries in use); delete keys or raise state.entries"
    )]
    Full {
        /// Entries of the key's stripe.
        stripe: u32,
        /// Entries in use in the whole store (at the time of the error).
        used: usize,
        /// Entries of the store.
        capacity: usize,
    },
    /// The stripe's lock was held by a live process for longer than [`LOCK_WAIT`].
    #[error(
        "the state store is busy: process {holder} held the key's lock for over {LOCK_WAIT:?}"
    )]
    Busy {
        /// Pid the lock word names.
        holder: u32,
    },
}

/// Where everything sits, from the configuration alone (never from the shared header,
/// which any process with the store mapped could overwrite).
#[derive(Clone, Copy, Debug)]
struct Layout {
    stripes: u32,
    per_stripe: u32,
    value_size: usize,
    record: usize,
    entry: usize,
    entries_off: usize,
    len: usize,
}

impl Layout {
    fn new(cfg: StateConfig) -> Result<Self, PoolError> {
        if cfg.entries == 0 || cfg.entries > ENTRIES_MAX {
            return Err(PoolError::Geometry(format!(
                "state entries {} out of range 1..={ENTRIES_MAX}",
                cfg.entries
            )));
        }
        if cfg.value_size == 0 || cfg.value_size > VALUE_MAX {
            return Err(PoolError::Geometry(format!(
                "state value_size {} out of range 1..={VALUE_MAX}",
                cfg.value_size
            )));
        }
        let per_stripe = cfg.entries.min(STRIPE_ENTRIES);
        let stripes = cfg.entries.div_ceil(per_stripe);
        let value_size = cfg.value_size as usize;
        let record = (RECORD_HEAD + KEY_MAX + value_size).next_multiple_of(8);
        let entry = (ENTRY_HEAD + 2 * record).next_multiple_of(64);
        let entries_off = HEADER + stripes as usize * 64;
        let len = (entries_off + (stripes * per_stripe) as usize * entry).next_multiple_of(4096);
        Ok(Self {
            stripes,
            per_stripe,
            value_size,
            record,
            entry,
            entries_off,
            len,
        })
    }

    fn capacity(&self) -> usize {
        (self.stripes * self.per_stripe) as usize
    }
}

/// A published record, as read (lengths not yet checked).
#[derive(Clone, Copy)]
struct RecordHead {
    state: u32,
    key_len: usize,
    value_len: usize,
}

/// The chain's key-value store (see the module docs for the model).
pub struct State {
    region: Region,
    layout: Layout,
    pid: u32,
}

impl State {
    /// Creates a store for `cfg` (the agent does, once per chain).
    pub fn create(name: &str, cfg: StateConfig) -> Result<Self, PoolError> {
        let layout = Layout::new(cfg)?;
        let region = Region::create(&format!("zerohop-state:{name}"), layout.len, false)?;
        let s = Self {
            region,
            layout,
            pid: std::process::id(),
        };
        // SAFETY: the header is the first 64 bytes of a fresh, zeroed, writable mapping that
        // no other process has yet.
        unsafe {
            let b = s.region.base();
            b.cast::<u64>().write(MAGIC);
            b.add(8).cast::<u32>().write(VERSION);
            b.add(12).cast::<u32>().write(cfg.entries);
            b.add(16).cast::<u32>().write(cfg.value_size);
        }
        Ok(s)
    }

    /// Maps a store received as a descriptor; `cfg` must be what it was created with (the
    /// plan says). The descriptor must be writable.
    pub fn attach(fd: OwnedFd, cfg: StateConfig) -> Result<Self, PoolError> {
        let layout = Layout::new(cfg)?;
        let region = Region::attach(fd)?;
        if !region.writable() {
            return Err(PoolError::Geometry(
                "the state store was handed over read-only".into(),
            ));
        }
        if region.len() < layout.len {
            return Err(PoolError::Geometry(format!(
                "state store of {} bytes, its configuration needs {}",
                region.len(),
                layout.len
            )));
        }
        // SAFETY: the region is at least a page long; the magic is read once.
        let magic = unsafe { region.base().cast::<u64>().read_volatile() };
        if magic != MAGIC {
            return Err(PoolError::BadMagic);
        }
        Ok(Self {
            region,
            layout,
            pid: std::process::id(),
        })
    }

    /// The memfd, to hand to instances.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }

    /// Keys the store can hold.
    pub fn capacity(&self) -> usize {
        self.layout.capacity()
    }

    /// Largest value, in bytes.
    pub fn value_size(&self) -> usize {
        self.layout.value_size
    }

    /// The value of `key`, copied out.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        check_key(key)?;
        let (stripe, first) = self.home(key);
        for k in 0..self.layout.per_stripe {
            let e = self.entry_index(stripe, (first + k) % self.layout.per_stripe);
            match self.read_entry(stripe, e, key)? {
                Probe::End => return Ok(None),
                Probe::Found(v) => return Ok(Some(v)),
                Probe::Other => {}
            }
        }
        Ok(None)
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        if value.len() > self.layout.value_size {
            return Err(StateError::ValueTooLarge {
                len: value.len(),
                max: self.layout.value_size,
            });
        }
        self.update(key, |_| Some(value.to_vec())).map(drop)
    }

    /// Removes `key`; whether it was there.
    pub fn delete(&self, key: &[u8]) -> Result<bool, StateError> {
        let mut had = false;
        self.update(key, |old| {
            had = old.is_some();
            None
        })?;
        Ok(had)
    }

    /// Atomically replaces the value of `key` with `f(old)` (`None`: absent / delete) and
    /// returns the new value. No other write of the key runs between reading `old` and
    /// writing the result; `f` runs under the key's stripe lock, so keep it short. If `f`'s
    /// value is too large, nothing is written.
    pub fn update<F>(&self, key: &[u8], f: F) -> Result<Option<Vec<u8>>, StateError>
    where
        F: FnOnce(Option<&[u8]>) -> Option<Vec<u8>>,
    {
        check_key(key)?;
        let (stripe, first) = self.home(key);
        let _lock = self.lock(stripe)?;
        let mut found = None;
        let mut free = None;
        for k in 0..self.layout.per_stripe {
            let e = self.entry_index(stripe, (first + k) % self.layout.per_stripe);
            let a = self.active(e);
            let head = self.record_head(e, a);
            match head.state {
                EMPTY => {
                    free.get_or_insert(e);
                    break;
                }
                DELETED => {
                    free.get_or_insert(e);
                }
                USED if self.key_is(e, a, head, key) => {
                    found = Some(e);
                    break;
                }
                _ => {}
            }
        }
        let old = found.map(|e| {
            let a = self.active(e);
            let head = self.record_head(e, a);
            self.copy_value(e, a, head.value_len.min(self.layout.value_size))
        });
        let new = f(old.as_deref());
        if let Some(v) = &new {
            if v.len() > self.layout.value_size {
                return Err(StateError::ValueTooLarge {
                    len: v.len(),
                    max: self.layout.value_size,
                });
            }
        }
        match (found, &new) {
            (Some(e), Some(v)) => self.publish(e, USED, key, v),
            (Some(e), None) => self.publish(e, DELETED, &[], &[]),
            (None, Some(v)) => match free {
                Some(e) => self.publish(e, USED, key, v),
                None => {
                    return Err(StateError::Full {
                        stripe: self.layout.per_stripe,
                        used: self.len(),
                        capacity: self.capacity(),
                    })
                }
            },
            (None, None) => {}
        }
        Ok(new)
    }

    /// Keys in the store now (a scan; concurrent writes may or may not be counted).
    pub fn len(&self) -> usize {
        (0..self.capacity())
            .filter(|&e| self.record_head(e, self.active(e)).state == USED)
            .count()
    }

    /// The pids named by the stripes' lock words now (0: free); for diagnostics and tests.
    pub fn lock_holders(&self) -> Vec<u32> {
        (0..self.layout.stripes)
            // Relaxed: a snapshot for diagnostics, ordering nothing.
            .map(|s| self.lock_word(s).load(Ordering::Relaxed) & !WAITERS)
            .collect()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stripe of `key` and the first entry to probe in it.
    fn home(&self, key: &[u8]) -> (u32, u32) {
        let h = fnv1a(key);
        let stripes = u64::from(self.layout.stripes);
        (
            (h % stripes) as u32,
            ((h / stripes) % u64::from(self.layout.per_stripe)) as u32,
        )
    }

    fn entry_index(&self, stripe: u32, k: u32) -> usize {
        (stripe * self.layout.per_stripe + k) as usize
    }

    fn entry_ptr(&self, e: usize) -> *mut u8 {
        debug_assert!(e < self.capacity());
        // SAFETY: e < capacity, so the entry lies within the mapping (Layout::len).
        unsafe {
            self.region
                .base()
                .add(self.layout.entries_off + e * self.layout.entry)
        }
    }

    fn seq(&self, e: usize) -> &AtomicU64 {
        // SAFETY: the entry starts 64-byte aligned inside the mapping; its first 8 bytes are
        // only ever accessed atomically, by every process.
        unsafe { &*self.entry_ptr(e).cast::<AtomicU64>() }
    }

    fn active_word(&self, e: usize) -> &AtomicU32 {
        // SAFETY: bytes 8..12 of the entry, 4-aligned, only accessed atomically.
        unsafe { &*self.entry_ptr(e).add(8).cast::<AtomicU32>() }
    }

    /// Which record of entry `e` is published (0 or 1, whatever the word holds).
    fn active(&self, e: usize) -> usize {
        // SYNC POINT: Acquire pairs with the Release store of `active` in `publish`: the
        // record it names is whole (its head and bytes were written before that store).
        (self.active_word(e).load(Ordering::Acquire) & 1) as usize
    }

    fn record_ptr(&self, e: usize, r: usize) -> *mut u8 {
        // SAFETY: r is 0 or 1; both records lie within the entry.
        unsafe { self.entry_ptr(e).add(ENTRY_HEAD + r * self.layout.record) }
    }

    fn record_word(&self, e: usize, r: usize, field: usize) -> &AtomicU32 {
        // SAFETY: fields 0..3 of the record head, 4-aligned; the head is only accessed
        // atomically.
        unsafe { &*self.record_ptr(e, r).add(4 * field).cast::<AtomicU32>() }
    }

    /// Relaxed loads: the record was made visible by the Acquire of `active` (readers) or
    /// of the stripe lock (writers); `seq` tells a reader whether it changed meanwhile.
    fn record_head(&self, e: usize, r: usize) -> RecordHead {
        RecordHead {
            state: self.record_word(e, r, 0).load(Ordering::Relaxed),
            key_len: self.record_word(e, r, 1).load(Ordering::Relaxed) as usize,
            value_len: self.record_word(e, r, 2).load(Ordering::Relaxed) as usize,
        }
    }

    /// Whether record `r` of entry `e` (whose head is `head`) holds `key`.
    fn key_is(&self, e: usize, r: usize, head: RecordHead, key: &[u8]) -> bool {
        if head.key_len != key.len() {
            return false;
        }
        let mut buf = [0u8; KEY_MAX];
        // SAFETY: key.len() <= KEY_MAX (checked by every caller), within the record's key
        // field. The bytes may change under us (another process writing); they are copied
        // as plain bytes and the caller validates the read with `seq` or holds the lock.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.record_ptr(e, r).add(RECORD_HEAD),
                buf.as_mut_ptr(),
                key.len(),
            )
        };
        &buf[..key.len()] == key
    }

    fn copy_value(&self, e: usize, r: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: len <= value_size (clamped by every caller), within the record's value
        // field; copied as plain bytes, validated as in `key_is`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.record_ptr(e, r).add(RECORD_HEAD + KEY_MAX),
                v.as_mut_ptr(),
                len,
            )
        };
        v
    }

    /// Reads entry `e` of `stripe` lock-free, looking for `key`.
    fn read_entry(&self, stripe: u32, e: usize, key: &[u8]) -> Result<Probe, StateError> {
        for _ in 0..READ_TRIES {
            // SYNC POINT: Acquire pairs with the Release `fetch_add` of `seq` in `publish` and
            // `recover`: a reader that sees a bump sees the `active` stored before it.
            let s1 = self.seq(e).load(Ordering::Acquire);
            let probe = self.probe(e, key);
            // SYNC POINT: the fence orders the record's bytes read above before the second
            // load of `seq`. A writer rewrites the record this reader may be copying only
            // after taking the stripe lock (Acquire) released (Release) after the bump that
            // retired it, so a copy that saw any rewritten byte sees that bump here.
            fence(Ordering::Acquire);
            if self.seq(e).load(Ordering::Relaxed) == s1 {
                return Ok(probe);
            }
            std::hint::spin_loop();
        }
        // Writers keep publishing (or one died mid-way): read under the lock, which also
        // takes a dead writer's lock over.
        let _lock = self.lock(stripe)?;
        Ok(self.probe(e, key))
    }

    fn probe(&self, e: usize, key: &[u8]) -> Probe {
        let a = self.active(e);
        let head = self.record_head(e, a);
        match head.state {
            EMPTY => Probe::End,
            USED if self.key_is(e, a, head, key) => {
                if head.value_len > self.layout.value_size {
                    return Probe::Other;
                }
                Probe::Found(self.copy_value(e, a, head.value_len))
            }
            _ => Probe::Other,
        }
    }

    /// Writes the inactive record of `e` and publishes it. The caller holds the stripe lock.
    fn publish(&self, e: usize, state: u32, key: &[u8], value: &[u8]) {
        debug_assert!(key.len() <= KEY_MAX && value.len() <= self.layout.value_size);
        let r = 1 - self.active(e);
        let p = self.record_ptr(e, r);
        // SAFETY: the inactive record is written only by the holder of the stripe lock (us);
        // readers look at the active one. Lengths were checked against the fields.
        unsafe {
            std::ptr::copy_nonoverlapping(key.as_ptr(), p.add(RECORD_HEAD), key.len());
            std::ptr::copy_nonoverlapping(
                value.as_ptr(),
                p.add(RECORD_HEAD + KEY_MAX),
                value.len(),
            );
        }
        self.record_word(e, r, 1)
            .store(key.len() as u32, Ordering::Relaxed);
        self.record_word(e, r, 2)
            .store(value.len() as u32, Ordering::Relaxed);
        self.record_word(e, r, 0).store(state, Ordering::Relaxed);
        // SYNC POINT: Release pairs with the Acquire load of `active` in `active`: the record
        // above is whole before anyone is told to read it.
        self.active_word(e).store(r as u32, Ordering::Release);
        // SYNC POINT: Release pairs with the Acquire first load of `seq` in `read_entry`
        // (and its second load, after the fence there): readers of the record just retired
        // notice that it changed hands.
        self.seq(e).fetch_add(1, Ordering::Release);
    }

    fn lock_word(&self, stripe: u32) -> &AtomicU32 {
        // SAFETY: stripe < stripes; each stripe's lock is the first word of its 64-byte line
        // after the header, inside the mapping, only accessed atomically.
        unsafe {
            &*self
                .region
                .base()
                .add(HEADER + stripe as usize * 64)
                .cast::<AtomicU32>()
        }
    }

    /// Takes `stripe`'s lock, taking it over from a holder that no longer exists.
    fn lock(&self, stripe: u32) -> Result<StripeLock<'_>, StateError> {
        let word = self.lock_word(stripe);
        let deadline = Instant::now() + LOCK_WAIT;
        let mut spins = 0u32;
        loop {
            let cur = word.load(Ordering::Relaxed);
            if cur == 0 {
                // SYNC POINT: Acquire pairs with the Release swap in `StripeLock::drop`: the
                // previous holder's records, `active` and `seq` are all seen.
                if word
                    .compare_exchange(0, self.pid, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(StripeLock { word });
                }
                continue;
            }
            if spins < 100 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let holder = cur & !WAITERS;
            if holder != self.pid && !sys::pid_alive(holder) {
                // SYNC POINT: Acquire as above; a dead holder released nothing, which
                // `recover` makes up for.
                if word
                    .compare_exchange(cur, self.pid, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    self.recover(stripe);
                    return Ok(StripeLock { word });
                }
                continue;
            }
            if Instant::now() >= deadline {
                return Err(StateError::Busy { holder });
            }
            // Relaxed: only asks the holder to wake us; the lock is taken by the CASes above.
            if cur & WAITERS == 0
                && word
                    .compare_exchange(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            // Sleep until released, or re-check the holder's life in a while.
            sys::futex_wait(word, cur | WAITERS, Duration::from_millis(5));
        }
    }

    /// After taking a dead writer's lock: make every reader of the stripe that started
    /// before re-read (the dead writer may have published without bumping `seq`, and the
    /// next writer rewrites records such a reader may still be copying).
    fn recover(&self, stripe: u32) {
        for k in 0..self.layout.per_stripe {
            // SYNC POINT: Release pairs with the loads of `seq` in `read_entry`, as the bump
            // in `publish` does.
            self.seq(self.entry_index(stripe, k))
                .fetch_add(1, Ordering::Release);
        }
    }
}

enum Probe {
    /// A never-used entry: the key is not in the store.
    End,
    Found(Vec<u8>),
    /// Another key, a deleted entry, or something unreadable: go on probing.
    Other,
}

/// A held stripe lock; released on drop (also when the closure of an update panics).
struct StripeLock<'a> {
    word: &'a AtomicU32,
}

impl Drop for StripeLock<'_> {
    fn drop(&mut self) {
        // SYNC POINT: Release pairs with the Acquire CASes in `State::lock`: the next holder
        // sees every record this one published.
        if self.word.swap(0, Ordering::Release) & WAITERS != 0 {
            sys::futex_wake_all(self.word);
        }
    }
}

fn check_key(key: &[u8]) -> Result<(), StateError> {
    if key.is_empty() || key.len() > KEY_MAX {
        return Err(StateError::BadKey { len: key.len() });
    }
    Ok(())
}

/// FNV-1a, 64 bit: where a key lives. Every SDK computes the same.
pub fn fnv1a(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(entries: u32, value_size: u32) -> State {
        State::create(
            "test",
            StateConfig {
                entries,
                value_size,
            },
        )
        .unwrap()
    }

    #[test]
    fn put_get_update_delete() {
        let s = store(64, 32);
        assert_eq!(s.get(b"a").unwrap(), None);
        s.put(b"a", b"one").unwrap();
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"one"[..]));
        let new = s
            .update(b"a", |old| {
                let mut v = old.unwrap().to_vec();
                v.extend_from_slice(b"+");
                Some(v)
            })
            .unwrap();
        assert_eq!(new.as_deref(), Some(&b"one+"[..]));
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"one+"[..]));
        assert_eq!(s.len(), 1);
        assert!(s.delete(b"a").unwrap());
        assert!(!s.delete(b"a").unwrap());
        assert_eq!(s.get(b"a").unwrap(), None);
        assert!(s.is_empty());
        // The deleted entry is reused.
        s.put(b"b", b"").unwrap();
        assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b""[..]));
    }

    #[test]
    fn limits_are_clear_errors() {
        let s = store(4, 8);
        assert_eq!(s.get(b"").unwrap_err(), StateError::BadKey { len: 0 });
        assert_eq!(
            s.put(&[b'k'; KEY_MAX + 1], b"v").unwrap_err(),
            StateError::BadKey { len: KEY_MAX + 1 }
        );
        s.put(&[b'k'; KEY_MAX], b"v").unwrap();
        assert_eq!(
            s.put(b"x", b"123456789").unwrap_err(),
            StateError::ValueTooLarge { len: 9, max: 8 }
        );
        // A too-large update writes nothing.
        s.put(b"x", b"1").unwrap();
        assert!(s.update(b"x", |_| Some(vec![0; 9])).is_err());
        assert_eq!(s.get(b"x").unwrap().as_deref(), Some(&b"1"[..]));
        s.put(b"y", b"2").unwrap();
        s.put(b"z", b"3").unwrap();
        let full = s.put(b"w", b"4").unwrap_err();
        assert_eq!(
            full,
            StateError::Full {
                stripe: 4,
                used: 4,
                capacity: 4
            }
        );
        assert!(full.to_string().contains("raise state.entries"), "{full}");
        // Replacing an existing key still works when full; freeing one makes room.
        s.put(b"z", b"33").unwrap();
        assert!(s.delete(b"y").unwrap());
        s.put(b"w", b"4").unwrap();
        for (k, v) in [(&b"x"[..], &b"1"[..]), (b"z", b"33"), (b"w", b"4")] {
            assert_eq!(s.get(k).unwrap().as_deref(), Some(v));
        }
    }

    #[test]
    fn many_keys_across_stripes() {
        let s = store(2048, 16);
        assert_eq!(s.capacity(), 2048);
        for i in 0..1500u32 {
            s.put(format!("key-{i}").as_bytes(), &i.to_le_bytes())
                .unwrap();
        }
        for i in 0..1500u32 {
            assert_eq!(
                s.get(format!("key-{i}").as_bytes()).unwrap(),
                Some(i.to_le_bytes().to_vec())
            );
        }
        for i in (0..1500u32).step_by(2) {
            assert!(s.delete(format!("key-{i}").as_bytes()).unwrap());
        }
        assert_eq!(s.len(), 750);
        assert_eq!(s.get(b"key-1").unwrap(), Some(1u32.to_le_bytes().to_vec()));
        assert_eq!(s.get(b"key-0").unwrap(), None);
    }

    #[test]
    fn threads_lose_no_increment() {
        let s = std::sync::Arc::new(store(16, 8));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        s.update(b"n", |old| {
                            let n = old.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()));
                            Some((n + 1).to_le_bytes().to_vec())
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.get(b"n").unwrap(), Some(8000u64.to_le_bytes().to_vec()));
    }

    #[test]
    fn a_dead_holders_lock_is_taken_over_and_a_live_ones_ends_in_busy() {
        let s = store(16, 8);
        s.put(b"k", b"v").unwrap();
        let (stripe, _) = s.home(b"k");
        // A pid that exists no more: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        s.lock_word(stripe).store(dead, Ordering::Relaxed);
        s.put(b"k", b"w").unwrap();
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"w"[..]));
        assert_eq!(s.lock_word(stripe).load(Ordering::Relaxed), 0);
        // A live holder that never lets go (pid 1 is always there).
        s.lock_word(stripe).store(1, Ordering::Relaxed);
        assert_eq!(
            s.put(b"k", b"x").unwrap_err(),
            StateError::Busy { holder: 1 }
        );
        // Reads need no lock.
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"w"[..]));
        s.lock_word(stripe).store(0, Ordering::Relaxed);
    }

    #[test]
    fn garbage_is_read_as_no_match() {
        let s = store(16, 8);
        s.put(b"k", b"v").unwrap();
        // Scribble over every record head: huge lengths, unknown states.
        for e in 0..s.capacity() {
            for r in 0..2 {
                s.record_word(e, r, 0).store(USED, Ordering::Relaxed);
                s.record_word(e, r, 1).store(1, Ordering::Relaxed);
                s.record_word(e, r, 2).store(u32::MAX, Ordering::Relaxed);
            }
        }
        assert_eq!(s.get(b"k").unwrap(), None);
        assert!(s.put(b"q", b"1").is_err(), "no free entry left");
    }

    #[test]
    fn attach_checks_the_descriptor() {
        let cfg = StateConfig {
            entries: 16,
            value_size: 8,
        };
        let s = State::create("a", cfg).unwrap();
        s.put(b"k", b"v").unwrap();
        let fd = s.fd().try_clone_to_owned().unwrap();
        let t = State::attach(fd, cfg).unwrap();
        assert_eq!(t.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        let fd = s.fd().try_clone_to_owned().unwrap();
        let bigger = StateConfig {
            entries: 4096,
            value_size: 8,
        };
        assert!(State::attach(fd, bigger).is_err());
        let ro = crate::region::reopen_readonly(s.fd()).unwrap();
        assert!(State::attach(ro, cfg).is_err());
    }
}
