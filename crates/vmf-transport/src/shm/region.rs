//! Layout of a host's shared region, and attaching to it.
//!
//! ```text
//! 0              RegionHeader (4 KiB): magic, version, size, UUID, init word, offsets
//! slots_off      max_local × Slot (128 B each): pid, start time, rank, state, doorbell
//! pairs_off      max_local × max_local × u64: offset of the ring src→dst, 0 = not yet created
//!                (indexed [dst][src], so a receiver's incoming entries are contiguous)
//! heap_off       rings, allocated on first use by their producer (bump allocator, heap_top)
//! heap_end
//! ```
//! All positions are offsets from the start of the region; every offset read from the region is checked
//! against the mapping before use. The same code serves a file under /dev/shm and an existing mappable
//! file or device (an ivshmem PCI BAR): there no file is created and the size is the device's.
//!
//! Initialisation is a compare-and-swap on `init_word` = (job hash << 2 | state), so ranks of one job agree
//! on who initialises even across VMs (where no file lock or pid can be shared), and memory left by an
//! earlier job in a reused device is re-initialised instead of trusted.
use crate::TransportError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vmf_bb::segment::{Segment, ShmSafe};
use vmf_bb::{align_up, ring::RING_CTL_SIZE};
use vmf_pal::process::ProcessId;

/// "VMFREGN\0" little-endian.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"VMFREGN\0");
/// Layout version. 1 = initial layout; 2 = slots record their kernel id (to tell co-resident VMs apart);
/// 3 = per-slot pool partitions; 4 = ring control blocks carry the pair's duplex box (384 bytes).
pub const LAYOUT_VERSION: u32 = 4;
/// Bytes reserved for the header.
pub const HEADER_SIZE: u64 = 4096;
/// Bytes per slot.
pub const SLOT_SIZE: u64 = 128;
/// Prefix of region files created in the region directory.
pub const FILE_PREFIX: &str = "vmf-";
/// Suffix of region files.
pub const FILE_SUFFIX: &str = ".shm";

const STATE_INIT: u64 = 1;
const STATE_READY: u64 = 2;

/// The region header.
#[repr(C, align(128))]
pub struct RegionHeader {
    /// [`REGION_MAGIC`], written last during initialisation.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// Max local ranks (slots).
    pub max_local: AtomicU32,
    /// Total size in bytes.
    pub size: AtomicU64,
    /// Region UUID (random, 128 bits).
    pub uuid: [AtomicU64; 2],
    /// (job hash << 2) | state.
    pub init_word: AtomicU64,
    /// Offset of the slot table.
    pub slots_off: AtomicU64,
    /// Offset of the pair table.
    pub pairs_off: AtomicU64,
    /// Start of the ring heap.
    pub heap_off: AtomicU64,
    /// End of the ring heap.
    pub heap_end: AtomicU64,
    /// Next free heap byte.
    pub heap_top: AtomicU64,
    /// Attachments so far (statistics; slots are claimed by compare-and-swap on their state).
    pub nattached: AtomicU32,
    /// pid of the launcher that owns the job (0: none known).
    pub launcher_pid: AtomicU32,
    /// Start time of that launcher.
    pub launcher_start: AtomicU64,
    /// pid of the rank that initialised the region.
    pub creator_pid: AtomicU32,
    _r: AtomicU32,
    /// Its start time.
    pub creator_start: AtomicU64,
    /// Offset of the shared pool (one partition per slot, after the ring heap).
    pub pool_off: AtomicU64,
    /// Bytes of each slot's pool partition (a multiple of 4096; 0: no pool).
    pub pool_per_slot: AtomicU64,
    /// A rank's copier (`vmf_bb::copier`) wants a CPU for its helper thread until this time
    /// (CLOCK_MONOTONIC ns of the kernel `copier_kernel`): ranks of that kernel that wait give up their
    /// spin and yield meanwhile. A hint: written without ordering, zero until a copier announces itself.
    pub copier_until: AtomicU64,
    /// The kernel id of the rank that last wrote `copier_until` (clocks of other kernels differ).
    pub copier_kernel: AtomicU64,
}
// SAFETY: atomics only.
unsafe impl ShmSafe for RegionHeader {}

/// One local rank's slot.
#[repr(C, align(128))]
pub struct Slot {
    /// 0 free, 1 attached, 2 detached (reusable), 3 being claimed.
    pub state: AtomicU32,
    /// Global rank in the job.
    pub rank: AtomicU32,
    /// pid.
    pub pid: AtomicU32,
    /// Futex word the owner sleeps on; senders bump and wake it.
    pub doorbell: AtomicU32,
    /// Process start time (with pid: identity that survives pid reuse).
    pub start_time: AtomicU64,
    /// Nonzero while the owner is (about to be) asleep on `doorbell`.
    pub sleeping: AtomicU32,
    /// The one CPU the owner is pinned to, plus 1; 0 when it may run on several (a hint for waiting:
    /// a rank on another CPU is worth spinning for, one on ours needs the CPU we would spin on).
    pub cpu: AtomicU32,
    /// Hash of the owner's kernel boot id: equal values share a kernel (futex wake-ups reach).
    pub kernel: AtomicU64,
    /// In a VM with an ivshmem doorbell: `1 << 32 | IVPosition << 16 | vector`, how peers ring the owner
    /// while it sleeps with `sleeping` = bell (0: it has no vector).
    pub bell: AtomicU64,
}
// SAFETY: atomics only.
unsafe impl ShmSafe for Slot {}
const _: () = assert!(std::mem::size_of::<Slot>() as u64 == SLOT_SIZE);
const _: () = assert!(std::mem::size_of::<RegionHeader>() as u64 <= HEADER_SIZE);

/// Where the region lives.
#[derive(Debug, Clone)]
pub enum RegionSource {
    /// A file `vmf-<job>.shm` in this directory, created by the first rank.
    Dir(PathBuf),
    /// An existing mappable file or device, used as it is.
    Device(PathBuf),
}

/// Sizing of a new region.
#[derive(Debug, Clone, Copy)]
pub struct RegionSizing {
    /// Slots (the most ranks that may attach).
    pub max_local: u32,
    /// Heap bytes for rings.
    pub heap: u64,
    /// Bytes of shared pool per slot (`MPI_Alloc_mem`, shared-memory collectives); rounded to pages.
    pub pool_per_slot: u64,
}

impl RegionSizing {
    /// Bytes of header and tables before the heap.
    pub fn tables(&self) -> u64 {
        let n = self.max_local as u64;
        align_up(HEADER_SIZE + n * SLOT_SIZE + n * n * 8, 4096)
    }
    /// Total region bytes.
    pub fn total(&self) -> u64 {
        self.tables() + self.heap + self.max_local as u64 * align_up(self.pool_per_slot, 4096)
    }
}

/// 64-bit FNV-1a of the job key, never 0.
pub fn job_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (h >> 2).max(1)
}

/// File name of a job's region in a region directory.
pub fn region_file_name(job: &str) -> String {
    format!("{FILE_PREFIX}{job}{FILE_SUFFIX}")
}

/// An attached region.
pub struct Region {
    seg: Segment,
    /// Validated copies of header values (never re-read from shared memory).
    pub uuid: [u64; 2],
    /// Number of slots.
    pub max_local: u32,
    slots_off: u64,
    pairs_off: u64,
    heap_off: u64,
    heap_end: u64,
    pool_off: u64,
    pool_per_slot: u64,
    /// True if this process created the backing file (it lives in a region directory).
    pub is_file: bool,
}

fn err(what: impl Into<String>) -> TransportError {
    TransportError::Setup(what.into())
}

impl Region {
    /// Open (creating if needed) and initialise the region of job `job` from `src`.
    /// `launcher` is recorded for stale-region cleanup.
    pub fn open(
        src: &RegionSource,
        job: &str,
        sizing: RegionSizing,
        launcher: Option<ProcessId>,
        timeout: Duration,
    ) -> Result<Region, TransportError> {
        let (seg, is_file) = match src {
            RegionSource::Dir(d) => {
                let p = d.join(region_file_name(job));
                let (s, _) = Segment::open_or_create(&p, sizing.total())
                    .map_err(|e| err(format!("Unable to create the shared region since {e}")))?;
                (s, true)
            }
            RegionSource::Device(p) => (
                Segment::open_existing(p)
                    .map_err(|e| err(format!("Unable to map the shared region since {e}")))?,
                false,
            ),
        };
        let jh = job_hash(job);
        let hdr: &RegionHeader = seg.at(0).map_err(|e| err(e.to_string()))?;
        let deadline = Instant::now() + timeout;
        loop {
            let w = hdr.init_word.load(Ordering::Acquire);
            if w >> 2 == jh {
                if w & 3 == STATE_READY {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(err(format!(
                        "Unable to attach to the shared region {} since its initialisation did not finish within {:?}",
                        seg.path().display(),
                        timeout
                    )));
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            // Not ours (fresh zeroes, or an earlier job's leftovers in a device): try to become the
            // initialiser, unless a rank of that other job may still be using the device.
            if !is_file && w & 3 == STATE_READY {
                if let Some(why) = Self::occupant(&seg, hdr) {
                    return Err(err(format!(
                        "Unable to use the shared region {} since another job's region occupies it ({why}); wait for that job to end, or give this job another device",
                        seg.path().display()
                    )));
                }
            }
            if hdr
                .init_word
                .compare_exchange(w, jh << 2 | STATE_INIT, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                Self::initialise(&seg, sizing, launcher)?;
                hdr.init_word
                    .store(jh << 2 | STATE_READY, Ordering::Release);
                break;
            }
        }
        Self::validate(seg, is_file)
    }

    /// Why a device region initialised by another job must not be taken over: a slot still attached
    /// whose owner is alive, or runs under another kernel (another VM, where its liveness cannot be
    /// seen). Slots of dead processes on this kernel, and anything unreadable, do not count.
    fn occupant(seg: &Segment, hdr: &RegionHeader) -> Option<String> {
        if hdr.magic.load(Ordering::Acquire) != REGION_MAGIC {
            return None;
        }
        let n = hdr.max_local.load(Ordering::Acquire) as u64;
        let off = hdr.slots_off.load(Ordering::Acquire);
        let me = vmf_pal::process::kernel_id();
        (0..n.min(4096)).find_map(|i| {
            let s: &Slot = seg.at(off.checked_add(i * SLOT_SIZE)?).ok()?;
            if s.state.load(Ordering::Acquire) != 1 {
                return None;
            }
            let pid = s.pid.load(Ordering::Acquire);
            let rank = s.rank.load(Ordering::Acquire);
            if s.kernel.load(Ordering::Acquire) != me {
                return Some(format!("rank {rank} (pid {pid}) in another VM is attached"));
            }
            let p = ProcessId {
                pid: pid as i32,
                start_time: s.start_time.load(Ordering::Acquire),
            };
            p.is_alive()
                .then(|| format!("rank {rank} (pid {pid}) is attached and alive"))
        })
    }

    fn initialise(
        seg: &Segment,
        mut sizing: RegionSizing,
        launcher: Option<ProcessId>,
    ) -> Result<(), TransportError> {
        let size = seg.len();
        sizing.pool_per_slot = align_up(sizing.pool_per_slot, 4096);
        if sizing.total() > size {
            // A device smaller than requested: shrink the pool first, then the heap, to what is there.
            let n = sizing.max_local.max(1) as u64;
            let room = size.saturating_sub(sizing.tables() + sizing.heap);
            sizing.pool_per_slot = (room / n) / 4096 * 4096;
        }
        if sizing.total() > size {
            sizing.pool_per_slot = 0;
            if sizing.tables() + 64 * 1024 > size {
                return Err(err(format!(
                    "Unable to initialise the shared region since it has {size} bytes and {} ranks need at least {}",
                    sizing.max_local,
                    sizing.tables() + 64 * 1024
                )));
            }
            sizing.heap = size - sizing.tables();
        }
        let tables = sizing.tables();
        // Zero the header and tables (a reused device may hold anything); the heap is zeroed per ring.
        let p = seg.ptr(0, tables).map_err(|e| err(e.to_string()))?;
        // Everything but the init word, which we hold in the INIT state: zeroing it would let another rank
        // win the compare-and-swap and initialise concurrently.
        let iw = std::mem::offset_of!(RegionHeader, init_word);
        // SAFETY: both ranges are in bounds; no other rank reads them before the init word says READY.
        unsafe {
            std::ptr::write_bytes(p, 0, iw);
            std::ptr::write_bytes(p.add(iw + 8), 0, tables as usize - iw - 8);
        }
        let hdr: &RegionHeader = seg.at(0).map_err(|e| err(e.to_string()))?;
        let n = sizing.max_local as u64;
        hdr.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        hdr.max_local.store(sizing.max_local, Ordering::Relaxed);
        hdr.size.store(size, Ordering::Relaxed);
        let mut u = [0u8; 16];
        getrandom::fill(&mut u)
            .map_err(|e| err(format!("Unable to create a region UUID since {e}")))?;
        hdr.uuid[0].store(
            u64::from_le_bytes(u[..8].try_into().unwrap()),
            Ordering::Relaxed,
        );
        hdr.uuid[1].store(
            u64::from_le_bytes(u[8..].try_into().unwrap()),
            Ordering::Relaxed,
        );
        hdr.slots_off.store(HEADER_SIZE, Ordering::Relaxed);
        hdr.pairs_off
            .store(HEADER_SIZE + n * SLOT_SIZE, Ordering::Relaxed);
        hdr.heap_off.store(tables, Ordering::Relaxed);
        hdr.heap_top.store(tables, Ordering::Relaxed);
        hdr.heap_end.store(tables + sizing.heap, Ordering::Relaxed);
        hdr.pool_off.store(tables + sizing.heap, Ordering::Relaxed);
        hdr.pool_per_slot
            .store(sizing.pool_per_slot, Ordering::Relaxed);
        hdr.nattached.store(0, Ordering::Relaxed);
        if let Some(l) = launcher {
            hdr.launcher_pid.store(l.pid as u32, Ordering::Relaxed);
            hdr.launcher_start.store(l.start_time, Ordering::Relaxed);
        }
        let me = ProcessId::current();
        hdr.creator_pid.store(me.pid as u32, Ordering::Relaxed);
        hdr.creator_start.store(me.start_time, Ordering::Relaxed);
        hdr.magic.store(REGION_MAGIC, Ordering::Release);
        Ok(())
    }

    fn validate(seg: Segment, is_file: bool) -> Result<Region, TransportError> {
        let hdr: &RegionHeader = seg.at(0).map_err(|e| err(e.to_string()))?;
        let bad = |what: &str| {
            err(format!(
                "Unable to use the shared region {} since {what}",
                seg.path().display()
            ))
        };
        if hdr.magic.load(Ordering::Acquire) != REGION_MAGIC {
            return Err(bad("its magic number is wrong"));
        }
        let v = hdr.version.load(Ordering::Relaxed);
        if v != LAYOUT_VERSION {
            return Err(bad(&format!(
                "its layout version is {v}, this build speaks {LAYOUT_VERSION}"
            )));
        }
        let size = hdr.size.load(Ordering::Relaxed);
        let n = hdr.max_local.load(Ordering::Relaxed) as u64;
        let slots_off = hdr.slots_off.load(Ordering::Relaxed);
        let pairs_off = hdr.pairs_off.load(Ordering::Relaxed);
        let heap_off = hdr.heap_off.load(Ordering::Relaxed);
        let heap_end = hdr.heap_end.load(Ordering::Relaxed);
        let pool_off = hdr.pool_off.load(Ordering::Relaxed);
        let pool_per_slot = hdr.pool_per_slot.load(Ordering::Relaxed);
        let ok = size <= seg.len()
            && pool_off >= heap_end
            && pool_per_slot % 4096 == 0
            && pool_per_slot
                .checked_mul(n)
                .and_then(|b| b.checked_add(pool_off))
                .is_some_and(|e| e <= size)
            && (1..=65536).contains(&n)
            && slots_off >= HEADER_SIZE
            && slots_off % SLOT_SIZE == 0
            && pairs_off >= slots_off + n * SLOT_SIZE
            && pairs_off % 8 == 0
            && heap_off >= pairs_off + n * n * 8
            && heap_off <= heap_end
            && heap_end <= size;
        if !ok {
            return Err(bad("its header offsets are inconsistent"));
        }
        let uuid = [
            hdr.uuid[0].load(Ordering::Relaxed),
            hdr.uuid[1].load(Ordering::Relaxed),
        ];
        Ok(Region {
            seg,
            uuid,
            max_local: n as u32,
            slots_off,
            pairs_off,
            heap_off,
            heap_end,
            pool_off,
            pool_per_slot,
            is_file,
        })
    }

    /// The header.
    pub fn header(&self) -> &RegionHeader {
        self.seg.at(0).expect("header validated at open")
    }

    /// The backing segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Path of the backing file or device.
    pub fn path(&self) -> &Path {
        self.seg.path()
    }

    /// UUID as 32 hex digits.
    pub fn uuid_hex(&self) -> String {
        format!("{:016x}{:016x}", self.uuid[0], self.uuid[1])
    }

    /// Claim a slot for global rank `rank` (this process): the first free slot, or one whose previous
    /// occupant detached (a rank that moved away; the migration protocol drained every ring to and from it,
    /// so its rings are empty and may be reused). Returns the local index.
    pub fn attach(&self, rank: u32) -> Result<u32, TransportError> {
        for idx in 0..self.max_local {
            let s = self.slot(idx)?;
            let st = s.state.load(Ordering::Acquire);
            if (st == 0 || st == 2)
                && s.state
                    .compare_exchange(st, 3, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                let me = ProcessId::current();
                s.rank.store(rank, Ordering::Relaxed);
                s.pid.store(me.pid as u32, Ordering::Relaxed);
                s.start_time.store(me.start_time, Ordering::Relaxed);
                s.kernel
                    .store(vmf_pal::process::kernel_id(), Ordering::Relaxed);
                s.sleeping.store(0, Ordering::Relaxed);
                s.cpu.store(0, Ordering::Relaxed);
                s.bell.store(0, Ordering::Relaxed);
                s.state.store(1, Ordering::Release);
                self.header().nattached.fetch_add(1, Ordering::AcqRel);
                return Ok(idx);
            }
        }
        Err(err(format!(
            "Unable to attach rank {rank} to the shared region since all {} slots are taken",
            self.max_local
        )))
    }

    /// Slot `idx`.
    pub fn slot(&self, idx: u32) -> Result<&Slot, TransportError> {
        if idx >= self.max_local {
            return Err(err(format!("slot index {idx} out of range")));
        }
        self.seg
            .at(self.slots_off + idx as u64 * SLOT_SIZE)
            .map_err(|e| err(e.to_string()))
    }

    /// Kernel id recorded in slot `idx`.
    pub fn slot_kernel(&self, idx: u32) -> Result<u64, TransportError> {
        Ok(self.slot(idx)?.kernel.load(Ordering::Acquire))
    }

    /// Process identity recorded in slot `idx`.
    pub fn slot_process(&self, idx: u32) -> Result<ProcessId, TransportError> {
        let s = self.slot(idx)?;
        Ok(ProcessId {
            pid: s.pid.load(Ordering::Acquire) as i32,
            start_time: s.start_time.load(Ordering::Acquire),
        })
    }

    /// The pair-table entry for ring `src → dst` (local indices).
    pub fn pair(&self, src: u32, dst: u32) -> Result<&AtomicU64, TransportError> {
        if src >= self.max_local || dst >= self.max_local {
            return Err(err(format!("pair ({src},{dst}) out of range")));
        }
        let n = self.max_local as u64;
        self.seg
            .at(self.pairs_off + (dst as u64 * n + src as u64) * 8)
            .map_err(|e| err(e.to_string()))
    }

    /// Allocate `len` bytes (128-aligned) from the ring heap. Returns the offset.
    pub fn alloc(&self, len: u64) -> Result<u64, TransportError> {
        let hdr = self.header();
        let len = align_up(len, 128);
        let mut top = hdr.heap_top.load(Ordering::Acquire);
        loop {
            if top < self.heap_off || top % 128 != 0 {
                return Err(err("the shared region's heap pointer is corrupt"));
            }
            let end = top.checked_add(len).filter(|&e| e <= self.heap_end).ok_or_else(|| {
                err(format!(
                    "Unable to allocate a {len}-byte ring since the shared region's heap ({} bytes) is exhausted; \
                     raise VMF_SHM_BUDGET or lower VMF_SHM_RING_SIZE",
                    self.heap_end - self.heap_off
                ))
            })?;
            match hdr
                .heap_top
                .compare_exchange_weak(top, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(top),
                Err(t) => top = t,
            }
        }
    }

    /// Validate a ring offset read from the pair table and its capacity; return its base pointer.
    pub fn ring_at(
        &self,
        off: u64,
        expected_cap: Option<u64>,
    ) -> Result<(*mut u8, u64), TransportError> {
        if off < self.heap_off || off % 128 != 0 || off >= self.heap_end {
            return Err(err(format!(
                "ring offset {off} lies outside the region's heap"
            )));
        }
        let ctl: &vmf_bb::ring::RingCtl = {
            self.seg
                .check(off, RING_CTL_SIZE as u64, 128)
                .map_err(|e| err(e.to_string()))?;
            let p = self
                .seg
                .ptr(off, RING_CTL_SIZE as u64)
                .map_err(|e| err(e.to_string()))?;
            // SAFETY: in bounds and aligned (checked); RingCtl is atomics only.
            unsafe { &*(p as *const vmf_bb::ring::RingCtl) }
        };
        let cap = expected_cap.unwrap_or_else(|| ctl.capacity.load(Ordering::Acquire));
        if !cap.is_power_of_two() || cap < vmf_bb::ring::MIN_CAPACITY {
            return Err(err(format!("ring capacity {cap} is invalid")));
        }
        let total = RING_CTL_SIZE as u64 + cap;
        if off.checked_add(total).is_none_or(|e| e > self.heap_end) {
            return Err(err(format!(
                "ring at {off} with capacity {cap} overruns the heap"
            )));
        }
        Ok((
            self.seg.ptr(off, total).map_err(|e| err(e.to_string()))?,
            cap,
        ))
    }

    /// The pool partition of slot `idx`: (offset, bytes); `None` when the region has no pool.
    pub fn pool_of(&self, idx: u32) -> Option<(u64, u64)> {
        (idx < self.max_local && self.pool_per_slot > 0).then(|| {
            (
                self.pool_off + idx as u64 * self.pool_per_slot,
                self.pool_per_slot,
            )
        })
    }

    /// A pointer to `len` bytes at `off`, validated to lie inside the partition of slot `idx` (offsets read
    /// from peers are checked here before use).
    pub fn pool_ptr(&self, idx: u32, off: u64, len: u64) -> Result<*mut u8, TransportError> {
        let (base, bytes) = self
            .pool_of(idx)
            .ok_or_else(|| err(format!("slot {idx} has no shared pool")))?;
        if off < base || off.checked_add(len).is_none_or(|e| e > base + bytes) {
            return Err(err(format!(
                "pool range {off}+{len} lies outside slot {idx}'s partition"
            )));
        }
        self.seg.ptr(off, len).map_err(|e| err(e.to_string()))
    }

    /// The offset of `len` bytes at `p` if they lie inside the pool, and the slot whose partition holds them.
    pub fn pool_offset(&self, p: *const u8, len: usize) -> Option<(u32, u64)> {
        if self.pool_per_slot == 0 {
            return None;
        }
        let base = self.seg.ptr(0, 0).ok()? as usize;
        let off = (p as usize).checked_sub(base)? as u64;
        if off < self.pool_off {
            return None;
        }
        let idx = (off - self.pool_off) / self.pool_per_slot;
        let (b, bytes) = self.pool_of(idx.try_into().ok()?)?;
        (off.checked_add(len as u64)? <= b + bytes).then_some((idx as u32, off))
    }

    /// Number of slots whose owner is still attached.
    pub fn attached_count(&self) -> u32 {
        (0..self.max_local)
            .filter(|&i| {
                self.slot(i)
                    .is_ok_and(|s| s.state.load(Ordering::Acquire) == 1)
            })
            .count() as u32
    }

    /// Mark slot `idx` detached (on orderly shutdown).
    pub fn detach(&self, idx: u32) {
        if let Ok(s) = self.slot(idx) {
            s.state.store(2, Ordering::Release);
        }
    }
}

/// What [`stale_regions`] found about one region file.
#[derive(Debug)]
pub struct RegionFileInfo {
    /// Path.
    pub path: PathBuf,
    /// Job id (from the file name).
    pub job: String,
    /// True if no process of the job is alive.
    pub stale: bool,
}

/// List region files in `dir` and whether each belongs to a dead job: its launcher is dead, or (no launcher
/// recorded) none of its attached ranks is alive and it is older than `grace`.
pub fn scan_regions(dir: &Path, grace: Duration) -> Vec<RegionFileInfo> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(job) = name
            .strip_prefix(FILE_PREFIX)
            .and_then(|r| r.strip_suffix(FILE_SUFFIX))
        else {
            continue;
        };
        let path = e.path();
        let age = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok());
        // A recorded launcher that is gone is conclusive; otherwise (unreadable, or no launcher recorded) a
        // file younger than `grace` may still be under construction.
        let old = age.is_none_or(|a| a >= grace);
        let stale = match region_is_stale(&path) {
            Some((true, true)) => true,
            Some((stale, _)) => stale && old,
            None => old,
        };
        out.push(RegionFileInfo {
            path,
            job: job.to_owned(),
            stale,
        });
    }
    out
}

/// (stale, conclusive): conclusive when decided by the recorded launcher.
fn region_is_stale(path: &Path) -> Option<(bool, bool)> {
    let seg = Segment::open_existing(path).ok()?;
    let hdr: &RegionHeader = seg.at(0).ok()?;
    if hdr.magic.load(Ordering::Acquire) != REGION_MAGIC {
        return Some((true, false));
    }
    let lp = hdr.launcher_pid.load(Ordering::Relaxed);
    if lp != 0 {
        let l = ProcessId {
            pid: lp as i32,
            start_time: hdr.launcher_start.load(Ordering::Relaxed),
        };
        return Some((!l.is_alive(), true));
    }
    let n = hdr.max_local.load(Ordering::Relaxed).min(65536) as u64;
    let slots_off = hdr.slots_off.load(Ordering::Relaxed);
    for i in 0..n {
        let Ok(s) = seg.at::<Slot>(slots_off + i * SLOT_SIZE) else {
            break;
        };
        if s.state.load(Ordering::Acquire) == 1 {
            let p = ProcessId {
                pid: s.pid.load(Ordering::Relaxed) as i32,
                start_time: s.start_time.load(Ordering::Relaxed),
            };
            if p.is_alive() {
                return Some((false, false));
            }
        }
    }
    let c = ProcessId {
        pid: hdr.creator_pid.load(Ordering::Relaxed) as i32,
        start_time: hdr.creator_start.load(Ordering::Relaxed),
    };
    Some((!c.is_alive(), false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vmf-region-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
    /// A region of job `job` in test directory `d`, with the tests' sizing and no launcher.
    fn open_in(d: &Path, job: &str) -> Result<Region, TransportError> {
        Region::open(
            &RegionSource::Dir(d.to_path_buf()),
            job,
            SZ,
            None,
            Duration::from_secs(2),
        )
    }
    const SZ: RegionSizing = RegionSizing {
        max_local: 4,
        heap: 1 << 20,
        pool_per_slot: 64 << 10,
    };

    #[test]
    fn two_openers_share_uuid_works() {
        let d = dir("share");
        let a = open_in(&d, "j1").unwrap();
        let b = open_in(&d, "j1").unwrap();
        assert_eq!(a.uuid, b.uuid);
        assert_eq!(a.attach(0).unwrap(), 0);
        assert_eq!(b.attach(1).unwrap(), 1);
        assert_eq!(b.slot_process(0).unwrap(), ProcessId::current());
        // A detached slot is reused; a full region refuses.
        a.detach(0);
        assert_eq!(a.attach(5).unwrap(), 0);
        assert_eq!(a.attach(6).unwrap(), 2);
        assert_eq!(a.attach(7).unwrap(), 3);
        assert!(a.attach(8).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn concurrent_openers_agree_on_one_initialiser_works() {
        for round in 0..20 {
            let d = dir(&format!("race{round}"));
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let d = d.clone();
                    std::thread::spawn(move || {
                        Region::open(
                            &RegionSource::Dir(d),
                            "race",
                            SZ,
                            None,
                            Duration::from_secs(5),
                        )
                        .map(|r| r.uuid)
                    })
                })
                .collect();
            let uuids: Vec<_> = hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
            assert!(
                uuids.iter().all(|u| *u == uuids[0]),
                "round {round}: {uuids:?}"
            );
            std::fs::remove_dir_all(&d).unwrap();
        }
    }

    #[test]
    fn device_is_reinitialised_for_new_job_works() {
        let d = dir("dev");
        let p = d.join("bar");
        std::fs::File::create(&p).unwrap().set_len(4 << 20).unwrap();
        let a = Region::open(
            &RegionSource::Device(p.clone()),
            "jobA",
            SZ,
            None,
            Duration::from_secs(2),
        )
        .unwrap();
        let ia = a.attach(0).unwrap();
        let open_b = || {
            Region::open(
                &RegionSource::Device(p.clone()),
                "jobB",
                SZ,
                None,
                Duration::from_secs(2),
            )
        };
        // Job A is attached and alive: B must not take the device over.
        let e = open_b().err().expect("a live job's device must be refused").to_string();
        assert!(e.contains("another job's region occupies it"), "{e}");
        // Another VM's rank (a kernel id not ours) counts as alive too.
        a.slot(ia).unwrap().kernel.store(12345, Ordering::Relaxed);
        assert!(open_b().is_err());
        a.slot(ia).unwrap().kernel.store(vmf_pal::process::kernel_id(), Ordering::Relaxed);
        // A dead owner on this kernel is a leftover.
        a.slot(ia).unwrap().pid.store(i32::MAX as u32 - 1, Ordering::Relaxed);
        let b = open_b().unwrap();
        assert_ne!(a.uuid, b.uuid);
        assert_eq!(b.attach(0).unwrap(), 0, "slots of the old job must be gone");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn corrupt_header_fails() {
        let d = dir("corrupt");
        let a = open_in(&d, "j").unwrap();
        a.header().heap_end.store(u64::MAX, Ordering::Relaxed);
        assert!(open_in(&d, "j").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn heap_exhaustion_and_bad_ring_offsets_fail() {
        let d = dir("heap");
        let a = open_in(&d, "j").unwrap();
        assert!(a.alloc(1 << 19).is_ok());
        assert!(a.alloc(1 << 20).is_err());
        assert!(a.ring_at(3, None).is_err());
        assert!(a.ring_at(u64::MAX - 127, None).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn stale_scan_finds_dead_job_works() {
        let d = dir("stale");
        let dead = ProcessId {
            pid: i32::MAX - 1,
            start_time: 1,
        };
        drop(
            Region::open(
                &RegionSource::Dir(d.clone()),
                "deadjob",
                SZ,
                Some(dead),
                Duration::from_secs(2),
            )
            .unwrap(),
        );
        drop(
            Region::open(
                &RegionSource::Dir(d.clone()),
                "livejob",
                SZ,
                Some(ProcessId::current()),
                Duration::from_secs(2),
            )
            .unwrap(),
        );
        let found = scan_regions(&d, Duration::ZERO);
        assert_eq!(found.len(), 2);
        for f in found {
            assert_eq!(f.stale, f.job == "deadjob", "{f:?}");
        }
        // A dead launcher is conclusive even for a fresh file; a live one never is stale.
        let found = scan_regions(&d, Duration::from_secs(3600));
        for f in found {
            assert_eq!(f.stale, f.job == "deadjob", "{f:?}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
