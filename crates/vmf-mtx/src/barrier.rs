//! Process-shared barriers (002_*'s barriers, and its condition-variable designs, on a shared file).
//!
//! Two algorithms, by [`BarrierKind`]:
//!
//! - `Spin`: a dissemination barrier. In round k of barrier number e, participant i writes e into its
//!   partner's flag (i + 2^k mod n) and waits until its own flag for round k has reached e; every flag has
//!   one writer and one reader and a cache line of its own, so two participants exchange one line each
//!   way per barrier instead of meeting on a shared counter (2 ranks: about twice the barriers per second
//!   of the central barrier when a cache-line transfer is slow). Waiters spin (002_*'s spin/atomic barrier;
//!   after about 100 us they yield the CPU every 256 looks, so oversubscribed participants still progress).
//! - `Block` and `Adaptive`: a sense-reversing central barrier: each arrival increments `count`; the last
//!   one resets it and advances the generation word `gen`, which the others wait on (one wake-up reaches
//!   every sleeper):
//! - `Block`: sleep in the kernel at once — a futex on `gen` when every participant runs in this kernel,
//!   else (participants in other VMs over an ivshmem BAR, where a futex cannot reach) sleeps of
//!   `BOUNDED_SLEEP`, looking at `gen` between them;
//! - `Adaptive`: spin a little (not at all when the host's CPUs are oversubscribed), then yield,
//!   then block as above (vmfabric's wait policy).
//!
//! Participants register (index, pid, kernel) when they open the barrier; a waiter checks now and then
//! that all are alive, so a dead participant is an error, never a hang.
use crate::shared::{SharedFile, WaitKind};
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::Ordering;

const MAGIC: u64 = u64::from_le_bytes(*b"VMFBAR01");
const B_COUNT: u64 = 64; // own cache line: arrivals
const B_GEN: u64 = 128; // own cache line: what waiters watch
const B_SLEEPERS: u64 = 132;
/// Dissemination flags: per participant and round, a 32-bit word on a 64-byte line of its own.
const B_FLAGS: u64 = 192;
/// Rounds of the dissemination barrier provided for (2^12 = MAX_PARTICIPANTS).
const ROUNDS: u64 = 12;
/// Participants: (pid, start, kernel) per index, 24 bytes each, after the flags.
fn part_at(n: usize) -> u64 {
    B_FLAGS + n as u64 * ROUNDS * 64
}

fn rounds(n: u32) -> u32 {
    32 - (n.max(1) - 1).leading_zeros()
}

/// How barrier waiters wait.
pub type BarrierKind = WaitKind;

/// One participant's handle on a shared barrier.
pub struct Barrier {
    f: SharedFile,
    kind: BarrierKind,
    me: u32,
    /// Barriers this participant has completed (the dissemination barrier's epoch).
    epoch: u32,
}

impl Barrier {
    /// Create the barrier file for `n` participants at `path` (which must not exist).
    pub fn create(path: &Path, n: usize) -> Result<()> {
        SharedFile::create(path, n, part_at(n), MAGIC)
    }

    /// Open the barrier at `path` as participant `index` (0..n), waiting `kind`'s way. Every participant
    /// must open it before the first [`Barrier::wait`] can complete.
    pub fn open(path: &Path, index: usize, kind: BarrierKind) -> Result<Barrier> {
        Ok(Barrier {
            f: SharedFile::open_with(path, index, part_at, MAGIC, "barrier")?,
            kind,
            me: index as u32,
            epoch: 0,
        })
    }

    /// Number of participants.
    pub fn participants(&self) -> usize {
        self.f.n as usize
    }

    /// Wait until all participants have called `wait` for this round.
    pub fn wait(&mut self) -> Result<()> {
        if self.kind == BarrierKind::Spin {
            return self.wait_dissemination();
        }
        let n = self.f.n;
        let gen = self.f.u32at(B_GEN);
        let g = gen.load(Ordering::Acquire);
        let count = self.f.u32at(B_COUNT);
        let arrived = count.fetch_add(1, Ordering::AcqRel) + 1;
        if arrived > n {
            return Err(Error::Corrupt(format!("{arrived} arrivals at a {n}-participant barrier")));
        }
        if arrived == n {
            count.store(0, Ordering::Relaxed);
            gen.store(g.wrapping_add(1), Ordering::SeqCst);
            if self.kind != BarrierKind::Spin {
                self.f.wake(B_GEN, B_SLEEPERS, u32::MAX);
            }
            return Ok(());
        }
        let f = &self.f;
        f.wait_change(B_GEN, B_SLEEPERS, g, self.kind, || f.check_participants("barrier"))
    }
}

impl Barrier {
    fn flag(&self, i: u32, k: u32) -> u64 {
        B_FLAGS + (i as u64 * ROUNDS + k as u64) * 64
    }

    fn wait_dissemination(&mut self) -> Result<()> {
        let n = self.f.n;
        let e = self.epoch.wrapping_add(1);
        for k in 0..rounds(n) {
            let to = (self.me + (1 << k)) % n;
            self.f.u32at(self.flag(to, k)).store(e, Ordering::Release);
            let mine = self.flag(self.me, k);
            let f = &self.f;
            // Reached e (counted with wrap-around: a fast partner may already be at e + 1).
            f.wait_until(mine, |v| v.wrapping_sub(e) as i32 >= 0, || f.check_participants("barrier"))?;
        }
        self.epoch = e;
        Ok(())
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
        for (kind, n) in [(BarrierKind::Spin, 2), (BarrierKind::Spin, 3), (BarrierKind::Block, 5), (BarrierKind::Adaptive, 5)] {
            let p = Arc::new(tmp(&format!("{}-{n}", kind.name())));
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
        b.f.register_exited(1);
        let e = b.wait().unwrap_err();
        assert!(e.to_string().contains("participant 1"), "{e}");
        assert!(Barrier::open(&p, 2, BarrierKind::Spin).is_err());
        std::fs::remove_file(&p).unwrap();
    }
}
