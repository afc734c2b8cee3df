//! Gang turns: vmfabric jobs that share a host's CPUs take turns with them.
//!
//! Two jobs whose ranks together outnumber the CPUs each assume the CPUs are theirs: a waiting rank spins
//! (adaptive policy) while the rank it waits for sits in the run queue behind a spinner of the other job,
//! so every message costs a scheduler time slice (two 2-rank ping-pong jobs on 2 CPUs ran 30-130x slower
//! than one alone). Handing every message through the scheduler (sleep/wake) is better but still slow.
//! Instead, jobs that know of each other take turns, like gang scheduling: time is cut into slices
//! (`VMF_GANG_SLICE_US`, 5 ms) and the slices go round the active jobs; a rank that waits during another
//! job's slice sleeps until its own, so within a slice one job has the CPUs and its messages move at full
//! speed.
//!
//! The host-wide registry is a 4 KiB file `vmf-gang-<uid>` in the region directory (per host, like the
//! regions): 63 entries of (job hash, last time a rank of the job waited, its ranks on this host). A rank
//! refreshes its job's entry at most every millisecond while it waits; jobs whose ranks waited in the last
//! 50 ms are active; turns apply only when two or more jobs are active and their ranks outnumber the CPUs.
//! Every job computes the same turn from CLOCK_MONOTONIC and the same sorted list, so no lock or owner is
//! needed; an entry nobody refreshed for 10 s is reused. Everything read from the file only steers
//! scheduling: a bad value can cost time, never memory safety.
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const MAGIC: u64 = u64::from_le_bytes(*b"VMFGANG1");
const FILE_LEN: usize = 4096;
const ENTRY: usize = 64;
const ENTRIES: usize = FILE_LEN / ENTRY - 1;
/// A job whose ranks waited within this takes part in the turns.
const ACTIVE_NS: u64 = 50_000_000;
/// An entry nobody refreshed for this long is free.
const STALE_NS: u64 = 10_000_000_000;
/// Refresh the own entry and the view of the others at most this often.
const REFRESH_NS: u64 = 1_000_000;
/// Longest single sleep for another job's turn (the turn is recomputed after it).
const MAX_SLEEP_NS: u64 = 10_000_000;

/// This rank's membership in the host's registry.
pub struct Gang {
    seg: vmf_bb::segment::Segment,
    job: u64,
    ranks: u64,
    cpus: u64,
    slice_ns: u64,
    entry: usize,
    next_refresh: u64,
    crowded: bool,
    nactive: u64,
    index: u64,
}

impl Gang {
    /// Join the registry in `dir` for job `job` with `ranks` ranks on this host and `cpus` CPUs. `None`
    /// if the file cannot be made or mapped (the job then simply does not take turns).
    pub fn join(dir: &Path, job: u64, ranks: usize, cpus: usize, slice: Duration) -> Option<Gang> {
        if slice.is_zero() {
            return None;
        }
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let path = dir.join(format!("vmf-gang-{uid}"));
        let (seg, _) = vmf_bb::segment::Segment::open_or_create(&path, FILE_LEN as u64).ok()?;
        let mut g = Gang {
            seg,
            job: job.max(1),
            ranks: ranks.max(1) as u64,
            cpus: cpus.max(1) as u64,
            slice_ns: slice.as_nanos().min(u64::MAX as u128) as u64,
            entry: 0,
            next_refresh: 0,
            crowded: false,
            nactive: 1,
            index: 0,
        };
        let _ = g.word(0, 0).compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
        if g.word(0, 0).load(Ordering::Acquire) != MAGIC {
            return None; // not our format: leave it alone
        }
        g.claim(crate::engine::migrate::monotonic_ns())?;
        Some(g)
    }

    /// Word `w` of entry `e` (entry 0 is the header).
    fn word(&self, e: usize, w: usize) -> &AtomicU64 {
        debug_assert!(e <= ENTRIES && w < ENTRY / 8);
        self.seg
            .at::<AtomicU64>((e * ENTRY + w * 8) as u64)
            .expect("registry words lie inside the mapped file")
    }

    /// Find this job's entry or take a free (or stale) one.
    fn claim(&mut self, now: u64) -> Option<()> {
        for e in 1..=ENTRIES {
            if self.word(e, 0).load(Ordering::Acquire) == self.job {
                self.entry = e;
                return Some(());
            }
        }
        for e in 1..=ENTRIES {
            let cur = self.word(e, 0).load(Ordering::Acquire);
            let last = self.word(e, 1).load(Ordering::Acquire);
            let free = cur == 0 || now.saturating_sub(last) > STALE_NS;
            if free
                && self
                    .word(e, 0)
                    .compare_exchange(cur, self.job, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.word(e, 1).store(now, Ordering::Release);
                self.word(e, 2).store(self.ranks, Ordering::Release);
                self.entry = e;
                return Some(());
            }
        }
        None
    }

    fn refresh(&mut self, now: u64) {
        self.next_refresh = now + REFRESH_NS;
        if self.word(self.entry, 0).load(Ordering::Acquire) != self.job && self.claim(now).is_none() {
            self.crowded = false;
            return;
        }
        self.word(self.entry, 1).store(now, Ordering::Release);
        self.word(self.entry, 2).store(self.ranks, Ordering::Release);
        let mut active: Vec<u64> = Vec::with_capacity(4);
        let mut total = 0u64;
        for e in 1..=ENTRIES {
            let job = self.word(e, 0).load(Ordering::Acquire);
            let last = self.word(e, 1).load(Ordering::Acquire);
            if job != 0 && now.saturating_sub(last) < ACTIVE_NS && !active.contains(&job) {
                active.push(job);
                total = total.saturating_add(self.word(e, 2).load(Ordering::Acquire).min(1 << 20));
            }
        }
        active.sort_unstable();
        self.nactive = active.len().max(1) as u64;
        self.index = active.iter().position(|&j| j == self.job).unwrap_or(0) as u64;
        self.crowded = self.nactive >= 2 && total > self.cpus;
    }

    /// Called by a waiting rank (at `now`, CLOCK_MONOTONIC ns): how long to stay off the CPU because it
    /// is another job's turn, or `None` to go on waiting as usual.
    pub fn off_turn(&mut self, now: u64) -> Option<Duration> {
        if now >= self.next_refresh {
            self.refresh(now);
        }
        if !self.crowded {
            return None;
        }
        let slot = now / self.slice_ns;
        let ahead = (self.index + self.nactive - slot % self.nactive) % self.nactive;
        if ahead == 0 {
            return None;
        }
        let start = (slot + ahead).saturating_mul(self.slice_ns);
        Some(Duration::from_nanos(start.saturating_sub(now).clamp(1, MAX_SLEEP_NS)))
    }

    /// True while turns are being taken on this host (two or more jobs, more ranks than CPUs).
    pub fn crowded(&self) -> bool {
        self.crowded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("vmf-gang-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn two_crowded_jobs_take_alternate_slices() {
        let d = dir("alt");
        let slice = Duration::from_millis(5);
        let mut a = Gang::join(&d, 11, 2, 2, slice).unwrap();
        let mut b = Gang::join(&d, 22, 2, 2, slice).unwrap();
        let mut a2 = Gang::join(&d, 11, 2, 2, slice).unwrap(); // a second rank of job 11
        assert_eq!(a.entry, a2.entry);
        assert_ne!(a.entry, b.entry);
        let t0 = crate::engine::migrate::monotonic_ns();
        // Both active now.
        a.off_turn(t0);
        b.off_turn(t0);
        a2.off_turn(t0);
        let mut at = t0 + 2 * REFRESH_NS;
        for _ in 0..20 {
            let (x, y, x2) = (a.off_turn(at), b.off_turn(at), a2.off_turn(at));
            assert!(a.crowded() && b.crowded());
            // Exactly one of the two jobs runs, and both ranks of job 11 agree.
            assert!(x.is_none() != y.is_none(), "{x:?} {y:?}");
            assert_eq!(x.is_none(), x2.is_none());
            let wait = x.or(y).unwrap();
            assert!(wait <= slice, "{wait:?}");
            at += slice.as_nanos() as u64 / 2;
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn no_turns_alone_or_with_cpus_for_everyone_or_after_a_job_went_quiet() {
        let d = dir("alone");
        let slice = Duration::from_millis(5);
        let mut a = Gang::join(&d, 1, 2, 2, slice).unwrap();
        let t0 = crate::engine::migrate::monotonic_ns();
        assert!(a.off_turn(t0).is_none() && !a.crowded());
        // Enough CPUs for both jobs: no turns.
        let mut c = Gang::join(&d, 3, 2, 4, slice).unwrap();
        let mut a4 = Gang::join(&d, 1, 2, 4, slice).unwrap();
        assert!(c.off_turn(t0 + 1).is_none() && a4.off_turn(t0 + 1).is_none());
        assert!(!c.crowded());
        // A crowded pair, then job 3 stops waiting: after ACTIVE_NS job 1 runs alone again.
        let mut b = Gang::join(&d, 3, 2, 2, slice).unwrap();
        b.off_turn(t0 + 2);
        a.next_refresh = 0;
        a.off_turn(t0 + 3);
        assert!(a.crowded());
        let later = t0 + ACTIVE_NS + 10 * REFRESH_NS;
        assert!(a.off_turn(later).is_none() && !a.crowded());
        let _ = std::fs::remove_dir_all(&d);
    }
}
