//! Collectives, blocking and nonblocking, as *schedules*.
//!
//! Every collective is built as a [`Sched`]: a list of steps (send, receive, round boundary, local
//! reduction/copy/unpack) on the communicator's collective context, with one tag per call (the
//! communicator's collective sequence number, so any number of nonblocking collectives may be in flight
//! in the order the standard requires). A blocking collective builds the schedule and runs it to the end.
//! A nonblocking one stores it in a request; it advances once at the start and then inside every
//! MPI_Wait*/MPI_Test* call (on any request: all collectives in flight advance while a rank waits for
//! something else). There is no progress thread, and blocking point-to-point calls (MPI_Send/MPI_Recv)
//! do not advance them: a later round of a nonblocking collective moves when its rank calls Wait/Test.
//!
//! Algorithms (by size and rank count). Up to 8 ranks and 4 KiB, one-hop ("direct") algorithms: barrier
//! = everyone signals everyone, broadcast = flat from the root, reduce = everyone sends to the root,
//! allreduce = everyone sends to everyone and each rank reduces all contributions in rank order (so every
//! rank gets bit-identical results, for any op), grouped as the tree algorithms below group them
//! (`op::Tree`: recursive doubling's for allreduce, the binomial tree's for reduce, which are MPICH's
//! too), so the bits do not depend on the algorithm. No rank then waits for another to forward, which is
//! what matters when ranks outnumber cores. Otherwise: dissemination barrier; binomial broadcast;
//! binomial reduce (rank order kept for non-commutative ops); recursive-doubling allreduce (with the
//! order-preserving fold for non-powers of two) below 64 KiB or for non-commutative ops, ring
//! reduce-scatter + ring allgather above (reading the input in place, no full copy); gather/scatter
//! linear at the root; allgather direct (one round) below 64 KiB total, ring above; all-to-all with every
//! exchange posted in one round (up to 8 ranks, or below 32 KiB per peer), pairwise exchange otherwise;
//! scan/exscan recursive doubling; reduce_scatter(_block) = allreduce + local pick. Results are deterministic for a given rank count and
//! input. All ranks of a job on one host reach each other through shared memory, so these flat
//! algorithms are the shared-memory versions; host-aware hierarchical variants (intra-host phase, one
//! leader per host over TCP) are the next step once jobs span hosts.
//!
//! When every member shares one region whose ranks outnumber its cores (agreed when the shared-memory
//! area is set up), large broadcasts are flat too: each rank reads the root's buffer (single copy) instead
//! of waiting for a binomial forwarder that may not be running (256 KiB-1 MiB at 4 ranks on 2 cores:
//! about 25% faster).
//!
//! Small blocking collectives among the ranks of one region go through shared areas instead
//! (`shmcoll.rs`); what is here serves everything else: large messages, nonblocking and persistent
//! collectives, v/w variants, jobs across hosts, and `VMF_SHM_COLL=0`.
//!
//! Derived datatypes: the send side of a non-contiguous type is packed into a schedule temporary, the
//! receive side staged and unpacked by a final local step; reductions on a non-contiguous type made of
//! one basic type under a predefined op are reduced packed, as basic elements; user ops on derived types
//! receive the data in its raw extent layout. Contiguous data (predefined types, contiguous derived
//! types) moves straight from and to the user's buffers.
use crate::datatype::{self, Lay};
use crate::op::{self, MPI_Op, Red};
use crate::*;
use std::ffi::{c_int, c_void};
use vmf_core::{Op as COp, SendMode};

mod inter;
pub(crate) mod persistent;

pub(crate) const IN_PLACE: *const c_void = -1isize as *const c_void;

/// Small-message thresholds (bytes).
const ALLREDUCE_RING_MIN: usize = 64 * 1024;
/// Up to this many ranks, small collectives use one-hop ("direct") algorithms: every rank talks to every
/// other in a single round, so no rank waits for another to forward (what matters most when ranks
/// outnumber cores and a forwarder may not be running).
const DIRECT_MAX_RANKS: usize = 8;
const DIRECT_MAX_BYTES: usize = 4096;
const ALLGATHER_RING_MIN: usize = 64 * 1024;
const ALLTOALL_PAIRWISE_MIN: usize = 32 * 1024;

enum Step {
    Send {
        to: i64,
        p: *const u8,
        len: usize,
    },
    Recv {
        from: i64,
        p: *mut u8,
        len: usize,
    },
    /// Round boundary: wait for every send and receive posted so far.
    Wait,
    /// `b = a op b` (local; waits for the round first).
    Reduce {
        red: Red,
        a: *const u8,
        b: *mut u8,
        n: usize,
    },
    Copy {
        src: *const u8,
        dst: *mut u8,
        len: usize,
    },
    Call(Box<dyn FnMut() -> R>),
}

/// A collective in progress.
pub(crate) struct Sched {
    steps: Vec<Step>,
    pos: usize,
    pending: Vec<ReqId>,
    bufs: Vec<Vec<u8>>,
    /// Temporaries of earlier runs, for reuse.
    pool: Vec<Vec<u8>>,
    ctx: u32,
    tag: i32,
    pub done: bool,
    pub err: Option<MpiErr>,
}

static EMPTY: [u8; 8] = [0; 8];

impl Sched {
    fn new(ctx: u32, tag: i32) -> Sched {
        Sched {
            steps: Vec::new(),
            pos: 0,
            pending: Vec::new(),
            bufs: Vec::new(),
            pool: Vec::new(),
            ctx,
            tag,
            done: false,
            err: None,
        }
    }

    /// Make a finished schedule ready for another collective, keeping its allocations.
    fn reset(&mut self, ctx: u32, tag: i32) {
        self.steps.clear();
        self.pending.clear();
        self.pool.append(&mut self.bufs);
        self.pos = 0;
        self.ctx = ctx;
        self.tag = tag;
        self.done = false;
        self.err = None;
    }

    /// A temporary buffer owned by the schedule (its address is stable; its contents are not defined:
    /// every builder writes a temporary before reading it).
    fn tmp(&mut self, n: usize) -> *mut u8 {
        let n = n.max(1);
        if let Some(k) = self.pool.iter().position(|v| v.len() >= n) {
            let mut v = self.pool.swap_remove(k);
            let p = v.as_mut_ptr();
            self.bufs.push(v);
            return p;
        }
        let mut v = vec![0u8; n];
        let p = v.as_mut_ptr();
        self.bufs.push(v);
        p
    }
    fn keep(&mut self, v: Vec<u8>) -> *mut u8 {
        let mut v = v;
        if v.is_empty() {
            v.push(0);
        }
        let p = v.as_mut_ptr();
        self.bufs.push(v);
        p
    }
    fn send(&mut self, to: i64, p: *const u8, len: usize) {
        self.steps.push(Step::Send { to, p, len });
    }
    fn recv(&mut self, from: i64, p: *mut u8, len: usize) {
        self.steps.push(Step::Recv { from, p, len });
    }
    fn wait(&mut self) {
        self.steps.push(Step::Wait);
    }
    fn reduce(&mut self, red: Red, a: *const u8, b: *mut u8, n: usize) {
        if n > 0 {
            self.steps.push(Step::Reduce { red, a, b, n });
        }
    }
    fn copy(&mut self, src: *const u8, dst: *mut u8, len: usize) {
        if len > 0 && !std::ptr::eq(src, dst) {
            self.steps.push(Step::Copy { src, dst, len });
        }
    }
    fn call(&mut self, f: impl FnMut() -> R + 'static) {
        self.steps.push(Step::Call(Box::new(f)));
    }

    /// The current round's requests are all complete (the schedule can move on).
    pub fn ready(&self, e: &Engine) -> bool {
        self.pending.iter().all(|id| e.is_done(*id))
    }

    /// Advance as far as possible without blocking; true when finished.
    pub fn advance(&mut self, e: &mut Engine) -> R<bool> {
        if self.done {
            return Ok(true);
        }
        // A revoked communicator fails every collective, also one with nothing to send (a single member).
        let r = revoked(e, self.ctx).and_then(|()| self.advance_inner(e));
        if let Err(x) = r {
            self.done = true;
            self.err = Some(x.clone());
            for id in self.pending.drain(..) {
                if e.cancel_recv(id) || e.is_done(id) {
                    let _ = e.take_full(id);
                }
            }
            return Err(x);
        }
        r
    }

    fn advance_inner(&mut self, e: &mut Engine) -> R<bool> {
        loop {
            if !self.pending.is_empty() {
                if !self.ready(e) {
                    e.progress().map_err(from_core)?;
                    if !self.ready(e) {
                        return Ok(false);
                    }
                }
                let mut first = None;
                for id in self.pending.drain(..) {
                    let (_, er) = e.take_full(id).map_err(from_core)?;
                    if let Some(x) = er {
                        first.get_or_insert(x);
                    }
                }
                if let Some(x) = first {
                    return Err(from_core(x));
                }
            }
            if self.pos == self.steps.len() {
                self.done = true;
                if self.steps.iter().any(|s| matches!(s, Step::Call(_))) {
                    // staging buffers of user data are not worth keeping
                    self.bufs.clear();
                } else {
                    self.pool.append(&mut self.bufs);
                    self.pool.truncate(4);
                }
                return Ok(true);
            }
            while self.pos < self.steps.len() {
                match &mut self.steps[self.pos] {
                    Step::Send { to, p, len } => {
                        let p = if *len == 0 { EMPTY.as_ptr() } else { *p };
                        // SAFETY: user buffers stay valid until the collective completes (MPI rule);
                        // temporaries are owned by the schedule.
                        let id = unsafe {
                            e.isend(p, *len, *to, self.tag, self.ctx, SendMode::Standard)
                        }
                        .map_err(from_core)?;
                        self.pending.push(id);
                    }
                    Step::Recv { from, p, len } => {
                        let p = if *len == 0 {
                            EMPTY.as_ptr() as *mut u8
                        } else {
                            *p
                        };
                        // SAFETY: as above.
                        let id = unsafe { e.irecv(p, *len, *from, self.tag, self.ctx) }
                            .map_err(from_core)?;
                        self.pending.push(id);
                    }
                    Step::Wait => {
                        self.pos += 1;
                        break;
                    }
                    local => {
                        if !self.pending.is_empty() {
                            break;
                        }
                        // SAFETY: pointers prepared by the builders over live buffers.
                        unsafe {
                            match local {
                                Step::Reduce { red, a, b, n } => op::apply(red, *a, *b, *n),
                                Step::Copy { src, dst, len } => std::ptr::copy(*src, *dst, *len),
                                Step::Call(f) => f()?,
                                _ => unreachable!(),
                            }
                        }
                    }
                }
                self.pos += 1;
            }
        }
    }

    /// Run to completion.
    pub fn run(&mut self, e: &mut Engine) -> R {
        loop {
            if self.advance(e)? {
                return match self.err.take() {
                    Some(x) => Err(x),
                    None => Ok(()),
                };
            }
            let p = &self.pending;
            e.wait_until(COp::Wait, |e| p.iter().all(|id| e.is_done(*id)))
                .map_err(from_core)?;
        }
    }
}

// ------------------------------------------------------------------------------------------------ context

/// What a builder needs of the communicator.
pub(crate) struct Ctx {
    pub n: usize,
    pub me: usize,
    world: Option<Vec<usize>>,
    /// Intercommunicator: the remote group's world ranks (collectives follow `inter.rs`).
    inter: Option<Vec<usize>>,
    /// Every member shares one region and its ranks outnumber its cores (agreed at the shared-memory
    /// area's setup, so all members see the same value): large broadcasts go flat, each rank reading
    /// the root's buffer itself, instead of waiting for a forwarder that may not be running.
    flat: bool,
}

impl Ctx {
    #[inline]
    fn w(&self, r: usize) -> i64 {
        match &self.world {
            None => r as i64,
            Some(v) => v[r] as i64,
        }
    }
}

/// Take the next collective tag of communicator `ci` and make a schedule and context for it.
pub(crate) fn begin(st: &mut State, ci: usize) -> (Box<Sched>, Ctx) {
    let tag = st.comms[ci].as_mut().unwrap().next_coll_tag();
    begin_tagged(st, ci, tag)
}

/// A schedule and context for a collective of communicator `ci` on an already taken `tag`.
pub(crate) fn begin_tagged(st: &mut State, ci: usize, tag: i32) -> (Box<Sched>, Ctx) {
    let c = st.comms[ci].as_mut().unwrap();
    let (ctx, cx) = (
        c.coll,
        Ctx {
            n: c.size as usize,
            me: c.rank as usize,
            world: c.world.clone(),
            inter: c.remote.clone(),
            flat: crate::shmcoll::all_oversubscribed(&c.shm),
        },
    );
    let s = match st.spare.take() {
        Some(mut s) => {
            s.reset(ctx, tag);
            s
        }
        None => Box::new(Sched::new(ctx, tag)),
    };
    (s, cx)
}

/// Run a blocking schedule to the end and keep it for reuse.
fn finish(st: &mut State, mut s: Box<Sched>) -> R {
    let r = s.run(&mut st.fab.engine());
    if r.is_ok() && s.pool.iter().map(|v| v.len()).sum::<usize>() <= 4 << 20 {
        st.spare = Some(s);
    }
    r
}

/// A schedule over an explicit member list (world ranks) with an explicit context and tag.
pub(crate) fn begin_group(ctx: u32, tag: i32, members: &[usize], me: usize) -> (Sched, Ctx) {
    (
        Sched::new(ctx, tag),
        Ctx {
            n: members.len(),
            me,
            world: Some(members.to_vec()),
            inter: None,
            flat: false,
        },
    )
}

// ------------------------------------------------------------------------------------------------ algorithms

fn barrier_s(s: &mut Sched, c: &Ctx) {
    if let Some(x) = c.inter.as_deref() {
        return inter::barrier(s, c, x);
    }
    let (n, me) = (c.n, c.me);
    if n <= DIRECT_MAX_RANKS {
        for k in 1..n {
            s.recv(c.w((me + n - k) % n), std::ptr::null_mut(), 0);
        }
        for k in 1..n {
            s.send(c.w((me + k) % n), std::ptr::null(), 0);
        }
        s.wait();
        return;
    }
    let mut k = 1;
    while k < n {
        s.recv(c.w((me + n - k) % n), std::ptr::null_mut(), 0);
        s.send(c.w((me + k) % n), std::ptr::null(), 0);
        s.wait();
        k *= 2;
    }
}

fn bcast_s(s: &mut Sched, c: &Ctx, root: usize, buf: *mut u8, len: usize) {
    let n = c.n;
    if n <= DIRECT_MAX_RANKS && (len <= DIRECT_MAX_BYTES || c.flat) {
        // flat: the root sends to everyone
        if c.me == root {
            for k in 1..n {
                s.send(c.w((root + k) % n), buf, len);
            }
        } else {
            s.recv(c.w(root), buf, len);
        }
        s.wait();
        return;
    }
    let vr = (c.me + n - root) % n;
    let real = |v: usize| c.w((v + root) % n);
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            s.recv(real(vr - mask), buf, len);
            s.wait();
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            s.send(real(vr + mask), buf, len);
        }
        mask >>= 1;
    }
    s.wait();
}

/// Reduce the `n` blocks `x(v)` of `cnt` elements into `out`, grouped as `tree` says ([`op::Plan`]), with
/// schedule temporaries for the partial results.
fn fold_s(
    s: &mut Sched,
    tree: op::Tree,
    n: usize,
    x: &dyn Fn(usize) -> *mut u8,
    out: *mut u8,
    red: Red,
    cnt: usize,
) {
    let bytes = cnt * red.elem;
    let plan = op::Plan::new(tree, n);
    let tmp: Vec<*mut u8> = (0..plan.scratch).map(|_| s.tmp(bytes)).collect();
    let at = |o: op::Operand| match o {
        op::Operand::X(v) => x(v),
        op::Operand::Out => out,
        op::Operand::Tmp(k) => tmp[k],
    };
    for &(step, a, b) in &plan.steps {
        match step {
            op::FoldStep::Copy => s.copy(at(a), at(b), bytes),
            op::FoldStep::Apply => s.reduce(red, at(a), at(b), cnt),
        }
    }
}

/// Binomial reduce of `cnt` elements from `sbuf` to `rbuf` at `root`.
fn reduce_s(
    s: &mut Sched,
    c: &Ctx,
    root: usize,
    sbuf: *const u8,
    rbuf: *mut u8,
    red: Red,
    cnt: usize,
) {
    let n = c.n;
    let bytes = cnt * red.elem;
    if n > 2 && n <= DIRECT_MAX_RANKS && bytes <= DIRECT_MAX_BYTES && cnt > 0 {
        // one hop: everyone sends to the root, which reduces in the binomial tree's grouping (below)
        if c.me != root {
            s.send(c.w(root), sbuf, bytes);
            s.wait();
            return;
        }
        let all = s.tmp(bytes * n);
        let blk = |k: usize| all.wrapping_add(k * bytes);
        for k in 1..n {
            let from = (root + k) % n;
            s.recv(c.w(from), blk(from), bytes);
        }
        s.wait();
        s.copy(sbuf, blk(root), bytes);
        // Ranks counted from the root for commutative ops, from 0 otherwise, as in the tree below.
        let first = if red.commute { root } else { 0 };
        fold_s(
            s,
            op::Tree::Binomial,
            n,
            &|v| blk((first + v) % n),
            rbuf,
            red,
            cnt,
        );
        return;
    }
    // Non-commutative: a tree rooted at rank 0 in rank order, then 0 → root.
    let tree_root = if red.commute { root } else { 0 };
    let vr = (c.me + n - tree_root) % n;
    let real = |v: usize| c.w((v + tree_root) % n);
    let mut acc = s.tmp(bytes);
    s.copy(sbuf, acc, bytes);
    let mut other = s.tmp(bytes);
    let mut mask = 1;
    while mask < n {
        if vr & mask == 0 {
            let src = vr | mask;
            if src < n {
                s.recv(real(src), other, bytes);
                s.wait();
                // acc covers lower ranks: other = acc op other, then swap roles.
                s.reduce(red, acc, other, cnt);
                std::mem::swap(&mut acc, &mut other);
            }
        } else {
            s.send(real(vr & !mask), acc, bytes);
            s.wait();
            break;
        }
        mask <<= 1;
    }
    if vr == 0 {
        if c.me == root {
            s.copy(acc, rbuf, bytes);
        } else {
            s.send(c.w(root), acc, bytes);
            s.wait();
        }
    } else if c.me == root {
        // non-commutative case, root != 0
        s.recv(c.w(0), rbuf, bytes);
        s.wait();
    }
}

/// Allreduce of this rank's contribution `src` into `buf` (`src` may be `buf`: in place).
fn allreduce_s(s: &mut Sched, c: &Ctx, src: *const u8, buf: *mut u8, red: Red, cnt: usize) {
    let (n, me) = (c.n, c.me);
    let bytes = cnt * red.elem;
    if red.commute && bytes >= ALLREDUCE_RING_MIN && cnt >= n && n > 1 {
        return ring_allreduce(s, c, src, buf, red, cnt);
    }
    if n > 2 && n <= DIRECT_MAX_RANKS && bytes <= DIRECT_MAX_BYTES && cnt > 0 {
        // one hop: everyone sends its contribution to everyone, then each rank reduces all of them in
        // rank order, grouped as recursive doubling does (identical results on every rank, any op, and
        // the same as the recursive doubling below gives)
        let all = s.tmp(bytes * n);
        let blk = |k: usize| all.wrapping_add(k * bytes);
        for k in 1..n {
            let from = (me + n - k) % n;
            s.recv(c.w(from), blk(from), bytes);
        }
        for k in 1..n {
            s.send(c.w((me + k) % n), src, bytes);
        }
        s.wait();
        s.copy(src, blk(me), bytes);
        fold_s(s, op::Tree::Doubling, n, &|v| blk(v), buf, red, cnt);
        return;
    }
    s.copy(src, buf, bytes);
    if n == 1 || cnt == 0 {
        return;
    }
    let tmp = s.tmp(bytes);
    let mut p2 = 1;
    while p2 * 2 <= n {
        p2 *= 2;
    }
    let rem = n - p2;
    let vr: Option<usize> = if me < 2 * rem {
        if me % 2 == 0 {
            s.send(c.w(me + 1), buf, bytes);
            s.wait();
            None
        } else {
            s.recv(c.w(me - 1), tmp, bytes);
            s.wait();
            s.reduce(red, tmp, buf, cnt);
            Some(me / 2)
        }
    } else {
        Some(me - rem)
    };
    if let Some(v) = vr {
        let real = |x: usize| if x < rem { 2 * x + 1 } else { x + rem };
        let mut mask = 1;
        while mask < p2 {
            let pv = v ^ mask;
            let peer = real(pv);
            s.recv(c.w(peer), tmp, bytes);
            s.send(c.w(peer), buf, bytes);
            s.wait();
            if pv < v || red.commute {
                s.reduce(red, tmp, buf, cnt);
            } else {
                s.reduce(red, buf, tmp, cnt);
                s.copy(tmp, buf, bytes);
            }
            mask <<= 1;
        }
    }
    if me < 2 * rem {
        if me % 2 == 1 {
            s.send(c.w(me - 1), buf, bytes);
        } else {
            s.recv(c.w(me + 1), buf, bytes);
        }
        s.wait();
    }
}

/// Ring reduce-scatter + ring allgather. The input is read from `src` where a chunk is first touched, so
/// no full copy into `buf` is made.
fn ring_allreduce(s: &mut Sched, c: &Ctx, src: *const u8, buf: *mut u8, red: Red, cnt: usize) {
    let (n, me) = (c.n, c.me);
    let e = red.elem;
    let chunk = |k: usize| -> (usize, usize) {
        let base = cnt / n;
        let extra = cnt % n;
        let start = k * base + k.min(extra);
        (start, base + (k < extra) as usize)
    };
    let maxc = cnt / n + 1;
    let tmp = s.tmp(maxc * e);
    let (next, prev) = (c.w((me + 1) % n), c.w((me + n - 1) % n));
    for k in 0..n - 1 {
        let (ss, sl) = chunk((me + n - k) % n);
        let (rs, rl) = chunk((me + 2 * n - k - 1) % n);
        // SAFETY (pointer arithmetic): within the cnt-element buffers.
        unsafe {
            s.recv(prev, tmp, rl * e);
            // step 0 sends this rank's own input; later steps the partial sums it made
            let from = if k == 0 {
                src.add(ss * e)
            } else {
                buf.add(ss * e) as *const u8
            };
            s.send(next, from, sl * e);
            s.wait();
            s.copy(src.add(rs * e), buf.add(rs * e), rl * e);
            s.reduce(red, tmp, buf.add(rs * e), rl);
        }
    }
    for k in 0..n - 1 {
        let (ss, sl) = chunk((me + 1 + n - k) % n);
        let (rs, rl) = chunk((me + n - k) % n);
        unsafe {
            s.recv(prev, buf.add(rs * e), rl * e);
            s.send(next, buf.add(ss * e), sl * e);
        }
        s.wait();
    }
}

/// Allgather of variable blocks (`blocks[i]` = (pointer, bytes) of rank i's block in the result; this
/// rank's block already in place).
fn allgather_s(s: &mut Sched, c: &Ctx, blocks: &[(*mut u8, usize)]) {
    let (n, me) = (c.n, c.me);
    let total: usize = blocks.iter().map(|b| b.1).sum();
    if n == 1 {
        return;
    }
    if total < ALLGATHER_RING_MIN {
        for k in 1..n {
            let from = (me + n - k) % n;
            s.recv(c.w(from), blocks[from].0, blocks[from].1);
        }
        for k in 1..n {
            s.send(c.w((me + k) % n), blocks[me].0, blocks[me].1);
        }
        s.wait();
        return;
    }
    let (next, prev) = (c.w((me + 1) % n), c.w((me + n - 1) % n));
    for k in 0..n - 1 {
        let sb = (me + n - k) % n;
        let rb = (me + 2 * n - k - 1) % n;
        s.recv(prev, blocks[rb].0, blocks[rb].1);
        s.send(next, blocks[sb].0, blocks[sb].1);
        s.wait();
    }
}

/// All-to-all of variable blocks: `sb[i]` goes to rank i, `rb[i]` comes from rank i (own block copied).
fn alltoall_s(s: &mut Sched, c: &Ctx, sb: &[(*const u8, usize)], rb: &[(*mut u8, usize)]) {
    let (n, me) = (c.n, c.me);
    s.copy(sb[me].0, rb[me].0, sb[me].1.min(rb[me].1));
    // Up to 8 ranks every exchange is posted at once whatever the size (whoever runs moves data: best
    // when ranks outnumber cores); beyond, pairwise rounds for large blocks keep the traffic bounded.
    let big =
        n > DIRECT_MAX_RANKS && sb.iter().map(|b| b.1).max().unwrap_or(0) >= ALLTOALL_PAIRWISE_MIN;
    if !big {
        for k in 1..n {
            let from = (me + n - k) % n;
            s.recv(c.w(from), rb[from].0, rb[from].1);
        }
        for k in 1..n {
            let to = (me + k) % n;
            s.send(c.w(to), sb[to].0, sb[to].1);
        }
        s.wait();
    } else {
        for k in 1..n {
            let (to, from) = if n.is_power_of_two() {
                (me ^ k, me ^ k)
            } else {
                ((me + k) % n, (me + n - k) % n)
            };
            s.recv(c.w(from), rb[from].0, rb[from].1);
            s.send(c.w(to), sb[to].0, sb[to].1);
            s.wait();
        }
    }
}

/// Inclusive (or exclusive) scan by recursive doubling; `rbuf` holds this rank's input for inclusive.
fn scan_s(
    s: &mut Sched,
    c: &Ctx,
    sbuf: *const u8,
    rbuf: *mut u8,
    red: Red,
    cnt: usize,
    exclusive: bool,
) {
    let (n, me) = (c.n, c.me);
    let bytes = cnt * red.elem;
    let partial = s.tmp(bytes);
    let tmp = s.tmp(bytes);
    s.copy(sbuf, partial, bytes);
    if !exclusive {
        s.copy(sbuf, rbuf, bytes);
    }
    let mut have = !exclusive;
    let mut mask = 1;
    while mask < n {
        let dst = me ^ mask;
        if dst < n {
            s.recv(c.w(dst), tmp, bytes);
            s.send(c.w(dst), partial, bytes);
            s.wait();
            if dst < me {
                // tmp = lower ranks' partial: partial = tmp op partial, result = tmp op result
                s.reduce(red, tmp, partial, cnt);
                if have {
                    s.reduce(red, tmp, rbuf, cnt);
                } else {
                    s.copy(tmp, rbuf, bytes);
                    have = true;
                }
            } else if red.commute {
                s.reduce(red, tmp, partial, cnt);
            } else {
                s.reduce(red, partial, tmp, cnt);
                s.copy(tmp, partial, bytes);
            }
        }
        mask <<= 1;
    }
}

// ------------------------------------------------------------------------------------------------ staging

/// A send-side buffer: contiguous pointer, or packed into a schedule temporary.
unsafe fn src(
    s: &mut Sched,
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
) -> R<(*const u8, usize)> {
    match datatype::layout(buf, count, dt)? {
        Lay::Contig(b) => Ok((buf as *const u8, b)),
        Lay::Packed { bytes } => {
            let v = datatype::pack_vec(buf as *const u8, count as usize, dt, bytes)?;
            Ok((s.keep(v) as *const u8, bytes))
        }
    }
}

/// Receive-side staging list: blocks to unpack at the end.
struct Unp(Vec<(*mut u8, *mut u8, usize, usize, MPI_Datatype)>);

/// A receive-side buffer: contiguous pointer, or a temporary unpacked at the end.
unsafe fn dst(
    s: &mut Sched,
    u: &mut Unp,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
) -> R<(*mut u8, usize)> {
    match datatype::layout(buf, count, dt)? {
        Lay::Contig(b) => Ok((buf as *mut u8, b)),
        Lay::Packed { bytes } => {
            let t = s.tmp(bytes);
            u.0.push((t, buf as *mut u8, bytes, count as usize, dt));
            Ok((t, bytes))
        }
    }
}

fn finish_unpack(s: &mut Sched, u: Unp) {
    if u.0.is_empty() {
        return;
    }
    let list = u.0;
    // A nonblocking collective unpacks when it completes, maybe after MPI_Type_free: hold the types.
    if let Ok(st) = state() {
        list.iter().for_each(|e| datatype::hold(st, e.4));
    }
    s.call(move || {
        let mut r = Ok(());
        for &(t, b, bytes, count, dt) in &list {
            // SAFETY: t is a schedule temporary of `bytes`; b the user's buffer.
            if r.is_ok() {
                r = unsafe {
                    datatype::unpack_from(std::slice::from_raw_parts(t, bytes), bytes, b, count, dt)
                };
            }
            datatype::release(state()?, dt);
        }
        r
    });
}

unsafe fn arr_i(p: *const c_int, n: usize) -> R<Vec<c_int>> {
    if p.is_null() && n > 0 {
        return err(MPI_ERR_ARG, "array argument is NULL");
    }
    Ok((0..n).map(|i| *p.add(i)).collect())
}

pub(crate) fn check_root(root: c_int, n: usize) -> R<usize> {
    if root < 0 || root as usize >= n {
        err(
            MPI_ERR_ROOT,
            format!("root {root} is not in the communicator (size {n})"),
        )
    } else {
        Ok(root as usize)
    }
}

/// Resolve a reduction; for user ops on derived types the data moves in its raw extent layout.
fn red_of(st: &State, op: MPI_Op, dt: MPI_Datatype, count: c_int) -> R<(Red, usize)> {
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    op::resolve(st, op, dt, count as usize)
}

// ------------------------------------------------------------------------------------------------ builders

type Build<'a> = &'a mut dyn FnMut(&mut State, &mut Sched, &Ctx) -> R;

/// Run or start a collective on `comm`: build its schedule, then run it (blocking) or store it in a new
/// request (nonblocking).
unsafe fn go(comm: MPI_Comm, req: *mut MPI_Request, nonblocking: bool, b: Build) -> R {
    let st = state()?;
    let (ci, _) = st.comm(comm)?;
    if nonblocking && req.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    let (mut s, c) = if nonblocking {
        let tag = st.comms[ci].as_mut().unwrap().next_nbc_tag();
        begin_tagged(st, ci, tag)
    } else {
        begin(st, ci)
    };
    b(st, &mut s, &c)?;
    if !nonblocking {
        return finish(st, s);
    }
    let _ = s.advance(&mut st.fab.engine());
    *req = crate::p2p::new_sched_req(st, ci, s);
    Ok(())
}

unsafe fn bcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |_st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::bcast(s, x, buf, count, dt, root);
        }
        let root = check_root(root, c.n)?;
        let mut u = Unp(vec![]);
        let (p, len) = if c.me == root {
            let (p, l) = src(s, buf, count, dt)?;
            (p as *mut u8, l)
        } else {
            dst(s, &mut u, buf, count, dt)?
        };
        bcast_s(s, c, root, p, len);
        finish_unpack(s, u);
        Ok(())
    }
}

/// Reductions move raw extent-layout data; returns (pointer, bytes) of the input.
fn red_bytes(red: &Red, cnt: usize) -> usize {
    red.elem * cnt
}

/// A non-contiguous derived type made of one basic type under a predefined op: reduce it packed, as
/// basic elements (the input is packed into a temporary, the result unpacked at the end).
pub(crate) fn red_packed(
    st: &State,
    op: MPI_Op,
    dt: MPI_Datatype,
    count: c_int,
) -> R<Option<(Red, usize)>> {
    if !datatype::is_derived(dt) || !(op::MPI_MAX..=op::MPI_NO_OP).contains(&op) || count < 0 {
        return Ok(None);
    }
    let d = datatype::get(st, dt)?;
    if d.dense || d.basic == MPI_DATATYPE_NULL {
        return Ok(None);
    }
    let (basic, n) = (d.basic, d.nbasic * count as usize);
    let (mut red, n) = op::resolve(st, op, basic, n)?;
    // Packed, a pair type has no padding.
    red.elem = type_size(basic)?;
    Ok(Some((red, n)))
}

unsafe fn packed_in(
    s: &mut Sched,
    buf: *const u8,
    count: c_int,
    dt: MPI_Datatype,
    bytes: usize,
) -> R<*const u8> {
    Ok(s.keep(datatype::pack_vec(buf, count as usize, dt, bytes)?) as *const u8)
}

fn unpack_out(
    s: &mut Sched,
    t: *mut u8,
    buf: *mut c_void,
    bytes: usize,
    count: usize,
    dt: MPI_Datatype,
) {
    finish_unpack(s, Unp(vec![(t, buf as *mut u8, bytes, count, dt)]));
}

unsafe fn reduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::reduce(st, s, x, sbuf, rbuf, count, dt, op, root);
        }
        let root = check_root(root, c.n)?;
        let input = if sbuf == IN_PLACE && c.me == root {
            rbuf as *const u8
        } else {
            sbuf as *const u8
        };
        if let Some((red, cnt)) = red_packed(st, op, dt, count)? {
            let bytes = red_bytes(&red, cnt);
            let inp = packed_in(s, input, count, dt, bytes)?;
            let out = s.tmp(bytes);
            reduce_s(s, c, root, inp, out, red, cnt);
            if c.me == root {
                unpack_out(s, out, rbuf, bytes, count as usize, dt);
            }
            return Ok(());
        }
        let (red, cnt) = red_of(st, op, dt, count)?;
        let bytes = red_bytes(&red, cnt);
        if bytes > 0 && (input.is_null() || (c.me == root && rbuf.is_null())) {
            return err(MPI_ERR_BUFFER, "NULL buffer");
        }
        reduce_s(s, c, root, input, rbuf as *mut u8, red, cnt);
        Ok(())
    }
}

unsafe fn allreduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::allreduce(st, s, c, x, sbuf, rbuf, count, dt, op);
        }
        if let Some((red, cnt)) = red_packed(st, op, dt, count)? {
            let bytes = red_bytes(&red, cnt);
            let input = if sbuf == IN_PLACE {
                rbuf as *const u8
            } else {
                sbuf as *const u8
            };
            let inp = packed_in(s, input, count, dt, bytes)?;
            let out = s.tmp(bytes);
            allreduce_s(s, c, inp, out, red, cnt);
            unpack_out(s, out, rbuf, bytes, count as usize, dt);
            return Ok(());
        }
        let (red, cnt) = red_of(st, op, dt, count)?;
        let bytes = red_bytes(&red, cnt);
        if bytes > 0 && (rbuf.is_null() || sbuf.is_null()) {
            return err(MPI_ERR_BUFFER, "NULL buffer");
        }
        let src = if sbuf == IN_PLACE {
            rbuf as *const u8
        } else {
            sbuf as *const u8
        };
        allreduce_s(s, c, src, rbuf as *mut u8, red, cnt);
        Ok(())
    }
}

/// Gather/gatherv: `rc`/`displs` None means fixed `rcount` blocks.
unsafe fn gatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: Option<*const c_int>,
    rcount: c_int,
    displs: Option<*const c_int>,
    rtype: MPI_Datatype,
    root: c_int,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |_st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::gatherv(
                s, x, sbuf, scount, stype, rbuf, rcounts, rcount, displs, rtype, root,
            );
        }
        let root = check_root(root, c.n)?;
        if c.me != root {
            let (p, len) = src(s, sbuf, scount, stype)?;
            s.send(c.w(root), p, len);
            s.wait();
            return Ok(());
        }
        let (ext, _) = datatype::ext_size(rtype)?;
        let counts = match rcounts {
            Some(p) => arr_i(p, c.n)?,
            None => vec![rcount; c.n],
        };
        let disp = match displs {
            Some(p) => arr_i(p, c.n)?,
            None => (0..c.n as c_int).map(|i| i * rcount).collect(),
        };
        let mut u = Unp(vec![]);
        for i in 0..c.n {
            let b = (rbuf as *mut u8).wrapping_offset(disp[i] as isize * ext) as *mut c_void;
            if i == root {
                if sbuf != IN_PLACE {
                    datatype::local_copy(
                        sbuf as *const u8,
                        scount.max(0) as usize,
                        stype,
                        b as *mut u8,
                        counts[i].max(0) as usize,
                        rtype,
                    )?;
                }
                continue;
            }
            let (p, len) = dst(s, &mut u, b, counts[i], rtype)?;
            s.recv(c.w(i), p, len);
        }
        s.wait();
        finish_unpack(s, u);
        Ok(())
    }
}

unsafe fn scatterv(
    sbuf: *const c_void,
    scounts: Option<*const c_int>,
    scount: c_int,
    displs: Option<*const c_int>,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |_st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::scatterv(
                s, x, sbuf, scounts, scount, displs, stype, rbuf, rcount, rtype, root,
            );
        }
        let root = check_root(root, c.n)?;
        if c.me != root {
            let mut u = Unp(vec![]);
            let (p, len) = dst(s, &mut u, rbuf, rcount, rtype)?;
            s.recv(c.w(root), p, len);
            s.wait();
            finish_unpack(s, u);
            return Ok(());
        }
        let (ext, _) = datatype::ext_size(stype)?;
        let counts = match scounts {
            Some(p) => arr_i(p, c.n)?,
            None => vec![scount; c.n],
        };
        let disp = match displs {
            Some(p) => arr_i(p, c.n)?,
            None => (0..c.n as c_int).map(|i| i * scount).collect(),
        };
        for i in 0..c.n {
            let b = (sbuf as *const u8).wrapping_offset(disp[i] as isize * ext) as *const c_void;
            if i == root {
                if !std::ptr::eq(rbuf, IN_PLACE) {
                    datatype::local_copy(
                        b as *const u8,
                        counts[i].max(0) as usize,
                        stype,
                        rbuf as *mut u8,
                        rcount.max(0) as usize,
                        rtype,
                    )?;
                }
                continue;
            }
            let (p, len) = src(s, b, counts[i], stype)?;
            s.send(c.w(i), p, len);
        }
        s.wait();
        Ok(())
    }
}

unsafe fn allgatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: Option<*const c_int>,
    rcount: c_int,
    displs: Option<*const c_int>,
    rtype: MPI_Datatype,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |_st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::allgatherv(
                s, x, sbuf, scount, stype, rbuf, rcounts, rcount, displs, rtype,
            );
        }
        let (ext, _) = datatype::ext_size(rtype)?;
        let counts = match rcounts {
            Some(p) => arr_i(p, c.n)?,
            None => vec![rcount; c.n],
        };
        let disp = match displs {
            Some(p) => arr_i(p, c.n)?,
            None => (0..c.n as c_int).map(|i| i * rcount).collect(),
        };
        let mut u = Unp(vec![]);
        let mut blocks = Vec::with_capacity(c.n);
        for i in 0..c.n {
            let b = (rbuf as *mut u8).wrapping_offset(disp[i] as isize * ext) as *mut c_void;
            let (p, len) = dst(s, &mut u, b, counts[i], rtype)?;
            if i == c.me {
                if sbuf != IN_PLACE {
                    datatype::local_copy(
                        sbuf as *const u8,
                        scount.max(0) as usize,
                        stype,
                        b as *mut u8,
                        counts[i].max(0) as usize,
                        rtype,
                    )?;
                }
                if p != b as *mut u8 {
                    // staged: pack our own block into the staging buffer
                    let v = datatype::pack_vec(b as *const u8, counts[i] as usize, rtype, len)?;
                    std::ptr::copy_nonoverlapping(v.as_ptr(), p, len);
                }
            }
            blocks.push((p, len));
        }
        allgather_s(s, c, &blocks);
        finish_unpack(s, u);
        Ok(())
    }
}

/// Alltoall(v,w). `w`: per-peer datatypes and byte displacements.
#[allow(clippy::type_complexity)]
unsafe fn alltoallw(
    sbuf: *const c_void,
    sc: Vec<c_int>,
    sd: Vec<isize>,
    st_: Vec<MPI_Datatype>,
    rbuf: *mut c_void,
    rc: Vec<c_int>,
    rd: Vec<isize>,
    rt: Vec<MPI_Datatype>,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |_st, s, c| {
        if let Some(x) = c.inter.as_deref() {
            return inter::alltoallw(s, x, sbuf, &sc, &sd, &st_, rbuf, &rc, &rd, &rt);
        }
        let n = c.n;
        let mut u = Unp(vec![]);
        let mut rb = Vec::with_capacity(n);
        let mut sb = Vec::with_capacity(n);
        let in_place = sbuf == IN_PLACE;
        // In place: the send data is the receive buffer; stage it first.
        let mut saved: Vec<(*const u8, usize)> = Vec::new();
        if in_place {
            for i in 0..n {
                let b = (rbuf as *const u8).wrapping_offset(rd[i]) as *const c_void;
                let (p, len) = match datatype::layout(b, rc[i], rt[i])? {
                    Lay::Contig(l) => (
                        s.keep(std::slice::from_raw_parts(b as *const u8, l).to_vec()) as *const u8,
                        l,
                    ),
                    Lay::Packed { bytes } => (
                        s.keep(datatype::pack_vec(
                            b as *const u8,
                            rc[i] as usize,
                            rt[i],
                            bytes,
                        )?) as *const u8,
                        bytes,
                    ),
                };
                saved.push((p, len));
            }
        }
        for i in 0..n {
            let b = (rbuf as *mut u8).wrapping_offset(rd[i]) as *mut c_void;
            rb.push(dst(s, &mut u, b, rc[i], rt[i])?);
            if in_place {
                sb.push(saved[i]);
            } else {
                let b = (sbuf as *const u8).wrapping_offset(sd[i]) as *const c_void;
                sb.push(src(s, b, sc[i], st_[i])?);
            }
        }
        alltoall_s(s, c, &sb, &rb);
        finish_unpack(s, u);
        Ok(())
    }
}

/// MPI_Alltoall: predefined types go straight to the algorithm; anything else through the alltoallw path.
unsafe fn alltoall(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |st, s, c| {
        let n = c.inter.as_ref().map_or(c.n, |x| x.len());
        if sbuf != IN_PLACE
            && c.inter.is_none()
            && datatype::is_simple(stype)
            && datatype::is_simple(rtype)
        {
            let sb = msg_bytes(sbuf, scount, stype)?;
            let rb = msg_bytes(rbuf, rcount, rtype)?;
            let sv: Vec<(*const u8, usize)> = (0..n)
                .map(|i| ((sbuf as *const u8).wrapping_add(i * sb), sb))
                .collect();
            let rv: Vec<(*mut u8, usize)> = (0..n)
                .map(|i| ((rbuf as *mut u8).wrapping_add(i * rb), rb))
                .collect();
            alltoall_s(s, c, &sv, &rv);
            return Ok(());
        }
        let fixed = |count: c_int, dt: MPI_Datatype| -> R<Blocks> {
            let (ext, _) = datatype::ext_size(dt)?;
            Ok((
                vec![count; n],
                (0..n).map(|i| i as isize * count as isize * ext).collect(),
                vec![dt; n],
            ))
        };
        let r = fixed(rcount, rtype)?;
        let sx = if sbuf == IN_PLACE {
            r.clone()
        } else {
            fixed(scount, stype)?
        };
        let mut g = alltoallw(sbuf, sx.0, sx.1, sx.2, rbuf, r.0, r.1, r.2);
        g(st, s, c)
    }
}

unsafe fn reduce_scatter(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    rcounts: Option<*const c_int>,
    rcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |st, s, c| {
        let counts = match rcounts {
            Some(p) => arr_i(p, c.n)?,
            None => vec![rcount; c.n],
        };
        if let Some(x) = &c.inter {
            return inter::reduce_scatter(st, s, c, x, sbuf, rbuf, &counts, dt, op);
        }
        let total: c_int = counts.iter().sum();
        let packed = red_packed(st, op, dt, total)?;
        let (red, cnt) = match packed {
            Some(x) => x,
            None => red_of(st, op, dt, total)?,
        };
        let per = if total > 0 { cnt / total as usize } else { 1 };
        let bytes = red_bytes(&red, cnt);
        let tmp = s.tmp(bytes);
        let mut input = if sbuf == IN_PLACE {
            rbuf as *const u8
        } else {
            sbuf as *const u8
        };
        if packed.is_some() {
            input = packed_in(s, input, total, dt, bytes)?;
        }
        allreduce_s(s, c, input, tmp, red, cnt);
        let off: usize = counts[..c.me].iter().map(|&x| x as usize).sum();
        let mine = counts[c.me] as usize * per * red.elem;
        if packed.is_some() {
            unpack_out(
                s,
                tmp.wrapping_add(off * per * red.elem),
                rbuf,
                mine,
                counts[c.me] as usize,
                dt,
            );
        } else {
            s.copy(
                tmp.wrapping_add(off * per * red.elem),
                rbuf as *mut u8,
                mine,
            );
        }
        Ok(())
    }
}

unsafe fn scan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    exclusive: bool,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |st, s, c| {
        if c.inter.is_some() {
            return err(
                MPI_ERR_COMM,
                "MPI_Scan and MPI_Exscan are not defined on intercommunicators",
            );
        }
        if let Some((red, cnt)) = red_packed(st, op, dt, count)? {
            let bytes = red_bytes(&red, cnt);
            let input = if sbuf == IN_PLACE {
                rbuf as *const u8
            } else {
                sbuf as *const u8
            };
            let inp = packed_in(s, input, count, dt, bytes)?;
            let out = s.tmp(bytes);
            if exclusive {
                // rank 0's result is undefined: keep its buffer as it is
                let keep = datatype::pack_vec(rbuf as *const u8, count as usize, dt, bytes)?;
                std::ptr::copy_nonoverlapping(keep.as_ptr(), out, bytes);
            }
            scan_s(s, c, inp, out, red, cnt, exclusive);
            unpack_out(s, out, rbuf, bytes, count as usize, dt);
            return Ok(());
        }
        let (red, cnt) = red_of(st, op, dt, count)?;
        let bytes = red_bytes(&red, cnt);
        let input = if sbuf == IN_PLACE {
            let t = s.tmp(bytes);
            std::ptr::copy_nonoverlapping(rbuf as *const u8, t, bytes);
            t as *const u8
        } else {
            sbuf as *const u8
        };
        scan_s(s, c, input, rbuf as *mut u8, red, cnt, exclusive);
        Ok(())
    }
}

/// Neighbor collectives: (sources, destinations) of the communicator's topology, and whether it is
/// Cartesian.
pub(crate) fn neighbors(st: &State, ci: usize) -> R<(Vec<c_int>, Vec<c_int>, bool)> {
    let c = st.comms[ci].as_ref().unwrap();
    let (s, d) = crate::comm::topo_neighbors(c)?;
    Ok((s, d, matches!(c.topo, Some(crate::comm::Topo::Cart { .. }))))
}

#[allow(clippy::type_complexity)]
unsafe fn neighbor_w(
    sbuf: *const c_void,
    sc: Vec<c_int>,
    sd: Vec<isize>,
    stp: Vec<MPI_Datatype>,
    rbuf: *mut c_void,
    rc: Vec<c_int>,
    rd: Vec<isize>,
    rt: Vec<MPI_Datatype>,
    srcs: Vec<c_int>,
    dsts: Vec<c_int>,
    cart: bool,
) -> impl FnMut(&mut State, &mut Sched, &Ctx) -> R {
    move |_st, s, c| {
        let mut u = Unp(vec![]);
        // Sends go out in neighbour order (per dimension: negative, then positive direction), and
        // receives match per sender in the order they are posted. In a Cartesian topology the block
        // sent toward the negative direction must land in the receiver's positive-direction block
        // (MPI 4.0 §8.6), which differs from order matching when both neighbours of a dimension are
        // one process (a periodic dimension of size 1 or 2): so receives are posted positive first.
        for k in 0..srcs.len() {
            let i = if cart { k ^ 1 } else { k };
            let r = srcs[i];
            if r == MPI_PROC_NULL {
                continue;
            }
            let b = (rbuf as *mut u8).wrapping_offset(rd[i]) as *mut c_void;
            let (p, len) = dst(s, &mut u, b, rc[i], rt[i])?;
            s.recv(c.w(r as usize), p, len);
        }
        for (i, &r) in dsts.iter().enumerate() {
            if r == MPI_PROC_NULL {
                continue;
            }
            let b = (sbuf as *const u8).wrapping_offset(sd[i]) as *const c_void;
            let (p, len) = src(s, b, sc[i], stp[i])?;
            s.send(c.w(r as usize), p, len);
        }
        s.wait();
        finish_unpack(s, u);
        Ok(())
    }
}

/// Blocking barrier (used by MPI_Barrier).
pub(crate) fn barrier(st: &mut State, comm: MPI_Comm) -> R {
    if crate::shmcoll::barrier(st, comm)? {
        return Ok(());
    }
    let (ci, _) = st.comm(comm)?;
    let (mut s, c) = begin(st, ci);
    barrier_s(&mut s, &c);
    finish(st, s)
}

/// MPI_MAX on MPI_INT (context agreement).
const MAX_INT: Red = Red {
    op: op::MPI_MAX,
    dt: 0x4c00_0405,
    elem: 4,
    user: None,
    commute: true,
};

/// Allreduce of i32 values with MPI_MAX over an explicit member list (communicator construction).
pub(crate) fn allreduce_max_group(
    st: &mut State,
    ctx: u32,
    tag: i32,
    members: &[usize],
    me: usize,
    vals: &mut [i32],
) -> R {
    let (mut s, c) = begin_group(ctx, tag, members, me);
    let red = MAX_INT;
    let p = vals.as_mut_ptr() as *mut u8;
    allreduce_s(&mut s, &c, p, p, red, vals.len());
    s.run(&mut st.fab.engine())
}

/// Nonblocking form of [`allreduce_max_group`] for one value (MPI_Comm_idup's context agreement): the
/// request on communicator `ci` completes with `then(state, max)`.
pub(crate) fn iallreduce_max_group(
    st: &mut State,
    ci: usize,
    (ctx, tag): (u32, i32),
    members: &[usize],
    me: usize,
    mine: i32,
    then: impl FnOnce(&mut State, i32) -> R + 'static,
) -> MPI_Request {
    let (mut s, c) = begin_group(ctx, tag, members, me);
    let red = MAX_INT;
    // The value lives in the schedule's own buffer, which stays put until `then` has run.
    let p = s.tmp(4);
    // SAFETY: `tmp` returned 4 writable bytes.
    unsafe { (p as *mut i32).write_unaligned(mine) };
    allreduce_s(&mut s, &c, p, p, red, 1);
    let mut s = Box::new(s);
    let _ = s.advance(&mut st.fab.engine());
    let h = crate::p2p::new_sched_req(st, ci, s);
    let i = ((h as u32) & 0x03ff_ffff) as usize;
    // SAFETY: read after the schedule completed, before it is dropped (`p2p::complete`).
    st.reqs[i].then = Some(Box::new(move |st: &mut State| {
        then(st, unsafe { (p as *const i32).read_unaligned() })
    }));
    h
}

/// Allgather of fixed-size i32 records over communicator `ci`.
pub(crate) fn allgather_ints(st: &mut State, ci: usize, mine: &[i32]) -> R<Vec<i32>> {
    let (mut s, c) = begin(st, ci);
    let k = mine.len();
    let mut out = vec![0i32; k * c.n];
    out[c.me * k..c.me * k + k].copy_from_slice(mine);
    let base = out.as_mut_ptr() as *mut u8;
    let blocks: Vec<(*mut u8, usize)> = (0..c.n)
        .map(|i| (base.wrapping_add(i * k * 4), k * 4))
        .collect();
    allgather_s(&mut s, &c, &blocks);
    finish(st, s)?;
    Ok(out)
}

/// Allgather of byte strings of any length over communicator `ci` (window creation): the lengths first,
/// then the strings.
pub(crate) fn allgather_bytes(st: &mut State, ci: usize, mine: &[u8]) -> R<Vec<Vec<u8>>> {
    let lens = allgather_ints(st, ci, &[mine.len() as i32])?;
    let (mut s, c) = begin(st, ci);
    let mut out: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l.max(0) as usize]).collect();
    out[c.me].copy_from_slice(mine);
    let blocks: Vec<(*mut u8, usize)> = out.iter_mut().map(|v| (v.as_mut_ptr(), v.len())).collect();
    allgather_s(&mut s, &c, &blocks);
    finish(st, s)?;
    Ok(out)
}

// ------------------------------------------------------------------------------------------------ entry points

unsafe fn v_args(
    st: &mut State,
    comm: MPI_Comm,
    counts: *const c_int,
    displs: *const c_int,
    types: Option<*const MPI_Datatype>,
    dt: MPI_Datatype,
    bytes_displs: bool,
) -> R<Blocks> {
    let n = st.comm(comm)?.1.peer_size() as usize;
    let c = arr_i(counts, n)?;
    let d = arr_i(displs, n)?;
    let t: Vec<MPI_Datatype> = match types {
        Some(p) => {
            if p.is_null() && n > 0 {
                return err(MPI_ERR_ARG, "array of types is NULL");
            }
            (0..n).map(|i| *p.add(i)).collect()
        }
        None => vec![dt; n],
    };
    let mut bd = Vec::with_capacity(n);
    for i in 0..n {
        if bytes_displs {
            bd.push(d[i] as isize);
        } else {
            bd.push(d[i] as isize * datatype::ext_size(t[i])?.0);
        }
    }
    Ok((c, bd, t))
}

unsafe fn nbr_args(
    st: &mut State,
    comm: MPI_Comm,
    count: c_int,
    dt: MPI_Datatype,
    counts: *const c_int,
    displs: *const c_int,
    types: Option<*const MPI_Datatype>,
    bytes: bool,
    k: usize,
    fixed: bool,
) -> R<Blocks> {
    let _ = st.comm(comm)?;
    if fixed {
        let (ext, _) = datatype::ext_size(dt)?;
        return Ok((
            vec![count; k],
            (0..k).map(|i| i as isize * count as isize * ext).collect(),
            vec![dt; k],
        ));
    }
    let c = arr_i(counts, k)?;
    let d = arr_i(displs, k)?;
    let t: Vec<MPI_Datatype> = match types {
        Some(p) => (0..k).map(|i| *p.add(i)).collect(),
        None => vec![dt; k],
    };
    let mut bd = Vec::with_capacity(k);
    for i in 0..k {
        bd.push(if bytes {
            d[i] as isize
        } else {
            d[i] as isize * datatype::ext_size(t[i])?.0
        });
    }
    Ok((c, bd, t))
}

/// `nbr_args` for the large-count forms: `k` counts (each must fit in an int: `bigcount::ci`) and
/// displacements in MPI_Aint, in units of `dt`'s extent, or of bytes with `types` (the `w` form).
unsafe fn nbr_args_c(
    counts: *const MPI_Count,
    displs: *const MPI_Aint,
    dt: MPI_Datatype,
    types: Option<*const MPI_Datatype>,
    k: usize,
) -> R<Blocks> {
    if k > 0 && (counts.is_null() || displs.is_null() || types.is_some_and(|t| t.is_null())) {
        return err(MPI_ERR_ARG, "array argument is NULL");
    }
    let mut out = (
        Vec::with_capacity(k),
        Vec::with_capacity(k),
        Vec::with_capacity(k),
    );
    for i in 0..k {
        out.0.push(crate::bigcount::ci(*counts.add(i))?);
        let t = types.map_or(dt, |p| *p.add(i));
        let d = *displs.add(i);
        out.1.push(if types.is_some() {
            d
        } else {
            d.checked_mul(datatype::ext_size(t)?.0)
                .ok_or_else(|| MpiErr {
                    code: MPI_ERR_ARG,
                    msg: format!("displacement {d} overflows"),
                })?
        });
        out.2.push(t);
    }
    Ok(out)
}

/// Per-peer blocks of a v/w collective: counts, byte displacements and types.
type Blocks = (Vec<c_int>, Vec<isize>, Vec<MPI_Datatype>);

macro_rules! coll_pair {
    ($( fn $name:ident / $pname:ident / $iname:ident / $piname:ident ( $($a:ident : $t:ty),* ) => $body:expr $(, shm $shm:expr)?; )*) => {$(
        mpi_api! {
            fn $name / $pname($($a: $t,)* comm: MPI_Comm) -> c_int {
                // A closure, so that `?` and the shared-memory path's early return end the call's body.
                #[allow(clippy::redundant_closure_call)]
                let r = (|| -> R {
                    $( if ($shm)(state()?, comm)? { return Ok(()); } )?
                    let mut b = $body;
                    go(comm, std::ptr::null_mut(), false, &mut b)
                })();
                fin(comm, stringify!($name), r)
            }
            fn $iname / $piname($($a: $t,)* comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
                #[allow(clippy::redundant_closure_call)]
                let r = (|| -> R {
                    let mut b = $body;
                    go(comm, request, true, &mut b)
                })();
                fin(comm, stringify!($iname), r)
            }
        }
    )*};
}

coll_pair! {
    fn MPI_Bcast / PMPI_Bcast / MPI_Ibcast / PMPI_Ibcast(buffer: *mut c_void, count: c_int, datatype: MPI_Datatype, root: c_int)
        => bcast(buffer, count, datatype, root), shm |st, comm| crate::shmcoll::bcast(st, comm, buffer, count, datatype, root);
    fn MPI_Reduce / PMPI_Reduce / MPI_Ireduce / PMPI_Ireduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op, root: c_int)
        => reduce(sendbuf, recvbuf, count, datatype, op, root), shm |st, comm| crate::shmcoll::reduce(st, comm, sendbuf, recvbuf, count, datatype, op, Some(root));
    fn MPI_Allreduce / PMPI_Allreduce / MPI_Iallreduce / PMPI_Iallreduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op)
        => allreduce(sendbuf, recvbuf, count, datatype, op), shm |st, comm| crate::shmcoll::reduce(st, comm, sendbuf, recvbuf, count, datatype, op, None);
    fn MPI_Gather / PMPI_Gather / MPI_Igather / PMPI_Igather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int)
        => gatherv(sendbuf, sendcount, sendtype, recvbuf, None, recvcount, None, recvtype, root), shm |st, comm| crate::shmcoll::gather(st, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, Some(root));
    fn MPI_Gatherv / PMPI_Gatherv / MPI_Igatherv / PMPI_Igatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, root: c_int)
        => gatherv(sendbuf, sendcount, sendtype, recvbuf, Some(recvcounts), 0, Some(displs), recvtype, root);
    fn MPI_Scatter / PMPI_Scatter / MPI_Iscatter / PMPI_Iscatter(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int)
        => scatterv(sendbuf, None, sendcount, None, sendtype, recvbuf, recvcount, recvtype, root), shm |st, comm| crate::shmcoll::scatter(st, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, Some(root));
    fn MPI_Scatterv / PMPI_Scatterv / MPI_Iscatterv / PMPI_Iscatterv(sendbuf: *const c_void, sendcounts: *const c_int, displs: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int)
        => scatterv(sendbuf, Some(sendcounts), 0, Some(displs), sendtype, recvbuf, recvcount, recvtype, root);
    fn MPI_Allgather / PMPI_Allgather / MPI_Iallgather / PMPI_Iallgather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype)
        => allgatherv(sendbuf, sendcount, sendtype, recvbuf, None, recvcount, None, recvtype), shm |st, comm| crate::shmcoll::gather(st, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, None);
    fn MPI_Allgatherv / PMPI_Allgatherv / MPI_Iallgatherv / PMPI_Iallgatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype)
        => allgatherv(sendbuf, sendcount, sendtype, recvbuf, Some(recvcounts), 0, Some(displs), recvtype);
    fn MPI_Reduce_scatter / PMPI_Reduce_scatter / MPI_Ireduce_scatter / PMPI_Ireduce_scatter(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const c_int, datatype: MPI_Datatype, op: MPI_Op)
        => reduce_scatter(sendbuf, recvbuf, Some(recvcounts), 0, datatype, op);
    fn MPI_Reduce_scatter_block / PMPI_Reduce_scatter_block / MPI_Ireduce_scatter_block / PMPI_Ireduce_scatter_block(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: c_int, datatype: MPI_Datatype, op: MPI_Op)
        => reduce_scatter(sendbuf, recvbuf, None, recvcount, datatype, op);
    fn MPI_Scan / PMPI_Scan / MPI_Iscan / PMPI_Iscan(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op)
        => scan(sendbuf, recvbuf, count, datatype, op, false);
    fn MPI_Exscan / PMPI_Exscan / MPI_Iexscan / PMPI_Iexscan(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op)
        => scan(sendbuf, recvbuf, count, datatype, op, true);
    fn MPI_Alltoall / PMPI_Alltoall / MPI_Ialltoall / PMPI_Ialltoall(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype)
        => alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype), shm |st, comm| crate::shmcoll::scatter(st, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, None);
}

mpi_api! {
    fn MPI_Barrier / PMPI_Barrier(comm: MPI_Comm) -> c_int {
        let r = (|| -> R { barrier(state()?, comm) })();
        fin(comm, "MPI_Barrier", r)
    }
    fn MPI_Ibarrier / PMPI_Ibarrier(comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = {
            let mut b = |_st: &mut State, s: &mut Sched, c: &Ctx| -> R { barrier_s(s, c); Ok(()) };
            go(comm, request, true, &mut b)
        };
        fin(comm, "MPI_Ibarrier", r)
    }
}

macro_rules! a2a_pair {
    ($( fn $name:ident / $pname:ident / $iname:ident / $piname:ident ( $($a:ident : $t:ty),* ) => |$st:ident, $comm:ident, $sb:ident, $rb:ident| $args:expr; )*) => {$(
        mpi_api! {
            fn $name / $pname($($a: $t,)* $comm: MPI_Comm) -> c_int {
                let r = (|| -> R {
                    let $st = state()?;
                    let (sc, sd, stp, rc, rd, rt) = $args;
                    let mut b = alltoallw($sb, sc, sd, stp, $rb, rc, rd, rt);
                    go($comm, std::ptr::null_mut(), false, &mut b)
                })();
                fin($comm, stringify!($name), r)
            }
            fn $iname / $piname($($a: $t,)* $comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
                let r = (|| -> R {
                    let $st = state()?;
                    let (sc, sd, stp, rc, rd, rt) = $args;
                    let mut b = alltoallw($sb, sc, sd, stp, $rb, rc, rd, rt);
                    go($comm, request, true, &mut b)
                })();
                fin($comm, stringify!($iname), r)
            }
        }
    )*};
}

/// The send and the receive side's blocks of a v/w collective, flattened for the schedule.
type SixVecs = (
    Vec<c_int>,
    Vec<isize>,
    Vec<MPI_Datatype>,
    Vec<c_int>,
    Vec<isize>,
    Vec<MPI_Datatype>,
);

unsafe fn six(s: Blocks, r: Blocks) -> SixVecs {
    (s.0, s.1, s.2, r.0, r.1, r.2)
}

a2a_pair! {
    fn MPI_Alltoallv / PMPI_Alltoallv / MPI_Ialltoallv / PMPI_Ialltoallv(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype)
        => |st, comm, sendbuf, recvbuf| {
            let r = v_args(st, comm, recvcounts, rdispls, None, recvtype, false)?;
            let s = if sendbuf == IN_PLACE { r.clone() } else { v_args(st, comm, sendcounts, sdispls, None, sendtype, false)? };
            six(s, r)
        };
    fn MPI_Alltoallw / PMPI_Alltoallw / MPI_Ialltoallw / PMPI_Ialltoallw(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtypes: *const MPI_Datatype)
        => |st, comm, sendbuf, recvbuf| {
            let r = v_args(st, comm, recvcounts, rdispls, Some(recvtypes), 0, true)?;
            let s = if sendbuf == IN_PLACE { r.clone() } else { v_args(st, comm, sendcounts, sdispls, Some(sendtypes), 0, true)? };
            six(s, r)
        };
}

macro_rules! nbr_pair {
    ($( fn $name:ident / $pname:ident / $iname:ident / $piname:ident / $xname:ident / $pxname:ident ( $($a:ident : $t:ty),* ) => |$st:ident, $ns:ident, $nd:ident, $comm:ident, $sb:ident, $rb:ident| $args:expr; )*) => {$(
        mpi_api! {
            // Persistent form (MPI 4.0): counts, displacements and neighbours are fixed now; every
            // MPI_Start runs the same builder (coll/persistent.rs).
            fn $xname / $pxname($($a: $t,)* $comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
                let r = (|| -> R {
                    let $st = state()?;
                    let ci = $st.comm($comm)?.0;
                    let ($ns, $nd, cart) = neighbors($st, ci)?;
                    let (sc, sd, stp, rc, rd, rt) = $args;
                    let types = stp.iter().chain(rt.iter()).copied().collect();
                    persistent::init($comm, info, request, types, Box::new(neighbor_w($sb, sc, sd, stp, $rb, rc, rd, rt, $ns, $nd, cart)))
                })();
                fin($comm, stringify!($xname), r)
            }
            fn $name / $pname($($a: $t,)* $comm: MPI_Comm) -> c_int {
                let r = (|| -> R {
                    let $st = state()?;
                    let ci = $st.comm($comm)?.0;
                    let ($ns, $nd, cart) = neighbors($st, ci)?;
                    let (sc, sd, stp, rc, rd, rt) = $args;
                    let mut b = neighbor_w($sb, sc, sd, stp, $rb, rc, rd, rt, $ns, $nd, cart);
                    go($comm, std::ptr::null_mut(), false, &mut b)
                })();
                fin($comm, stringify!($name), r)
            }
            fn $iname / $piname($($a: $t,)* $comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
                let r = (|| -> R {
                    let $st = state()?;
                    let ci = $st.comm($comm)?.0;
                    let ($ns, $nd, cart) = neighbors($st, ci)?;
                    let (sc, sd, stp, rc, rd, rt) = $args;
                    let mut b = neighbor_w($sb, sc, sd, stp, $rb, rc, rd, rt, $ns, $nd, cart);
                    go($comm, request, true, &mut b)
                })();
                fin($comm, stringify!($iname), r)
            }
        }
    )*};
}

nbr_pair! {
    fn MPI_Neighbor_allgather / PMPI_Neighbor_allgather / MPI_Ineighbor_allgather / PMPI_Ineighbor_allgather / MPI_Neighbor_allgather_init / PMPI_Neighbor_allgather_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let r = nbr_args(st, comm, recvcount, recvtype, std::ptr::null(), std::ptr::null(), None, false, ns.len(), true)?;
            let s = (vec![sendcount; nd.len()], vec![0isize; nd.len()], vec![sendtype; nd.len()]);
            six(s, r)
        };
    fn MPI_Neighbor_allgatherv / PMPI_Neighbor_allgatherv / MPI_Ineighbor_allgatherv / PMPI_Ineighbor_allgatherv / MPI_Neighbor_allgatherv_init / PMPI_Neighbor_allgatherv_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let r = nbr_args(st, comm, 0, recvtype, recvcounts, displs, None, false, ns.len(), false)?;
            let s = (vec![sendcount; nd.len()], vec![0isize; nd.len()], vec![sendtype; nd.len()]);
            six(s, r)
        };
    fn MPI_Neighbor_alltoall / PMPI_Neighbor_alltoall / MPI_Ineighbor_alltoall / PMPI_Ineighbor_alltoall / MPI_Neighbor_alltoall_init / PMPI_Neighbor_alltoall_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let r = nbr_args(st, comm, recvcount, recvtype, std::ptr::null(), std::ptr::null(), None, false, ns.len(), true)?;
            let s = nbr_args(st, comm, sendcount, sendtype, std::ptr::null(), std::ptr::null(), None, false, nd.len(), true)?;
            six(s, r)
        };
    fn MPI_Neighbor_alltoallv / PMPI_Neighbor_alltoallv / MPI_Ineighbor_alltoallv / PMPI_Ineighbor_alltoallv / MPI_Neighbor_alltoallv_init / PMPI_Neighbor_alltoallv_init(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let r = nbr_args(st, comm, 0, recvtype, recvcounts, rdispls, None, false, ns.len(), false)?;
            let s = nbr_args(st, comm, 0, sendtype, sendcounts, sdispls, None, false, nd.len(), false)?;
            six(s, r)
        };
    fn MPI_Neighbor_alltoallw / PMPI_Neighbor_alltoallw / MPI_Ineighbor_alltoallw / PMPI_Ineighbor_alltoallw / MPI_Neighbor_alltoallw_init / PMPI_Neighbor_alltoallw_init(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let _ = st.comm(comm)?;
            let rc = arr_i(recvcounts, ns.len())?;
            let sc = arr_i(sendcounts, nd.len())?;
            let rd: Vec<isize> = (0..ns.len()).map(|i| *rdispls.add(i)).collect();
            let sd: Vec<isize> = (0..nd.len()).map(|i| *sdispls.add(i)).collect();
            let rt: Vec<MPI_Datatype> = (0..ns.len()).map(|i| *recvtypes.add(i)).collect();
            let stp: Vec<MPI_Datatype> = (0..nd.len()).map(|i| *sendtypes.add(i)).collect();
            (sc, sd, stp, rc, rd, rt)
        };
    // Large-count forms (MPI 4.0): counts are MPI_Count, displacements MPI_Aint.
    fn MPI_Neighbor_allgatherv_c / PMPI_Neighbor_allgatherv_c / MPI_Ineighbor_allgatherv_c / PMPI_Ineighbor_allgatherv_c / MPI_Neighbor_allgatherv_init_c / PMPI_Neighbor_allgatherv_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let _ = st.comm(comm)?;
            let r = nbr_args_c(recvcounts, displs, recvtype, None, ns.len())?;
            let sc = crate::bigcount::ci(sendcount)?;
            let s = (vec![sc; nd.len()], vec![0isize; nd.len()], vec![sendtype; nd.len()]);
            six(s, r)
        };
    fn MPI_Neighbor_alltoallv_c / PMPI_Neighbor_alltoallv_c / MPI_Ineighbor_alltoallv_c / PMPI_Ineighbor_alltoallv_c / MPI_Neighbor_alltoallv_init_c / PMPI_Neighbor_alltoallv_init_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let _ = st.comm(comm)?;
            let r = nbr_args_c(recvcounts, rdispls, recvtype, None, ns.len())?;
            let s = nbr_args_c(sendcounts, sdispls, sendtype, None, nd.len())?;
            six(s, r)
        };
    fn MPI_Neighbor_alltoallw_c / PMPI_Neighbor_alltoallw_c / MPI_Ineighbor_alltoallw_c / PMPI_Ineighbor_alltoallw_c / MPI_Neighbor_alltoallw_init_c / PMPI_Neighbor_alltoallw_init_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype)
        => |st, ns, nd, comm, sendbuf, recvbuf| {
            let _ = st.comm(comm)?;
            let r = nbr_args_c(recvcounts, rdispls, 0, Some(recvtypes), ns.len())?;
            let s = nbr_args_c(sendcounts, sdispls, 0, Some(sendtypes), nd.len())?;
            six(s, r)
        };
}
