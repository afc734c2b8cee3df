//! The paged shared address space (004_*, §4.1.3 and §4.1.6, finished).
//!
//! Addresses are bytes of one space of `pages × page_size`; page p is kept by the page node whose
//! window covers it. A page node's window holds, per page, a page-table entry (one 64-byte line: the
//! lock word and the version word) and the page's home frame.
//!
//! **The lock word** (compare-and-swap only):
//! `writer:16 | readers:16 | next:16 | next_writes:1 | defined:1` (bits 0, 16, 32, 48, 49). A thread
//! (owner id, 16 bits, never 0) holds a page for writing (`writer` = id, no readers) or for reading
//! (`readers` counts the holders, no writer): many readers or one writer. A thread that cannot take
//! the page **reserves** it in `next` (if free); from then on only that thread may take it when it
//! becomes available, so a released page goes to the waiter and not back to the hot holder (the
//! thesis's 1500 µs: renewing holders starved the others). Holders keep a page across accesses (a
//! *lease*) and give it up at a safe point once the lease has run and someone is reserved (readers only
//! for a reserved writer); before any blocking instruction (lock, wait, barr, join, in) and when the
//! thread ends, a thread gives up everything it holds.
//!
//! **Frames.** Where the page node's memory is mapped here (co-resident nodes), the holder works on the
//! home frame in place. Elsewhere it works on a copy: fetched when the version word differs from its
//! cached copy's (the thesis's "local but not owned" state costs no transfer), written back before a
//! writer's release, which then bumps the version. A page never written reads as zeros.
//!
//! A multi-word `lod`/`str` is atomic within a page; one that spans pages takes them one at a time.
use crate::backend::{BResult, Backend};
use std::time::{Duration, Instant};

pub const PTE_BYTES: usize = 64;
const WRITER: u64 = 0xffff;
const READER_ONE: u64 = 1 << 16;
const READERS: u64 = 0xffff << 16;
const NEXT_SHIFT: u32 = 32;
const NEXT: u64 = 0xffff << NEXT_SHIFT;
const NEXT_WRITES: u64 = 1 << 48;
const DEFINED: u64 = 1 << 49;

/// What a page node keeps: pages `first..first+count`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageNode {
    pub rank: usize,
    pub first: u64,
    pub count: u64,
    /// Offset of the synchronisation table in this window (the first page node only).
    pub sync_off: Option<usize>,
    pub frames_off: usize,
    pub bytes: usize,
}

/// Where everything lives.
#[derive(Clone, Debug)]
pub struct Layout {
    pub page_size: usize,
    pub page_shift: u32,
    pub pages: u64,
    pub nodes: Vec<PageNode>,
    /// Index into `nodes` of each page.
    owner: Vec<u32>,
}

impl Layout {
    /// `ranges[i]` = (rank, first page, count) of page node i; `sync_bytes` go to the first.
    pub fn new(page_size: usize, pages: u64, ranges: &[(usize, u64, u64)], sync_bytes: usize) -> Layout {
        assert!(page_size.is_power_of_two() && page_size >= 64);
        let mut owner = vec![u32::MAX; pages as usize];
        let nodes = ranges
            .iter()
            .enumerate()
            .map(|(i, &(rank, first, count))| {
                for p in first..first + count {
                    owner[p as usize] = i as u32;
                }
                let ptes = count as usize * PTE_BYTES;
                let sync_off = (i == 0).then_some(ptes);
                let meta = ptes + if i == 0 { sync_bytes } else { 0 };
                let frames_off = meta.div_ceil(4096) * 4096;
                PageNode {
                    rank,
                    first,
                    count,
                    sync_off,
                    frames_off,
                    bytes: frames_off + count as usize * page_size,
                }
            })
            .collect();
        Layout {
            page_size,
            page_shift: page_size.trailing_zeros(),
            pages,
            nodes,
            owner,
        }
    }

    pub fn space_bytes(&self) -> u64 {
        self.pages << self.page_shift
    }

    /// (rank, page-table-entry offset, frame offset) of page `p` (< pages).
    #[inline]
    pub fn locate(&self, p: u64) -> (usize, usize, usize) {
        let n = &self.nodes[self.owner[p as usize] as usize];
        let i = (p - n.first) as usize;
        (n.rank, i * PTE_BYTES, n.frames_off + (i << self.page_shift))
    }

    /// Window bytes of `rank` (0 if it keeps no pages).
    pub fn window_bytes(&self, rank: usize) -> usize {
        self.nodes.iter().find(|n| n.rank == rank).map_or(0, |n| n.bytes)
    }

    /// (rank, offset) of the synchronisation table.
    pub fn sync_home(&self) -> (usize, usize) {
        (self.nodes[0].rank, self.nodes[0].sync_off.unwrap_or(0))
    }
}

/// A page this thread holds.
struct Held {
    page: u64,
    frame: *mut u8,
    write: bool,
    dirty: bool,
    deadline: Instant,
}

/// The page a thread used last: its frame, and whether it is held for writing. Compiled code reads it
/// (`#[repr(C)]`: page at 0, frame at 8, write at 16).
#[repr(C)]
pub struct Tlb {
    /// u64::MAX: none.
    pub page: u64,
    pub frame: *mut u8,
    /// 1 when held for writing.
    pub write: u64,
}

/// Page-protocol counters of one thread.
#[derive(Clone, Debug, Default)]
pub struct PagerStats {
    pub acquires: u64,
    pub fetches: u64,
    pub writebacks: u64,
    pub waits: u64,
    pub releases_for_waiter: u64,
    /// Nanoseconds each acquisition that had to wait took (from the first attempt to holding the
    /// page: the cost of taking a page another thread holds), the first 100 000.
    pub take_ns: Vec<u32>,
    /// Nanoseconds each page fetch (copy mode) took, the first 100 000.
    pub fetch_ns: Vec<u32>,
}

const SAMPLES: usize = 100_000;

fn sample(v: &mut Vec<u32>, since: Instant) {
    if v.len() < SAMPLES {
        v.push(since.elapsed().as_nanos().min(u32::MAX as u128) as u32);
    }
}

impl PagerStats {
    /// Add another thread's counters.
    pub fn add(&mut self, o: &PagerStats) {
        self.acquires += o.acquires;
        self.fetches += o.fetches;
        self.writebacks += o.writebacks;
        self.waits += o.waits;
        self.releases_for_waiter += o.releases_for_waiter;
        self.take_ns.extend_from_slice(&o.take_ns);
        self.fetch_ns.extend_from_slice(&o.fetch_ns);
    }
}

/// Median of samples in microseconds (None without samples).
pub fn median_us(v: &[u32]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    Some(s[s.len() / 2] as f64 / 1000.0)
}

/// Why an access failed.
#[derive(Debug)]
pub enum Fault {
    /// The address range is outside the shared space.
    Range(u64, usize),
    /// A page node could not be reached.
    Backend(String),
    /// The node is stopping (its first thread halted, or another node trapped).
    Stopped,
}

impl From<String> for Fault {
    fn from(s: String) -> Fault {
        Fault::Backend(s)
    }
}

/// One thread's view of the shared space.
pub struct Pager<'a> {
    b: &'a dyn Backend,
    l: &'a Layout,
    me: u64,
    lease: Duration,
    inplace: bool,
    held: Vec<Held>,
    /// Cached copies (copy mode): page -> (version, bytes).
    copies: std::collections::HashMap<u64, (u64, Box<[u8]>)>,
    /// One-entry translation cache (boxed: compiled code reads it through a stable pointer).
    tlb: Box<Tlb>,
    pub stats: PagerStats,
    /// Set when the thread must stop waiting (the node stops).
    stop: &'a std::sync::atomic::AtomicBool,
    /// The application's poll word: changed while waiting, so a holder running compiled code reaches
    /// a safe point.
    poke: Option<&'a std::sync::atomic::AtomicU64>,
}

// SAFETY: the frames are owned by the protocol, not by the thread.
unsafe impl Send for Pager<'_> {}

impl<'a> Pager<'a> {
    /// `me`: this thread's owner id (1..=65535); `inplace`: use mapped home frames when possible.
    pub fn new(
        b: &'a dyn Backend,
        l: &'a Layout,
        me: u64,
        lease: Duration,
        inplace: bool,
        stop: &'a std::sync::atomic::AtomicBool,
    ) -> Pager<'a> {
        assert!(me > 0 && me <= WRITER);
        Pager {
            b,
            l,
            me,
            lease,
            inplace,
            held: Vec::new(),
            copies: Default::default(),
            tlb: Box::new(Tlb {
                page: u64::MAX,
                frame: std::ptr::null_mut(),
                write: 0,
            }),
            stats: PagerStats::default(),
            stop,
            poke: None,
        }
    }

    /// Change `poll` while waiting for a page.
    pub fn with_poke(mut self, poll: Option<&'a std::sync::atomic::AtomicU64>) -> Pager<'a> {
        self.poke = poll;
        self
    }

    /// Pointer to `len` bytes at `addr` (which must lie in one page), held for reading or writing.
    #[inline(always)]
    pub fn at(&mut self, addr: u64, write: bool) -> Result<*mut u8, Fault> {
        let page = addr >> self.l.page_shift;
        if page == self.tlb.page && (self.tlb.write != 0 || !write) {
            let off = (addr & (self.l.page_size as u64 - 1)) as usize;
            // SAFETY: off < page size; the frame is page_size bytes.
            return Ok(unsafe { self.tlb.frame.add(off) });
        }
        self.at_slow(addr, write)
    }

    #[cold]
    fn at_slow(&mut self, addr: u64, write: bool) -> Result<*mut u8, Fault> {
        let page = addr >> self.l.page_shift;
        if page >= self.l.pages {
            return Err(Fault::Range(addr, 8));
        }
        let i = match self.held.iter().position(|h| h.page == page) {
            Some(i) if self.held[i].write || !write => i,
            Some(i) => {
                // read -> write: give the read back, take it for writing
                self.release(i)?;
                self.acquire(page, true)?
            }
            None => self.acquire(page, write)?,
        };
        let h = &mut self.held[i];
        if write {
            h.dirty = true;
        }
        *self.tlb = Tlb {
            page,
            frame: h.frame,
            write: u64::from(h.write),
        };
        let off = (addr & (self.l.page_size as u64 - 1)) as usize;
        // SAFETY: as in `at`.
        Ok(unsafe { h.frame.add(off) })
    }

    /// Read 8-byte words at `addr` into `out`.
    pub fn read_words(&mut self, addr: u64, out: &mut [i64]) -> Result<(), Fault> {
        self.check(addr, out.len())?;
        let mut done = 0;
        while done < out.len() {
            let a = addr + 8 * done as u64;
            let in_page = self.l.page_size - (a as usize & (self.l.page_size - 1));
            if in_page < 8 {
                // a word across a page boundary
                let mut w = [0u8; 8];
                for (k, byte) in w.iter_mut().enumerate() {
                    // SAFETY: `at` returned a pointer to a held byte.
                    *byte = unsafe { *self.at(a + k as u64, false)? };
                }
                out[done] = i64::from_ne_bytes(w);
                done += 1;
                continue;
            }
            let n = (in_page / 8).min(out.len() - done);
            let p = self.at(a, false)?;
            // SAFETY: n words lie inside the held page.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, out[done..].as_mut_ptr() as *mut u8, n * 8) };
            done += n;
        }
        Ok(())
    }

    /// Write the words of `data` at `addr`.
    pub fn write_words(&mut self, addr: u64, data: &[i64]) -> Result<(), Fault> {
        self.check(addr, data.len())?;
        let mut done = 0;
        while done < data.len() {
            let a = addr + 8 * done as u64;
            let in_page = self.l.page_size - (a as usize & (self.l.page_size - 1));
            if in_page < 8 {
                let w = data[done].to_ne_bytes();
                for (k, byte) in w.iter().enumerate() {
                    // SAFETY: as in read_words.
                    unsafe { *self.at(a + k as u64, true)? = *byte };
                }
                done += 1;
                continue;
            }
            let n = (in_page / 8).min(data.len() - done);
            let p = self.at(a, true)?;
            // SAFETY: as in read_words.
            unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr() as *const u8, p, n * 8) };
            done += n;
        }
        Ok(())
    }

    #[inline]
    fn check(&self, addr: u64, words: usize) -> Result<(), Fault> {
        match addr.checked_add(8 * words as u64) {
            Some(end) if end <= self.l.space_bytes() => Ok(()),
            _ => Err(Fault::Range(addr, words * 8)),
        }
    }

    fn acquire(&mut self, page: u64, write: bool) -> Result<usize, Fault> {
        let (t, pte, frame_off) = self.l.locate(page);
        let me = self.me;
        let mut spins = 0u32;
        let mut waited = false;
        let started = Instant::now();
        let w = loop {
            let w = self.b.load(t, pte)?;
            let writer = w & WRITER;
            let next = (w & NEXT) >> NEXT_SHIFT;
            let mine_or_free = next == 0 || next == me;
            let clear_next = if next == me { w & !(NEXT | NEXT_WRITES) } else { w };
            let want = if write {
                (writer == 0 && w & READERS == 0 && mine_or_free).then_some(clear_next | me | DEFINED)
            } else {
                (writer == 0 && mine_or_free && w & READERS != READERS).then(|| (clear_next + READER_ONE) | DEFINED)
            };
            if let Some(new) = want {
                if self.b.cas(t, pte, w, new)? == w {
                    break w;
                }
                continue;
            }
            if next == 0 {
                let r = (me << NEXT_SHIFT) | if write { NEXT_WRITES } else { 0 };
                let _ = self.b.cas(t, pte, w, w | r)?;
            }
            if !waited {
                waited = true;
                self.stats.waits += 1;
            }
            // Meanwhile give up what others wait for (two threads each holding what the other wants
            // would otherwise wait forever).
            self.tick_all(Instant::now(), true)?;
            if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Fault::Stopped);
            }
            if let Some(p) = self.poke {
                if spins.is_multiple_of(16) || spins > 64 {
                    p.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
            }
            backoff(&mut spins);
        };
        self.stats.acquires += 1;
        if waited {
            sample(&mut self.stats.take_ns, started);
        }
        let frame = match (self.inplace, self.b.frame(t, frame_off)) {
            (true, Some(f)) => f,
            _ => {
                let defined = w & DEFINED != 0;
                let version = if defined { self.b.load(t, pte + 8)? } else { 0 };
                let ps = self.l.page_size;
                let entry = self.copies.entry(page).or_insert_with(|| (u64::MAX, vec![0u8; ps].into_boxed_slice()));
                if entry.0 != version {
                    if defined {
                        let t0 = Instant::now();
                        self.b.read(t, frame_off, &mut entry.1)?;
                        self.stats.fetches += 1;
                        sample(&mut self.stats.fetch_ns, t0);
                    } else {
                        entry.1.fill(0);
                    }
                    entry.0 = version;
                }
                entry.1.as_mut_ptr()
            }
        };
        self.held.push(Held {
            page,
            frame,
            write,
            dirty: false,
            deadline: Instant::now() + self.lease,
        });
        Ok(self.held.len() - 1)
    }

    fn release(&mut self, i: usize) -> BResult<()> {
        let h = self.held.swap_remove(i);
        if h.page == self.tlb.page {
            self.tlb.page = u64::MAX;
        }
        let (t, pte, frame_off) = self.l.locate(h.page);
        let copied = self.copies.contains_key(&h.page) && !(self.inplace && self.b.frame(t, frame_off).is_some());
        if h.write && h.dirty && copied {
            let c = self.copies.get_mut(&h.page).expect("copy of a held page");
            self.b.write(t, frame_off, &c.1)?;
            let v = self.b.load(t, pte + 8)?.wrapping_add(1);
            self.b.store(t, pte + 8, v)?;
            c.0 = v;
            self.stats.writebacks += 1;
        }
        loop {
            let w = self.b.load(t, pte)?;
            let new = if h.write { w & !WRITER } else { w - READER_ONE };
            if self.b.cas(t, pte, w, new)? == w {
                return Ok(());
            }
        }
    }

    /// A safe point: give up held pages whose lease has run and that someone waits for.
    #[inline]
    pub fn tick(&mut self) -> BResult<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        self.tick_all(Instant::now(), false)
    }

    fn tick_all(&mut self, now: Instant, waiting: bool) -> BResult<()> {
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if now < h.deadline {
                i += 1;
                continue;
            }
            let (t, pte, _) = self.l.locate(h.page);
            let w = self.b.load(t, pte)?;
            let next = (w & NEXT) >> NEXT_SHIFT;
            let wanted = next != 0 && next != self.me && (h.write || w & NEXT_WRITES != 0);
            if wanted || waiting && next != 0 && next != self.me {
                self.stats.releases_for_waiter += 1;
                self.release(i)?;
            } else {
                self.held[i].deadline = now + self.lease;
                i += 1;
            }
        }
        Ok(())
    }

    /// Give up every held page (before blocking, at the end of the thread).
    pub fn release_all(&mut self) -> BResult<()> {
        while !self.held.is_empty() {
            self.release(self.held.len() - 1)?;
        }
        Ok(())
    }

    /// The translation cache, for compiled code (valid while this pager lives).
    pub fn tlb(&self) -> *const Tlb {
        &*self.tlb
    }

    /// Pages held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// Spin, then yield, then sleep (up to 50 µs), so waiting threads leave the CPU to the holder on an
/// oversubscribed host.
pub fn backoff(spins: &mut u32) {
    *spins += 1;
    match *spins {
        0..=64 => vmf_pal::cpu_relax(),
        65..=256 => vmf_pal::yield_now(),
        n => std::thread::sleep(Duration::from_micros(((n - 256) as u64).min(50))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Direct;
    use std::sync::atomic::AtomicBool;

    fn mem(l: &Layout) -> Vec<u64> {
        vec![0u64; l.nodes[0].bytes / 8]
    }

    #[test]
    fn layout_places_pages_on_their_nodes() {
        let l = Layout::new(4096, 8, &[(0, 0, 4), (1, 4, 4)], 100);
        assert_eq!(l.locate(0), (0, 0, 4096));
        assert_eq!(l.locate(5), (1, 64, 4096 + 4096));
        assert_eq!(l.nodes[0].sync_off, Some(256));
        assert_eq!(l.nodes[1].sync_off, None);
        assert_eq!(l.window_bytes(1), 4096 + 4 * 4096);
        assert_eq!(l.space_bytes(), 8 * 4096);
    }

    fn counters(inplace: bool, lease_us: u64) {
        // 4 threads, each with its own owner id, increment their own words on shared pages (so they
        // contend for every page: 256-byte pages, one word of each thread across a page boundary),
        // with leases and reservations: no write may be lost to a stale copy or a write-back.
        let l = Layout::new(256, 4, &[(0, 0, 4)], 0);
        let mut m = mem(&l);
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let stop = AtomicBool::new(false);
        let iters = 2000;
        // the third word crosses a page boundary (except thread 4's)
        let addrs = |id: u64| [8 * id, 256 + 8 * id, [252, 508, 764, 600][id as usize - 1]];
        std::thread::scope(|s| {
            for id in 1..=4u64 {
                let (b, l, stop) = (&b, &l, &stop);
                s.spawn(move || {
                    let mut p = Pager::new(b, l, id, Duration::from_micros(lease_us), inplace, stop);
                    for k in 0..iters {
                        for addr in addrs(id) {
                            let mut w = [0i64];
                            p.read_words(addr, &mut w).unwrap();
                            w[0] += 1;
                            p.write_words(addr, &w).unwrap();
                        }
                        if k % 7 == 0 {
                            p.tick().unwrap();
                        }
                    }
                    p.release_all().unwrap();
                });
            }
        });
        let stop = AtomicBool::new(false);
        let mut p = Pager::new(&b, &l, 9, Duration::from_micros(10), inplace, &stop);
        for id in 1..=4u64 {
            for addr in addrs(id) {
                let mut w = [0i64];
                p.read_words(addr, &mut w).unwrap();
                assert_eq!(w[0], iters, "address {addr} of thread {id} (inplace {inplace})");
            }
        }
        p.release_all().unwrap();
        // every lock word is free again
        for pg in 0..4 {
            let (_, pte, _) = l.locate(pg);
            assert_eq!(m[pte / 8] & (WRITER | READERS | NEXT), 0, "page {pg}");
        }
    }

    #[test]
    fn concurrent_writers_lose_no_update_in_place() {
        counters(true, 5);
    }

    #[test]
    fn concurrent_writers_lose_no_update_with_copies_and_write_back() {
        counters(false, 5);
    }

    #[test]
    fn concurrent_writers_lose_no_update_with_zero_lease() {
        counters(false, 0);
    }

    #[test]
    fn out_of_range_addresses_fault() {
        let l = Layout::new(256, 2, &[(0, 0, 2)], 0);
        let mut m = mem(&l);
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let stop = AtomicBool::new(false);
        let mut p = Pager::new(&b, &l, 1, Duration::from_micros(10), true, &stop);
        let mut w = [0i64; 2];
        assert!(matches!(p.read_words(504, &mut w), Err(Fault::Range(504, 16))));
        assert!(matches!(p.write_words(u64::MAX - 3, &w), Err(Fault::Range(..))));
        p.read_words(496, &mut w).unwrap();
    }

    #[test]
    fn a_waiting_reservation_gets_the_page_before_the_holder_takes_it_back() {
        let l = Layout::new(256, 1, &[(0, 0, 1)], 0);
        let mut m = mem(&l);
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let stop = AtomicBool::new(false);
        let mut a = Pager::new(&b, &l, 1, Duration::ZERO, true, &stop);
        a.write_words(0, &[1]).unwrap();
        // thread 2 reserves the page (as its waiting loop does)
        let w = m[0];
        m[0] = w | (2 << NEXT_SHIFT) | NEXT_WRITES;
        a.tick().unwrap(); // lease run out, a waiter: released
        assert_eq!(a.held(), 0);
        assert_eq!(m[0] & WRITER, 0);
        // the holder cannot take it back while 2 is reserved
        let (b2, l2) = (&b, &l);
        let stop2 = AtomicBool::new(true);
        let mut again = Pager::new(b2, l2, 1, Duration::ZERO, true, &stop2);
        assert!(matches!(again.write_words(0, &[5]), Err(Fault::Stopped)));
        let mut c = Pager::new(&b, &l, 2, Duration::ZERO, true, &stop);
        let mut r = [0i64];
        c.read_words(0, &mut r).unwrap();
        assert_eq!(r[0], 1);
        assert_eq!(m[0] & NEXT, 0, "the reservation is consumed");
    }
}
