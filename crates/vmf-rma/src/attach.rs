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

/// One published range: where it is, and where its pages are shared in place (when they are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Start address of the attached range.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Nonzero when (part of) the range is shared in place: an id unique in the owner's process.
    pub id: u64,
    /// The memfd holding the shared pages (a descriptor of the owner's).
    pub fd: u64,
    /// Where the shared pages start, relative to `addr` (negative when they start before it).
    pub rel: i64,
    /// Bytes shared.
    pub map_len: u64,
    /// The memfd's inode (a peer checks the descriptor it took is that file).
    pub ino: u64,
}

/// Words per published entry.
const ENTRY_WORDS: usize = 8;

/// Bytes of a published table.
pub const TABLE_BYTES: usize = 16 + ATTACH_MAX * ENTRY_WORDS * 8;

/// A published attach table at `p` ([`TABLE_BYTES`] bytes of shared memory): `seq`, `n`, then `n`
/// [`Entry`]s sorted by address.
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
        // SAFETY: i < 2 + ENTRY_WORDS * ATTACH_MAX words inside the table (callers index within it).
        unsafe { &*(self.p.add(8 * i) as *const AtomicU64) }
    }

    fn field(&self, k: usize, f: usize) -> u64 {
        self.word(2 + ENTRY_WORDS * k + f).load(Ordering::Relaxed)
    }

    fn entry(&self, k: usize) -> Entry {
        Entry {
            addr: self.field(k, 0),
            len: self.field(k, 1),
            id: self.field(k, 2),
            fd: self.field(k, 3),
            rel: self.field(k, 4) as i64,
            map_len: self.field(k, 5),
            ino: self.field(k, 6),
        }
    }

    /// Publish `entries` (owner only; sorted, at most ATTACH_MAX).
    pub fn publish(&self, entries: &[Entry]) {
        let seq = self.word(0);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let n = entries.len().min(ATTACH_MAX);
        for (k, e) in entries[..n].iter().enumerate() {
            let w = [e.addr, e.len, e.id, e.fd, e.rel as u64, e.map_len, e.ino, 0];
            for (f, v) in w.into_iter().enumerate() {
                self.word(2 + ENTRY_WORDS * k + f).store(v, Ordering::Relaxed);
            }
        }
        self.word(1).store(n as u64, Ordering::Relaxed);
        seq.store((s | 1) + 1, Ordering::Release);
    }

    /// Run `f` on a consistent view (entry count, index of the last entry starting at or below `addr`):
    /// `None` only if the owner leaves the table half rewritten for seconds (it died while publishing).
    /// An owner preempted in the middle of a publication (ranks outnumbering cores) is waited for,
    /// yielding the CPU it may need: a reader that gave up then would report attached memory as not
    /// attached.
    fn read<T>(&self, addr: u64, f: impl Fn(usize, Option<usize>) -> T) -> Option<T> {
        let mut deadline = None;
        for i in 0u64.. {
            if i >= 10_000 {
                let now = std::time::Instant::now();
                if now >= *deadline.get_or_insert(now + std::time::Duration::from_secs(5)) {
                    return None;
                }
                std::thread::yield_now();
            }
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
                if self.field(mid, 0) <= addr {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let r = f(n, lo.checked_sub(1));
            std::sync::atomic::fence(Ordering::Acquire);
            if self.word(0).load(Ordering::Relaxed) == s {
                return Some(r);
            }
        }
        None
    }

    /// Does `[addr, addr + len)` lie inside published ranges (one, or adjacent ones)? `None` while the
    /// owner keeps rewriting the table.
    pub fn contains(&self, addr: u64, len: u64) -> Option<bool> {
        self.read(addr, |n, k| {
            k.is_some_and(|k| {
                covered(addr, len, k, n, |i| (self.field(i, 0), self.field(i, 1)))
            })
        })
    }

    /// The entry whose attached range and pages shared in place both hold `[addr, addr + len)`, if any.
    pub fn shared(&self, addr: u64, len: u64) -> Option<Entry> {
        self.read(addr, |_, k| {
            let e = self.entry(k?);
            let end = addr.checked_add(len)?;
            let ms = (e.addr as i128 + e.rel as i128).max(e.addr as i128);
            let me = (e.addr as i128 + e.rel as i128 + e.map_len as i128).min(e.addr as i128 + e.len as i128);
            (e.id != 0 && addr as i128 >= ms && end as i128 <= me).then_some(e)
        })
        .flatten()
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
        let ranges: Vec<Entry> = (0..1000).map(|k| plain(k * 100, 50)).collect();
        t.publish(&ranges);
        for k in [0u64, 1, 500, 999] {
            assert_eq!(t.contains(k * 100, 50), Some(true));
            assert_eq!(t.contains(k * 100 + 10, 41), Some(false));
            assert_eq!(t.contains(k * 100 + 60, 1), Some(false));
        }
        t.publish(&[plain(1000, 10), plain(1010, 5), plain(5000, 100)]);
        assert_eq!(t.contains(1005, 10), Some(true), "adjacent ranges cover together");
        assert_eq!(t.contains(1000, 16), Some(false));
        assert_eq!(t.contains(999, 2), Some(false));
        t.publish(&[]);
        assert_eq!(t.contains(0, 1), Some(false));
        // A range whose pages are shared in place, starting 40 bytes before it (a whole page rounded
        // out), and one shared only in its whole pages.
        let a = Entry { addr: 4136, len: 5000, id: 7, fd: 3, rel: -40, map_len: 8192, ino: 9 };
        let b = Entry { addr: 20_000, len: 10_000, id: 8, fd: 4, rel: 480, map_len: 8192, ino: 9 };
        t.publish(&[a, plain(9136, 10), b]);
        assert_eq!(t.shared(4136, 5000), Some(a));
        assert_eq!(t.shared(4136, 5001), None, "past the range (into the next one)");
        assert_eq!(t.shared(9136, 1), None, "not shared");
        assert_eq!(t.shared(20_480, 8192), Some(b));
        assert_eq!(t.shared(20_479, 2), None, "the partial page before");
        assert_eq!(t.shared(28_672, 1), None, "the partial page after");
        assert_eq!(t.contains(20_000, 10_000), Some(true));
    }

    fn plain(addr: u64, len: u64) -> Entry {
        Entry { addr, len, ..Default::default() }
    }
}
