//! A sealed, shared memfd mapping: the building block of the pool and of shared-memory
//! transports. Handed to other processes only as a file descriptor.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::{sys, PoolError};

/// A memfd mapped read-write and shared, sealed against shrinking and growing.
pub struct Region {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is valid process-wide until drop; users synchronise through atomics
// placed in it.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a zero-filled region of `len` bytes named `memfd:NAME`.
    pub fn create(name: &str, len: usize, hugetlb: bool) -> Result<Self, PoolError> {
        let fd = sys::memfd_create(name, hugetlb)?;
        sys::ftruncate(fd.as_fd(), len)?;
        sys::seal(fd.as_fd())?;
        // Huge pages are populated up front so a shortage fails here, not as a SIGBUS later.
        let base = sys::mmap_shared(fd.as_fd(), len, hugetlb)?;
        Ok(Self { fd, base, len })
    }

    /// Maps a region received as a file descriptor; it must be sealed against shrinking.
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
        let base = sys::mmap_shared(fd.as_fd(), len, false)?;
        Ok(Self { fd, base, len })
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Start of the mapping (page aligned).
    pub fn base(&self) -> *mut u8 {
        self.base
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

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: (base, len) is our mapping; borrowers hold the Region (or an Arc of what
        // owns it), so no reference into it outlives this.
        unsafe { sys::munmap(self.base, self.len) };
    }
}
