//! The store (a shared file: header, lock table, participant slots, node data) and minitransactions.
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vmf_bb::segment::Segment;
use vmf_pal::process::ProcessId;

const MAGIC: u64 = u64::from_le_bytes(*b"VMFMTX01");
const VERSION: u64 = 3;
/// Bytes between lock words: each on a cache line of its own, so commits on different stripes never
/// touch one line (packed 8 to a line, two ranks committing to their own counters bounced the line of
/// their neighbouring lock words: 2 ranks, no contention, 11 M commits/s each instead of the ~40 M of one
/// alone). Version 1 packed them; version 3 added the header's multi-kernel word (leases are kept only
/// while participants of two kernels share the store).
const LOCK_STRIDE: u64 = 64;
const HDR: u64 = 4096;
// Header words (each an AtomicU64 at this byte offset).
const H_MAGIC: u64 = 0;
const H_VERSION: u64 = 8;
const H_NODES: u64 = 16;
const H_NODE_BYTES: u64 = 24;
const H_STRIPE: u64 = 32;
const H_SLOTS: u64 = 40;
const H_LEASE_MS: u64 = 48;
/// 0 while every participant that ever attached ran in one kernel; else the wall-clock time (ns) at which a
/// participant of a second kernel was first seen. Leases are renewed, and judged, only once it is set.
const H_MULTI: u64 = 56;
const H_URGENT: u64 = 64;
const H_LOCKS_OFF: u64 = 72;
const H_SLOTS_OFF: u64 = 80;
const H_DATA_OFF: u64 = 88;
const H_TOTAL: u64 = 96;

// Participant slot: words at these offsets, then the lock list, then the redo log.
const SLOT_SIZE: u64 = 64 * 1024;
const S_STATE: u64 = 0;
const S_KERNEL: u64 = 8;
const S_PID: u64 = 16;
const S_START: u64 = 24;
const S_LEASE: u64 = 32;
const S_PHASE: u64 = 40;
const S_NLOCKS: u64 = 48;
const S_LOGLEN: u64 = 56;
const S_LOCKS: u64 = 64;
/// Most stripes one commit may lock.
pub const MAX_LOCKS: usize = 1024;
const S_LOG: u64 = S_LOCKS + MAX_LOCKS as u64 * 8;
/// Bytes of redo log per slot (write records: node u32, len u32, offset u64, data padded to 8).
pub const LOG_BYTES: usize = (SLOT_SIZE - S_LOG) as usize;

// Slot states (low byte of S_STATE; a recovering slot carries its recoverer's tag above it).
const FREE: u64 = 0;
const OWNED: u64 = 1;
const RECOVERING: u64 = 2;
// Commit phases.
const IDLE: u64 = 0;
const LOCKING: u64 = 1;
const COMMITTING: u64 = 2;
/// Locked, compared and logged, waiting for the coordinator's decision (a remote memory node's part of a
/// two-phase commit). A recoverer treats it as LOCKING: the writes were not applied, none are.
const PREPARED: u64 = 3;

/// Test hook: a commit calls `_exit(9)` at this point (1: all locks taken; 2: log written and COMMITTING
/// set, no write applied; 3: the first write applied). 0: never. For crash-safety tests only.
#[doc(hidden)]
pub static CRASH_AT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

#[inline]
fn crash_point(p: u8) {
    if CRASH_AT.load(Ordering::Relaxed) == p {
        // SAFETY: ends the process at once, as kill -9 would.
        unsafe { libc::_exit(9) };
    }
}

/// A commit waiting longer than this raises the store's turnstile (see the crate documentation).
pub const STARVE_AFTER: Duration = Duration::from_millis(20);

/// Parameters of a new store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Lock granularity in bytes (a power of two, 8..=4096): items in different stripes never contend.
    pub stripe: usize,
    /// Participant slots (processes attached at once).
    pub slots: usize,
    /// Lease of a lock holder in another kernel: after this long without renewal it is presumed dead.
    pub lease: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            stripe: 64,
            slots: 64,
            lease: Duration::from_millis(2000),
        }
    }
}

/// How [`Mtx::commit`] treats a lock held by another commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Fail with [`Outcome::LockFailed`] (002_*'s minitransactions).
    Try,
    /// Wait for it (in lock order: no deadlock; the turnstile: no starvation).
    Blocking,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every compare held; the writes are applied and the reads filled.
    Committed,
    /// Compare item `i` (in the order added) did not hold; nothing was written, the reads are filled.
    CompareFailed(usize),
    /// A lock was held by another commit (only in [`Mode::Try`]); nothing was read or written.
    LockFailed,
}

/// A store attached by this process, holding one participant slot until dropped.
pub struct Store {
    seg: std::sync::Arc<Segment>,
    /// Start of the mapping (`seg` keeps it mapped) and its validated length: the hot paths address
    /// words and node bytes from here with their own bounds checks, no division.
    base: *mut u8,
    total: u64,
    node_span: u64,
    nodes: usize,
    node_bytes: u64,
    stripe_shift: u32,
    stripes: u64,
    nslots: usize,
    lease_ns: u64,
    locks_off: u64,
    slots_off: u64,
    data_off: u64,
    kernel: u64,
    me: usize,
    /// Time-stamp counter at this process's last look at the clock for its lease (x86-64), so that most
    /// commits skip the clock (a coarse clock_gettime cost ~5 ns here, 14% of a one-stripe commit).
    lease_tsc: AtomicU64,
}

// SAFETY: `base` points into the shared mapping `seg` owns; everything reached through it is shared memory
// accessed with atomics or under the store's locks, from any thread.
unsafe impl Send for Store {}
// SAFETY: as above.
unsafe impl Sync for Store {}

fn io(path: &Path, why: impl ToString) -> Error {
    Error::Io {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// Wall-clock time in ns, coarse (a few ms; a vDSO read, no system call): leases are seconds long and
/// compared across kernels, which share only the wall clock.
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Store {
    /// Create a store file of `nodes` memory nodes of `node_bytes` each at `path` (which must not exist:
    /// a store is never re-initialised under processes attached to it), and attach to it.
    pub fn create(path: &Path, nodes: usize, node_bytes: usize, opts: &StoreOptions) -> Result<Store> {
        if nodes == 0 || nodes > 1 << 20 {
            return Err(Error::InvalidArgument(format!("{nodes} memory nodes (1..=1048576)")));
        }
        if node_bytes == 0 || node_bytes as u64 > 1 << 40 {
            return Err(Error::InvalidArgument(format!("{node_bytes} bytes per node (1..=2^40)")));
        }
        if !opts.stripe.is_power_of_two() || !(8..=4096).contains(&opts.stripe) {
            return Err(Error::InvalidArgument(format!(
                "a stripe of {} bytes (a power of two, 8..=4096)",
                opts.stripe
            )));
        }
        if opts.slots == 0 || opts.slots > 4096 {
            return Err(Error::InvalidArgument(format!("{} slots (1..=4096)", opts.slots)));
        }
        let node_bytes = node_bytes as u64;
        let stripes = node_bytes.div_ceil(opts.stripe as u64);
        let locks_off = HDR;
        let slots_off = round_up(locks_off + nodes as u64 * stripes * LOCK_STRIDE, 4096);
        let data_off = round_up(slots_off + opts.slots as u64 * SLOT_SIZE, 4096);
        let node_span = round_up(node_bytes, 64);
        let total = round_up(data_off + nodes as u64 * node_span, 4096);
        // Created exclusively: an existing file is someone's store.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode_0600()
            .open(path)
            .map_err(|e| io(path, format!("cannot create it ({e})")))?;
        let (seg, _) = Segment::open_or_create(path, total).map_err(|e| io(path, e))?;
        let w = |off: u64, v: u64| seg.at::<AtomicU64>(off).unwrap().store(v, Ordering::Relaxed);
        w(H_VERSION, VERSION);
        w(H_NODES, nodes as u64);
        w(H_NODE_BYTES, node_bytes);
        w(H_STRIPE, opts.stripe as u64);
        w(H_SLOTS, opts.slots as u64);
        w(H_LEASE_MS, opts.lease.as_millis().max(1) as u64);
        w(H_LOCKS_OFF, locks_off);
        w(H_SLOTS_OFF, slots_off);
        w(H_DATA_OFF, data_off);
        w(H_TOTAL, total);
        // The magic last: a store is usable once it is there.
        seg.at::<AtomicU64>(H_MAGIC).unwrap().store(MAGIC, Ordering::Release);
        drop(seg);
        Store::open(path)
    }

    /// Attach to the store at `path` (made by [`Store::create`] or `vmfabric mtx create`).
    pub fn open(path: &Path) -> Result<Store> {
        Store::open_in(path, vmf_pal::process::kernel_id())
    }

    /// [`Store::open`] as a participant of kernel `kernel` (tests play a VM's process with it).
    #[doc(hidden)]
    pub fn open_in(path: &Path, kernel: u64) -> Result<Store> {
        let seg = Segment::open_existing(path).map_err(|e| io(path, e))?;
        if seg.len() < HDR {
            return Err(Error::Corrupt(format!("{} is {} bytes, smaller than a header", path.display(), seg.len())));
        }
        let r = |off: u64| seg.at::<AtomicU64>(off).unwrap().load(Ordering::Acquire);
        // A store being created: wait briefly for its magic.
        let t0 = Instant::now();
        while r(H_MAGIC) == 0 && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if r(H_MAGIC) != MAGIC {
            return Err(Error::Corrupt(format!("{} is not a vmfabric store (bad magic)", path.display())));
        }
        if r(H_VERSION) != VERSION {
            return Err(Error::Corrupt(format!("store version {} (this library reads {VERSION})", r(H_VERSION))));
        }
        let (nodes, node_bytes, stripe, nslots) = (r(H_NODES), r(H_NODE_BYTES), r(H_STRIPE), r(H_SLOTS));
        let (locks_off, slots_off, data_off, total) = (r(H_LOCKS_OFF), r(H_SLOTS_OFF), r(H_DATA_OFF), r(H_TOTAL));
        let ok = (1..=1 << 20).contains(&nodes)
            && (1..=1 << 40).contains(&node_bytes)
            && stripe.is_power_of_two()
            && (8..=4096).contains(&stripe)
            && (1..=4096).contains(&nslots);
        if !ok {
            return Err(Error::Corrupt("header fields out of range".into()));
        }
        let stripes = node_bytes.div_ceil(stripe);
        let want_slots = round_up(locks_off + nodes * stripes * LOCK_STRIDE, 4096);
        let want_data = round_up(slots_off + nslots * SLOT_SIZE, 4096);
        let want_total = round_up(data_off + nodes * round_up(node_bytes, 64), 4096);
        if locks_off != HDR || slots_off != want_slots || data_off != want_data || total != want_total || seg.len() < total {
            return Err(Error::Corrupt(format!(
                "layout does not add up (file {} bytes, header says {total})",
                seg.len()
            )));
        }
        let lease_ns = r(H_LEASE_MS).clamp(1, 3_600_000) * 1_000_000;
        let base = seg.ptr(0, total).map_err(|e| Error::Corrupt(e.to_string()))?;
        let mut s = Store {
            seg: std::sync::Arc::new(seg),
            base,
            total,
            node_span: round_up(node_bytes, 64),
            nodes: nodes as usize,
            node_bytes,
            stripe_shift: stripe.trailing_zeros(),
            stripes,
            nslots: nslots as usize,
            lease_ns,
            lease_tsc: AtomicU64::new(0),
            locks_off,
            slots_off,
            data_off,
            kernel,
            me: usize::MAX,
        };
        s.me = s.claim_slot()?;
        Ok(s)
    }

    /// Have participants of more than one kernel shared this store (leases in force)?
    pub fn multi_kernel(&self) -> bool {
        self.hdr(H_MULTI).load(Ordering::Acquire) != 0
    }

    /// Another attachment to the same store (same mapping) holding a participant slot of its own: a
    /// process that takes part in several commits at once (a memory node serving prepared transactions of
    /// several coordinators) uses one per commit in flight, since locks are tagged by slot.
    pub fn another(&self) -> Result<Store> {
        let mut s = Store {
            seg: self.seg.clone(),
            base: self.base,
            total: self.total,
            node_span: self.node_span,
            nodes: self.nodes,
            node_bytes: self.node_bytes,
            stripe_shift: self.stripe_shift,
            stripes: self.stripes,
            nslots: self.nslots,
            lease_ns: self.lease_ns,
            lease_tsc: AtomicU64::new(0),
            locks_off: self.locks_off,
            slots_off: self.slots_off,
            data_off: self.data_off,
            kernel: self.kernel,
            me: usize::MAX,
        };
        s.me = s.claim_slot()?;
        Ok(s)
    }

    /// Number of memory nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Bytes of each memory node.
    pub fn node_bytes(&self) -> usize {
        self.node_bytes as usize
    }

    /// Lock granularity in bytes.
    pub fn stripe(&self) -> usize {
        1 << self.stripe_shift
    }

    /// Path of the store file.
    pub fn path(&self) -> &Path {
        self.seg.path()
    }

    /// This process's participant slot.
    pub fn slot(&self) -> usize {
        self.me
    }

    /// A new, empty minitransaction on this store.
    pub fn begin(&self) -> Mtx {
        Mtx::default()
    }

    /// Copy `out.len()` bytes at (`node`, `offset`) out without any lock (a snapshot that may be torn by a
    /// concurrent commit: what a minitransaction's compare item then checks).
    pub fn peek(&self, node: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        let p = self.data(node, offset as u64, out.len() as u64)?;
        // SAFETY: in bounds (checked by `data`); other processes may write concurrently, bytes are bytes.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The 8-byte word at (`node`, `offset`) (8-aligned), for direct loads, stores and CPU atomics by
    /// co-resident processes outside minitransactions (a spin lock, a flag). Commits do not see such
    /// accesses as conflicts: use them only on words no minitransaction touches.
    pub fn word_at(&self, node: usize, offset: usize) -> Result<&AtomicU64> {
        if offset % 8 != 0 {
            return Err(Error::InvalidArgument(format!("offset {offset} is not 8-byte aligned")));
        }
        let p = self.data(node, offset as u64, 8)?;
        // SAFETY: in bounds and 8-aligned (node data starts 64-aligned); lives as long as the mapping.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }

    /// Address of `len` bytes at (`node`, `offset`), checked.
    fn data(&self, node: usize, offset: u64, len: u64) -> Result<*mut u8> {
        if node >= self.nodes {
            return Err(Error::InvalidArgument(format!("memory node {node} (the store has {})", self.nodes)));
        }
        if offset.checked_add(len).is_none_or(|e| e > self.node_bytes) {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..{} of node {node} (a node has {})",
                offset.saturating_add(len),
                self.node_bytes
            )));
        }
        let off = self.data_off + node as u64 * self.node_span + offset;
        debug_assert!(off + len <= self.total);
        // SAFETY: the node's bytes lie inside the mapping (layout validated at open).
        Ok(unsafe { self.base.add(off as usize) })
    }

    /// The word at byte `off` of the mapping; `off` is one of the layout's own (8-aligned, in bounds).
    #[inline]
    fn word(&self, off: u64) -> &AtomicU64 {
        assert!(off + 8 <= self.total && off % 8 == 0, "word offset {off} outside the store");
        // SAFETY: in bounds and aligned (asserted; the mapping is page-aligned); lives with `seg`.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }

    fn hdr(&self, f: u64) -> &AtomicU64 {
        self.word(f)
    }

    fn slot_word(&self, slot: usize, f: u64) -> &AtomicU64 {
        self.word(self.slots_off + slot as u64 * SLOT_SIZE + f)
    }

    /// Lock word of stripe `key` (`node << 32 | stripe`), or Corrupt.
    fn lock(&self, key: u64) -> Result<&AtomicU64> {
        let (node, stripe) = (key >> 32, key & 0xffff_ffff);
        if node >= self.nodes as u64 || stripe >= self.stripes {
            return Err(Error::Corrupt(format!("lock key {key:#x} names no stripe")));
        }
        Ok(self.word(self.locks_off + (node * self.stripes + stripe) * LOCK_STRIDE))
    }

    // ------------------------------------------------------------------ slots and liveness

    fn claim_slot(&self) -> Result<usize> {
        let me = ProcessId::current();
        for pass in 0..2 {
            for s in 0..self.nslots {
                let st = self.slot_word(s, S_STATE);
                if pass == 1 && st.load(Ordering::Acquire) & 0xff != FREE && !self.alive(s) {
                    let _ = self.recover(s, None);
                }
                if st.compare_exchange(FREE, OWNED, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    self.slot_word(s, S_PID).store(me.pid as u64, Ordering::Relaxed);
                    self.slot_word(s, S_START).store(me.start_time, Ordering::Relaxed);
                    self.slot_word(s, S_LEASE).store(realtime_ns(), Ordering::Relaxed);
                    self.slot_word(s, S_PHASE).store(IDLE, Ordering::Relaxed);
                    self.slot_word(s, S_NLOCKS).store(0, Ordering::Relaxed);
                    self.slot_word(s, S_LOGLEN).store(0, Ordering::Relaxed);
                    self.slot_word(s, S_KERNEL).store(self.kernel, Ordering::SeqCst);
                    self.note_kernels(s);
                    return Ok(s);
                }
            }
        }
        Err(Error::NoSlot(self.nslots))
    }

    /// After claiming slot `mine`: if a participant of another kernel holds a slot, leases matter from now
    /// on (set [`H_MULTI`]). Both of two participants of different kernels attaching at once publish their
    /// kernel before they look (sequentially consistent), so at least one sees the other.
    fn note_kernels(&self, mine: usize) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.hdr(H_MULTI).load(Ordering::Acquire) != 0 {
            return;
        }
        for s in (0..self.nslots).filter(|&s| s != mine) {
            if self.slot_word(s, S_STATE).load(Ordering::SeqCst) & 0xff == FREE {
                continue;
            }
            // A slot just claimed publishes its kernel right after: wait for it (bounded).
            let mut k = self.slot_word(s, S_KERNEL).load(Ordering::SeqCst);
            let t0 = Instant::now();
            while k == 0 && t0.elapsed() < Duration::from_millis(10) {
                std::hint::spin_loop();
                k = self.slot_word(s, S_KERNEL).load(Ordering::SeqCst);
            }
            if k != self.kernel {
                let _ = self.hdr(H_MULTI).compare_exchange(0, realtime_ns().max(1), Ordering::AcqRel, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Is slot `s` in use by a live process (its owner, or the process recovering it)?
    fn alive(&self, s: usize) -> bool {
        let st = self.slot_word(s, S_STATE).load(Ordering::Acquire);
        match st & 0xff {
            OWNED => self.owner_alive(s),
            RECOVERING => {
                let r = (st >> 8) as usize;
                r >= 1 && r <= self.nslots && r != s + 1 && self.owner_alive(r - 1)
            }
            _ => false,
        }
    }

    /// Is the process recorded in slot `s` alive? Exact in this kernel (pid and start time); in another
    /// kernel, while its lease is fresh.
    fn owner_alive(&self, s: usize) -> bool {
        let kernel = self.slot_word(s, S_KERNEL).load(Ordering::Relaxed);
        if kernel == self.kernel && kernel != 0 {
            let pid = self.slot_word(s, S_PID).load(Ordering::Relaxed);
            let start = self.slot_word(s, S_START).load(Ordering::Relaxed);
            ProcessId {
                pid: pid.min(i32::MAX as u64) as i32,
                start_time: start,
            }
            .is_alive()
        } else {
            // Leases were not renewed before a second kernel came: a participant has a full lease from
            // then on to renew its own.
            let lease = self.slot_word(s, S_LEASE).load(Ordering::Relaxed);
            let since = self.hdr(H_MULTI).load(Ordering::Acquire);
            realtime_ns().saturating_sub(lease.max(since)) < self.lease_ns
        }
    }

    /// Recover the slot of a dead participant: finish its commit if it had reached COMMITTING (replay the
    /// log), release its locks — those its slot lists, and `also` (a lock word found holding its tag: a
    /// single-stripe commit takes its one lock without listing it) — and free the slot. Safe to race with
    /// other recoverers: one wins the slot.
    fn recover(&self, s: usize, also: Option<u64>) -> Result<()> {
        let st = self.slot_word(s, S_STATE);
        let cur = st.load(Ordering::Acquire);
        let mine = RECOVERING | ((self.me.wrapping_add(1) as u64) << 8);
        let takeable = cur & 0xff == OWNED || (cur & 0xff == RECOVERING && cur != mine);
        if !takeable || self.alive(s) {
            return Ok(());
        }
        if st.compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return Ok(()); // someone else is on it
        }
        let tag = s as u64 + 1;
        if self.slot_word(s, S_PHASE).load(Ordering::Acquire) == COMMITTING {
            self.replay(s)?;
        }
        let n = self.slot_word(s, S_NLOCKS).load(Ordering::Acquire);
        if n > MAX_LOCKS as u64 {
            return Err(Error::Corrupt(format!("slot {s} lists {n} locks")));
        }
        for i in 0..n {
            let key = self.slot_word(s, S_LOCKS + i * 8).load(Ordering::Relaxed);
            let _ = self.lock(key)?.compare_exchange(tag, 0, Ordering::Release, Ordering::Relaxed);
        }
        if let Some(key) = also {
            // While the slot is still ours to recover, so no new owner can hold this tag yet.
            let _ = self.lock(key)?.compare_exchange(tag, 0, Ordering::Release, Ordering::Relaxed);
        }
        let _ = self.hdr(H_URGENT).compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed);
        self.slot_word(s, S_NLOCKS).store(0, Ordering::Relaxed);
        self.slot_word(s, S_PHASE).store(IDLE, Ordering::Relaxed);
        self.slot_word(s, S_LOGLEN).store(0, Ordering::Relaxed);
        self.slot_word(s, S_KERNEL).store(0, Ordering::Relaxed);
        st.store(FREE, Ordering::Release);
        Ok(())
    }

    /// Apply the redo log of slot `s` (idempotent). Every record is validated first.
    fn replay(&self, s: usize) -> Result<()> {
        let len = self.slot_word(s, S_LOGLEN).load(Ordering::Acquire) as usize;
        if len > LOG_BYTES {
            return Err(Error::Corrupt(format!("slot {s}'s log claims {len} bytes")));
        }
        let base = self.slots_off + s as u64 * SLOT_SIZE + S_LOG;
        let log = self.seg.ptr(base, LOG_BYTES as u64).map_err(|e| Error::Corrupt(e.to_string()))?;
        // SAFETY: LOG_BYTES at `log` are inside the slot (checked by `ptr`); the dead writer is gone.
        let log = unsafe { std::slice::from_raw_parts(log as *const u8, len) };
        let mut recs = Vec::new();
        let mut p = 0;
        while p < len {
            if p + 16 > len {
                return Err(Error::Corrupt(format!("slot {s}'s log ends inside a record header")));
            }
            let node = u32::from_le_bytes(log[p..p + 4].try_into().unwrap()) as usize;
            let n = u32::from_le_bytes(log[p + 4..p + 8].try_into().unwrap()) as usize;
            let off = u64::from_le_bytes(log[p + 8..p + 16].try_into().unwrap());
            let end = p + 16 + n;
            if end > len {
                return Err(Error::Corrupt(format!("slot {s}'s log record overruns the log")));
            }
            let dst = self
                .data(node, off, n as u64)
                .map_err(|e| Error::Corrupt(format!("slot {s}'s log: {e}")))?;
            recs.push((dst, p + 16, n));
            p = round_up(end as u64, 8) as usize;
        }
        for (dst, at, n) in recs {
            // SAFETY: `dst` checked by `data`; the source lies in the validated log.
            unsafe { std::ptr::copy_nonoverlapping(log.as_ptr().add(at), dst, n) };
        }
        Ok(())
    }

    /// Recover every slot whose owner died (what `vmfabric mtx check` runs); returns how many.
    pub fn recover_dead(&self) -> Result<usize> {
        let mut n = 0;
        for s in 0..self.nslots {
            if s != self.me && self.slot_word(s, S_STATE).load(Ordering::Acquire) & 0xff != FREE && !self.alive(s) {
                self.recover(s, None)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.me < self.nslots {
            self.slot_word(self.me, S_KERNEL).store(0, Ordering::Relaxed);
            self.slot_word(self.me, S_STATE).store(FREE, Ordering::Release);
        }
    }
}

/// How a commit waits for a held lock, across its locks: looks since the last lock taken, when it started
/// waiting, whether it raised the turnstile.
#[derive(Default)]
struct Wait {
    spins: u32,
    since: Option<Instant>,
    raised: bool,
}

impl Store {
    /// The start of every commit: let a starving commit through first (a `Try` commit fails instead:
    /// `Some(LockFailed)`), and renew the lease — what tells a participant in another kernel that we live —
    /// when it is a quarter old (a coarse clock read otherwise).
    fn enter_commit(&self, mode: Mode) -> Result<Option<Outcome>> {
        let tag = self.me as u64 + 1;
        let u = self.hdr(H_URGENT).load(Ordering::Acquire);
        if u != 0 && u != tag {
            if mode == Mode::Try {
                return Ok(Some(Outcome::LockFailed));
            }
            self.wait_turnstile(u)?;
        }
        self.renew_lease();
        Ok(None)
    }

    /// Before taking locks: renew this slot's lease if a quarter of it has passed. On x86-64 the clock is
    /// read only when the time-stamp counter says that a sixteenth of the lease may have passed, counting
    /// 0.5 ticks per nanosecond (every x86-64 CPU of this century ticks faster, so the real interval is
    /// shorter still and the lease is never renewed late).
    #[inline]
    fn renew_lease(&self) {
        // One kernel only: liveness is exact (pid and start time), no lease is read (this skips a time-stamp
        // read, ~9 ns here, a third of a one-stripe commit).
        if self.hdr(H_MULTI).load(Ordering::Relaxed) == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: rdtsc has no preconditions.
            let t = unsafe { core::arch::x86_64::_rdtsc() };
            let last = self.lease_tsc.load(Ordering::Relaxed);
            if last != 0 && t.wrapping_sub(last) < self.lease_ns / 16 / 2 {
                return;
            }
            self.lease_tsc.store(t, Ordering::Relaxed);
        }
        let now = realtime_ns();
        let lease = self.slot_word(self.me, S_LEASE);
        if now.saturating_sub(lease.load(Ordering::Relaxed)) > self.lease_ns / 4 {
            lease.store(now, Ordering::Relaxed);
        }
    }

    /// What an item's bounds check depends on: the mapping's address and the node count and size (a store
    /// mapped later at the same address with the same nodes accepts exactly the same items).
    fn identity(&self) -> (usize, usize, u64) {
        (self.base as usize, self.nodes, self.node_bytes)
    }

    /// Address of byte `offset` of `node`, for an item already checked against this store.
    #[inline]
    fn data_unchecked(&self, node: usize, offset: usize) -> *mut u8 {
        let off = self.data_off + node as u64 * self.node_span + offset as u64;
        // SAFETY (of the callers' use): the item was checked by `data` against this store.
        self.base.wrapping_add(off as usize)
    }

    /// Take lock `key`: `Ok(true)` once ours; `Ok(false)` if held and `mode` is `Try`. `Blocking` waits —
    /// spins, yields every 64 looks, every 1024 looks recovers a dead holder, and after `STARVE_AFTER`
    /// raises the turnstile (noted in `wait`; the caller lowers it).
    fn take_lock(&self, key: u64, mode: Mode, wait: &mut Wait) -> Result<bool> {
        let tag = self.me as u64 + 1;
        let w = self.lock(key)?;
        loop {
            let cur = w.load(Ordering::Relaxed);
            if cur == 0 {
                if w.compare_exchange_weak(0, tag, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    wait.spins = 0;
                    return Ok(true);
                }
                continue;
            }
            if cur > self.nslots as u64 || cur == tag {
                return Err(Error::Corrupt(format!("lock word {key:#x} holds {cur:#x}")));
            }
            if mode == Mode::Try {
                return Ok(false);
            }
            wait.spins += 1;
            if wait.spins % 64 == 0 {
                let now = Instant::now();
                let t0 = *wait.since.get_or_insert(now);
                // A dead holder never lets go: recover it (checked now and then, not per look).
                if wait.spins % 1024 == 0 && !self.alive(cur as usize - 1) {
                    self.recover(cur as usize - 1, Some(key))?;
                }
                if !wait.raised && now - t0 > STARVE_AFTER {
                    wait.raised = self
                        .hdr(H_URGENT)
                        .compare_exchange(0, tag, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok();
                }
                vmf_pal::yield_now();
            } else {
                vmf_pal::cpu_relax();
            }
        }
    }

    /// Lower the turnstile if this commit raised it.
    fn lower_turnstile(&self, raised: bool) {
        if raised {
            let tag = self.me as u64 + 1;
            let _ = self.hdr(H_URGENT).compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Wait while another commit holds the turnstile (it will release it when done, or die: recovered).
    fn wait_turnstile(&self, mut u: u64) -> Result<()> {
        let urgent = self.hdr(H_URGENT);
        let mut n = 0u32;
        while u != 0 {
            if u > self.nslots as u64 {
                return Err(Error::Corrupt(format!("turnstile holds {u:#x}")));
            }
            n += 1;
            if n % 4096 == 0 && !self.alive(u as usize - 1) {
                self.recover(u as usize - 1, None)?;
            }
            vmf_pal::yield_now();
            u = urgent.load(Ordering::Acquire);
        }
        Ok(())
    }
}

/// Open options helper: `create_new` files readable by their owner only.
trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}
impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

// ---------------------------------------------------------------------- minitransactions

/// An item: (`node`, `offset`) and `len` bytes of the transaction's arena from `at` (expected bytes,
/// read results, or data to write).
#[derive(Debug, Clone, Copy)]
struct Item {
    node: usize,
    offset: usize,
    at: usize,
    len: usize,
}

/// A minitransaction: compare, read and write items, committed all-or-nothing by [`Mtx::commit`]. Reusable
/// after [`Mtx::reset`], without allocating once its buffers have grown.
#[derive(Debug, Default, Clone)]
pub struct Mtx {
    compares: Vec<Item>,
    reads: Vec<Item>,
    writes: Vec<Item>,
    arena: Vec<u8>,
    failed: Option<usize>,
    keys: Vec<u64>,
    /// [`Store::identity`] of the store every item was checked against (zeros: none yet, or items of two
    /// stores): the lean commit path trusts the items' bounds only for that store.
    bound: (usize, usize, u64),
    /// Locks held (the first `held` of `keys`) and whether this commit raised the turnstile: between
    /// [`Mtx::prepare`] and [`Mtx::finish`].
    held: usize,
    raised: bool,
    prepared: bool,
}

impl Mtx {
    fn check(&mut self, store: &Store, node: usize, offset: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Err(Error::InvalidArgument("an item of 0 bytes".into()));
        }
        store.data(node, offset as u64, len as u64)?;
        let id = store.identity();
        let first = self.compares.is_empty() && self.reads.is_empty() && self.writes.is_empty();
        self.bound = if first || self.bound == id { id } else { (0, 0, 0) };
        Ok(())
    }

    /// Add a compare item: the commit writes nothing unless the `expected.len()` bytes at (`node`,
    /// `offset`) equal `expected`.
    pub fn compare(&mut self, store: &Store, node: usize, offset: usize, expected: &[u8]) -> Result<()> {
        self.check(store, node, offset, expected.len())?;
        let it = self.put(node, offset, expected);
        self.compares.push(it);
        Ok(())
    }

    /// Add a read item of `len` bytes at (`node`, `offset`); returns its index for [`Mtx::read_result`].
    pub fn read(&mut self, store: &Store, node: usize, offset: usize, len: usize) -> Result<usize> {
        self.check(store, node, offset, len)?;
        let at = self.arena.len();
        self.arena.resize(at + len, 0);
        self.reads.push(Item { node, offset, at, len });
        Ok(self.reads.len() - 1)
    }

    /// Add a write item: `data` is written at (`node`, `offset`) if every compare holds.
    pub fn write(&mut self, store: &Store, node: usize, offset: usize, data: &[u8]) -> Result<()> {
        self.check(store, node, offset, data.len())?;
        let it = self.put(node, offset, data);
        self.writes.push(it);
        Ok(())
    }

    /// Replace the expected bytes of compare item `i` (same length): a transaction prepared once is then
    /// re-committed with new values, its items' places checked only when they were added.
    pub fn set_compare(&mut self, i: usize, expected: &[u8]) -> Result<()> {
        let it = *self.compares.get(i).ok_or_else(|| Error::InvalidArgument(format!("compare item {i} of {}", self.compares.len())))?;
        self.set_bytes(it, expected)
    }

    /// Replace the data of write item `i` (same length); see [`Mtx::set_compare`].
    pub fn set_write(&mut self, i: usize, data: &[u8]) -> Result<()> {
        let it = *self.writes.get(i).ok_or_else(|| Error::InvalidArgument(format!("write item {i} of {}", self.writes.len())))?;
        self.set_bytes(it, data)
    }

    fn set_bytes(&mut self, it: Item, bytes: &[u8]) -> Result<()> {
        if bytes.len() != it.len {
            return Err(Error::InvalidArgument(format!("{} bytes for an item of {}", bytes.len(), it.len)));
        }
        self.arena[it.at..it.at + it.len].copy_from_slice(bytes);
        Ok(())
    }

    fn put(&mut self, node: usize, offset: usize, bytes: &[u8]) -> Item {
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        Item { node, offset, at, len: bytes.len() }
    }

    fn bytes(&self, it: &Item) -> &[u8] {
        &self.arena[it.at..it.at + it.len]
    }

    /// What read item `i` returned at the last commit (zeros before one).
    pub fn read_result(&self, i: usize) -> Option<&[u8]> {
        self.reads.get(i).map(|r| self.bytes(r))
    }

    /// Index of the compare item that failed at the last commit.
    pub fn failed_item(&self) -> Option<usize> {
        self.failed
    }

    /// Forget every item (keeps the allocations).
    pub fn reset(&mut self) {
        self.compares.clear();
        self.reads.clear();
        self.writes.clear();
        self.arena.clear();
        self.failed = None;
    }

    /// Bytes the redo log needs for the write items.
    fn log_bytes(&self) -> usize {
        self.writes.iter().map(|w| 16 + round_up(w.len as u64, 8) as usize).sum()
    }

    /// Commit: lock every stripe the items touch (in one global order), fill the reads, check the
    /// compares, apply the writes through the slot's redo log, unlock.
    pub fn commit(&mut self, store: &Store, mode: Mode) -> Result<Outcome> {
        self.failed = None;
        if self.prepared {
            return Err(Error::InvalidArgument("the minitransaction is prepared: finish it first".into()));
        }
        let sh = store.stripe_shift;
        if let Some(r) = self.commit_one_stripe(store, mode, sh) {
            return r;
        }
        // A lone aligned write of at most 8 bytes is one atomic store: no log needed.
        let single = match self.writes.as_slice() {
            [w] => {
                let n = w.len;
                n.is_power_of_two() && n <= 8 && w.offset % n == 0
            }
            _ => false,
        };
        if let Some(o) = self.lock_all(store, mode, !single, false)? {
            return Ok(o);
        }
        crash_point(1);
        if let Some(o) = self.compare_or_release(store)? {
            return Ok(o);
        }
        if single {
            let w = &self.writes[0];
            let p = store.data(w.node, w.offset as u64, w.len as u64)?;
            // SAFETY: aligned to its power-of-two size (checked above), in bounds; one atomic store, so a
            // crash leaves it written or not.
            unsafe { atomic_store(p, self.bytes(w)) };
        } else if !self.writes.is_empty() {
            // The redo log, then COMMITTING, then the writes: a recoverer replays exactly these.
            if let Err(e) = self.write_log(store) {
                self.release(store);
                return Err(e);
            }
            store.slot_word(store.me, S_PHASE).store(COMMITTING, Ordering::Release);
            crash_point(2);
            self.apply(store)?;
        }
        self.release(store);
        Ok(Outcome::Committed)
    }

    /// The first phase of a two-phase commit, as a memory node runs it for a remote coordinator: lock the
    /// stripes, fill the reads, check the compares and, if they hold, write the redo log and keep the
    /// locks (`Ok(Committed)`: the vote yes); [`Mtx::finish`] then applies or drops the writes. A
    /// compare that fails or (in `Try` mode) a held lock releases everything at once. `urgent` raises the
    /// store's turnstile for this commit (a coordinator that has retried past [`STARVE_AFTER`]): local
    /// commits then let it through first; it is lowered by `finish` or by the failure.
    pub fn prepare(&mut self, store: &Store, mode: Mode, urgent: bool) -> Result<Outcome> {
        self.failed = None;
        if self.prepared {
            return Err(Error::InvalidArgument("the minitransaction is already prepared".into()));
        }
        if let Some(o) = self.lock_all(store, mode, true, urgent)? {
            return Ok(o);
        }
        if let Some(o) = self.compare_or_release(store)? {
            return Ok(o);
        }
        if !self.writes.is_empty() {
            if let Err(e) = self.write_log(store) {
                self.release(store);
                return Err(e);
            }
        }
        store.slot_word(store.me, S_PHASE).store(PREPARED, Ordering::Release);
        self.prepared = true;
        Ok(Outcome::Committed)
    }

    /// Is this minitransaction prepared (between [`Mtx::prepare`] and [`Mtx::finish`])?
    pub fn is_prepared(&self) -> bool {
        self.prepared
    }

    /// The second phase: apply the logged writes (`commit`) or drop them, and release the locks.
    pub fn finish(&mut self, store: &Store, commit: bool) -> Result<()> {
        if !self.prepared {
            return Err(Error::InvalidArgument("the minitransaction is not prepared".into()));
        }
        self.prepared = false;
        if commit && !self.writes.is_empty() {
            store.slot_word(store.me, S_PHASE).store(COMMITTING, Ordering::Release);
            if let Err(e) = self.apply(store) {
                self.release(store);
                return Err(e);
            }
        }
        self.release(store);
        Ok(())
    }

    /// Take every lock the items need, in order (`Ok(None)`: all held, in `self.held`), after checking
    /// sizes (`logged`: the writes go through the log, which must hold them). `Ok(Some(LockFailed))`:
    /// nothing is held.
    fn lock_all(&mut self, store: &Store, mode: Mode, logged: bool, urgent: bool) -> Result<Option<Outcome>> {
        let sh = store.stripe_shift;
        // The stripes, sorted: one global order.
        self.keys.clear();
        for it in self.compares.iter().chain(&self.reads).chain(&self.writes) {
            let (a, b) = (it.offset as u64 >> sh, (it.offset + it.len - 1) as u64 >> sh);
            for st in a..=b {
                self.keys.push((it.node as u64) << 32 | st);
            }
        }
        self.keys.sort_unstable();
        self.keys.dedup();
        if self.keys.len() > MAX_LOCKS {
            return Err(Error::TooLarge(format!("{} stripes (at most {MAX_LOCKS})", self.keys.len())));
        }
        if logged && !self.writes.is_empty() && self.log_bytes() > LOG_BYTES {
            return Err(Error::TooLarge(format!(
                "{} bytes of writes and record headers (the log holds {LOG_BYTES})",
                self.log_bytes()
            )));
        }
        let me = store.me;
        let tag = me as u64 + 1;
        let mut wait = Wait::default();
        if urgent {
            match store.hdr(H_URGENT).compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => wait.raised = true,
                Err(u) if u == tag => {}
                Err(_) => return Ok(Some(Outcome::LockFailed)),
            }
            store.renew_lease();
        } else if let Some(o) = store.enter_commit(mode)? {
            return Ok(Some(o));
        }
        store.slot_word(me, S_PHASE).store(LOCKING, Ordering::Relaxed);
        let mut got = 0;
        while got < self.keys.len() {
            let key = self.keys[got];
            // Intent first: a recoverer releases only words that hold our tag.
            store.slot_word(me, S_LOCKS + got as u64 * 8).store(key, Ordering::Relaxed);
            store.slot_word(me, S_NLOCKS).store(got as u64 + 1, Ordering::Release);
            match store.take_lock(key, mode, &mut wait) {
                Ok(true) => got += 1,
                Ok(false) => {
                    self.unlock(store, got, wait.raised);
                    return Ok(Some(Outcome::LockFailed));
                }
                Err(e) => {
                    self.unlock(store, got, wait.raised);
                    return Err(e);
                }
            }
        }
        self.held = got;
        self.raised = wait.raised;
        Ok(None)
    }

    /// Under the locks: reads and compares; a failing compare (or an error) releases everything.
    fn compare_or_release(&mut self, store: &Store) -> Result<Option<Outcome>> {
        match self.read_and_compare(store) {
            Ok(None) => Ok(None),
            Ok(Some(i)) => {
                self.release(store);
                Ok(Some(Outcome::CompareFailed(i)))
            }
            Err(e) => {
                self.release(store);
                Err(e)
            }
        }
    }

    /// Write the redo log of the write items into this process's slot (sizes checked by `lock_all`).
    fn write_log(&self, store: &Store) -> Result<()> {
        let base = store.slots_off + store.me as u64 * SLOT_SIZE + S_LOG;
        let log = store.seg.ptr(base, LOG_BYTES as u64).map_err(|e| Error::Corrupt(e.to_string()))?;
        let mut p = 0usize;
        for w in &self.writes {
            let mut h = [0u8; 16];
            h[..4].copy_from_slice(&(w.node as u32).to_le_bytes());
            h[4..8].copy_from_slice(&(w.len as u32).to_le_bytes());
            h[8..].copy_from_slice(&(w.offset as u64).to_le_bytes());
            // SAFETY: log_bytes() <= LOG_BYTES (checked by lock_all), so every record fits.
            unsafe {
                std::ptr::copy_nonoverlapping(h.as_ptr(), log.add(p), 16);
                std::ptr::copy_nonoverlapping(self.arena.as_ptr().add(w.at), log.add(p + 16), w.len);
            }
            p = round_up((p + 16 + w.len) as u64, 8) as usize;
        }
        store.slot_word(store.me, S_LOGLEN).store(p as u64, Ordering::Release);
        Ok(())
    }

    /// Apply the write items (under the locks, after COMMITTING).
    fn apply(&self, store: &Store) -> Result<()> {
        for w in &self.writes {
            let d = store.data(w.node, w.offset as u64, w.len as u64)?;
            // SAFETY: checked; locked by us.
            unsafe { std::ptr::copy_nonoverlapping(self.arena.as_ptr().add(w.at), d, w.len) };
            crash_point(3);
        }
        std::sync::atomic::fence(Ordering::Release);
        Ok(())
    }

    /// Release what `lock_all` took.
    fn release(&self, store: &Store) {
        self.unlock(store, self.held, self.raised);
    }

    /// The fast path: every item in one stripe and at most one write that is a single atomic store. The
    /// one lock is taken without listing it in the slot (a recoverer that finds it held by a dead slot
    /// clears it) and nothing is logged: what a crash leaves is the store done or not. `None`: not such a
    /// transaction.
    fn commit_one_stripe(&mut self, store: &Store, mode: Mode, sh: u32) -> Option<Result<Outcome>> {
        let first = self.compares.first().or(self.reads.first()).or(self.writes.first())?;
        let (node, stripe) = (first.node, first.offset as u64 >> sh);
        let same = |it: &Item| it.node == node && it.offset as u64 >> sh == stripe && (it.offset + it.len - 1) as u64 >> sh == stripe;
        if !(self.compares.iter().all(same) && self.reads.iter().all(same) && self.writes.iter().all(same)) {
            return None;
        }
        let atomic = |w: &Item| w.len.is_power_of_two() && w.len <= 8 && w.offset % w.len == 0;
        if self.writes.len() > 1 || !self.writes.iter().all(atomic) {
            return None;
        }
        Some(self.commit_fast(store, mode, (node as u64) << 32 | stripe))
    }

    fn commit_fast(&mut self, store: &Store, mode: Mode, key: u64) -> Result<Outcome> {
        if self.bound == store.identity() {
            if let Some(o) = self.commit_lean(store, key) {
                return Ok(o);
            }
        }
        if let Some(o) = store.enter_commit(mode)? {
            return Ok(o);
        }
        let mut wait = Wait::default();
        let taken = store.take_lock(key, mode, &mut wait);
        if !matches!(taken, Ok(true)) {
            store.lower_turnstile(wait.raised);
            return taken.map(|_| Outcome::LockFailed);
        }
        crash_point(1);
        let r = self.read_and_compare(store).and_then(|failed| {
            if let Some(i) = failed {
                return Ok(Outcome::CompareFailed(i));
            }
            if let Some(wr) = self.writes.first() {
                let p = store.data(wr.node, wr.offset as u64, wr.len as u64)?;
                // SAFETY: aligned to its power-of-two size, in bounds; one atomic store.
                unsafe { atomic_store(p, self.bytes(wr)) };
            }
            Ok(Outcome::Committed)
        });
        store.lock(key)?.store(0, Ordering::Release);
        store.lower_turnstile(wait.raised);
        r
    }

    /// The one-stripe commit when nothing stands in its way (no turnstile raised, the lock free at the
    /// first try): one CAS, the items, one store, with no call that can fail — the items' bounds were
    /// checked against this very store when they were added. `None`: take the general one-stripe path.
    #[inline]
    fn commit_lean(&mut self, store: &Store, key: u64) -> Option<Outcome> {
        let tag = store.me as u64 + 1;
        if store.hdr(H_URGENT).load(Ordering::Acquire) != 0 {
            return None;
        }
        store.renew_lease();
        let w = store.lock(key).ok()?;
        if w.compare_exchange(0, tag, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return None;
        }
        crash_point(1);
        let at = |it: &Item| store.data_unchecked(it.node, it.offset);
        for r in &self.reads {
            // SAFETY: checked in bounds of this store when added (`bound`); the stripe is locked by us.
            unsafe { std::ptr::copy_nonoverlapping(at(r), self.arena.as_mut_ptr().add(r.at), r.len) };
        }
        let mut out = Outcome::Committed;
        for (i, c) in self.compares.iter().enumerate() {
            // SAFETY: as above.
            if !unsafe { eq_bytes(at(c), &self.arena[c.at..c.at + c.len]) } {
                self.failed = Some(i);
                out = Outcome::CompareFailed(i);
                break;
            }
        }
        if out == Outcome::Committed {
            if let Some(wr) = self.writes.first() {
                // SAFETY: in bounds (as above), aligned to its power-of-two size (checked by the caller):
                // one atomic store.
                unsafe { atomic_store(at(wr), &self.arena[wr.at..wr.at + wr.len]) };
            }
        }
        w.store(0, Ordering::Release);
        Some(out)
    }

    /// Under the locks: copy the read items out (they are returned even when a compare fails), then check
    /// the compares in order. Returns the first failing compare's index (also kept for `failed_item`).
    fn read_and_compare(&mut self, store: &Store) -> Result<Option<usize>> {
        for r in &self.reads {
            let p = store.data(r.node, r.offset as u64, r.len as u64)?;
            // SAFETY: checked; the stripes are locked by us; the arena holds r.len bytes at r.at.
            unsafe { std::ptr::copy_nonoverlapping(p, self.arena.as_mut_ptr().add(r.at), r.len) };
        }
        for (i, c) in self.compares.iter().enumerate() {
            let p = store.data(c.node, c.offset as u64, c.len as u64)?;
            // SAFETY: as above.
            let cur = unsafe { std::slice::from_raw_parts(p, c.len) };
            if cur != self.bytes(c) {
                self.failed = Some(i);
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Release the first `got` locks of this commit, then leave the LOCKING/COMMITTING phase.
    fn unlock(&self, store: &Store, got: usize, raised: bool) {
        let me = store.me;
        let tag = me as u64 + 1;
        // Phase IDLE before the locks go: a recoverer must never replay a log over data others changed.
        store.slot_word(me, S_PHASE).store(IDLE, Ordering::Release);
        for &key in self.keys[..got].iter().rev() {
            if let Ok(w) = store.lock(key) {
                let _ = w.compare_exchange(tag, 0, Ordering::Release, Ordering::Relaxed);
            }
        }
        store.slot_word(me, S_NLOCKS).store(0, Ordering::Release);
        store.lower_turnstile(raised);
    }
}

/// Store `data` (1, 2, 4 or 8 bytes) at `p` (aligned to its size) with one atomic store.
///
/// # Safety
/// `p` is valid for `data.len()` bytes and aligned to `data.len()`.
/// `len` bytes at `p` equal `want`? (Eight bytes or fewer in one unaligned load: no call.)
///
/// # Safety
/// `p` must be valid for `want.len()` bytes.
#[inline]
unsafe fn eq_bytes(p: *const u8, want: &[u8]) -> bool {
    if want.len() == 8 {
        return std::ptr::read_unaligned(p as *const u64) == u64::from_ne_bytes(want.try_into().unwrap());
    }
    std::slice::from_raw_parts(p, want.len()) == want
}

unsafe fn atomic_store(p: *mut u8, data: &[u8]) {
    use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU8};
    match data.len() {
        1 => (*(p as *const AtomicU8)).store(data[0], Ordering::Release),
        2 => (*(p as *const AtomicU16)).store(u16::from_ne_bytes(data.try_into().unwrap()), Ordering::Release),
        4 => (*(p as *const AtomicU32)).store(u32::from_ne_bytes(data.try_into().unwrap()), Ordering::Release),
        _ => (*(p as *const AtomicU64)).store(u64::from_ne_bytes(data.try_into().unwrap()), Ordering::Release),
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
