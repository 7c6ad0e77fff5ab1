//! A sealed, shared memfd mapping: the building block of the pool and of shared-memory
//! transports. Handed to other processes only as a file descriptor.
//!
//! A region is created read-write by the agent and handed to each party either read-write
//! (the parties that must write it) or read-only ([`Region::readonly_fd`]: a separate
//! read-only open file description, which cannot be mapped writable). The memfd's mode is
//! set to 0400 at creation, so a party holding only the read-only descriptor cannot reopen
//! it for writing through `/proc/self/fd` either (the agent's uid owns it; a party under
//! another uid gets `EACCES`, and one under the same uid, inside a user namespace, is
//! refused by the owner bits as long as it cannot `chmod`, which the seccomp filter forbids).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::{sys, PoolError};

/// A memfd mapped shared (read-write or read-only), sealed against shrinking and growing.
pub struct Region {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is valid process-wide until drop; users synchronise through atomics
// placed in it.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a zero-filled region of `len` bytes named `memfd:NAME`, mapped read-write.
    pub fn create(name: &str, len: usize, hugetlb: bool) -> Result<Self, PoolError> {
        let fd = sys::memfd_create(name, hugetlb)?;
        sys::ftruncate(fd.as_fd(), len)?;
        sys::seal(fd.as_fd())?;
        sys::fchmod(fd.as_fd(), 0o400)?;
        // Huge pages are populated up front so a shortage fails here, not as a SIGBUS later.
        let base = sys::mmap_shared(fd.as_fd(), len, hugetlb, true)?;
        Ok(Self {
            fd,
            base,
            len,
            writable: true,
        })
    }

    /// Maps a region received as a file descriptor; it must be sealed against shrinking.
    /// Mapped read-write if the descriptor was opened for writing, read-only otherwise.
    pub fn attach(fd: OwnedFd) -> Result<Self, PoolError> {
        let len = sys::file_len(fd.as_fd())?;
        let want = libc::F_SEAL_SHRINK;
        if sys::seals(fd.as_fd())? & want != want {
            return Err(PoolError::Geometry(
                "shared memfd is not sealed against shrinking".into(),
            ));
        }
        if len == 0 {
            return Err(PoolError::Geometry("shared memfd is empty".into()));
        }
        let writable = sys::writable(fd.as_fd())?;
        let base = sys::mmap_shared(fd.as_fd(), len, false, writable)?;
        Ok(Self {
            fd,
            base,
            len,
            writable,
        })
    }

    /// A read-only descriptor of this region, for a party that may only read it.
    pub fn readonly_fd(&self) -> Result<OwnedFd, PoolError> {
        reopen_readonly(self.fd.as_fd())
    }

    /// Unmaps the region and returns its memfd (to hand on without mapping it here).
    pub fn into_fd(self) -> OwnedFd {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: (base, len) is our mapping and `self` is consumed, so no borrow of it is
        // left; `me` is never dropped, so this is the only unmap.
        unsafe { sys::munmap(me.base, me.len) };
        // SAFETY: the descriptor is moved out of a value that is never dropped or used
        // again, so it has exactly one owner.
        unsafe { std::ptr::read(&me.fd) }
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Start of the mapping (page aligned). Writing through it is allowed only if
    /// [`Region::writable`].
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Whether this process mapped the region writable.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Mapped bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A read-only descriptor (a new open file description) of the region whose memfd is `fd`,
/// mapped here or not.
pub fn reopen_readonly(fd: BorrowedFd<'_>) -> Result<OwnedFd, PoolError> {
    sys::reopen_readonly(fd)
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: (base, len) is our mapping; borrowers hold the Region (or an Arc of what
        // owns it), so no reference into it outlives this.
        unsafe { sys::munmap(self.base, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readonly_descriptor_maps_read_only() {
        let r = Region::create("ro-test", 4096, false).unwrap();
        // SAFETY: fresh writable mapping of 4096 bytes.
        unsafe { r.base().write(7) };
        let ro = Region::attach(r.readonly_fd().unwrap()).unwrap();
        assert!(!ro.writable());
        // SAFETY: in bounds; reading a byte of a shared mapping.
        assert_eq!(unsafe { ro.base().read_volatile() }, 7);
        // The read-only description cannot be mapped writable.
        let fd = r.readonly_fd().unwrap();
        assert!(sys::mmap_shared(fd.as_fd(), 4096, false, true).is_err());
        assert!(Region::attach(r.fd().try_clone_to_owned().unwrap())
            .unwrap()
            .writable());
    }

    #[test]
    fn into_fd_unmaps_and_keeps_the_memory() {
        let r = Region::create("into-fd-test", 4096, false).unwrap();
        // SAFETY: fresh writable mapping of 4096 bytes.
        unsafe { r.base().add(100).write(42) };
        let base = r.base() as usize;
        let fd = r.into_fd();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            !maps.lines().any(|l| l.starts_with(&format!("{base:x}-"))),
            "still mapped"
        );
        let again = Region::attach(fd).unwrap();
        // SAFETY: in bounds of the new 4096-byte mapping.
        assert_eq!(unsafe { again.base().add(100).read_volatile() }, 42);
    }
}
