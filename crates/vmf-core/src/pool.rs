//! This rank's partition of the region's shared pool.
//!
//! Every slot of a region owns a fixed partition of the pool (`VMF_SHM_POOL` bytes). Only its owner
//! allocates in it, so the allocator's books live in process memory and no shared lock exists: a bad
//! peer can scribble over pool bytes but never over allocator state. The pool serves `MPI_Alloc_mem`
//! (a large send from such a buffer is copied by the receiver straight out of the region, no system
//! call) and the per-communicator areas of the shared-memory collectives. Allocation is first fit over a
//! sorted free list with coalescing; it is not on any hot path.
//!
//! Blocks that other ranks still read when their owner lets go (collective areas) are freed *deferred*:
//! the block starts with a reference count in shared memory that every user decrements when done; the
//! owner returns the block to the free list once the count reaches zero (checked on each allocation).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use vmf_transport::shm::region::Region;

/// The allocator of one slot's pool partition.
pub struct Pool {
    region: Arc<Region>,
    slot: u32,
    /// Free extents (offset, bytes), sorted by offset, never adjacent.
    free: Vec<(u64, u64)>,
    /// Live blocks: address → (offset, bytes).
    live: HashMap<usize, (u64, u64)>,
    /// Blocks released by their owner but possibly still read by peers: (address, refcount offset).
    deferred: Vec<usize>,
}

const ALIGN: u64 = 128;

impl Pool {
    /// The pool of `slot` in `region`; `None` when the region has no pool.
    pub fn new(region: Arc<Region>, slot: u32) -> Option<Pool> {
        let (off, len) = region.pool_of(slot)?;
        Some(Pool {
            region,
            slot,
            free: vec![(off, len)],
            live: HashMap::new(),
            deferred: Vec::new(),
        })
    }

    /// The region the pool lives in.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The slot that owns this partition.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Allocate `len` bytes aligned to `align` (a power of two, at most 4096). Returns the address and
    /// its offset in the region, or `None` when the partition has no room.
    pub fn alloc(&mut self, len: usize, align: usize) -> Option<(*mut u8, u64)> {
        self.sweep();
        let align = (align.max(ALIGN as usize).next_power_of_two() as u64).min(4096);
        let len = (len.max(1) as u64).div_ceil(ALIGN) * ALIGN;
        for i in 0..self.free.len() {
            let (off, bytes) = self.free[i];
            let start = off.div_ceil(align) * align;
            let end = start.checked_add(len)?;
            if end > off + bytes {
                continue;
            }
            // Split: [off, start) stays free, [start, end) is used, [end, off+bytes) stays free.
            let mut repl = Vec::with_capacity(2);
            if start > off {
                repl.push((off, start - off));
            }
            if end < off + bytes {
                repl.push((end, off + bytes - end));
            }
            self.free.splice(i..=i, repl);
            let p = self.region.pool_ptr(self.slot, start, len).ok()?;
            self.live.insert(p as usize, (start, len));
            return Some((p, start));
        }
        None
    }

    /// Return a block from [`Pool::alloc`]. False if `p` is not a live block of this pool.
    pub fn free(&mut self, p: *mut u8) -> bool {
        let Some((off, len)) = self.live.remove(&(p as usize)) else {
            return false;
        };
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Coalesce with the next, then the previous extent.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        true
    }

    /// True if `p..p+len` lies in a live block of this pool.
    pub fn owns(&self, p: *const u8) -> bool {
        self.live.contains_key(&(p as usize))
    }

    /// Release a block whose first 4 bytes are an [`AtomicU32`] reference count held by its readers:
    /// drop this owner's reference, and free the block once no reader is left (now or on a later
    /// allocation).
    ///
    /// # Safety
    /// `p` must be a live block of this pool whose first word is the reference count.
    pub unsafe fn release_shared(&mut self, p: *mut u8) {
        if !self.live.contains_key(&(p as usize)) {
            return;
        }
        // SAFETY: a live, 128-aligned block of at least 128 bytes (caller's contract).
        let refs = unsafe { &*(p as *const AtomicU32) };
        refs.fetch_sub(1, Ordering::AcqRel);
        self.deferred.push(p as usize);
        self.sweep();
    }

    fn sweep(&mut self) {
        let mut i = 0;
        while i < self.deferred.len() {
            let p = self.deferred[i] as *mut u8;
            // SAFETY: deferred blocks stay allocated until freed here.
            let refs = unsafe { &*(p as *const AtomicU32) }.load(Ordering::Acquire);
            // A corrupt count (a peer scribbled) would keep the block forever: that only leaks pool space.
            if refs == 0 {
                self.deferred.swap_remove(i);
                self.free(p);
            } else {
                i += 1;
            }
        }
    }

    /// Blocks still live or still possibly read by peers.
    pub fn in_use(&self) -> usize {
        self.live.len() + self.deferred.len()
    }

    /// Bytes still free (for tests and `vmfabric info`).
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|e| e.1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmf_transport::shm::region::{RegionSizing, RegionSource};

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tempdir(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("vmf-pool-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn region(dir: &std::path::Path) -> Arc<Region> {
        let sz = RegionSizing {
            max_local: 2,
            heap: 1 << 16,
            pool_per_slot: 64 << 10,
        };
        Arc::new(
            Region::open(
                &RegionSource::Dir(dir.into()),
                "pooltest",
                sz,
                None,
                std::time::Duration::from_secs(5),
            )
            .unwrap(),
        )
    }

    #[test]
    fn alloc_free_coalesce_and_bounds() {
        let d = tempdir("a");
        let r = region(&d.0);
        let mut p = Pool::new(r.clone(), 1).unwrap();
        let total = p.free_bytes();
        assert_eq!(total, 64 << 10);
        let (a, ao) = p.alloc(1000, 64).unwrap();
        let (b, bo) = p.alloc(5000, 4096).unwrap();
        assert_eq!(bo % 4096, 0);
        assert!(bo >= ao + 1024);
        assert_eq!(r.pool_offset(b, 5000), Some((1, bo)));
        assert_eq!(r.pool_offset(a, 1000), Some((1, ao)));
        // Too large: None, never a block past the partition.
        assert!(p.alloc(64 << 10, 128).is_none());
        assert!(p.free(a));
        assert!(!p.free(a), "double free refused");
        assert!(p.free(b));
        assert_eq!(p.free_bytes(), total, "everything coalesced back");
        let (c, _) = p.alloc(64 << 10, 128).unwrap();
        assert!(p.free(c));
        // Slot 0's partition is separate.
        let mut q = Pool::new(r.clone(), 0).unwrap();
        let (x, xo) = q.alloc(128, 128).unwrap();
        assert_eq!(r.pool_offset(x, 128), Some((0, xo)));
        assert!(
            r.pool_ptr(1, xo, 128).is_err(),
            "offset of slot 0 is not valid in slot 1"
        );
    }

    #[test]
    fn shared_release_waits_for_readers() {
        let d = tempdir("b");
        let r = region(&d.0);
        let mut p = Pool::new(r, 0).unwrap();
        let total = p.free_bytes();
        let (a, _) = p.alloc(256, 128).unwrap();
        // SAFETY: a fresh 256-byte block.
        let refs = unsafe { &*(a as *const AtomicU32) };
        refs.store(2, Ordering::Release);
        unsafe { p.release_shared(a) };
        assert!(p.free_bytes() < total, "a reader still holds it");
        refs.fetch_sub(1, Ordering::AcqRel);
        let _ = p.alloc(128, 128).map(|(b, _)| p.free(b));
        assert_eq!(p.free_bytes(), total);
    }
}
