//! Shared-memory collectives: small blocking collectives among the ranks of one region.
//!
//! On first use, every member of a communicator whose ranks all share this rank's region allocates an
//! *area* from its own partition of the region's shared pool and the offsets are exchanged once (an
//! allgather over point-to-point). An area is a control line — reader count and `done` sequence number
//! — and two data buffers used alternately by successive collectives (sequence `k` uses buffer `k & 1`).
//! Each buffer starts with its `arrive` stamp, followed at once by the data, so a small contribution and
//! its stamp travel between caches as one line.
//!
//! Collective number `k` on the communicator (every member numbers them alike) works like this:
//! - a rank that publishes data first makes sure every member's `done` is at least `k - 2` (nobody still
//!   reads the buffer it is about to overwrite; usually known without a load, since seeing a member's
//!   stamp `k - 1` implies its `done >= k - 2`), copies its contribution into its buffer `k & 1` and
//!   stores the stamp `k` (release);
//! - a rank that needs another's data waits until that rank's stamp in buffer `k & 1` is at least `k`
//!   (acquire) and copies or reduces straight out of the other's buffer;
//! - then it stores `done = k` and rings the doorbell of any member that sleeps.
//!
//! So a broadcast is one copy in by the root and one copy out per reader, with no message, no matching
//! and no system call; an allreduce is one copy in per rank and a reduction of all contributions in rank
//! order by every rank, grouped as MPICH groups it (`op::Tree`; bit-identical results everywhere, and the
//! same as MPICH's and our point-to-point schedules', any op, commutative or not); a barrier is one
//! store and `n - 1` loads. A rank that waits for others uses the engine's waiting policy (spin, yield,
//! sleep on its doorbell) while still progressing point-to-point traffic, and dead peers are detected
//! as in any other wait.
//!
//! Used for Barrier, Bcast, Reduce, Allreduce, Gather, Scatter, Allgather and Alltoall when the data a
//! rank publishes fits one buffer ([`DATA`] bytes) — a decision every member makes alike from the
//! arguments the standard requires to match. A larger Bcast, Allreduce or Alltoall (up to [`BIG_MAX`])
//! uses each publishing member's *big* block instead: a second pool block, allocated when first needed,
//! whose halves alternate from one big collective to the next; a flag in the buffer beside the stamp says
//! whether the member could get it, and if anyone could not, all take the point-to-point schedule for
//! that call. Not used on emulated hosts (a rank may move to another
//! region), with `VMF_SHM_COLL=0`, or when the pool is exhausted (all members then agree to use the
//! point-to-point schedules). Everything read from the area is a sequence number that is only compared,
//! so a corrupt peer can stall a collective (until liveness checks end the job) but not misdirect a copy.
use crate::coll::{check_root, red_packed};
use crate::datatype::{self, Lay};
use crate::op::{self, MPI_Op};
use crate::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use vmf_core::engine::{Awaiting, Engine};
use vmf_core::Op as COp;

/// Data bytes of each buffer of an area.
pub(crate) const DATA: usize = 8192;
const CTL: usize = 128;
/// Offset of the data in a buffer (after the stamp; 16 keeps every basic type aligned).
const HDR: usize = 16;
const BUF: usize = (HDR + DATA).div_ceil(128) * 128;
const AREA: usize = CTL + 2 * BUF;
/// Largest communicator served (each wait reads one line per member).
const MAX_RANKS: usize = 64;
/// Largest collective (bytes one rank publishes) served through a member's *big* block: a second pool
/// block, allocated when first needed and grown on demand, with two halves used alternately. A fixed
/// limit, so that every member decides alike; at most 8 MiB of blocks per communicator and rank, half the
/// default pool, which leaves room for `MPI_Alloc_mem` and the areas of other communicators.
const BIG_MAX: usize = 4 << 20;
/// Largest such alltoall when some member has a core of its own: beyond it the pipelined point-to-point
/// exchange, where sender and receiver copy at the same time, measured faster (2 ranks, 1 MiB blocks:
/// 78-82 µs against 101-132), while with ranks outnumbering cores the big blocks win at every size
/// (4 ranks on 2 cores, 256 KiB blocks: 89-107 µs against 180-191). An alltoall of predefined types
/// goes in rounds instead, which beat the point-to-point exchange at every size: no limit there.
const BIG_CORE_MAX: usize = 1 << 20;
/// A large alltoall of predefined types publishes at most this many bytes per round (a chunk of every
/// block; see [`alltoall_rounds`]; 4 ranks on 2 cores, 1 MiB blocks: 440-540 µs with 512 KiB rounds,
/// 480-510 with 256 KiB, 455-670 with 1 MiB, 570-640 with 2 MiB) ...
const ROUND_MAX: usize = 512 << 10;
/// ... and goes in two rounds at least once it publishes more than this in all.
const ROUND_MIN: usize = 512 << 10;

#[repr(C)]
struct Ctl {
    /// Members that still use this area (first word: see `Pool::release_shared`).
    refs: AtomicU32,
    _r: u32,
    done: AtomicU64,
    /// Barriers: the last barrier every member was seen to enter (written by rank 0 only).
    release: AtomicU64,
    /// Region offset of the owner's big block (0: none) and the bytes of each of its halves; written by
    /// the owner before the stamp of the collective that first uses them.
    big_off: AtomicU64,
    big_half: AtomicU64,
}

/// The shared-memory state of one communicator.
#[derive(Default)]
pub(crate) enum Shm {
    /// Not decided yet (decided at the first small blocking collective).
    #[default]
    Unknown,
    /// Point-to-point schedules only.
    Off,
    On(Box<Area>),
}

pub(crate) struct Area {
    /// The communicator's collective context: once revoked (MPIX_Comm_revoke), waits end with
    /// MPIX_ERR_REVOKED.
    ctx: u32,
    /// Sequence number of the last collective.
    seq: u64,
    me: usize,
    /// Comm rank → world rank.
    world: Vec<usize>,
    /// Each member's area, validated at setup.
    areas: Vec<*mut u8>,
    /// Every member is known to have finished at least this collective (saves loading `done` lines).
    known_done: u64,
    /// Every member's host has more ranks than cores (from the setup exchange: the same on all members).
    all_oversub: bool,
    /// This rank's big block and the bytes of each half.
    big: Option<(*mut u8, usize)>,
    /// Members' big blocks as last validated: (offset, half, pointer).
    peer_big: Vec<Option<(u64, usize, *mut u8)>>,
    /// The half the next big collective uses, and the last collective number of the call that last used
    /// each half (readers are done with it once every member's `done` reaches that number).
    big_turn: usize,
    big_last: [u64; 2],
    /// Ranks outnumber this host's cores (this rank's view).
    oversub: bool,
    /// The member whose barrier release this rank waits for instead of every arrival (None: every
    /// arrival). See [`Area::fresh`].
    lead: Option<usize>,
    /// The last collective was a barrier.
    after_barrier: bool,
    /// The number of the last barrier.
    last_barrier: u64,
    /// Members pinned to this rank's CPU (see [`Area::wait_members`]).
    mates: Vec<usize>,
    /// This rank and every member run on one known CPU each.
    pinned: bool,
    /// How this rank reduces the members' contributions: [`op::Tree::Doubling`] (allreduce) and
    /// [`op::Tree::Binomial`] (reduce), for the member count.
    plans: [op::Plan; 2],
    /// Partial results of reductions ([`fold`]).
    scratch: Vec<Line>,
}

/// A cache line of [`fold`]'s scratch (aligned for every type a reduction handles).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// True when the communicator has a shared-memory area and every member reported oversubscription.
pub(crate) fn all_oversubscribed(s: &Shm) -> bool {
    matches!(s, Shm::On(a) if a.all_oversub)
}

#[inline]
fn ctl<'a>(a: *mut u8) -> &'a Ctl {
    // SAFETY: areas are validated, 128-aligned pool blocks of AREA bytes that stay mapped while the
    // communicator lives; Ctl is atomics only.
    unsafe { &*(a as *const Ctl) }
}

/// The `done` sequence number of area `a`.
#[inline]
fn done(a: *mut u8) -> u64 {
    ctl(a).done.load(Ordering::Acquire)
}

/// The data of buffer `k & 1` of area `a`.
#[inline]
fn buf(a: *mut u8, k: u64) -> *mut u8 {
    a.wrapping_add(CTL + (k as usize & 1) * BUF + HDR)
}

/// The first data word of buffer `k & 1` of area `a` (the big-block flag of a large alltoall).
#[inline]
fn flag<'a>(a: *mut u8, k: u64) -> &'a AtomicU64 {
    // SAFETY: as for `ctl`; the data of a buffer is 16-aligned and at least 8 bytes.
    unsafe { &*(buf(a, k) as *const AtomicU64) }
}

/// The arrive stamp of buffer `k & 1` of area `a`.
#[inline]
fn stamp<'a>(a: *mut u8, k: u64) -> &'a AtomicU64 {
    // SAFETY: as for `ctl`; the stamp is the first word of the buffer.
    unsafe { &*(a.wrapping_add(CTL + (k as usize & 1) * BUF) as *const AtomicU64) }
}

impl Area {
    /// Called by every collective first, with its root (None: every member waits for every other).
    /// Which member should leave a barrier first depends on the collective that follows it: when ranks
    /// outnumber cores, whoever leaves first runs while the others wait for a CPU. Waiting for every
    /// arrival lets each CPU switch once per barrier, and symmetric collectives (allreduce, alltoall,
    /// barriers back to back) do best with it; but then the root of a following broadcast is not the
    /// first to leave, and the members that reach the broadcast before it wait a context switch or two
    /// (4 ranks on 2 CPUs: 2.0 us against 0.07). So a barrier followed by a rooted collective makes the
    /// next barrier's non-roots wait for the root's release (the root leaves first), while a barrier
    /// followed by a symmetric one goes back to every arrival. Every member sees the same sequence of
    /// collectives, so leads never form a cycle: after any collective that follows a barrier, the root
    /// has no lead and everyone else leads with the root or with nobody. Ranks free to run anywhere keep
    /// rank 0 as their lead.
    fn fresh(&mut self, root: Option<usize>) {
        if !self.after_barrier {
            return;
        }
        self.after_barrier = false;
        if self.oversub && self.pinned {
            self.lead = root.filter(|&r| r != self.me);
        }
    }
    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
    fn mine(&self) -> *mut u8 {
        self.areas[self.me]
    }
    /// Wait until `ok(a, r)` holds for every member `r` with area `a`. When ranks outnumber cores and are
    /// pinned, the wait tells the engine whether a member it still waits for shares this rank's CPU (then
    /// it yields to it at once) or all run elsewhere (then it spins a little: yielding would only hand the
    /// CPU to a mate that waits as well). 4 ranks on 2 CPUs: a barrier costs one context switch per CPU.
    ///
    /// Spinning is safe only while no awaited member may be waiting for a mate: every mate has reached
    /// collective `k` itself (stamped or finished it), or `free()` says the awaited members need nothing
    /// more from anyone. Without that, a mate that has not reached `k` may be the one the awaited members
    /// wait for (4 ranks on 2 CPUs, rank 2 waiting for rank 0's barrier release while rank 0 waits for
    /// rank 3, rank 2's mate: a spin there cost the whole budget, 20 us, per barrier).
    fn wait_members(
        &self,
        e: &mut Engine,
        k: u64,
        ok: impl Fn(*mut u8, usize) -> bool,
        free: impl Fn() -> bool,
    ) -> R {
        let areas = &self.areas;
        let all = || areas.iter().enumerate().all(|(r, &a)| ok(a, r));
        if all() {
            return Ok(());
        }
        let (mates, pinned) = (&self.mates, self.pinned);
        let reached = |a: *mut u8| {
            stamp(a, k).load(Ordering::Acquire) >= k || done(a) >= k
        };
        // Once true, stays true (what `free` reads only grows).
        let is_free = std::cell::Cell::new(false);
        let ctx = self.ctx;
        e.wait_for_peers(COp::Wait, |e| {
            if all() || e.is_revoked(ctx) {
                Awaiting::Done
            } else if !pinned || mates.iter().any(|&r| !ok(areas[r], r)) {
                Awaiting::Here
            } else if is_free.get() || mates.iter().all(|&r| reached(areas[r])) {
                Awaiting::Elsewhere
            } else if free() {
                is_free.set(true);
                Awaiting::Elsewhere
            } else {
                Awaiting::Here
            }
        })
        .map_err(from_core)?;
        revoked(e, ctx)
    }
    /// Wait until every member is done with collective `k - 2` (whose buffer `k` reuses).
    fn may_write(&mut self, e: &mut Engine, k: u64) -> R {
        if k <= 2 || self.known_done >= k - 2 {
            return Ok(());
        }
        self.wait_members(e, k - 2, |a, _| done(a) >= k - 2, || false)?;
        self.known_done = k - 2;
        Ok(())
    }
    /// Wait for the root's stamp `k`. A root that has left collective `k - 1` while every member is done
    /// with `k - 2` (so that its `may_write` passes) stamps `k` without waiting for anyone, so a rank on
    /// another CPU spins for it even if a mate has not reached `k` yet: the mate's turn comes once this
    /// rank has taken the data (4 ranks on 2 CPUs, a 4 KiB broadcast after a barrier: 0.9 us a call when
    /// the readers yielded to their mates instead). Should the root wait for a mate after all (its own
    /// point-to-point traffic between the two collectives, or the schedule a big collective falls back
    /// to when a pool is full), the spin ends after `WAIT_PEER_SPIN_US` and the wait yields as before.
    fn wait_arrived(&self, e: &mut Engine, root: usize, k: u64) -> R {
        let ra = self.areas[root];
        let left = || {
            if self.last_barrier == k - 1 {
                // A barrier stores `done` on arrival and `release` on leaving (the latter only when
                // ranks outnumber cores, the only case where spinning is in question).
                ctl(ra).release.load(Ordering::Acquire) >= k - 1
            } else {
                done(ra) >= k - 1
            }
        };
        let writable =
            || k <= 2 || self.known_done >= k - 2 || self.areas.iter().all(|&a| done(a) >= k - 2);
        self.wait_members(
            e,
            k,
            |a, r| r != root || stamp(a, k).load(Ordering::Acquire) >= k,
            || left() && writable(),
        )
    }
    /// Wait for every member's stamp `k`. A member stamps `k` only after storing `done = k - 1`, so this
    /// also tells that everyone finished collective `k - 1`.
    fn wait_all_arrived(&mut self, e: &mut Engine, k: u64) -> R {
        self.wait_members(e, k, |a, _| stamp(a, k).load(Ordering::Acquire) >= k, || false)?;
        self.known_done = self.known_done.max(k - 1);
        Ok(())
    }
    /// Wait until every member has finished collective `k` (nobody reads any of our buffers any more).
    fn wait_all_done(&mut self, e: &mut Engine, k: u64) -> R {
        if self.known_done >= k {
            return Ok(());
        }
        self.wait_members(e, k, |a, _| done(a) >= k, || false)?;
        self.known_done = k;
        Ok(())
    }
    /// Start a collective that publishes `need` bytes in our big block: take the next half, wait until no
    /// member still reads it (usually known without a load) and make the block hold `need` bytes per half.
    /// Growing frees the old block, so it waits until every member is done with both halves. Returns the
    /// half and false when the pool cannot provide the block (the members then agree on point-to-point).
    fn begin_big(&mut self, e: &mut Engine, need: usize) -> R<(usize, bool)> {
        let h = self.next_half();
        if self.big.is_some_and(|(_, half)| half >= need) {
            self.wait_all_done(e, self.big_last[h])?;
            return Ok((h, true));
        }
        let c = ctl(self.mine());
        if let Some((p, _)) = self.big.take() {
            self.wait_all_done(e, self.big_last[0].max(self.big_last[1]))?;
            c.big_off.store(0, Ordering::Relaxed);
            c.big_half.store(0, Ordering::Relaxed);
            e.pool_free(p);
        }
        // Round up, so that a growing series of sizes reallocates a few times only.
        let half = need.next_power_of_two().max(64 << 10);
        let Some(p) = e.pool_alloc(2 * half, 128) else {
            return Ok((h, false));
        };
        let Some(off) = e.pool_offset(p, 2 * half) else {
            e.pool_free(p);
            return Ok((h, false));
        };
        c.big_off.store(off, Ordering::Relaxed);
        c.big_half.store(half as u64, Ordering::Relaxed);
        self.big = Some((p, half));
        Ok((h, true))
    }
    /// Collective `k` publishes `need` bytes in our big block: wait until we may write our area for `k`,
    /// take the next half ([`Area::begin_big`]) and record that `k` uses it.
    fn claim_big(&mut self, e: &mut Engine, k: u64, need: usize) -> R<(usize, bool)> {
        self.may_write(e, k)?;
        let (h, ok) = self.begin_big(e, need)?;
        self.big_last[h] = k;
        Ok((h, ok))
    }
    /// The half the next big collective uses (every member, publisher or not, takes its turn alike).
    fn next_half(&mut self) -> usize {
        let h = self.big_turn;
        self.big_turn ^= 1;
        h
    }
    /// Raise (`ok`) or lower our big-block flag for collective `k`, stamp `k` and wait for every member's
    /// stamp. True if every flag is up; otherwise mark collective `done` finished and return false (every
    /// member sees the same flags and takes the point-to-point schedule).
    fn publish_all(&mut self, e: &mut Engine, k: u64, ok: bool, done: u64) -> R<bool> {
        flag(self.mine(), k).store(ok as u64, Ordering::Relaxed);
        self.set(e, Some(k), None);
        self.wait_all_arrived(e, k)?;
        if self
            .areas
            .iter()
            .all(|&a| flag(a, k).load(Ordering::Relaxed) == 1)
        {
            return Ok(true);
        }
        self.set(e, None, Some(done));
        Ok(false)
    }
    /// Half `h` of member `r`'s big block, holding at least `need` bytes (read after its stamp).
    fn big_of(&mut self, e: &Engine, r: usize, h: usize, need: usize) -> R<*mut u8> {
        let (p, half) = if r == self.me {
            match self.big {
                Some(b) => b,
                None => return err(MPI_ERR_INTERN, "no big collective block of our own"),
            }
        } else {
            let c = ctl(self.areas[r]);
            let (off, half) = (
                c.big_off.load(Ordering::Acquire),
                c.big_half.load(Ordering::Acquire) as usize,
            );
            match self.peer_big[r] {
                Some((o, h, p)) if o == off && h == half => (p, half),
                _ => {
                    let w = self.world[r];
                    let Some(p) = half
                        .checked_mul(2)
                        .and_then(|len| e.peer_pool_ptr(w, off, len))
                        .filter(|&p| off != 0 && p as usize % 128 == 0)
                    else {
                        return err(MPI_ERR_INTERN, format!("rank {w} published a big collective block at offset {off:#x} ({half} bytes per half) outside its pool partition"));
                    };
                    self.peer_big[r] = Some((off, half, p));
                    (p, half)
                }
            }
        };
        if half < need {
            return err(
                MPI_ERR_INTERN,
                format!("a big collective block holds {half} bytes per half, {need} needed"),
            );
        }
        Ok(p.wrapping_add(h * half))
    }
    fn set(&self, e: &Engine, arrive: Option<u64>, done: Option<u64>) {
        if let Some(k) = arrive {
            stamp(self.mine(), k).store(k, Ordering::Release);
        }
        if let Some(k) = done {
            ctl(self.mine()).done.store(k, Ordering::Release);
        }
        for (r, &w) in self.world.iter().enumerate() {
            if r != self.me {
                e.wake_peer(w);
            }
        }
    }
}

/// Reduce the members' contributions `x(v)` (`cnt` elements of `red`) into `out` by `plan` (one of the
/// area's [`Area::plans`]: rank order, grouped as MPICH and our tree schedules group it), with the
/// partial results in `scratch` (the area's, grown as needed).
///
/// # Safety
/// Every `x(v)` and `out` hold `cnt` elements, and `out` is none of them.
unsafe fn fold(
    scratch: &mut Vec<Line>,
    plan: &op::Plan,
    red: &op::Red,
    cnt: usize,
    x: impl Fn(usize) -> *const u8,
    out: *mut u8,
) {
    let bytes = red.elem * cnt;
    let lines = bytes.div_ceil(64);
    if scratch.len() < plan.scratch * lines {
        scratch.resize(plan.scratch * lines, Line([0; 64]));
    }
    let base = scratch.as_mut_ptr() as *mut u8;
    let at = |o: op::Operand| match o {
        op::Operand::X(v) => x(v) as *mut u8,
        op::Operand::Out => out,
        op::Operand::Tmp(k) => base.add(k * lines * 64),
    };
    for &(step, a, b) in &plan.steps {
        match step {
            op::FoldStep::Copy => std::ptr::copy_nonoverlapping(at(a), at(b), bytes),
            op::FoldStep::Apply => op::apply(red, at(a), at(b), cnt),
        }
    }
}

fn wait(e: &mut Engine, f: impl Fn() -> bool) -> R {
    if f() {
        return Ok(());
    }
    e.wait_until(COp::Wait, |_| f()).map_err(from_core)
}

/// Run `f` on the area of communicator `ci` (set up on first use: collective over the communicator).
/// Ok(false) when the communicator has none.
fn run(st: &mut State, ci: usize, f: impl FnOnce(&State, &mut Engine, &mut Area) -> R) -> R<bool> {
    if matches!(st.comms[ci].as_ref().unwrap().shm, Shm::Unknown) {
        let on = setup(st, ci)?;
        st.comms[ci].as_mut().unwrap().shm = on.map_or(Shm::Off, Shm::On);
    }
    let mut a = match std::mem::replace(&mut st.comms[ci].as_mut().unwrap().shm, Shm::Off) {
        Shm::On(a) => a,
        other => {
            st.comms[ci].as_mut().unwrap().shm = other;
            return Ok(false);
        }
    };
    let mut e = st.fab.engine();
    let r = revoked(&e, a.ctx).and_then(|()| f(st, &mut e, &mut a));
    drop(e);
    st.comms[ci].as_mut().unwrap().shm = Shm::On(a);
    r.map(|()| true)
}

/// Run a big-block collective `f` on communicator `ci`. Ok(false) — take the schedule — when the
/// communicator has no area, when `bytes` exceed `core_max` while some member has a core of its own
/// (the set-up agreed on that, so every member decides alike), or when `f` reports that a publisher's pool
/// could not hold its block (every member sees the same flags).
fn run_big(
    st: &mut State,
    ci: usize,
    bytes: usize,
    core_max: usize,
    f: impl FnOnce(&State, &mut Engine, &mut Area) -> R<bool>,
) -> R<bool> {
    let mut used = false;
    let ran = run(st, ci, |st, e, a| {
        if bytes <= core_max || a.all_oversub {
            used = f(st, e, a)?;
        }
        Ok(())
    })?;
    Ok(ran && used)
}

fn setup(st: &mut State, ci: usize) -> R<Option<Box<Area>>> {
    let r = setup_inner(st, ci);
    let e = st.fab.engine();
    if e.config().verbose {
        let c = st.comms[ci].as_ref().unwrap();
        let verdict = match &r {
            Ok(Some(_)) => "on",
            Ok(None) => "off",
            Err(_) => "failed",
        };
        eprintln!("vmfabric: rank {}: communicator context {} ({} ranks): shared-memory collectives {verdict}", e.rank(), c.pt, c.size);
    }
    r
}

fn setup_inner(st: &mut State, ci: usize) -> R<Option<Box<Area>>> {
    let (n, me, world) = {
        let c = st.comms[ci].as_ref().unwrap();
        let n = c.size as usize;
        (
            n,
            c.rank as usize,
            (0..n).map(|r| c.to_world(r as i32)).collect::<Vec<_>>(),
        )
    };
    // Every member reaches the same verdict: the configuration is the job's, and "all members share my
    // region" holds for one member exactly when it holds for all.
    {
        let e = st.fab.engine();
        let me_w = e.rank();
        if !e.config().shm_coll
            || !(2..=MAX_RANKS).contains(&n)
            || e.may_migrate()
            || world
                .iter()
                .any(|&w| w != me_w && e.route(w) != vmf_core::engine::Route::Shm)
        {
            return Ok(None);
        }
    }
    // Under MPI_THREAD_MULTIPLE a thread waiting in a collective must hand the library lock to the other
    // threads (`mt.rs`), which the point-to-point schedules do and these areas' waits do not attempt:
    // publish no area, so every member falls back alike (as for a full pool).
    let mine = if crate::mt::on() {
        None
    } else {
        st.fab.engine().pool_alloc(AREA, 128)
    };
    let off = match mine {
        Some(p) => {
            let c = ctl(p);
            c.refs.store(n as u32, Ordering::Relaxed);
            stamp(p, 0).store(0, Ordering::Relaxed);
            stamp(p, 1).store(0, Ordering::Relaxed);
            c.release.store(0, Ordering::Relaxed);
            c.big_off.store(0, Ordering::Relaxed);
            c.big_half.store(0, Ordering::Relaxed);
            c.done.store(0, Ordering::Release);
            st.fab.engine().pool_offset(p, AREA).unwrap_or(0)
        }
        None => 0,
    };
    let oversub = st.fab.engine().waiter().oversubscribed as i32;
    let all = crate::coll::allgather_ints(
        st,
        ci,
        &[off as u32 as i32, (off >> 32) as u32 as i32, oversub],
    )?;
    let offs: Vec<u64> = all
        .chunks(3)
        .map(|v| v[0] as u32 as u64 | (v[1] as u32 as u64) << 32)
        .collect();
    let all_oversub = all.chunks(3).all(|v| v[2] != 0);
    let mut e = st.fab.engine();
    if offs.contains(&0) {
        // Somebody's pool is full: everybody falls back; nobody will read this area.
        if let Some(p) = mine {
            e.pool_free(p);
        }
        return Ok(None);
    }
    let mut areas = Vec::with_capacity(n);
    for (r, (&o, &w)) in offs.iter().zip(&world).enumerate() {
        let p = if r == me {
            mine
        } else {
            e.peer_pool_ptr(w, o, AREA)
        };
        match p {
            Some(p) if p as usize % 128 == 0 => areas.push(p),
            _ => {
                return err(
                    MPI_ERR_INTERN,
                    format!("rank {w} published a collective area at offset {o:#x} outside its pool partition"),
                )
            }
        }
    }
    // Who shares our CPU, from what members published when they started (before this exchange).
    let cpus: Vec<Option<usize>> = world.iter().map(|&w| e.peer_cpu(w)).collect();
    let mates = (0..n)
        .filter(|&r| r != me && cpus[r].is_some() && cpus[r] == cpus[me])
        .collect();
    let pinned = cpus.iter().all(Option::is_some);
    let oversub = e.waiter().oversubscribed;
    Ok(Some(Box::new(Area {
        ctx: st.comms[ci].as_ref().unwrap().coll,
        oversub,
        // Oversubscribed ranks that may run anywhere wait for rank 0's release; see `fresh` for the rest.
        lead: (oversub && !pinned && me != 0).then_some(0),
        after_barrier: false,
        last_barrier: 0,
        mates,
        pinned,
        seq: 0,
        me,
        world,
        areas,
        known_done: 0,
        all_oversub,
        big: None,
        peer_big: vec![None; n],
        big_turn: 0,
        big_last: [0; 2],
        plans: [
            op::Plan::new(op::Tree::Doubling, n),
            op::Plan::new(op::Tree::Binomial, n),
        ],
        scratch: Vec::new(),
    })))
}

/// Drop this rank's references to a communicator's areas (MPI_Comm_free): readers decrement each
/// member's count; the owner frees its own once the count reaches zero.
pub(crate) fn release(st: &mut State, shm: Shm) {
    if let Shm::On(a) = shm {
        let mut e = st.fab.engine();
        // On a revoked communicator a collective may have been cut short: members may never be done with
        // our big block, so it stays allocated rather than waiting for them.
        if let Some((p, _)) = a.big.filter(|_| !e.is_revoked(a.ctx)) {
            // Members may still be copying out of our big block from the last collective: free it once
            // all are done (if one never is, it dies or hangs, and the block stays allocated).
            let (areas, k) = (&a.areas, a.big_last[0].max(a.big_last[1]));
            if wait(&mut e, || {
                areas
                    .iter()
                    .all(|&x| ctl(x).done.load(Ordering::Acquire) >= k)
            })
            .is_ok()
            {
                e.pool_free(p);
            }
        }
        for (r, &p) in a.areas.iter().enumerate() {
            if r == a.me {
                // SAFETY: our own live pool block, whose first word is the reader count.
                unsafe { e.pool_release_shared(p) };
            } else {
                ctl(p).refs.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------ data

/// Copy `count` elements of `dt` at `src` (user layout) into `dst` (packed); returns the bytes.
#[inline]
unsafe fn put(
    st: &State,
    dst: *mut u8,
    src: *const c_void,
    count: usize,
    dt: MPI_Datatype,
    bytes: usize,
) -> R {
    if datatype::is_simple(dt) {
        // A predefined type without padding (checked by `sig`): contiguous.
        std::ptr::copy_nonoverlapping(src as *const u8, dst, bytes);
        return Ok(());
    }
    match datatype::layout(src, count as c_int, dt)? {
        Lay::Contig(_) => std::ptr::copy_nonoverlapping(src as *const u8, dst, bytes),
        Lay::Packed { .. } => {
            datatype::pack(&*datatype::desc(st, dt)?, src as *const u8, count, dst)
        }
    }
    Ok(())
}

/// Copy `bytes` packed bytes at `src` into `count` elements of `dt` at `dst` (user layout).
#[inline]
unsafe fn take(
    st: &State,
    src: *const u8,
    bytes: usize,
    dst: *mut c_void,
    count: usize,
    dt: MPI_Datatype,
) -> R {
    if datatype::is_simple(dt) {
        std::ptr::copy_nonoverlapping(src, dst as *mut u8, bytes);
        return Ok(());
    }
    match datatype::layout(dst, count as c_int, dt)? {
        Lay::Contig(_) => std::ptr::copy_nonoverlapping(src, dst as *mut u8, bytes),
        Lay::Packed { .. } => {
            datatype::unpack(&*datatype::desc(st, dt)?, src, bytes, dst as *mut u8, count)
        }
    }
    Ok(())
}

/// Bytes of `count` elements of `dt` (the type signature size) and the span of their extents, checking
/// the arguments.
fn span(count: c_int, dt: MPI_Datatype) -> R<(usize, isize)> {
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    let (ext, size) = datatype::ext_size(dt)?;
    Ok((size * count as usize, ext * count as isize))
}

/// Bytes of `count` elements of `dt` (the type signature size), checking the arguments.
fn sig(count: c_int, dt: MPI_Datatype) -> R<usize> {
    span(count, dt).map(|(bytes, _)| bytes)
}

fn nonnull(p: *const c_void, bytes: usize) -> R {
    if bytes > 0 && p.is_null() {
        return err(MPI_ERR_BUFFER, "NULL buffer");
    }
    Ok(())
}

/// A communicator index when the shm path may serve a collective on `comm` whose largest published
/// block is `bytes`.
fn eligible(st: &mut State, comm: MPI_Comm, bytes: usize) -> R<Option<usize>> {
    let (ci, c) = st.comm(comm)?;
    // Intercommunicators have their own collective semantics (intercomm.rs, coll/inter.rs).
    if bytes > DATA || matches!(c.shm, Shm::Off) || c.size < 2 || c.remote.is_some() {
        return Ok(None);
    }
    Ok(Some(ci))
}

// ------------------------------------------------------------------------------------------------ collectives
// Each returns Ok(false) when the shm path does not apply (the caller then runs the schedule).

pub(crate) fn barrier(st: &mut State, comm: MPI_Comm) -> R<bool> {
    let Some(ci) = eligible(st, comm, 0)? else {
        return Ok(false);
    };
    run(st, ci, |_, e, a| {
        a.fresh(None);
        let k = a.next();
        a.set(e, Some(k), Some(k));
        match a.lead {
            // Leave after the leader: one line to watch, and the leader's next collective is under way
            // before we run.
            Some(l) if l != a.me => {
                a.wait_members(
                    e,
                    k,
                    |x, r| r != l || ctl(x).release.load(Ordering::Acquire) >= k,
                    || false,
                )?;
                a.known_done = a.known_done.max(k - 1);
            }
            _ => a.wait_all_arrived(e, k)?,
        }
        if a.oversub {
            // Anyone may lead the next barrier of another member: say we left (seen everyone arrive).
            ctl(a.mine()).release.store(k, Ordering::Release);
            a.set(e, None, None);
        }
        a.after_barrier = true;
        a.last_barrier = k;
        Ok(())
    })
}

pub(crate) unsafe fn bcast(
    st: &mut State,
    comm: MPI_Comm,
    p: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
) -> R<bool> {
    let bytes = sig(count, dt)?;
    // A large broadcast: the root copies into its big block, every other member copies out.
    let big = bytes > DATA && bytes <= BIG_MAX;
    let Some(ci) = eligible(st, comm, if big { 0 } else { bytes })? else {
        return Ok(false);
    };
    let root = check_root(root, st.comms[ci].as_ref().unwrap().size as usize)?;
    nonnull(p, bytes)?;
    if big {
        // With a core per rank, the pipelined point-to-point broadcast is as fast from 1 MiB on (2 ranks:
        // 25-27 µs against 28-29).
        return run_big(st, ci, bytes, BIG_CORE_MAX / 2, |st, e, a| {
            a.fresh(Some(root));
            let k = a.next();
            if a.me == root {
                let (h, ok) = a.claim_big(e, k, bytes)?;
                if ok {
                    put(
                        st,
                        a.big_of(e, root, h, bytes)?,
                        p,
                        count as usize,
                        dt,
                        bytes,
                    )?;
                }
                flag(a.mine(), k).store(ok as u64, Ordering::Relaxed);
                a.set(e, Some(k), Some(k));
                Ok(ok)
            } else {
                let h = a.next_half();
                a.big_last[h] = k;
                a.wait_arrived(e, root, k)?;
                // A lowered flag: the root's pool could not hold the data, everyone takes the schedule.
                let ok = flag(a.areas[root], k).load(Ordering::Relaxed) == 1;
                if ok {
                    take(
                        st,
                        a.big_of(e, root, h, bytes)?,
                        bytes,
                        p,
                        count as usize,
                        dt,
                    )?;
                }
                a.set(e, None, Some(k));
                Ok(ok)
            }
        });
    }
    run(st, ci, |st, e, a| {
        a.fresh(Some(root));
        let k = a.next();
        if a.me == root {
            a.may_write(e, k)?;
            put(st, buf(a.mine(), k), p, count as usize, dt, bytes)?;
            a.set(e, Some(k), Some(k));
        } else {
            a.wait_arrived(e, root, k)?;
            take(st, buf(a.areas[root], k), bytes, p, count as usize, dt)?;
            a.set(e, None, Some(k));
        }
        Ok(())
    })
}

/// Reduce (root = Some) or allreduce (None).
pub(crate) unsafe fn reduce(
    st: &mut State,
    comm: MPI_Comm,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: Option<c_int>,
) -> R<bool> {
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    // Non-contiguous types under predefined ops are reduced packed by the schedules; keep them there.
    if red_packed(st, op, dt, count)?.is_some() {
        return Ok(false);
    }
    let (red, cnt) = op::resolve(st, op, dt, count as usize)?;
    let bytes = red.elem * cnt;
    // A large allreduce: reduce-scatter over the members' big blocks, then everyone copies the result out.
    let big = root.is_none() && bytes > DATA && bytes <= BIG_MAX;
    let Some(ci) = eligible(st, comm, if big { 0 } else { bytes })? else {
        return Ok(false);
    };
    let n = st.comms[ci].as_ref().unwrap().size as usize;
    let root = match root {
        Some(r) => Some(check_root(r, n)?),
        None => None,
    };
    let me = st.comms[ci].as_ref().unwrap().rank as usize;
    let input = if sbuf == crate::coll::IN_PLACE {
        rbuf as *const c_void
    } else {
        sbuf
    };
    nonnull(input, bytes)?;
    if root.is_none_or(|r| r == me) {
        nonnull(rbuf, bytes)?;
    }
    if big {
        return run_big(st, ci, bytes, BIG_CORE_MAX, |_, e, a| {
            // Two collective numbers: k1 publishes the contributions, k2 the reduced segments.
            a.fresh(None);
            let k1 = a.next();
            let k2 = a.next();
            a.may_write(e, k1)?;
            let (h, ok) = a.begin_big(e, bytes)?;
            a.big_last[h] = k2;
            let seg = |r: usize| (cnt * r / n, cnt * (r + 1) / n);
            let (lo, hi) = seg(me);
            let (off, len) = (lo * red.elem, (hi - lo) * red.elem);
            // Only this rank reads segment `me` of its contribution, so unless the result overwrites the
            // input (in place) that segment is read from the input and not staged: 1/n less copying.
            let in_place = std::ptr::eq(input, rbuf);
            if ok {
                let (src, dst) = (input as *const u8, a.big_of(e, me, h, bytes)?);
                if in_place {
                    std::ptr::copy_nonoverlapping(src, dst, bytes);
                } else {
                    std::ptr::copy_nonoverlapping(src, dst, off);
                    let end = off + len;
                    std::ptr::copy_nonoverlapping(src.add(end), dst.add(end), bytes - end);
                }
            }
            if !a.publish_all(e, k1, ok, k2)? {
                return Ok(false);
            }
            // Segment `me` of the result, reduced as in the small path (recursive doubling's grouping).
            // The result then replaces this rank's staged segment.
            let out = rbuf as *mut u8;
            let contrib = (0..n)
                .map(|r| -> R<*const u8> {
                    Ok(if r == me && !in_place {
                        (input as *const u8).add(off)
                    } else {
                        a.big_of(e, r, h, bytes)?.add(off) as *const u8
                    })
                })
                .collect::<R<Vec<_>>>()?;
            fold(
                &mut a.scratch,
                &a.plans[0],
                &red,
                hi - lo,
                |r| contrib[r],
                out.add(off),
            );
            std::ptr::copy_nonoverlapping(out.add(off), a.big_of(e, me, h, bytes)?.add(off), len);
            a.may_write(e, k2)?;
            a.set(e, Some(k2), None);
            a.wait_all_arrived(e, k2)?;
            for r in (0..n).filter(|&r| r != me) {
                let (lo, hi) = seg(r);
                let (off, len) = (lo * red.elem, (hi - lo) * red.elem);
                std::ptr::copy_nonoverlapping(
                    a.big_of(e, r, h, bytes)?.add(off),
                    out.add(off),
                    len,
                );
            }
            a.set(e, None, Some(k2));
            Ok(true)
        });
    }
    run(st, ci, |_, e, a| {
        a.fresh(None);
        let k = a.next();
        a.may_write(e, k)?;
        std::ptr::copy_nonoverlapping(input as *const u8, buf(a.mine(), k), bytes);
        if root.is_some_and(|r| r != me) {
            a.set(e, Some(k), Some(k));
            return Ok(());
        }
        a.set(e, Some(k), None);
        a.wait_all_arrived(e, k)?;
        // Rank order, grouped as MPICH and our tree schedules group it (op::Tree): recursive doubling for
        // an allreduce; for a reduce the binomial tree, on ranks counted from the root when the op
        // commutes. Not a right fold x0 op (x1 op x2): floating-point sums would then differ from
        // MPICH's in the last bit, enough to fail numerically fragile codes validated under MPICH.
        let (plan, first) = match root {
            None => (&a.plans[0], 0),
            Some(r) if red.commute => (&a.plans[1], r),
            Some(_) => (&a.plans[1], 0),
        };
        let areas = &a.areas;
        let x = |v: usize| buf(areas[(first + v) % n], k) as *const u8;
        fold(&mut a.scratch, plan, &red, cnt, x, rbuf as *mut u8);
        a.set(e, None, Some(k));
        Ok(())
    })
}

/// Gather (root = Some) or allgather (None) of equal blocks.
pub(crate) unsafe fn gather(
    st: &mut State,
    comm: MPI_Comm,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: Option<c_int>,
) -> R<bool> {
    let (ci, c) = st.comm(comm)?;
    if c.remote.is_some() {
        return Ok(false);
    }
    let (n, me) = (c.size as usize, c.rank as usize);
    let root = match root {
        Some(r) => Some(check_root(r, n)?),
        None => None,
    };
    let receiver = root.is_none_or(|r| r == me);
    let in_place = sbuf == crate::coll::IN_PLACE;
    let rbytes = if receiver { sig(rcount, rtype)? } else { 0 };
    let sbytes = if in_place {
        rbytes
    } else {
        sig(scount, stype)?
    };
    if eligible(st, comm, sbytes)?.is_none() {
        return Ok(false);
    }
    if !in_place {
        nonnull(sbuf, sbytes)?;
    }
    if receiver {
        nonnull(rbuf, rbytes)?;
        if sbytes != rbytes {
            return err(
                MPI_ERR_TRUNCATE,
                format!("send block is {sbytes} bytes, receive block {rbytes}"),
            );
        }
    }
    let rext = if receiver {
        datatype::ext_size(rtype)?.0 * rcount as isize
    } else {
        0
    };
    run(st, ci, |st, e, a| {
        a.fresh(None);
        let k = a.next();
        a.may_write(e, k)?;
        let mine = buf(a.mine(), k);
        if in_place {
            // My block already sits at its place in rbuf.
            let at = (rbuf as *mut u8).wrapping_offset(rext * me as isize) as *const c_void;
            put(st, mine, at, rcount as usize, rtype, sbytes)?;
        } else {
            put(st, mine, sbuf, scount as usize, stype, sbytes)?;
        }
        if !receiver {
            a.set(e, Some(k), Some(k));
            return Ok(());
        }
        a.set(e, Some(k), None);
        a.wait_all_arrived(e, k)?;
        for r in 0..n {
            if r == me && in_place {
                continue;
            }
            let at = (rbuf as *mut u8).wrapping_offset(rext * r as isize) as *mut c_void;
            take(st, buf(a.areas[r], k), rbytes, at, rcount as usize, rtype)?;
        }
        a.set(e, None, Some(k));
        Ok(())
    })
}

/// Scatter (root = Some) or all-to-all (None) of equal blocks.
pub(crate) unsafe fn scatter(
    st: &mut State,
    comm: MPI_Comm,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: Option<c_int>,
) -> R<bool> {
    let (ci, c) = st.comm(comm)?;
    if c.remote.is_some() {
        return Ok(false);
    }
    let (n, me) = (c.size as usize, c.rank as usize);
    let root = match root {
        Some(r) => Some(check_root(r, n)?),
        None => None,
    };
    let sender = root.is_none_or(|r| r == me);
    let in_place = sbuf == crate::coll::IN_PLACE;
    // In-place: scatter's root keeps its block in sbuf (rbuf is IN_PLACE); alltoall reads rbuf.
    let scatter_root_in_place =
        root.is_some() && sender && std::ptr::eq(rbuf, crate::coll::IN_PLACE);
    let (rbytes, rext) = if scatter_root_in_place {
        span(scount, stype)?
    } else {
        span(rcount, rtype)?
    };
    let (src, sc, st_) = if in_place {
        (rbuf as *const c_void, rcount, rtype)
    } else {
        (sbuf, scount, stype)
    };
    let (sbytes, sext) = if !sender {
        (0, 0)
    } else if (sc, st_) == (rcount, rtype) && !scatter_root_in_place {
        (rbytes, rext)
    } else {
        span(sc, st_)?
    };
    let simple = datatype::is_simple(st_) && datatype::is_simple(rtype);
    // A large alltoall goes through every member's big block (one copy in, one copy out per byte). With
    // predefined types it goes in rounds of a chunk of every block, so that what one rank copies in is
    // still in the cache when the others copy it out, and the block stays small; other types go whole.
    let need = rbytes * n;
    let chunked = root.is_none() && simple && need > ROUND_MIN;
    let big = root.is_none() && need > DATA && (need <= BIG_MAX || chunked);
    if eligible(st, comm, if big { 0 } else { need })?.is_none() {
        return Ok(false);
    }
    if sender {
        nonnull(src, sbytes)?;
        if sbytes != rbytes {
            return err(
                MPI_ERR_TRUNCATE,
                format!("send block is {sbytes} bytes, receive block {rbytes}"),
            );
        }
    }
    if !scatter_root_in_place {
        nonnull(rbuf, rbytes)?;
    }
    if big && chunked {
        // In rounds it beats the pipelined point-to-point exchange at every size (2 ranks on 2 cores,
        // 1 MiB blocks: 90-103 µs against 115-133; 4 MiB: 470-562 against 556-724).
        return run_big(st, ci, need, usize::MAX, |_, e, a| unsafe {
            alltoall_rounds(
                e,
                a,
                src as *const u8,
                sext,
                rbuf as *mut u8,
                rext,
                rbytes,
                in_place,
            )
        });
    }
    if big {
        return run_big(st, ci, need, BIG_CORE_MAX, |st, e, a| {
            a.fresh(None);
            let k = a.next();
            let (h, ok) = a.claim_big(e, k, need)?;
            if ok {
                let mine = a.big_of(e, me, h, need)?;
                for r in 0..n {
                    let at = (src as *const u8).wrapping_offset(sext * r as isize) as *const c_void;
                    put(st, mine.add(r * rbytes), at, sc as usize, st_, rbytes)?;
                }
            }
            if !a.publish_all(e, k, ok, k)? {
                return Ok(false);
            }
            for r in 0..n {
                let from = a.big_of(e, r, h, need)?;
                let at = (rbuf as *mut u8).wrapping_offset(rext * r as isize) as *mut c_void;
                take(
                    st,
                    from.add(me * rbytes),
                    rbytes,
                    at,
                    rcount as usize,
                    rtype,
                )?;
            }
            a.set(e, None, Some(k));
            Ok(true)
        });
    }
    // An alltoall of predefined types copies its own block straight across, after it has stamped.
    let own_direct = root.is_none() && simple;
    run(st, ci, |st, e, a| {
        a.fresh(root);
        let k = a.next();
        if sender {
            a.may_write(e, k)?;
            let mine = buf(a.mine(), k);
            for r in (0..n).filter(|&r| !own_direct || r != me) {
                let at = (src as *const u8).wrapping_offset(sext * r as isize) as *const c_void;
                put(st, mine.add(r * rbytes), at, sc as usize, st_, rbytes)?;
            }
        }
        match root {
            Some(r) if r == me => {
                if !scatter_root_in_place {
                    take(
                        st,
                        buf(a.mine(), k).add(me * rbytes),
                        rbytes,
                        rbuf,
                        rcount as usize,
                        rtype,
                    )?;
                }
                a.set(e, Some(k), Some(k));
            }
            Some(r) => {
                a.wait_arrived(e, r, k)?;
                take(
                    st,
                    buf(a.areas[r], k).add(me * rbytes),
                    rbytes,
                    rbuf,
                    rcount as usize,
                    rtype,
                )?;
                a.set(e, None, Some(k));
            }
            None => {
                a.set(e, Some(k), None);
                if own_direct && !in_place {
                    std::ptr::copy_nonoverlapping(
                        (src as *const u8).wrapping_offset(sext * me as isize),
                        (rbuf as *mut u8).wrapping_offset(rext * me as isize),
                        rbytes,
                    );
                }
                a.wait_all_arrived(e, k)?;
                for r in (0..n).filter(|&r| !own_direct || r != me) {
                    let at = (rbuf as *mut u8).wrapping_offset(rext * r as isize) as *mut c_void;
                    take(
                        st,
                        buf(a.areas[r], k).add(me * rbytes),
                        rbytes,
                        at,
                        rcount as usize,
                        rtype,
                    )?;
                }
                a.set(e, None, Some(k));
            }
        }
        Ok(())
    })
}

/// The bytes of each block that one round of a chunked alltoall moves: at most [`ROUND_MAX`] for all the
/// blocks of a round, at least two rounds, a multiple of 64 bytes.
fn round_chunk(n: usize, block: usize) -> usize {
    let c = (ROUND_MAX / n).min(block.div_ceil(2));
    c.div_ceil(64).max(1) * 64
}

/// A large alltoall of contiguous blocks through the big blocks, in rounds: in each, every rank copies
/// chunk q of each block for another member into its big block's half for the round, stamps, waits for
/// every other stamp and copies chunk q of its own block out of each member's half. Each round is a
/// collective of its own (a sequence number, alternating halves), so a rank may start round q + 2 only
/// once every member is done with round q. Against copying every block whole (4 ranks on 2 cores, 1 MiB
/// blocks): the staging copy is read back while still in the cache, and each rank's block shrinks from
/// 2 × 4 MiB to 2 × 512 KiB; 440-540 µs per call against 1320-1440.
///
/// In place works too: round q reads chunk q of every block before it overwrites chunk q, and no later
/// round reads chunk q again.
#[allow(clippy::too_many_arguments)]
unsafe fn alltoall_rounds(
    e: &mut Engine,
    a: &mut Area,
    src: *const u8,
    sext: isize,
    rbuf: *mut u8,
    rext: isize,
    block: usize,
    in_place: bool,
) -> R<bool> {
    let (n, me) = (a.areas.len(), a.me);
    let chunk = round_chunk(n, block);
    let need = chunk * n;
    a.fresh(None);
    let mut off = 0;
    while off < block {
        let len = chunk.min(block - off);
        let k = a.next();
        let (h, ok) = a.claim_big(e, k, need)?;
        if ok {
            let mine = a.big_of(e, me, h, need)?;
            for r in (0..n).filter(|&r| r != me) {
                std::ptr::copy_nonoverlapping(
                    src.wrapping_offset(sext * r as isize).add(off),
                    mine.add(r * chunk),
                    len,
                );
            }
        }
        if !a.publish_all(e, k, ok, k)? {
            if off == 0 {
                return Ok(false);
            }
            // Every round needs the same block, which the first round got.
            return err(
                MPI_ERR_INTERN,
                "a member lost its big collective block during an alltoall",
            );
        }
        if off == 0 && !in_place {
            std::ptr::copy_nonoverlapping(
                src.wrapping_offset(sext * me as isize),
                rbuf.wrapping_offset(rext * me as isize),
                block,
            );
        }
        for r in (0..n).filter(|&r| r != me) {
            let from = a.big_of(e, r, h, need)?;
            std::ptr::copy_nonoverlapping(
                from.add(me * chunk),
                rbuf.wrapping_offset(rext * r as isize).add(off),
                len,
            );
        }
        a.set(e, None, Some(k));
        off += len;
    }
    Ok(true)
}
