//! The memory attached to a dynamic window (`MPI_Win_attach`): ranges of the owner's address space.
//!
//! The owner keeps the list in its heap, sorted by address ([`AttachList`]), and checks its own
//! operations and its agent's against it. For co-resident peers, which reach attached memory by single
//! copy, the owner also publishes the list in a table of its own memfd ([`AttachTable`]), read under a
//! sequence lock: a peer's operation goes ahead only if the table says the target range lies inside attached
//! memory (one range, or ranges that follow each other without a gap). The table holds addresses only the kernel dereferences (in `process_vm_readv` /
//! `writev` on the owner), and a corrupt table makes a check fail or pass wrongly, never makes a peer
//! access its own memory out of bounds.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most ranges a dynamic window member may have attached at once.
pub const ATTACH_MAX: usize = 1 << 16;

/// Bytes of a published table.
pub const TABLE_BYTES: usize = 16 + ATTACH_MAX * 16;

/// The owner's list of attached ranges (address, length), sorted by address, disjoint.
#[derive(Clone, Default, Debug)]
pub struct AttachList(Arc<Mutex<Vec<(u64, u64)>>>);

impl AttachList {
    /// An empty list.
    pub fn new() -> AttachList {
        AttachList::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add `[base, base + len)`; an error if it overlaps attached memory or the list is full.
    pub fn attach(&self, base: u64, len: u64) -> Result<Vec<(u64, u64)>, String> {
        let mut l = self.lock();
        if l.len() >= ATTACH_MAX {
            return Err(format!("at most {ATTACH_MAX} ranges may be attached at once"));
        }
        let end = base
            .checked_add(len)
            .ok_or_else(|| "the range wraps around the address space".to_string())?;
        let i = l.partition_point(|&(b, _)| b < base);
        let overlaps_prev = i > 0 && l[i - 1].0 + l[i - 1].1 > base;
        let overlaps_next = i < l.len() && l[i].0 < end;
        if overlaps_prev || overlaps_next {
            return Err("the range overlaps memory already attached".into());
        }
        l.insert(i, (base, len));
        Ok(l.clone())
    }

    /// Remove the range attached at `base`.
    pub fn detach(&self, base: u64) -> Result<Vec<(u64, u64)>, String> {
        let mut l = self.lock();
        match l.binary_search_by_key(&base, |&(b, _)| b) {
            Ok(i) => {
                l.remove(i);
                Ok(l.clone())
            }
            Err(_) => Err("no memory is attached at that address".into()),
        }
    }

    /// Does `[addr, addr + len)` lie inside attached memory (one range, or adjacent ones)?
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        inside(&self.lock(), addr, len)
    }

    /// The ranges.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.lock().clone()
    }
}

fn inside(l: &[(u64, u64)], addr: u64, len: u64) -> bool {
    let i = l.partition_point(|&(b, _)| b <= addr);
    i > 0 && covered(addr, len, i - 1, l.len(), |k| l[k])
}

/// Is `[addr, addr + len)` covered by range `first` (which starts at or below `addr`) and the ranges that
/// follow it without a gap? An operation may cross from one attached range into an adjacent one, as in
/// MPICH (two neighbouring arrays attached separately are one piece of memory to the program).
fn covered(addr: u64, len: u64, first: usize, n: usize, range: impl Fn(usize) -> (u64, u64)) -> bool {
    let Some(want) = addr.checked_add(len) else { return false };
    let (b, l) = range(first);
    if addr < b {
        return false;
    }
    let mut end = b.saturating_add(l);
    let mut k = first + 1;
    while end < want && k < n {
        let (nb, nl) = range(k);
        if nb != end {
            break;
        }
        end = nb.saturating_add(nl);
        k += 1;
    }
    want <= end
}

/// A published attach table at `p` ([`TABLE_BYTES`] bytes of shared memory): `seq`, `n`, then `n` sorted
/// (address, length) pairs.
#[derive(Clone, Copy, Debug)]
pub struct AttachTable {
    p: *mut u8,
}

// SAFETY: the table is atomics in shared memory that outlives its users (the window keeps the mapping).
unsafe impl Send for AttachTable {}
// SAFETY: as above.
unsafe impl Sync for AttachTable {}

impl AttachTable {
    /// The table at `p`.
    ///
    /// # Safety
    /// `p` must point to [`TABLE_BYTES`] bytes aligned to 8, valid while the table is used.
    pub unsafe fn at(p: *mut u8) -> AttachTable {
        AttachTable { p }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: i < 2 + 2 * ATTACH_MAX words inside the table (callers index within it).
        unsafe { &*(self.p.add(8 * i) as *const AtomicU64) }
    }

    /// Publish `ranges` (owner only; sorted, at most ATTACH_MAX).
    pub fn publish(&self, ranges: &[(u64, u64)]) {
        let seq = self.word(0);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let n = ranges.len().min(ATTACH_MAX);
        for (k, &(b, l)) in ranges[..n].iter().enumerate() {
            self.word(2 + 2 * k).store(b, Ordering::Relaxed);
            self.word(3 + 2 * k).store(l, Ordering::Relaxed);
        }
        self.word(1).store(n as u64, Ordering::Relaxed);
        seq.store((s | 1) + 1, Ordering::Release);
    }

    /// Does `[addr, addr + len)` lie inside published ranges (one, or adjacent ones)? `None` while the owner keeps
    /// rewriting the table.
    pub fn contains(&self, addr: u64, len: u64) -> Option<bool> {
        for _ in 0..10_000 {
            let s = self.word(0).load(Ordering::Acquire);
            if s & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let n = (self.word(1).load(Ordering::Relaxed) as usize).min(ATTACH_MAX);
            // Binary search for the last range starting at or below addr (a torn read only misleads the
            // search, and the sequence check below discards it).
            let (mut lo, mut hi) = (0usize, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.word(2 + 2 * mid).load(Ordering::Relaxed) <= addr {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let hit = lo > 0
                && covered(addr, len, lo - 1, n, |k| {
                    (
                        self.word(2 + 2 * k).load(Ordering::Relaxed),
                        self.word(3 + 2 * k).load(Ordering::Relaxed),
                    )
                });
            std::sync::atomic::fence(Ordering::Acquire);
            if self.word(0).load(Ordering::Relaxed) == s {
                return Some(hit);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_keeps_sorted_disjoint_ranges_works() {
        let l = AttachList::new();
        l.attach(5000, 100).unwrap();
        l.attach(1000, 10).unwrap();
        assert!(l.attach(1005, 10).is_err(), "overlap with the previous range");
        assert!(l.attach(4990, 20).is_err(), "overlap with the next range");
        l.attach(1010, 5).unwrap();
        assert_eq!(l.ranges(), vec![(1000, 10), (1010, 5), (5000, 100)]);
        assert!(l.contains(1000, 10) && l.contains(1005, 10) && l.contains(5099, 1));
        assert!(l.contains(1000, 15) && !l.contains(1000, 16), "adjacent ranges cover together");
        assert!(!l.contains(1012, 4000), "a gap ends the cover");
        assert!(!l.contains(999, 1) && !l.contains(u64::MAX, 2));
        l.detach(1010).unwrap();
        assert!(l.detach(1010).is_err());
    }

    #[test]
    fn published_table_answers_like_the_list_works() {
        let mut buf = vec![0u64; TABLE_BYTES / 8];
        // SAFETY: a buffer of TABLE_BYTES.
        let t = unsafe { AttachTable::at(buf.as_mut_ptr() as *mut u8) };
        assert_eq!(t.contains(10, 1), Some(false));
        let ranges: Vec<(u64, u64)> = (0..1000).map(|k| (k * 100, 50)).collect();
        t.publish(&ranges);
        for k in [0u64, 1, 500, 999] {
            assert_eq!(t.contains(k * 100, 50), Some(true));
            assert_eq!(t.contains(k * 100 + 10, 41), Some(false));
            assert_eq!(t.contains(k * 100 + 60, 1), Some(false));
        }
        t.publish(&[(1000, 10), (1010, 5), (5000, 100)]);
        assert_eq!(t.contains(1005, 10), Some(true), "adjacent ranges cover together");
        assert_eq!(t.contains(1000, 16), Some(false));
        assert_eq!(t.contains(999, 2), Some(false));
        t.publish(&[]);
        assert_eq!(t.contains(0, 1), Some(false));
    }
}
