//! What the barrier and the condition variable share: a file of participants (index → pid, start time,
//! kernel) whose liveness waiters check, and waiting for a 32-bit word of the file to change by spinning,
//! yielding or sleeping (a futex when every participant runs in this kernel, else bounded sleeps, as
//! between VMs that share an ivshmem BAR, where no futex reaches).
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vmf_bb::segment::Segment;
use vmf_pal::process::ProcessId;

/// Most participants of one barrier or condition variable.
pub const MAX_PARTICIPANTS: usize = 4096;
/// Sleep between looks when a participant runs in another kernel (no futex reaches it).
pub(crate) const BOUNDED_SLEEP: Duration = Duration::from_micros(50);
/// How often a waiter checks that the participants are alive.
pub(crate) const LIVENESS_EVERY: Duration = Duration::from_millis(100);
const MAGIC_AT: u64 = 0;
const N_AT: u64 = 8;

/// How a waiter waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// Busy-wait (002_*'s non-blocking designs).
    Spin,
    /// Sleep in the kernel (futex, or bounded sleeps across kernels).
    Block,
    /// Spin, then yield, then block.
    Adaptive,
}

impl WaitKind {
    /// Parse `spin`, `block` or `adaptive`.
    pub fn parse(s: &str) -> Option<WaitKind> {
        match s {
            "spin" => Some(WaitKind::Spin),
            "block" => Some(WaitKind::Block),
            "adaptive" => Some(WaitKind::Adaptive),
            _ => None,
        }
    }

    /// The name [`WaitKind::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::Spin => "spin",
            WaitKind::Block => "block",
            WaitKind::Adaptive => "adaptive",
        }
    }
}

/// A mapped file with a header (magic, participant count), objects of the caller's at fixed offsets and
/// a participant table at `part` (24 bytes per participant).
pub(crate) struct SharedFile {
    pub seg: Segment,
    pub n: u32,
    part: u64,
    /// Every registered participant runs in this kernel (a futex reaches them all).
    one_kernel: std::cell::Cell<bool>,
    /// More participants than CPUs.
    pub oversubscribed: bool,
}

pub(crate) fn file_size(part: u64, n: usize) -> u64 {
    (part + n as u64 * 24).div_ceil(4096) * 4096
}

impl SharedFile {
    /// Create the file for `n` participants at `path` (which must not exist), with `magic`.
    pub fn create(path: &Path, n: usize, part: u64, magic: u64) -> Result<()> {
        if n == 0 || n > MAX_PARTICIPANTS {
            return Err(Error::InvalidArgument(format!("{n} participants (1..={MAX_PARTICIPANTS})")));
        }
        let io = |why: String| Error::Io { path: path.display().to_string(), why };
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| io(format!("cannot create it ({e})")))?;
        }
        let (seg, _) = Segment::open_or_create(path, file_size(part, n)).map_err(|e| io(e.to_string()))?;
        seg.at::<AtomicU64>(N_AT).unwrap().store(n as u64, Ordering::Relaxed);
        seg.at::<AtomicU64>(MAGIC_AT).unwrap().store(magic, Ordering::Release);
        Ok(())
    }

    /// Open the file at `path` as participant `index`; `what` names the object in errors.
    pub fn open(path: &Path, index: usize, part: u64, magic: u64, what: &str) -> Result<SharedFile> {
        SharedFile::open_with(path, index, |_| part, magic, what)
    }

    /// [`SharedFile::open`] where the participant table's offset depends on the participant count.
    pub fn open_with(path: &Path, index: usize, part_of: impl Fn(usize) -> u64, magic: u64, what: &str) -> Result<SharedFile> {
        let io = |why: String| Error::Io { path: path.display().to_string(), why };
        let seg = Segment::open_existing(path).map_err(|e| io(e.to_string()))?;
        if seg.len() < 16 {
            return Err(Error::Corrupt(format!("{what} file too small")));
        }
        let t0 = Instant::now();
        let m = || seg.at::<AtomicU64>(MAGIC_AT).unwrap().load(Ordering::Acquire);
        while m() == 0 && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if m() != magic {
            return Err(Error::Corrupt(format!("{} is not a vmfabric {what}", path.display())));
        }
        let n = seg.at::<AtomicU64>(N_AT).unwrap().load(Ordering::Relaxed);
        let part = if n == 0 || n > MAX_PARTICIPANTS as u64 { 0 } else { part_of(n as usize) };
        if n == 0 || n > MAX_PARTICIPANTS as u64 || seg.len() < file_size(part, n as usize) {
            return Err(Error::Corrupt(format!("{what} of {n} participants in {} bytes", seg.len())));
        }
        if index >= n as usize {
            return Err(Error::InvalidArgument(format!("participant {index} of a {n}-participant {what}")));
        }
        let f = SharedFile {
            seg,
            n: n as u32,
            part,
            one_kernel: std::cell::Cell::new(true),
            oversubscribed: n as usize > vmf_pal::available_cpus(),
        };
        f.register(index, ProcessId::current());
        Ok(f)
    }

    /// Enter `who` as participant `index` (in this kernel).
    fn register(&self, index: usize, who: ProcessId) {
        let at = self.part + index as u64 * 24;
        self.seg.at::<AtomicU64>(at).unwrap().store(who.pid as u64, Ordering::Relaxed);
        self.seg.at::<AtomicU64>(at + 8).unwrap().store(who.start_time, Ordering::Relaxed);
        self.seg.at::<AtomicU64>(at + 16).unwrap().store(vmf_pal::process::kernel_id(), Ordering::Release);
    }

    /// Tests: participant `index` registered by a process that has exited.
    #[cfg(test)]
    pub fn register_exited(&self, index: usize) {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id() as i32;
        c.wait().unwrap();
        self.register(index, ProcessId { pid, start_time: 0 });
    }

    /// The 32-bit word at `off` (an offset the caller laid out below `part`).
    pub fn u32at(&self, off: u64) -> &AtomicU32 {
        self.seg.at::<AtomicU32>(off).expect("validated at open")
    }

    /// Is participant `i` alive? (Unregistered ones, and those in other kernels, count as alive.)
    pub fn alive(&self, i: u64) -> (bool, u64) {
        let at = self.part + i * 24;
        let w = |o: u64| self.seg.at::<AtomicU64>(at + o).unwrap().load(Ordering::Acquire);
        let (pid, start, kernel) = (w(0), w(8), w(16));
        if kernel == 0 || kernel != vmf_pal::process::kernel_id() {
            return (true, pid);
        }
        let p = ProcessId { pid: pid.min(i32::MAX as u64) as i32, start_time: start };
        (p.is_alive(), pid)
    }

    /// Is every registered participant alive? (Also notes whether all share this kernel.)
    pub fn check_participants(&self, what: &str) -> Result<()> {
        let k = vmf_pal::process::kernel_id();
        let mut one = true;
        for i in 0..self.n as u64 {
            let kernel = self.seg.at::<AtomicU64>(self.part + i * 24 + 16).unwrap().load(Ordering::Acquire);
            if kernel != 0 && kernel != k {
                one = false;
            }
            let (alive, pid) = self.alive(i);
            if !alive {
                return Err(Error::InvalidArgument(format!("{what} participant {i} (pid {pid}) died")));
            }
        }
        self.one_kernel.set(one);
        Ok(())
    }

    /// Wait until the word at `word` no longer holds `v` (or `done()` says so), `kind`'s way; sleepers
    /// count themselves in the word at `sleepers` so that changers know to wake them. `spin_budget`:
    /// looks before yielding or sleeping (`Spin` ignores it and spins, yielding now and then after about
    /// 100 us). `check` is called at every liveness interval (dead participants, a dead lock holder).
    pub fn wait_change(
        &self,
        word: u64,
        sleepers: u64,
        v: u32,
        kind: WaitKind,
        mut check: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let w = self.u32at(word);
        let moved = || w.load(Ordering::Acquire) != v;
        let spin_budget: u32 = match kind {
            WaitKind::Spin => u32::MAX,
            WaitKind::Block => 0,
            // Oversubscribed: straight to yielding (8 ranks on 2 CPUs: 1.6e5 barriers/s against 1.4e5 after
            // 16 spins; every spin delays a participant that has not arrived).
            WaitKind::Adaptive if self.oversubscribed => 0,
            WaitKind::Adaptive => 4000,
        };
        let mut i = 0u32;
        let mut last_check = Instant::now();
        while i < spin_budget {
            if moved() {
                return Ok(());
            }
            i += 1;
            // A spinner that has spun long (about 100 us) gives way now and then: with more participants
            // than CPUs the ones it waits for need its CPU.
            if i > 1 << 15 && i % 256 == 0 {
                vmf_pal::yield_now();
            } else {
                vmf_pal::cpu_relax();
            }
            if i % 65536 == 0 && last_check.elapsed() > LIVENESS_EVERY {
                check()?;
                last_check = Instant::now();
            }
        }
        // Yield phase (adaptive): hand the CPU to a participant that has not arrived yet.
        if kind == WaitKind::Adaptive {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(if self.oversubscribed { 2000 } else { 50 }) {
                if moved() {
                    return Ok(());
                }
                vmf_pal::yield_now();
            }
        }
        // Block phase.
        check()?;
        let mut last_check = Instant::now();
        loop {
            if moved() {
                return Ok(());
            }
            if self.one_kernel.get() {
                let sl = self.u32at(sleepers);
                sl.fetch_add(1, Ordering::SeqCst);
                if w.load(Ordering::SeqCst) == v {
                    vmf_pal::futex::wait(w, v, Some(LIVENESS_EVERY));
                }
                sl.fetch_sub(1, Ordering::SeqCst);
            } else {
                std::thread::sleep(BOUNDED_SLEEP);
            }
            if last_check.elapsed() >= LIVENESS_EVERY {
                check()?;
                last_check = Instant::now();
            }
        }
    }

    /// Spin until the word at `word` satisfies `reached` (yielding now and then after about 100 us, as
    /// [`WaitKind::Spin`] does); `check` at every liveness interval.
    pub fn wait_until(&self, word: u64, reached: impl Fn(u32) -> bool, mut check: impl FnMut() -> Result<()>) -> Result<()> {
        let w = self.u32at(word);
        let mut i = 0u32;
        let mut last_check = Instant::now();
        loop {
            if reached(w.load(Ordering::Acquire)) {
                return Ok(());
            }
            i = i.wrapping_add(1);
            if i > 1 << 15 && i % 256 == 0 {
                vmf_pal::yield_now();
            } else if i > 64 {
                // The first looks load back to back: a pause costs ~40 ns here, as much as the wait.
                vmf_pal::cpu_relax();
            }
            if i % 65536 == 0 && last_check.elapsed() > LIVENESS_EVERY {
                check()?;
                last_check = Instant::now();
            }
        }
    }

    /// After changing the word at `word`: wake up to `n` of its sleepers (none are counted: no system call).
    pub fn wake(&self, word: u64, sleepers: u64, n: u32) {
        if self.u32at(sleepers).load(Ordering::SeqCst) != 0 {
            vmf_pal::futex::wake(self.u32at(word), n);
        }
    }
}
