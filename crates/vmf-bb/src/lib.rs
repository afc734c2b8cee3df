//! Building blocks (layer 1 of vmfabric): a shared [`segment::Segment`] mapped from a file or device and
//! addressed only by bounds-checked offsets, the SPSC [`ring`] that carries messages through it, and the
//! [`copier`] that shares large copies with a helper thread.
//!
//! # Examples
//! ```
//! use vmf_bb::ring::{Ring, RING_CTL_SIZE};
//! let mut mem = vec![0u64; (RING_CTL_SIZE + 4096) / 8];
//! let base = mem.as_mut_ptr() as *mut u8;
//! // SAFETY: `mem` outlives both ends and is 8-byte aligned, zeroed and large enough.
//! let (mut tx, mut rx) = unsafe { (Ring::producer(base, 4096).unwrap(), Ring::consumer(base, 4096).unwrap()) };
//! let slot = tx.reserve(5).unwrap().unwrap();
//! unsafe { slot.write(0, b"hello") };
//! tx.commit(slot);
//! let rec = rx.peek().unwrap().unwrap();
//! assert_eq!(unsafe { rec.body() }, b"hello");
//! rx.release(rec);
//! ```
#![warn(missing_docs)]

pub mod copier;
pub mod duplex;
pub mod ring;
pub mod segment;

/// Size of the unit of cache coherence we pad to. 128 rather than 64 bytes: Intel's adjacent-line
/// prefetcher pulls lines in pairs, so two indices 64 bytes apart still false-share (as crossbeam's
/// `CachePadded` documents). Shared-memory layouts use this explicit constant instead of a crate type so the
/// layout cannot change under us with a dependency update.
pub const CACHE_PAD: usize = 128;

/// Round `x` up to a multiple of `a` (a power of two).
#[inline(always)]
pub const fn align_up(x: u64, a: u64) -> u64 {
    (x + a - 1) & !(a - 1)
}
