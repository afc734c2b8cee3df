//! Process-shared barriers (002_*'s barriers, and its condition-variable designs, on a shared file).
//!
//! A sense-reversing central barrier: each arrival increments `count`; the last one resets it and
//! advances the generation word `gen`, which the others wait on. How they wait is the [`BarrierKind`]:
//!
//! - `Spin`: load `gen` until it moves (002_*'s spin/atomic barrier; after about 100 us it yields the CPU
//!   every 256 looks, so oversubscribed participants still progress);
//! - `Block`: sleep in the kernel at once — a futex on `gen` when every participant runs in this kernel,
//!   else (participants in other VMs over an ivshmem BAR, where a futex cannot reach) sleeps of
//!   `BOUNDED_SLEEP`, looking at `gen` between them;
//! - `Adaptive`: spin a little (not at all when the host's CPUs are oversubscribed), then yield,
//!   then block as above (vmfabric's wait policy).
//!
//! Participants register (index, pid, kernel) when they open the barrier; a waiter checks now and then
//! that all are alive, so a dead participant is an error, never a hang.
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vmf_bb::segment::Segment;
use vmf_pal::process::ProcessId;

const MAGIC: u64 = u64::from_le_bytes(*b"VMFBAR01");
const B_MAGIC: u64 = 0;
const B_N: u64 = 8;
const B_COUNT: u64 = 64; // own cache line: arrivals
const B_GEN: u64 = 128; // own cache line: what waiters watch
const B_SLEEPERS: u64 = 132;
const B_PART: u64 = 192; // participants: (pid, start, kernel) per index, 24 bytes each
/// Most participants of one barrier.
pub const MAX_PARTICIPANTS: usize = 4096;
const BOUNDED_SLEEP: Duration = Duration::from_micros(50);
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// How waiters wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    /// Busy-wait on the generation word.
    Spin,
    /// Sleep in the kernel (futex, or bounded sleeps across kernels).
    Block,
    /// Spin, then yield, then block.
    Adaptive,
}

impl BarrierKind {
    /// Parse `spin`, `block` or `adaptive`.
    pub fn parse(s: &str) -> Option<BarrierKind> {
        match s {
            "spin" => Some(BarrierKind::Spin),
            "block" => Some(BarrierKind::Block),
            "adaptive" => Some(BarrierKind::Adaptive),
            _ => None,
        }
    }

    /// The name [`BarrierKind::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            BarrierKind::Spin => "spin",
            BarrierKind::Block => "block",
            BarrierKind::Adaptive => "adaptive",
        }
    }
}

/// One participant's handle on a shared barrier.
pub struct Barrier {
    seg: Segment,
    n: u32,
    kind: BarrierKind,
    /// Every participant runs in this kernel (a futex reaches them all).
    one_kernel: std::cell::Cell<bool>,
    oversubscribed: bool,
}

fn size_for(n: usize) -> u64 {
    (B_PART + n as u64 * 24).div_ceil(4096) * 4096
}

impl Barrier {
    /// Create the barrier file for `n` participants at `path` (which must not exist).
    pub fn create(path: &Path, n: usize) -> Result<()> {
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
        let (seg, _) = Segment::open_or_create(path, size_for(n)).map_err(|e| io(e.to_string()))?;
        seg.at::<AtomicU64>(B_N).unwrap().store(n as u64, Ordering::Relaxed);
        seg.at::<AtomicU64>(B_MAGIC).unwrap().store(MAGIC, Ordering::Release);
        Ok(())
    }

    /// Open the barrier at `path` as participant `index` (0..n), waiting `kind`'s way. Every participant
    /// must open it before the first [`Barrier::wait`] can complete.
    pub fn open(path: &Path, index: usize, kind: BarrierKind) -> Result<Barrier> {
        let io = |why: String| Error::Io { path: path.display().to_string(), why };
        let seg = Segment::open_existing(path).map_err(|e| io(e.to_string()))?;
        if seg.len() < B_PART {
            return Err(Error::Corrupt("barrier file too small".into()));
        }
        let t0 = Instant::now();
        let magic = || seg.at::<AtomicU64>(B_MAGIC).unwrap().load(Ordering::Acquire);
        while magic() == 0 && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if magic() != MAGIC {
            return Err(Error::Corrupt(format!("{} is not a vmfabric barrier", path.display())));
        }
        let n = seg.at::<AtomicU64>(B_N).unwrap().load(Ordering::Relaxed);
        if n == 0 || n > MAX_PARTICIPANTS as u64 || seg.len() < size_for(n as usize) {
            return Err(Error::Corrupt(format!("barrier of {n} participants in {} bytes", seg.len())));
        }
        if index >= n as usize {
            return Err(Error::InvalidArgument(format!("participant {index} of a {n}-participant barrier")));
        }
        let me = ProcessId::current();
        let at = B_PART + index as u64 * 24;
        seg.at::<AtomicU64>(at).unwrap().store(me.pid as u64, Ordering::Relaxed);
        seg.at::<AtomicU64>(at + 8).unwrap().store(me.start_time, Ordering::Relaxed);
        seg.at::<AtomicU64>(at + 16).unwrap().store(vmf_pal::process::kernel_id(), Ordering::Release);
        let oversubscribed = n as usize > vmf_pal::available_cpus();
        Ok(Barrier {
            seg,
            n: n as u32,
            kind,
            one_kernel: std::cell::Cell::new(true),
            oversubscribed,
        })
    }

    /// Number of participants.
    pub fn participants(&self) -> usize {
        self.n as usize
    }

    fn u32at(&self, off: u64) -> &AtomicU32 {
        self.seg.at::<AtomicU32>(off).expect("validated at open")
    }

    /// Is every registered participant alive? (Unregistered ones, and those in other kernels, count as
    /// alive; also notes whether all share this kernel.)
    fn check_participants(&self) -> Result<()> {
        let k = vmf_pal::process::kernel_id();
        let mut one = true;
        for i in 0..self.n as u64 {
            let at = B_PART + i * 24;
            let w = |o: u64| self.seg.at::<AtomicU64>(at + o).unwrap().load(Ordering::Acquire);
            let (pid, start, kernel) = (w(0), w(8), w(16));
            if kernel == 0 {
                continue;
            }
            if kernel != k {
                one = false;
                continue;
            }
            let p = ProcessId { pid: pid.min(i32::MAX as u64) as i32, start_time: start };
            if !p.is_alive() {
                return Err(Error::InvalidArgument(format!(
                    "barrier participant {i} (pid {pid}) died"
                )));
            }
        }
        self.one_kernel.set(one);
        Ok(())
    }

    /// Wait until all participants have called `wait` for this round.
    pub fn wait(&mut self) -> Result<()> {
        let gen = self.u32at(B_GEN);
        let g = gen.load(Ordering::Acquire);
        let count = self.u32at(B_COUNT);
        let arrived = count.fetch_add(1, Ordering::AcqRel) + 1;
        if arrived > self.n {
            return Err(Error::Corrupt(format!("{arrived} arrivals at a {}-participant barrier", self.n)));
        }
        if arrived == self.n {
            count.store(0, Ordering::Relaxed);
            gen.store(g.wrapping_add(1), Ordering::SeqCst);
            if self.kind != BarrierKind::Spin && self.u32at(B_SLEEPERS).load(Ordering::SeqCst) != 0 {
                vmf_pal::futex::wake(gen, u32::MAX);
            }
            return Ok(());
        }
        let moved = || gen.load(Ordering::Acquire) != g;
        // Spin phase.
        let spin_budget: u32 = match self.kind {
            BarrierKind::Spin => u32::MAX,
            BarrierKind::Block => 0,
            // Oversubscribed: straight to yielding (8 ranks on 2 CPUs: 1.6e5 barriers/s against 1.4e5 after
            // 16 spins; every spin delays a participant that has not arrived).
            BarrierKind::Adaptive if self.oversubscribed => 0,
            BarrierKind::Adaptive => 4000,
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
                self.check_participants()?;
                last_check = Instant::now();
            }
        }
        // Yield phase (adaptive): hand the CPU to a participant that has not arrived yet.
        if self.kind == BarrierKind::Adaptive {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(if self.oversubscribed { 2000 } else { 50 }) {
                if moved() {
                    return Ok(());
                }
                vmf_pal::yield_now();
            }
        }
        // Block phase.
        self.check_participants()?;
        let mut last_check = Instant::now();
        loop {
            if moved() {
                return Ok(());
            }
            if self.one_kernel.get() {
                let sl = self.u32at(B_SLEEPERS);
                sl.fetch_add(1, Ordering::SeqCst);
                if gen.load(Ordering::SeqCst) == g {
                    vmf_pal::futex::wait(gen, g, Some(LIVENESS_EVERY));
                }
                sl.fetch_sub(1, Ordering::SeqCst);
            } else {
                std::thread::sleep(BOUNDED_SLEEP);
            }
            if last_check.elapsed() >= LIVENESS_EVERY {
                self.check_participants()?;
                last_check = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn tmp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("vmf-bar-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// No participant leaves round k before every participant has entered it, for each kind, with more
    /// participants than CPUs too.
    #[test]
    fn no_participant_passes_early_for_every_kind_works() {
        for kind in [BarrierKind::Spin, BarrierKind::Block, BarrierKind::Adaptive] {
            let n = if kind == BarrierKind::Spin { 2 } else { 5 };
            let p = Arc::new(tmp(kind.name()));
            Barrier::create(&p, n).unwrap();
            let arrivals = Arc::new(AtomicUsize::new(0));
            let rounds = 1000;
            let hs: Vec<_> = (0..n)
                .map(|i| {
                    let (p, arrivals) = (p.clone(), arrivals.clone());
                    std::thread::spawn(move || {
                        let mut b = Barrier::open(&p, i, kind).unwrap();
                        for r in 1..=rounds {
                            arrivals.fetch_add(1, Ordering::SeqCst);
                            b.wait().unwrap();
                            let seen = arrivals.load(Ordering::SeqCst);
                            assert!(seen >= r * n, "{kind:?}: left round {r} having seen {seen} arrivals");
                            b.wait().unwrap(); // nobody starts round r+1 before all checked round r
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(arrivals.load(Ordering::SeqCst), rounds * n);
            std::fs::remove_file(&*p).unwrap();
        }
    }

    /// A participant that died is reported by the waiters instead of hanging them.
    #[test]
    fn a_dead_participant_is_an_error_not_a_hang_fails() {
        let p = tmp("dead");
        Barrier::create(&p, 2).unwrap();
        let mut b = Barrier::open(&p, 0, BarrierKind::Block).unwrap();
        // Participant 1 registered by a process that has exited.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id() as u64;
        c.wait().unwrap();
        let at = B_PART + 24;
        b.seg.at::<AtomicU64>(at).unwrap().store(pid, Ordering::Relaxed);
        b.seg.at::<AtomicU64>(at + 8).unwrap().store(0, Ordering::Relaxed);
        b.seg.at::<AtomicU64>(at + 16).unwrap().store(vmf_pal::process::kernel_id(), Ordering::Release);
        let e = b.wait().unwrap_err();
        assert!(e.to_string().contains("participant 1"), "{e}");
        assert!(Barrier::open(&p, 2, BarrierKind::Spin).is_err());
        std::fs::remove_file(&p).unwrap();
    }
}
