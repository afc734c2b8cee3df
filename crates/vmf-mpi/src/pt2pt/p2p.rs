//! Point-to-point communication: every send mode, blocking and nonblocking, persistent requests,
//! completion (wait/test families), probe and matched probe, cancel, buffered sends, and a barrier.
use crate::*;
use std::ffi::{c_int, c_void};
use vmf_core::{Op, SendMode};

// ------------------------------------------------------------------------------------------------ checks

/// Translate a destination/source rank of `c` to a world rank (`-1` for MPI_ANY_SOURCE); `None` for
/// MPI_PROC_NULL.
#[inline]
fn peer(c: &Comm, r: c_int, allow_any: bool) -> R<Option<i64>> {
    if r >= 0 && r < c.peer_size() {
        Ok(Some(c.peer_world(r) as i64))
    } else if r == MPI_PROC_NULL {
        Ok(None)
    } else if allow_any && r == MPI_ANY_SOURCE {
        Ok(Some(vmf_core::ANY_SOURCE as i64))
    } else {
        err(
            MPI_ERR_RANK,
            format!(
                "rank {r} is not in the communicator (size {})",
                c.peer_size()
            ),
        )
    }
}

#[inline]
fn check_tag(tag: c_int, allow_any: bool) -> R {
    if tag >= 0 || (allow_any && tag == MPI_ANY_TAG) {
        Ok(())
    } else {
        err(
            MPI_ERR_TAG,
            format!("tag {tag} is invalid (tags are 0..={TAG_UB})"),
        )
    }
}

pub(crate) fn comm_handle(ci: usize) -> MPI_Comm {
    match ci {
        0 => MPI_COMM_WORLD,
        1 => MPI_COMM_SELF,
        i => (0x8400_0000u32 | (i - 2) as u32) as c_int,
    }
}

#[inline]
fn st_from(c: &Comm, s: vmf_core::Status) -> St {
    St {
        src: c.peer_rank_of_world(s.source),
        tag: s.tag,
        bytes: s.count,
        cancelled: s.cancelled,
    }
}

fn core_err(e: Option<vmf_core::Error>) -> R {
    match e {
        None => Ok(()),
        Some(e) => Err(from_core(e)),
    }
}

// ------------------------------------------------------------------------------------------------ request table

type GreqQuery = unsafe extern "C" fn(*mut c_void, *mut MPI_Status) -> c_int;
type GreqFree = unsafe extern "C" fn(*mut c_void) -> c_int;
type GreqCancel = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
/// MPICH's extended generalized requests (MPIX_Grequest_start): progress function.
type GreqPoll = unsafe extern "C" fn(*mut c_void, *mut MPI_Status) -> c_int;
/// MPICH's extended generalized requests: blocking wait function (accepted; completion is driven by the
/// poll function, which MPICH's extension requires to make progress).
type GreqWait = unsafe extern "C" fn(c_int, *mut *mut c_void, f64, *mut MPI_Status) -> c_int;

/// The functions of a generalized-request class (MPIX_Grequest_class_create), by class handle.
#[derive(Clone, Copy)]
struct GreqClass {
    query: GreqQuery,
    free: GreqFree,
    cancel: GreqCancel,
    poll: Option<GreqPoll>,
    _wait: Option<GreqWait>,
}
static GREQ_CLASSES: std::sync::Mutex<Vec<GreqClass>> = std::sync::Mutex::new(Vec::new());
/// Class handles are this plus the index (0 is never a class).
const GREQ_CLASS_BASE: c_int = 0x4400_0000;

/// The functions a generalized request is started with (query, free and cancel are required).
fn greq_fns(
    query: Option<GreqQuery>,
    free: Option<GreqFree>,
    cancel: Option<GreqCancel>,
    poll: Option<GreqPoll>,
    wait: Option<GreqWait>,
) -> R<GreqClass> {
    let (Some(query), Some(free), Some(cancel)) = (query, free, cancel) else {
        return err(MPI_ERR_ARG, "query_fn, free_fn and cancel_fn must all be given");
    };
    Ok(GreqClass { query, free, cancel, poll, _wait: wait })
}

/// Start a generalized request with the functions `f` and the program's `extra` state.
unsafe fn start_greq(st: &mut State, f: GreqClass, extra: *mut c_void, request: *mut MPI_Request) -> R {
    if request.is_null() {
        return err(MPI_ERR_ARG, "request is NULL");
    }
    let g = Greq {
        query: f.query,
        free: f.free,
        cancel: f.cancel,
        extra,
        done: Default::default(),
        freed: false,
        poll: f.poll,
        poll_rc: MPI_SUCCESS,
    };
    *request = new_req(st, MReq { greq: Some(Box::new(g)), ..MReq::on(1) });
    Ok(())
}

/// Partitioned communication (MPI 4.0): a persistent request whose message moves as one piece, on the
/// communicator's collective context with a tag of its own range (so it matches only the other side's
/// partitioned operation). A send leaves when its last partition is marked ready; a receive reports a
/// partition arrived when the whole message has.
pub(crate) struct Part {
    parts: usize,
    ready: Vec<bool>,
    nready: usize,
}

/// Tag range of partitioned messages on the collective context (below: collective schedules, whose
/// sequence numbers wrap below it; above: intercommunicator set-up). Partitioned tags must fit in it.
const PART_TAG: c_int = 0x2000_0000;
const PART_TAG_MAX: c_int = 0x1fff_ffff;

fn part_tag(tag: c_int) -> c_int {
    PART_TAG | (tag & PART_TAG_MAX)
}

/// A generalized request (MPI_Grequest_start): the program completes it with MPI_Grequest_complete
/// (maybe from another thread: the flag is atomic and boxed, so its address is stable); MPI calls the
/// program's query function for the status and its free function when the request goes away.
pub(crate) struct Greq {
    query: GreqQuery,
    free: GreqFree,
    cancel: GreqCancel,
    extra: *mut c_void,
    done: std::sync::atomic::AtomicBool,
    /// MPI_Request_free came before MPI_Grequest_complete: the latter frees it.
    freed: bool,
    /// MPIX_Grequest_start / class requests: called by every test and wait until the request is done.
    poll: Option<GreqPoll>,
    /// The first error the poll function returned (the request's error at completion).
    poll_rc: c_int,
}

impl Greq {
    fn is_done(&self) -> bool {
        self.done.load(std::sync::atomic::Ordering::Acquire)
    }
    /// The status the program's query function reports, and its error.
    unsafe fn query(&self) -> (St, R) {
        let mut s = MPI_Status::default();
        let rc = (self.query)(self.extra, &mut s);
        let st = St {
            src: s.MPI_SOURCE,
            tag: s.MPI_TAG,
            bytes: crate::get_count(&s).max(0) as usize,
            cancelled: s.count_hi_and_cancelled & 1 != 0,
        };
        (
            st,
            if rc == MPI_SUCCESS {
                Ok(())
            } else {
                err(rc, "the generalized request's query function failed")
            },
        )
    }
}

pub(crate) fn new_req(st: &mut State, r: MReq) -> MPI_Request {
    let i = match st.free_reqs.pop() {
        Some(i) => {
            st.reqs[i as usize] = r;
            i as usize
        }
        None => {
            st.reqs.push(r);
            st.reqs.len() - 1
        }
    };
    (REQ_BASE | i as u32) as c_int
}

#[inline]
fn req_index(st: &State, h: MPI_Request) -> R<usize> {
    let u = h as u32;
    if u & 0xfc00_0000 == REQ_BASE {
        let i = (u & 0x03ff_ffff) as usize;
        if st.reqs.get(i).is_some_and(|r| r.live) {
            return Ok(i);
        }
    }
    err(MPI_ERR_REQUEST, format!("invalid request handle {h:#x}"))
}

/// A request for a nonblocking collective.
pub(crate) fn new_sched_req(st: &mut State, ci: usize, s: Box<crate::coll::Sched>) -> MPI_Request {
    st.nbc_active += 1;
    new_req(
        st,
        MReq {
            sched: Some(s),
            ..MReq::on(ci)
        },
    )
}

/// Advance the schedules (nonblocking collectives) among requests `idx`.
fn drive(st: &mut State, idx: &[usize]) {
    let (reqs, fab) = (&mut st.reqs, &st.fab);
    let mut e = fab.engine();
    let mut polls = Vec::new();
    for &i in idx {
        if let Some(s) = reqs[i].sched.as_mut() {
            let _ = s.advance(&mut e);
        }
        if let Some(g) = reqs[i].greq.as_ref() {
            if let (Some(p), false) = (g.poll, g.is_done()) {
                polls.push((i, p, g.extra));
            }
        }
    }
    drop(e);
    // Generalized requests with a poll function (MPICH's extension) progress when they are tested or
    // waited for. The function may call MPI (MPI_Grequest_complete): nothing is borrowed meanwhile.
    for (i, p, extra) in polls {
        let mut status = MPI_Status::default();
        // SAFETY: the program's function with the extra state it registered.
        let rc = unsafe { p(extra, &mut status) };
        if rc != MPI_SUCCESS {
            if let Some(g) = st.reqs.get_mut(i).and_then(|r| r.greq.as_mut()) {
                if g.poll_rc == MPI_SUCCESS {
                    g.poll_rc = rc;
                }
            }
        }
    }
}

/// Some of the requests `idx` are generalized requests that progress only when polled.
fn any_polled(st: &State, idx: &[usize]) -> bool {
    idx.iter().any(|&i| st.reqs[i].greq.as_ref().is_some_and(|g| g.poll.is_some()))
}

/// Requests of every nonblocking collective in flight (none in the common case: a counter says so).
fn all_scheds(st: &State) -> Vec<usize> {
    if st.nbc_active == 0 {
        return Vec::new();
    }
    (0..st.reqs.len())
        .filter(|&i| st.reqs[i].live && st.reqs[i].sched.as_ref().is_some_and(|s| !s.done))
        .collect()
}

/// Block until all (or any) of the requests `idx` are done, advancing schedules on the way.
fn wait_reqs(st: &mut State, idx: &[usize], all: bool) -> R {
    // While blocked here, every nonblocking collective in flight advances too (not only those waited for):
    // a peer may need this rank's next round before it can complete what we wait for.
    let scheds = all_scheds(st);
    let any_sched = !scheds.is_empty();
    if any_polled(st, idx) {
        // Poll, progress, look, let others run: the poll functions are what completes these.
        let mut spins = 0u32;
        let stp: *mut State = st;
        loop {
            // SAFETY: the global state; reloaded through an opaque pointer each round, because other
            // threads may use it while `relax` lets them in (MPI_THREAD_MULTIPLE).
            let st = unsafe { &mut *std::hint::black_box(stp) };
            drive(st, &scheds);
            drive(st, idx);
            // A poll function that failed ends the wait with its error (the request stays pending).
            if let Some(rc) = idx.iter().find_map(|&i| {
                st.reqs[i].greq.as_ref().map(|g| g.poll_rc).filter(|&rc| rc != MPI_SUCCESS)
            }) {
                return err(rc, "a generalized request's poll function failed");
            }
            let e = st.fab.engine();
            let done = if all {
                idx.iter().all(|&i| req_done_at(&e, &st.reqs, i))
            } else {
                idx.iter().any(|&i| req_done_at(&e, &st.reqs, i))
            };
            drop(e);
            if done {
                return Ok(());
            }
            st.fab.engine().progress().map_err(from_core)?;
            crate::mt::relax(st);
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            }
        }
    }
    loop {
        if any_sched {
            drive(st, &scheds);
        }
        // Under MPI_THREAD_MULTIPLE the wait hands the library lock to other threads between polls, and
        // they may grow (move) the request table: the condition reloads it through an opaque pointer.
        let (rp, mut e) = (&st.reqs as *const Vec<MReq>, st.fab.engine());
        let cond = |e: &Engine| {
            // SAFETY: the table lives in the global state; the lock is ours again whenever this runs.
            let rt: &Vec<MReq> = unsafe { &*std::hint::black_box(rp) };
            if all {
                idx.iter().all(|&i| req_done_at(e, rt, i))
            } else {
                idx.iter().any(|&i| req_done_at(e, rt, i))
            }
        };
        if !any_sched {
            return e.wait_until(Op::Wait, cond).map_err(from_core);
        }
        if cond(&e) {
            return Ok(());
        }
        e.wait_until(Op::Wait, |e| {
            cond(e)
                || scheds.iter().any(|&i| {
                    // SAFETY: as in `cond`.
                    let rt: &Vec<MReq> = unsafe { &*std::hint::black_box(rp) };
                    rt[i].sched.as_ref().is_some_and(|s| !s.done && s.ready(e))
                })
        })
        .map_err(from_core)?;
    }
}

/// Request `i` is done (with the send of an MPI_Isendrecv linked to it).
#[inline]
fn req_done_at(e: &Engine, reqs: &[MReq], i: usize) -> bool {
    let r = &reqs[i];
    req_done(e, r) && r.link.is_none_or(|j| req_done(e, &reqs[j as usize]))
}

#[inline]
fn req_done(e: &Engine, r: &MReq) -> bool {
    if let Some(g) = &r.greq {
        return g.is_done();
    }
    if let Some(p) = &r.part {
        if r.active && !r.is_recv && r.fin.is_none() && p.nready < p.parts {
            return false; // its message has not left yet
        }
    }
    if let Some(s) = &r.sched {
        return s.done;
    }
    !r.active || r.fin.is_some() || r.eng.is_none_or(|id| e.is_done(id))
}

/// Complete request `i` (which must be done): free it (nonpersistent; `*h` becomes MPI_REQUEST_NULL) or
/// make it inactive (persistent). Returns its status and error.
unsafe fn complete(st: &mut State, i: usize, h: *mut MPI_Request) -> R<(St, R)> {
    if let Some(g) = st.reqs[i].greq.take() {
        let (s, r) = g.query();
        let rf = (g.free)(g.extra);
        let r = if g.poll_rc != MPI_SUCCESS {
            err(g.poll_rc, "the generalized request's poll function failed")
        } else {
            r
        };
        let r = r.and(if rf == MPI_SUCCESS {
            Ok(())
        } else {
            err(rf, "the generalized request's free function failed")
        });
        release_slot(st, i, h);
        return Ok((s, r));
    }
    if let Some(j) = st.reqs[i].link.take() {
        // MPI_Isendrecv: the send completes with the receive; its error, if any, is the request's.
        let (_, send_res) = complete(st, j as usize, std::ptr::null_mut())?;
        let (s, recv_res) = complete(st, i, h)?;
        return Ok((s, recv_res.and(send_res)));
    }
    let r = &mut st.reqs[i];
    let ci = r.comm;
    let is_recv = r.is_recv;
    let res = if let Some(s) = r.sched.take() {
        st.nbc_active -= 1;
        let then = r.then.take();
        let res = match (s.err.clone(), then) {
            (Some(x), _) => Err(x),
            (None, Some(f)) => f(st),
            (None, None) => Ok(()),
        };
        drop(s);
        (St::EMPTY, res)
    } else if !r.active {
        (St::EMPTY, Ok(()))
    } else if let Some(f) = r.fin.take() {
        (f, Ok(()))
    } else if let Some(id) = r.eng.take() {
        let (s, e) = st.fab.engine().take_full(id).map_err(from_core)?;
        let c = st.comms[ci].as_ref().expect("request's communicator");
        let s = if is_recv {
            let mut s = st_from(c, s);
            if st.reqs[i].part.is_some() {
                s.tag = st.reqs[i].persist.map_or(s.tag, |p| p.tag); // the program's tag, not the range's
            }
            s
        } else {
            St {
                cancelled: s.cancelled,
                ..St::EMPTY
            }
        };
        if let Some(x) = st.reqs[i].xfer.take() {
            if let Some((b, n, dt)) = x.unpack {
                let r = crate::datatype::unpack_from(&x.tmp, s.bytes, b, n, dt);
                if st.reqs[i].persist.is_none() {
                    crate::datatype::release(st, dt); // the hold taken when the receive was posted
                }
                r?;
            }
        }
        (s, core_err(e))
    } else {
        (St::EMPTY, Ok(()))
    };
    let r = &mut st.reqs[i];
    if r.persist.is_none() {
        r.xfer = None;
    }
    r.active = false;
    // persistent requests (point-to-point or collective) stay allocated until MPI_Request_free
    if r.persist.is_none() && st.pcolls.get(i).is_none_or(|p| p.is_none()) {
        r.live = false;
        st.free_reqs.push(i as u32);
        if !h.is_null() {
            *h = MPI_REQUEST_NULL;
        }
    }
    Ok(res)
}

/// Status of a done request without completing it.
fn peek(st: &State, i: usize) -> (St, R) {
    if let Some(g) = &st.reqs[i].greq {
        // SAFETY: the program's query function, with its own extra state.
        return unsafe { g.query() };
    }
    if let Some(j) = st.reqs[i].link {
        let (s, r) = peek_one(st, i);
        return (s, r.and(peek_one(st, j as usize).1));
    }
    peek_one(st, i)
}

fn peek_one(st: &State, i: usize) -> (St, R) {
    let r = &st.reqs[i];
    if !r.active {
        return (St::EMPTY, Ok(()));
    }
    if let Some(f) = r.fin {
        return (f, Ok(()));
    }
    match r.eng.and_then(|id| st.fab.engine().peek(id)) {
        Some((s, e)) => {
            let c = st.comms[r.comm].as_ref().expect("request's communicator");
            let s = if r.is_recv {
                let mut s = st_from(c, s);
                if r.part.is_some() {
                    s.tag = r.persist.map_or(s.tag, |p| p.tag); // the program's tag
                }
                s
            } else {
                St {
                    cancelled: s.cancelled,
                    ..St::EMPTY
                }
            };
            (s, core_err(e))
        }
        None => (St::EMPTY, Ok(())),
    }
}

/// Collect finished buffered sends and orphaned requests; with `all`, wait for every one of them first.
pub(crate) fn reap(st: &mut State, all: bool) -> R {
    let mut e = st.fab.engine();
    if all {
        let (b, o) = (&st.bsends, &st.orphans);
        e.wait_until(Op::Wait, |e| {
            b.iter().all(|(id, _)| e.is_done(*id))
                && o.iter().all(|(id, _)| e.is_done(*id) || e.is_posted(*id))
        })
        .map_err(from_core)?;
    }
    let mut k = 0;
    while k < st.bsends.len() {
        if e.is_done(st.bsends[k].0) {
            let (id, v) = st.bsends.swap_remove(k);
            st.bsend_used = st.bsend_used.saturating_sub(v.len() + MPI_BSEND_OVERHEAD);
            let _ = e.take_full(id);
        } else {
            k += 1;
        }
    }
    let mut k = 0;
    let mut landed = Vec::new();
    while k < st.orphans.len() {
        if e.is_done(st.orphans[k].0) {
            let (id, staging) = st.orphans.swap_remove(k);
            let done = e.take_full(id);
            if let Some((b, n, dt)) = staging.as_ref().and_then(|x| x.unpack) {
                landed.push((
                    staging.unwrap(),
                    done.ok()
                        .filter(|(_, err)| err.is_none())
                        .map(|(s, _)| s.count),
                    b,
                    n,
                    dt,
                ));
            }
        } else {
            k += 1;
        }
    }
    drop(e);
    // A freed receive of a non-contiguous type still lands in the program's buffer; then its type hold ends.
    for (x, bytes, b, n, dt) in landed {
        if let Some(bytes) = bytes {
            // SAFETY: the buffer the program named when it posted the receive.
            let _ = unsafe { crate::datatype::unpack_from(&x.tmp, bytes, b, n, dt) };
        }
        crate::datatype::release(st, dt);
    }
    Ok(())
}

/// MPI_Psend_init / MPI_Precv_init: a persistent request for `partitions * count` elements.
#[allow(clippy::too_many_arguments)]
unsafe fn part_init(
    buf: *mut c_void,
    partitions: c_int,
    count: MPI_Count,
    dt: MPI_Datatype,
    peer_r: c_int,
    tag: c_int,
    comm: MPI_Comm,
    info: MPI_Info,
    is_recv: bool,
    req: *mut MPI_Request,
) -> R {
    crate::info::check(info)?;
    if partitions < 1 {
        return err(MPI_ERR_ARG, format!("{partitions} partitions (at least 1)"));
    }
    let total = count
        .checked_mul(partitions as MPI_Count)
        .and_then(|n| c_int::try_from(n).ok())
        .filter(|&n| n >= 0)
        .ok_or_else(|| MpiErr {
            code: MPI_ERR_COUNT,
            msg: format!("{partitions} partitions of {count} elements: negative or above INT_MAX"),
        })?;
    if !(0..=PART_TAG_MAX).contains(&tag) {
        return err(
            MPI_ERR_TAG,
            format!("tag {tag} is invalid for a partitioned operation (0..={PART_TAG_MAX}, no wildcards)"),
        );
    }
    persistent(
        buf,
        total,
        dt,
        peer_r,
        tag,
        comm,
        Mode::Standard,
        is_recv,
        req,
    )?;
    let st = state()?;
    let i = req_index(st, *req)?;
    if is_recv && peer_r == MPI_ANY_SOURCE {
        free_req(st, i)?;
        *req = MPI_REQUEST_NULL;
        return err(
            MPI_ERR_RANK,
            "partitioned receives name their source (no MPI_ANY_SOURCE)",
        );
    }
    let n = partitions as usize;
    st.reqs[i].part = Some(Box::new(Part {
        parts: n,
        ready: vec![false; n],
        nready: 0,
    }));
    Ok(())
}

/// Mark partitions of an active partitioned send ready; the last one sends the message.
unsafe fn pready(request: MPI_Request, list: &mut dyn Iterator<Item = c_int>) -> R {
    let st = state()?;
    let i = req_index(st, request)?;
    let r = &mut st.reqs[i];
    let (Some(p), false) = (r.part.as_mut(), r.is_recv) else {
        return err(
            MPI_ERR_REQUEST,
            "MPI_Pready* needs a partitioned send request",
        );
    };
    if !r.active {
        return err(
            MPI_ERR_REQUEST,
            "MPI_Pready* on a partitioned send that is not started (MPI_Start)",
        );
    }
    if r.fin.is_some() || r.eng.is_some() {
        return Ok(()); // MPI_PROC_NULL, or already sent
    }
    for k in list {
        let Some(x) = usize::try_from(k).ok().and_then(|k| p.ready.get_mut(k)) else {
            return err(MPI_ERR_ARG, format!("partition {k} of {}", p.parts));
        };
        if !*x {
            *x = true;
            p.nready += 1;
        }
    }
    if p.nready < p.parts {
        return Ok(());
    }
    let pr = r.persist.expect("partitioned requests are persistent");
    let ci = r.comm;
    let c = st.comms[ci].as_ref().ok_or_else(|| MpiErr {
        code: MPI_ERR_COMM,
        msg: "communicator was freed".into(),
    })?;
    let w = peer(c, pr.peer, false)?.expect("MPI_PROC_NULL sends complete at MPI_Start");
    let ctx = c.coll;
    let mut bp = pr.buf as *const u8;
    if pr.packed {
        let x = Box::new(crate::datatype::Xfer {
            tmp: crate::datatype::pack_vec(pr.buf, pr.count, pr.dt, pr.bytes)?,
            unpack: None,
        });
        bp = x.tmp.as_ptr();
        st.reqs[i].xfer = Some(x);
    }
    let id = st
        .fab
        .engine()
        .isend(bp, pr.bytes, w, part_tag(pr.tag), ctx, SendMode::Standard)
        .map_err(from_core)?;
    st.reqs[i].eng = Some(id);
    Ok(())
}

/// Give request slot `i` back (and set the program's handle, if any, to MPI_REQUEST_NULL).
unsafe fn release_slot(st: &mut State, i: usize, h: *mut MPI_Request) {
    let r = &mut st.reqs[i];
    r.live = false;
    r.active = false;
    st.free_reqs.push(i as u32);
    if !h.is_null() {
        *h = MPI_REQUEST_NULL;
    }
}

/// MPI_Request_free of request `i`: an active operation finishes in the background.
fn free_req(st: &mut State, i: usize) -> R {
    if let Some(mut s) = st.reqs[i].sched.take() {
        // A freed nonblocking collective still has to take part: finish it here.
        st.nbc_active -= 1;
        s.run(&mut st.fab.engine())?;
        if let Some(f) = st.reqs[i].then.take() {
            f(st)?;
        }
    }
    let r = &mut st.reqs[i];
    if let (true, Some(id)) = (r.active, r.eng.take()) {
        // The operation completes normally in the background (a freed receive still takes the message it
        // would have matched). The engine may still read (send) or write (receive) the staging buffer: it
        // goes with it.
        let x = r.xfer.take();
        if let (Some((_, _, dt)), Some(_)) = (x.as_ref().and_then(|x| x.unpack), r.persist) {
            crate::datatype::hold(st, dt); // the orphan unpacks after the request's own hold ends
        }
        st.orphans.push((id, x));
    }
    if let Some(p) = st.reqs[i].persist {
        crate::datatype::release(st, p.dt);
    }
    let r = &mut st.reqs[i];
    r.live = false;
    r.active = false;
    r.persist = None;
    st.free_reqs.push(i as u32);
    crate::coll::persistent::forget(st, i);
    Ok(())
}

// ------------------------------------------------------------------------------------------------ starting

/// Start a send; `None` when it completed at once without an engine request (MPI_PROC_NULL, buffered).
#[inline]
unsafe fn start_send(
    st: &mut State,
    ci: usize,
    buf: *const u8,
    bytes: usize,
    dest: i64,
    tag: c_int,
    mode: Mode,
) -> R<Option<ReqId>> {
    let pt = st.comms[ci].as_ref().unwrap().pt;
    if mode == Mode::Buffered {
        return bsend(st, pt, buf, bytes, dest, tag).map(|_| None);
    }
    let emode = if mode == Mode::Sync {
        SendMode::Synchronous
    } else {
        SendMode::Standard
    };
    st.fab
        .engine()
        .isend(buf, bytes, dest, tag, pt, emode)
        .map(Some)
        .map_err(from_core)
}

unsafe fn bsend(st: &mut State, pt: u32, buf: *const u8, bytes: usize, dest: i64, tag: c_int) -> R {
    reap(st, false)?;
    let Some((_, size)) = st.bsend_buf else {
        return err(
            MPI_ERR_BUFFER,
            "buffered send without an attached buffer (MPI_Buffer_attach)",
        );
    };
    if st.bsend_used + bytes + MPI_BSEND_OVERHEAD > size {
        return err(
            MPI_ERR_BUFFER,
            format!("attached buffer too small: {bytes} + {MPI_BSEND_OVERHEAD} bytes needed, {} of {size} free", size - st.bsend_used),
        );
    }
    let v = std::slice::from_raw_parts(buf, bytes).to_vec();
    let id = st
        .fab
        .engine()
        .isend(v.as_ptr(), bytes, dest, tag, pt, SendMode::Standard)
        .map_err(from_core)?;
    st.bsend_used += bytes + MPI_BSEND_OVERHEAD;
    st.bsends.push((id, v));
    Ok(())
}

/// Common checks of a send: returns (comm index, bytes, world destination or None for PROC_NULL).
/// Bytes on the wire of (buf, count, dt): contiguous predefined types straight from the handle, others
/// through their description.
#[inline]
fn lay_bytes(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> R<usize> {
    if crate::datatype::is_simple(dt) {
        return msg_bytes(buf, count, dt);
    }
    match crate::datatype::layout(buf, count, dt)? {
        crate::datatype::Lay::Contig(b) | crate::datatype::Lay::Packed { bytes: b } => Ok(b),
    }
}

/// Staging of a non-contiguous datatype: `Some(vec)` (send: packed data; receive: room) or None.
#[inline]
unsafe fn stage(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    bytes: usize,
    send: bool,
) -> R<Option<Vec<u8>>> {
    if crate::datatype::is_simple(dt) {
        return Ok(None);
    }
    match crate::datatype::layout(buf, count, dt)? {
        crate::datatype::Lay::Contig(_) => Ok(None),
        crate::datatype::Lay::Packed { .. } if send => {
            crate::datatype::pack_vec(buf as *const u8, count as usize, dt, bytes).map(Some)
        }
        crate::datatype::Lay::Packed { .. } => Ok(Some(vec![0u8; bytes.max(1)])),
    }
}

#[inline]
unsafe fn send_args(
    st: &mut State,
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<(usize, usize, Option<i64>)> {
    let (ci, c) = st.comm(comm)?;
    let bytes = lay_bytes(buf, count, dt)?;
    check_tag(tag, false)?;
    let w = peer(c, dest, false)?;
    Ok((ci, bytes, w))
}

#[inline]
unsafe fn recv_args(
    st: &mut State,
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<(usize, usize, Option<i64>)> {
    let (ci, c) = st.comm(comm)?;
    let bytes = lay_bytes(buf, count, dt)?;
    check_tag(tag, true)?;
    let w = peer(c, src, true)?;
    Ok((ci, bytes, w))
}

unsafe fn send_blocking(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    mode: Mode,
) -> R {
    let st = state()?;
    let (ci, bytes, w) = send_args(st, buf, count, dt, dest, tag, comm)?;
    let Some(w) = w else { return Ok(()) };
    let pk = stage(buf, count, dt, bytes, true)?;
    let p = pk.as_ref().map_or(buf as *const u8, |v| v.as_ptr());
    // Fast path: an eager message to an idle queue goes straight into the transport, no request.
    if matches!(mode, Mode::Standard | Mode::Ready) {
        let pt = st.comms[ci].as_ref().unwrap().pt;
        if st
            .fab
            .engine()
            .try_send_now(p, bytes, w, tag, pt)
            .map_err(from_core)?
        {
            return Ok(());
        }
    }
    let Some(id) = start_send(st, ci, p, bytes, w, tag, mode)? else {
        return Ok(());
    };
    let mut e = st.fab.engine();
    if !e.is_done(id) {
        e.wait_until(Op::Send, |e| e.is_done(id))
            .map_err(from_core)?;
    }
    let (_, er) = e.take_full(id).map_err(from_core)?;
    core_err(er)
}

unsafe fn send_nonblocking(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    mode: Mode,
    req: *mut MPI_Request,
) -> R {
    let st = state()?;
    if req.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    let (ci, bytes, w) = send_args(st, buf, count, dt, dest, tag, comm)?;
    let pk = if w.is_some() {
        stage(buf, count, dt, bytes, true)?
    } else {
        None
    };
    let p = pk.as_ref().map_or(buf as *const u8, |v| v.as_ptr());
    let (eng, fin) = match w {
        None => (None, Some(St::PROC_NULL)),
        Some(w) => match start_send(st, ci, p, bytes, w, tag, mode)? {
            Some(id) => (Some(id), None),
            None => (None, Some(St::EMPTY)),
        },
    };
    let xfer = pk.map(|tmp| Box::new(crate::datatype::Xfer { tmp, unpack: None }));
    *req = new_req(
        st,
        MReq {
            eng,
            fin,
            xfer,
            ..MReq::on(ci)
        },
    );
    Ok(())
}

unsafe fn recv_blocking(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> R {
    let st = state()?;
    let (ci, bytes, w) = recv_args(st, buf, count, dt, src, tag, comm)?;
    let Some(w) = w else {
        St::PROC_NULL.write(status);
        return Ok(());
    };
    let mut tmp = stage(buf, count, dt, bytes, false)?;
    let p = tmp.as_mut().map_or(buf as *mut u8, |v| v.as_mut_ptr());
    let pt = st.comms[ci].as_ref().unwrap().pt;
    let mut e = st.fab.engine();
    // Fast path: an eager message from a co-resident sender, copied straight from its ring.
    if tmp.is_none() {
        if let Some(s) = e.recv_direct(p, bytes, w, tag, pt).map_err(from_core)? {
            drop(e);
            st_from(st.comms[ci].as_ref().unwrap(), s).write(status);
            return Ok(());
        }
    }
    let id = e.irecv(p, bytes, w, tag, pt).map_err(from_core)?;
    if !e.is_done(id) {
        e.wait_until(Op::Recv, |e| e.is_done(id))
            .map_err(from_core)?;
    }
    let (s, er) = e.take_full(id).map_err(from_core)?;
    drop(e);
    if let Some(t) = &tmp {
        crate::datatype::unpack_from(t, s.count, buf as *mut u8, count as usize, dt)?;
    }
    // Looked up again after the wait: under MPI_THREAD_MULTIPLE other threads may have grown the table.
    st_from(st.comms[ci].as_ref().unwrap(), s).write(status);
    core_err(er)
}

unsafe fn recv_nonblocking(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> R {
    let st = state()?;
    if req.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    let (ci, bytes, w) = recv_args(st, buf, count, dt, src, tag, comm)?;
    let mut tmp = if w.is_some() {
        stage(buf, count, dt, bytes, false)?
    } else {
        None
    };
    let p = tmp.as_mut().map_or(buf as *mut u8, |v| v.as_mut_ptr());
    let (eng, fin) = match w {
        None => (None, Some(St::PROC_NULL)),
        Some(w) => {
            let pt = st.comms[ci].as_ref().unwrap().pt;
            (
                Some(
                    st.fab
                        .engine()
                        .irecv(p, bytes, w, tag, pt)
                        .map_err(from_core)?,
                ),
                None,
            )
        }
    };
    let xfer = recv_xfer(st, tmp, buf, count, dt);
    *req = new_req(
        st,
        MReq {
            is_recv: true,
            eng,
            fin,
            xfer,
            ..MReq::on(ci)
        },
    );
    Ok(())
}

/// The staging of a nonblocking receive into a non-contiguous datatype (`tmp` from [`stage`]): unpacked
/// into (buf, count, dt) at completion, with a hold on `dt` so MPI_Type_free meanwhile is harmless.
fn recv_xfer(
    st: &mut State,
    tmp: Option<Vec<u8>>,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
) -> Option<Box<crate::datatype::Xfer>> {
    let tmp = tmp?;
    crate::datatype::hold(st, dt);
    Some(Box::new(crate::datatype::Xfer {
        tmp,
        unpack: Some((buf as *mut u8, count as usize, dt)),
    }))
}

unsafe fn persistent(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    peer_r: c_int,
    tag: c_int,
    comm: MPI_Comm,
    mode: Mode,
    is_recv: bool,
    req: *mut MPI_Request,
) -> R {
    let st = state()?;
    if req.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    let (ci, bytes, _) = if is_recv {
        recv_args(st, buf, count, dt, peer_r, tag, comm)?
    } else {
        send_args(st, buf, count, dt, peer_r, tag, comm)?
    };
    let packed = stage(buf, 0, dt, 0, false)?.is_some()
        || (!crate::datatype::is_simple(dt)
            && !matches!(
                crate::datatype::layout(buf, count, dt)?,
                crate::datatype::Lay::Contig(_)
            ));
    crate::datatype::hold(st, dt); // each start packs or unpacks with it, maybe after MPI_Type_free
    let p = Persist {
        buf: buf as *mut u8,
        bytes,
        peer: peer_r,
        tag,
        mode,
        count: count as usize,
        dt,
        packed,
    };
    *req = new_req(
        st,
        MReq {
            is_recv,
            persist: Some(p),
            active: false,
            ..MReq::on(ci)
        },
    );
    Ok(())
}

unsafe fn start(st: &mut State, h: MPI_Request) -> R {
    let i = req_index(st, h)?;
    if st.pcolls.get(i).is_some_and(|p| p.is_some()) {
        return crate::coll::persistent::start(st, i);
    }
    let r = &st.reqs[i];
    let Some(p) = r.persist else {
        return err(
            MPI_ERR_REQUEST,
            "MPI_Start on a request that is not persistent",
        );
    };
    if r.active {
        return err(
            MPI_ERR_REQUEST,
            "MPI_Start on a request that is already active",
        );
    }
    let (ci, is_recv) = (r.comm, r.is_recv);
    let c = st.comms[ci].as_ref().ok_or_else(|| MpiErr {
        code: MPI_ERR_COMM,
        msg: "communicator was freed".into(),
    })?;
    let w = peer(c, p.peer, is_recv)?;
    let partitioned = st.reqs[i].part.is_some();
    let (pt, tag) = if partitioned {
        (c.coll, part_tag(p.tag))
    } else {
        (c.pt, p.tag)
    };
    if partitioned && !is_recv && w.is_some() {
        // The message leaves when the last partition is marked ready (MPI_Pready*).
        let part = st.reqs[i].part.as_mut().unwrap();
        part.ready.iter_mut().for_each(|x| *x = false);
        part.nready = 0;
        let r = &mut st.reqs[i];
        r.eng = None;
        r.fin = None;
        r.active = true;
        return Ok(());
    }
    let mut xfer = None;
    let mut bp = p.buf;
    if p.packed && w.is_some() {
        let x = if is_recv {
            crate::datatype::Xfer {
                tmp: vec![0u8; p.bytes.max(1)],
                unpack: Some((p.buf, p.count, p.dt)),
            }
        } else {
            crate::datatype::Xfer {
                tmp: crate::datatype::pack_vec(p.buf, p.count, p.dt, p.bytes)?,
                unpack: None,
            }
        };
        let mut x = Box::new(x);
        bp = x.tmp.as_mut_ptr();
        xfer = Some(x);
    }
    st.reqs[i].xfer = xfer;
    let (eng, fin) = match w {
        None => (None, Some(if is_recv { St::PROC_NULL } else { St::EMPTY })),
        Some(w) if is_recv => (
            Some(
                st.fab
                    .engine()
                    .irecv(bp, p.bytes, w, tag, pt)
                    .map_err(from_core)?,
            ),
            None,
        ),
        Some(w) => match start_send(st, ci, bp, p.bytes, w, p.tag, p.mode)? {
            Some(id) => (Some(id), None),
            None => (None, Some(St::EMPTY)),
        },
    };
    let r = &mut st.reqs[i];
    r.eng = eng;
    r.fin = fin;
    r.active = true;
    Ok(())
}

// ------------------------------------------------------------------------------------------------ completion

unsafe fn wait(h: *mut MPI_Request, status: *mut MPI_Status, ecomm: &mut MPI_Comm) -> R {
    let st = state()?;
    if h.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    if *h == MPI_REQUEST_NULL {
        St::EMPTY.write(status);
        return Ok(());
    }
    let i = req_index(st, *h)?;
    *ecomm = comm_handle(st.reqs[i].comm);
    if st.reqs[i].part.is_some() && !crate::mt::on() {
        let p = st.reqs[i].part.as_ref().unwrap();
        if st.reqs[i].active
            && !st.reqs[i].is_recv
            && st.reqs[i].fin.is_none()
            && p.nready < p.parts
        {
            return err(MPI_ERR_REQUEST, format!("MPI_Wait on a partitioned send with {} of {} partitions marked ready (it can never complete)", p.nready, p.parts));
        }
    }
    // Under MPI_THREAD_MULTIPLE other threads mark the partitions (the usual pattern): wait_reqs below
    // waits for them, handing the library lock over between polls.
    if st.reqs[i].sched.is_some()
        || st.nbc_active > 0
        || st.reqs[i].link.is_some()
        || st.reqs[i].greq.is_some()
        || st.reqs[i].part.is_some()
    {
        wait_reqs(st, &[i], true)?;
    } else if let (true, Some(id)) = (st.reqs[i].active, st.reqs[i].eng) {
        let mut e = st.fab.engine();
        if !e.is_done(id) {
            e.wait_until(Op::Wait, |e| e.is_done(id))
                .map_err(from_core)?;
        }
    }
    let (s, r) = complete(st, i, h)?;
    s.write(status);
    r
}

unsafe fn test(
    h: *mut MPI_Request,
    flag: *mut c_int,
    status: *mut MPI_Status,
    ecomm: &mut MPI_Comm,
) -> R {
    let st = state()?;
    if h.is_null() || flag.is_null() {
        return err(MPI_ERR_ARG, "NULL argument");
    }
    if *h == MPI_REQUEST_NULL {
        *flag = 1;
        St::EMPTY.write(status);
        return Ok(());
    }
    let i = req_index(st, *h)?;
    *ecomm = comm_handle(st.reqs[i].comm);
    if st.nbc_active > 0 {
        let sc = all_scheds(st);
        drive(st, &sc);
    }
    if st.reqs[i].greq.is_some() {
        drive(st, &[i]); // its poll function, if it has one
    }
    let mut done = req_done_at(&st.fab.engine(), &st.reqs, i);
    if !done {
        st.fab.engine().progress().map_err(from_core)?;
        done = req_done_at(&st.fab.engine(), &st.reqs, i);
    }
    *flag = done as c_int;
    if !done {
        return Ok(());
    }
    let (s, r) = complete(st, i, h)?;
    s.write(status);
    r
}

/// Indices of the requests in `reqs` (NULL → None), validated.
unsafe fn indices(st: &State, reqs: *mut MPI_Request, n: c_int) -> R<Vec<Option<usize>>> {
    if n < 0 {
        return err(MPI_ERR_COUNT, format!("count {n} is negative"));
    }
    if n > 0 && reqs.is_null() {
        return err(MPI_ERR_ARG, "array of requests is NULL");
    }
    (0..n as usize)
        .map(|k| {
            let h = *reqs.add(k);
            if h == MPI_REQUEST_NULL {
                Ok(None)
            } else {
                req_index(st, h).map(Some)
            }
        })
        .collect()
}

#[inline]
unsafe fn status_at(statuses: *mut MPI_Status, k: usize) -> *mut MPI_Status {
    if statuses.is_null() || statuses as usize == 1 {
        statuses
    } else {
        statuses.add(k)
    }
}

/// Complete every done request among `idx`; set per-request errors in the statuses; returns
/// MPI_ERR_IN_STATUS if any failed. `pending_marks` marks requests left incomplete with MPI_ERR_PENDING.
unsafe fn complete_all(
    st: &mut State,
    reqs: *mut MPI_Request,
    statuses: *mut MPI_Status,
    idx: &[Option<usize>],
    ecomm: &mut MPI_Comm,
) -> R {
    let mut first_err: Option<MpiErr> = None;
    let mut codes = Vec::new();
    for (k, ix) in idx.iter().enumerate() {
        let (s, r) = match ix {
            None => (St::EMPTY, Ok(())),
            Some(i) => {
                *ecomm = comm_handle(st.reqs[*i].comm);
                complete(st, *i, reqs.add(k))?
            }
        };
        s.write(status_at(statuses, k));
        let code = r.as_ref().map_or_else(|e| e.code, |_| MPI_SUCCESS);
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
        codes.push(code);
    }
    match first_err {
        None => Ok(()),
        Some(e) => {
            if !statuses.is_null() && statuses as usize != 1 {
                for (k, c) in codes.iter().enumerate() {
                    (*statuses.add(k)).MPI_ERROR = *c;
                }
            }
            err(MPI_ERR_IN_STATUS, format!("a request failed: {}", e.msg))
        }
    }
}

unsafe fn waitall(
    n: c_int,
    reqs: *mut MPI_Request,
    statuses: *mut MPI_Status,
    ecomm: &mut MPI_Comm,
) -> R {
    let st = state()?;
    let idx = indices(st, reqs, n)?;
    let flat: Vec<usize> = idx.iter().flatten().copied().collect();
    wait_reqs(st, &flat, true)?;
    complete_all(st, reqs, statuses, &idx, ecomm)
}

unsafe fn testall(
    n: c_int,
    reqs: *mut MPI_Request,
    flag: *mut c_int,
    statuses: *mut MPI_Status,
    ecomm: &mut MPI_Comm,
) -> R {
    let st = state()?;
    if flag.is_null() {
        return err(MPI_ERR_ARG, "flag is NULL");
    }
    let idx = indices(st, reqs, n)?;
    let flat: Vec<usize> = idx.iter().flatten().copied().collect();
    drive(st, &flat);
    let all = |st: &State| {
        let e = st.fab.engine();
        idx.iter()
            .all(|ix| ix.is_none_or(|i| req_done_at(&e, &st.reqs, i)))
    };
    let mut done = all(st);
    if !done {
        st.fab.engine().progress().map_err(from_core)?;
        done = all(st);
    }
    *flag = done as c_int;
    if done {
        complete_all(st, reqs, statuses, &idx, ecomm)
    } else {
        Ok(())
    }
}

/// Requests that count for Waitany/Waitsome: non-NULL and active.
fn active_set(st: &State, idx: &[Option<usize>]) -> Vec<(usize, usize)> {
    idx.iter()
        .enumerate()
        .filter_map(|(k, ix)| ix.filter(|&i| st.reqs[i].active).map(|i| (k, i)))
        .collect()
}

unsafe fn anyof(
    n: c_int,
    reqs: *mut MPI_Request,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
    block: bool,
    ecomm: &mut MPI_Comm,
) -> R {
    let st = state()?;
    if index.is_null() {
        return err(MPI_ERR_ARG, "index is NULL");
    }
    let idx = indices(st, reqs, n)?;
    let act = active_set(st, &idx);
    if act.is_empty() {
        *index = MPI_UNDEFINED;
        if !flag.is_null() {
            *flag = 1;
        }
        St::EMPTY.write(status);
        return Ok(());
    }
    let find = |st: &State| {
        let e = st.fab.engine();
        act.iter()
            .copied()
            .find(|&(_, i)| req_done_at(&e, &st.reqs, i))
    };
    let flat: Vec<usize> = act.iter().map(|&(_, i)| i).collect();
    drive(st, &flat);
    let mut got = find(st);
    if got.is_none() {
        if block {
            wait_reqs(st, &flat, false)?;
        } else {
            st.fab.engine().progress().map_err(from_core)?;
        }
        got = find(st);
    }
    match got {
        Some((k, i)) => {
            if !flag.is_null() {
                *flag = 1;
            }
            *index = k as c_int;
            *ecomm = comm_handle(st.reqs[i].comm);
            let (s, r) = complete(st, i, reqs.add(k))?;
            s.write(status);
            r
        }
        None => {
            *flag = 0;
            *index = MPI_UNDEFINED;
            Ok(())
        }
    }
}

unsafe fn someof(
    n: c_int,
    reqs: *mut MPI_Request,
    outcount: *mut c_int,
    indices_out: *mut c_int,
    statuses: *mut MPI_Status,
    block: bool,
    ecomm: &mut MPI_Comm,
) -> R {
    let st = state()?;
    if outcount.is_null() || (n > 0 && indices_out.is_null()) {
        return err(MPI_ERR_ARG, "NULL argument");
    }
    let idx = indices(st, reqs, n)?;
    let act = active_set(st, &idx);
    if act.is_empty() {
        *outcount = MPI_UNDEFINED;
        return Ok(());
    }
    let flat: Vec<usize> = act.iter().map(|&(_, i)| i).collect();
    if block {
        wait_reqs(st, &flat, false)?;
    } else {
        drive(st, &flat);
        st.fab.engine().progress().map_err(from_core)?;
    }
    let done: Vec<(usize, usize)> = {
        let e = st.fab.engine();
        act.iter()
            .copied()
            .filter(|&(_, i)| req_done_at(&e, &st.reqs, i))
            .collect()
    };
    let mut first_err = None;
    let mut codes = Vec::with_capacity(done.len());
    for (j, &(k, i)) in done.iter().enumerate() {
        *indices_out.add(j) = k as c_int;
        *ecomm = comm_handle(st.reqs[i].comm);
        let (s, r) = complete(st, i, reqs.add(k))?;
        s.write(status_at(statuses, j));
        codes.push(r.as_ref().map_or_else(|e| e.code, |_| MPI_SUCCESS));
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    *outcount = done.len() as c_int;
    if let Some(e) = first_err {
        if !statuses.is_null() && statuses as usize != 1 {
            for (j, c) in codes.iter().enumerate() {
                (*statuses.add(j)).MPI_ERROR = *c;
            }
        }
        return err(MPI_ERR_IN_STATUS, format!("a request failed: {}", e.msg));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------ probe

unsafe fn probe(
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
    flag: *mut c_int,
    status: *mut MPI_Status,
    block: bool,
) -> R {
    let st = state()?;
    let (ci, c) = st.comm(comm)?;
    check_tag(tag, true)?;
    if !block && flag.is_null() {
        return err(MPI_ERR_ARG, "flag is NULL");
    }
    let Some(w) = peer(c, src, true)? else {
        if !block {
            *flag = 1;
        }
        St::PROC_NULL.write(status);
        return Ok(());
    };
    let pt = c.pt;
    let c = st.comms[ci].as_ref().unwrap();
    let mut e = st.fab.engine();
    if block {
        let s = e.probe(w, tag, pt).map_err(from_core)?;
        st_from(c, s).write(status);
    } else {
        match e.iprobe(w, tag, pt).map_err(from_core)? {
            Some(s) => {
                *flag = 1;
                st_from(c, s).write(status);
            }
            None => *flag = 0,
        }
    }
    Ok(())
}

unsafe fn mprobe(
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
    flag: *mut c_int,
    msg: *mut MPI_Message,
    status: *mut MPI_Status,
    block: bool,
) -> R {
    let st = state()?;
    let (ci, c) = st.comm(comm)?;
    check_tag(tag, true)?;
    if msg.is_null() || (!block && flag.is_null()) {
        return err(MPI_ERR_ARG, "NULL argument");
    }
    let Some(w) = peer(c, src, true)? else {
        if !block {
            *flag = 1;
        }
        *msg = MPI_MESSAGE_NO_PROC;
        St::PROC_NULL.write(status);
        return Ok(());
    };
    let pt = c.pt;
    let m = {
        let mut e = st.fab.engine();
        if block {
            Some(e.mprobe(w, tag, pt).map_err(from_core)?)
        } else {
            e.improbe(w, tag, pt).map_err(from_core)?
        }
    };
    match m {
        None => *flag = 0,
        Some(m) => {
            if !block {
                *flag = 1;
            }
            st_from(st.comms[ci].as_ref().unwrap(), m.status()).write(status);
            let slot = put_in_free_slot(&mut st.msgs, 0, (m, ci));
            *msg = (MSG_BASE | slot as u32) as c_int;
        }
    }
    Ok(())
}

/// A started receive of a matched message: engine request, communicator index, staging buffer.
type Matched = (ReqId, usize, Option<Vec<u8>>);

/// Receive a matched message: returns the engine request (None for MPI_MESSAGE_NO_PROC) and comm index.
unsafe fn mrecv_start(
    st: &mut State,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    msg: *mut MPI_Message,
) -> R<Option<Matched>> {
    if msg.is_null() {
        return err(MPI_ERR_ARG, "message pointer is NULL");
    }
    let bytes = lay_bytes(buf, count, dt)?;
    if *msg == MPI_MESSAGE_NO_PROC {
        *msg = MPI_MESSAGE_NULL;
        return Ok(None);
    }
    let u = *msg as u32;
    let slot = (u & 0x03ff_ffff) as usize;
    if u & 0xfc00_0000 != MSG_BASE || st.msgs.get(slot).is_none_or(|m| m.is_none()) {
        return err(
            MPI_ERR_REQUEST,
            format!("invalid message handle {:#x}", *msg),
        );
    }
    // A non-contiguous datatype receives into a staging buffer, unpacked at completion.
    let mut tmp = stage(buf, count, dt, bytes, false)?;
    let p = tmp.as_mut().map_or(buf as *mut u8, |v| v.as_mut_ptr());
    let (m, ci) = st.msgs[slot].take().unwrap();
    *msg = MPI_MESSAGE_NULL;
    let id = st.fab.engine().imrecv(p, bytes, m).map_err(from_core)?;
    Ok(Some((id, ci, tmp)))
}

// ------------------------------------------------------------------------------------------------ entry points

mpi_api! {
    fn MPI_Send / PMPI_Send(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        fin(comm, "MPI_Send", send_blocking(buf, count, datatype, dest, tag, comm, Mode::Standard))
    }
    fn MPI_Ssend / PMPI_Ssend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        fin(comm, "MPI_Ssend", send_blocking(buf, count, datatype, dest, tag, comm, Mode::Sync))
    }
    fn MPI_Rsend / PMPI_Rsend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        fin(comm, "MPI_Rsend", send_blocking(buf, count, datatype, dest, tag, comm, Mode::Ready))
    }
    fn MPI_Bsend / PMPI_Bsend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        fin(comm, "MPI_Bsend", send_blocking(buf, count, datatype, dest, tag, comm, Mode::Buffered))
    }
    fn MPI_Isend / PMPI_Isend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Isend", send_nonblocking(buf, count, datatype, dest, tag, comm, Mode::Standard, request))
    }
    fn MPI_Issend / PMPI_Issend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Issend", send_nonblocking(buf, count, datatype, dest, tag, comm, Mode::Sync, request))
    }
    fn MPI_Irsend / PMPI_Irsend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Irsend", send_nonblocking(buf, count, datatype, dest, tag, comm, Mode::Ready, request))
    }
    fn MPI_Ibsend / PMPI_Ibsend(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Ibsend", send_nonblocking(buf, count, datatype, dest, tag, comm, Mode::Buffered, request))
    }
    fn MPI_Recv / PMPI_Recv(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        fin(comm, "MPI_Recv", recv_blocking(buf, count, datatype, source, tag, comm, status))
    }
    fn MPI_Irecv / PMPI_Irecv(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Irecv", recv_nonblocking(buf, count, datatype, source, tag, comm, request))
    }

    fn MPI_Send_init / PMPI_Send_init(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Send_init", persistent(buf as *mut c_void, count, datatype, dest, tag, comm, Mode::Standard, false, request))
    }
    fn MPI_Ssend_init / PMPI_Ssend_init(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Ssend_init", persistent(buf as *mut c_void, count, datatype, dest, tag, comm, Mode::Sync, false, request))
    }
    fn MPI_Rsend_init / PMPI_Rsend_init(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Rsend_init", persistent(buf as *mut c_void, count, datatype, dest, tag, comm, Mode::Ready, false, request))
    }
    fn MPI_Bsend_init / PMPI_Bsend_init(buf: *const c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Bsend_init", persistent(buf as *mut c_void, count, datatype, dest, tag, comm, Mode::Buffered, false, request))
    }
    fn MPI_Recv_init / PMPI_Recv_init(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Recv_init", persistent(buf, count, datatype, source, tag, comm, Mode::Standard, true, request))
    }
    fn MPI_Start / PMPI_Start(request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if request.is_null() {
                return err(MPI_ERR_ARG, "request pointer is NULL");
            }
            start(st, *request)
        })();
        fin(MPI_COMM_WORLD, "MPI_Start", r)
    }
    fn MPI_Startall / PMPI_Startall(count: c_int, array_of_requests: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if count < 0 {
                return err(MPI_ERR_COUNT, format!("count {count} is negative"));
            }
            if count > 0 && array_of_requests.is_null() {
                return err(MPI_ERR_ARG, "array of requests is NULL");
            }
            for k in 0..count as usize {
                start(st, *array_of_requests.add(k))?;
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Startall", r)
    }

    fn MPI_Sendrecv / PMPI_Sendrecv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, dest: c_int, sendtag: c_int,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        fin(comm, "MPI_Sendrecv", sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm, status))
    }
    fn MPI_Sendrecv_replace / PMPI_Sendrecv_replace(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
        source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        let r = (|| -> R {
            let (tmp, bytes) = packed_copy(buf, count, datatype)?;
            sendrecv(tmp.as_ptr() as *const c_void, bytes, MPI_BYTE, dest, sendtag, buf, count, datatype, source, recvtag, comm, status)
        })();
        fin(comm, "MPI_Sendrecv_replace", r)
    }

    fn MPI_Psend_init / PMPI_Psend_init(buf: *const c_void, partitions: c_int, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Psend_init", part_init(buf as *mut c_void, partitions, count, datatype, dest, tag, comm, info, false, request))
    }
    fn MPI_Precv_init / PMPI_Precv_init(buf: *mut c_void, partitions: c_int, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Precv_init", part_init(buf, partitions, count, datatype, source, tag, comm, info, true, request))
    }
    fn MPI_Pready / PMPI_Pready(partition: c_int, request: MPI_Request) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Pready", pready(request, &mut std::iter::once(partition)))
    }
    fn MPI_Pready_range / PMPI_Pready_range(partition_low: c_int, partition_high: c_int, request: MPI_Request) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Pready_range", pready(request, &mut (partition_low..=partition_high)))
    }
    fn MPI_Pready_list / PMPI_Pready_list(length: c_int, array_of_partitions: *const c_int, request: MPI_Request) -> c_int {
        let r = (|| -> R {
            if length < 0 || (length > 0 && array_of_partitions.is_null()) {
                return err(MPI_ERR_ARG, "length is negative or the partition list is NULL");
            }
            let list = std::slice::from_raw_parts(array_of_partitions, length as usize);
            pready(request, &mut list.iter().copied())
        })();
        fin(MPI_COMM_WORLD, "MPI_Pready_list", r)
    }
    fn MPI_Parrived / PMPI_Parrived(request: MPI_Request, partition: c_int, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let i = req_index(st, request)?;
            let (Some(p), true) = (st.reqs[i].part.as_ref(), st.reqs[i].is_recv) else {
                return err(MPI_ERR_REQUEST, "MPI_Parrived needs a partitioned receive request");
            };
            if partition < 0 || partition as usize >= p.parts {
                return err(MPI_ERR_ARG, format!("partition {partition} of {}", p.parts));
            }
            if flag.is_null() {
                return err(MPI_ERR_ARG, "flag is NULL");
            }
            let mut done = req_done(&st.fab.engine(), &st.reqs[i]);
            if !done {
                st.fab.engine().progress().map_err(from_core)?;
                done = req_done(&st.fab.engine(), &st.reqs[i]);
            }
            *flag = done as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Parrived", r)
    }
    fn MPI_Grequest_start / PMPI_Grequest_start(query_fn: Option<GreqQuery>, free_fn: Option<GreqFree>, cancel_fn: Option<GreqCancel>, extra_state: *mut c_void, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            start_greq(st, greq_fns(query_fn, free_fn, cancel_fn, None, None)?, extra_state, request)
        })();
        fin(MPI_COMM_WORLD, "MPI_Grequest_start", r)
    }
    fn MPI_Grequest_complete / PMPI_Grequest_complete(request: MPI_Request) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let i = req_index(st, request)?;
            let Some(g) = st.reqs[i].greq.as_ref() else { return err(MPI_ERR_REQUEST, "not a generalized request") };
            g.done.store(true, std::sync::atomic::Ordering::Release);
            if g.freed {
                let g = st.reqs[i].greq.take().unwrap();
                let rc = (g.free)(g.extra);
                release_slot(st, i, std::ptr::null_mut());
                if rc != MPI_SUCCESS {
                    return err(rc, "the generalized request's free function failed");
                }
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Grequest_complete", r)
    }
    fn MPIX_Grequest_start / PMPIX_Grequest_start(query_fn: Option<GreqQuery>, free_fn: Option<GreqFree>, cancel_fn: Option<GreqCancel>, poll_fn: Option<GreqPoll>, wait_fn: Option<GreqWait>, extra_state: *mut c_void, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            start_greq(st, greq_fns(query_fn, free_fn, cancel_fn, poll_fn, wait_fn)?, extra_state, request)
        })();
        fin(MPI_COMM_WORLD, "MPIX_Grequest_start", r)
    }
    fn MPIX_Grequest_class_create / PMPIX_Grequest_class_create(query_fn: Option<GreqQuery>, free_fn: Option<GreqFree>, cancel_fn: Option<GreqCancel>, poll_fn: Option<GreqPoll>, wait_fn: Option<GreqWait>, greq_class: *mut c_int) -> c_int {
        let r = (|| -> R {
            state()?;
            let f = greq_fns(query_fn, free_fn, cancel_fn, poll_fn, wait_fn)?;
            if greq_class.is_null() {
                return err(MPI_ERR_ARG, "greq_class is NULL");
            }
            let mut v = GREQ_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
            v.push(f);
            *greq_class = GREQ_CLASS_BASE + v.len() as c_int - 1;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPIX_Grequest_class_create", r)
    }
    fn MPIX_Grequest_class_allocate / PMPIX_Grequest_class_allocate(greq_class: c_int, extra_state: *mut c_void, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = {
                let v = GREQ_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
                usize::try_from(greq_class - GREQ_CLASS_BASE).ok().and_then(|k| v.get(k).copied())
            };
            let Some(c) = c else { return err(MPI_ERR_ARG, format!("invalid generalized-request class {greq_class}")) };
            start_greq(st, c, extra_state, request)
        })();
        fin(MPI_COMM_WORLD, "MPIX_Grequest_class_allocate", r)
    }

    fn MPI_Isendrecv / PMPI_Isendrecv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, dest: c_int, sendtag: c_int,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, source: c_int, recvtag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = isendrecv(sendbuf, sendcount, sendtype, dest, sendtag, None, recvbuf, recvcount, recvtype, source, recvtag, comm, request);
        fin(comm, "MPI_Isendrecv", r)
    }
    fn MPI_Isendrecv_replace / PMPI_Isendrecv_replace(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
        source: c_int, recvtag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            // The outgoing data is copied (packed) first, so the receive may land in `buf` at any time.
            let (tmp, c) = packed_copy(buf, count, datatype)?;
            isendrecv(tmp.as_ptr() as *const c_void, c, MPI_BYTE, dest, sendtag, Some(tmp), buf, count, datatype, source, recvtag, comm, request)
        })();
        fin(comm, "MPI_Isendrecv_replace", r)
    }

    fn MPI_Wait / PMPI_Wait(request: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = wait(request, status, &mut ec);
        fin(ec, "MPI_Wait", r)
    }
    fn MPI_Test / PMPI_Test(request: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = test(request, flag, status, &mut ec);
        fin(ec, "MPI_Test", r)
    }
    fn MPI_Waitall / PMPI_Waitall(count: c_int, array_of_requests: *mut MPI_Request, array_of_statuses: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = waitall(count, array_of_requests, array_of_statuses, &mut ec);
        fin(ec, "MPI_Waitall", r)
    }
    fn MPI_Testall / PMPI_Testall(count: c_int, array_of_requests: *mut MPI_Request, flag: *mut c_int, array_of_statuses: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = testall(count, array_of_requests, flag, array_of_statuses, &mut ec);
        fin(ec, "MPI_Testall", r)
    }
    fn MPI_Waitany / PMPI_Waitany(count: c_int, array_of_requests: *mut MPI_Request, index: *mut c_int, status: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = anyof(count, array_of_requests, index, std::ptr::null_mut(), status, true, &mut ec);
        fin(ec, "MPI_Waitany", r)
    }
    fn MPI_Testany / PMPI_Testany(count: c_int, array_of_requests: *mut MPI_Request, index: *mut c_int, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = if flag.is_null() { err(MPI_ERR_ARG, "flag is NULL") } else { anyof(count, array_of_requests, index, flag, status, false, &mut ec) };
        fin(ec, "MPI_Testany", r)
    }
    fn MPI_Waitsome / PMPI_Waitsome(incount: c_int, array_of_requests: *mut MPI_Request, outcount: *mut c_int, array_of_indices: *mut c_int, array_of_statuses: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = someof(incount, array_of_requests, outcount, array_of_indices, array_of_statuses, true, &mut ec);
        fin(ec, "MPI_Waitsome", r)
    }
    fn MPI_Testsome / PMPI_Testsome(incount: c_int, array_of_requests: *mut MPI_Request, outcount: *mut c_int, array_of_indices: *mut c_int, array_of_statuses: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = someof(incount, array_of_requests, outcount, array_of_indices, array_of_statuses, false, &mut ec);
        fin(ec, "MPI_Testsome", r)
    }
    fn MPI_Request_free / PMPI_Request_free(request: *mut MPI_Request) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = (|| -> R {
            let st = state()?;
            if request.is_null() {
                return err(MPI_ERR_ARG, "request pointer is NULL");
            }
            let i = req_index(st, *request)?;
            ec = comm_handle(st.reqs[i].comm);
            if let Some(g) = st.reqs[i].greq.as_mut() {
                if g.is_done() {
                    let g = st.reqs[i].greq.take().unwrap();
                    let rc = (g.free)(g.extra);
                    release_slot(st, i, request);
                    return if rc == MPI_SUCCESS { Ok(()) } else { err(rc, "the generalized request's free function failed") };
                }
                // Freed by MPI_Grequest_complete later; the handle is gone for the program now.
                g.freed = true;
                *request = MPI_REQUEST_NULL;
                return Ok(());
            }
            if let Some(j) = st.reqs[i].link.take() {
                free_req(st, j as usize)?;
            }
            free_req(st, i)?;
            *request = MPI_REQUEST_NULL;
            reap(st, false)
        })();
        fin(ec, "MPI_Request_free", r)
    }
    fn MPI_Request_get_status / PMPI_Request_get_status(request: MPI_Request, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = (|| -> R {
            let st = state()?;
            if flag.is_null() {
                return err(MPI_ERR_ARG, "flag is NULL");
            }
            if request == MPI_REQUEST_NULL {
                *flag = 1;
                St::EMPTY.write(status);
                return Ok(());
            }
            let i = req_index(st, request)?;
            ec = comm_handle(st.reqs[i].comm);
            drive(st, &[i]);
            let mut done = req_done_at(&st.fab.engine(), &st.reqs, i);
            if !done {
                st.fab.engine().progress().map_err(from_core)?;
                done = req_done_at(&st.fab.engine(), &st.reqs, i);
            }
            *flag = done as c_int;
            if done {
                let (s, r) = peek(st, i);
                s.write(status);
                r?;
            }
            Ok(())
        })();
        fin(ec, "MPI_Request_get_status", r)
    }
    fn MPI_Cancel / PMPI_Cancel(request: *mut MPI_Request) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = (|| -> R {
            let st = state()?;
            if request.is_null() {
                return err(MPI_ERR_ARG, "request pointer is NULL");
            }
            let i = req_index(st, *request)?;
            ec = comm_handle(st.reqs[i].comm);
            if let Some(g) = &st.reqs[i].greq {
                let rc = (g.cancel)(g.extra, g.is_done() as c_int);
                return if rc == MPI_SUCCESS { Ok(()) } else { err(rc, "the generalized request's cancel function failed") };
            }
            let r = &st.reqs[i];
            // Receives that have not matched are cancelled; sends cannot be (MPI_Test_cancelled says false).
            if let (true, true, Some(id)) = (r.active, r.is_recv, r.eng) {
                st.fab.engine().cancel_recv(id);
            }
            Ok(())
        })();
        fin(ec, "MPI_Cancel", r)
    }
    fn MPI_Test_cancelled / PMPI_Test_cancelled(status: *const MPI_Status, flag: *mut c_int) -> c_int {
        if status.is_null() || status as usize == 1 || flag.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Test_cancelled", MpiErr { code: MPI_ERR_ARG, msg: "NULL argument".into() });
        }
        *flag = (*status).count_hi_and_cancelled & 1;
        MPI_SUCCESS
    }
    fn MPI_Get_count / PMPI_Get_count(status: *const MPI_Status, datatype: MPI_Datatype, count: *mut c_int) -> c_int {
        let r = (|| -> R {
            if status.is_null() || status as usize == 1 || count.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            let ext = crate::datatype::ext_size(datatype)?.1;
            let bytes = get_count(&*status);
            *count = if ext == 0 {
                0
            } else if bytes % ext as i64 != 0 || bytes / ext as i64 > c_int::MAX as i64 {
                MPI_UNDEFINED
            } else {
                (bytes / ext as i64) as c_int
            };
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Get_count", r)
    }
    fn MPI_Get_elements / PMPI_Get_elements(status: *const MPI_Status, datatype: MPI_Datatype, count: *mut c_int) -> c_int {
        let r = (|| -> R {
            if status.is_null() || status as usize == 1 || count.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            *count = elements(&*status, datatype)?.try_into().unwrap_or(MPI_UNDEFINED);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Get_elements", r)
    }
    fn MPI_Get_elements_x / PMPI_Get_elements_x(status: *const MPI_Status, datatype: MPI_Datatype, count: *mut MPI_Count) -> c_int {
        let r = (|| -> R {
            if status.is_null() || status as usize == 1 || count.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            *count = elements(&*status, datatype)?;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Get_elements_x", r)
    }

    fn MPI_Status_set_elements / PMPI_Status_set_elements(status: *mut MPI_Status, datatype: MPI_Datatype, count: c_int) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Status_set_elements", set_elements(status, datatype, count as MPI_Count))
    }
    fn MPI_Status_set_elements_x / PMPI_Status_set_elements_x(status: *mut MPI_Status, datatype: MPI_Datatype, count: MPI_Count) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Status_set_elements_x", set_elements(status, datatype, count))
    }
    fn MPI_Status_set_cancelled / PMPI_Status_set_cancelled(status: *mut MPI_Status, flag: c_int) -> c_int {
        if status.is_null() || status as usize == 1 {
            return raise(MPI_COMM_WORLD, "MPI_Status_set_cancelled", MpiErr { code: MPI_ERR_ARG, msg: "status is NULL or MPI_STATUS_IGNORE".into() });
        }
        let s = &mut *status;
        s.count_hi_and_cancelled = (s.count_hi_and_cancelled & !1) | (flag != 0) as c_int;
        MPI_SUCCESS
    }
    fn MPI_Status_c2f / PMPI_Status_c2f(c_status: *const MPI_Status, f_status: *mut MPI_Fint) -> c_int {
        if c_status.is_null() || c_status as usize == 1 || f_status.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Status_c2f", MpiErr { code: MPI_ERR_ARG, msg: "a status is NULL or MPI_STATUS_IGNORE".into() });
        }
        // MPICH's Fortran status is the C structure, word for word (MPI_STATUS_SIZE = 5).
        std::ptr::copy_nonoverlapping(c_status as *const MPI_Fint, f_status, 5);
        MPI_SUCCESS
    }
    fn MPI_Status_f2c / PMPI_Status_f2c(f_status: *const MPI_Fint, c_status: *mut MPI_Status) -> c_int {
        if c_status.is_null() || c_status as usize == 1 || f_status.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Status_f2c", MpiErr { code: MPI_ERR_ARG, msg: "a status is NULL or MPI_STATUS_IGNORE".into() });
        }
        std::ptr::copy_nonoverlapping(f_status, c_status as *mut MPI_Fint, 5);
        MPI_SUCCESS
    }

    fn MPI_Probe / PMPI_Probe(source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        fin(comm, "MPI_Probe", probe(source, tag, comm, std::ptr::null_mut(), status, true))
    }
    fn MPI_Iprobe / PMPI_Iprobe(source: c_int, tag: c_int, comm: MPI_Comm, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
        fin(comm, "MPI_Iprobe", probe(source, tag, comm, flag, status, false))
    }
    fn MPI_Mprobe / PMPI_Mprobe(source: c_int, tag: c_int, comm: MPI_Comm, message: *mut MPI_Message, status: *mut MPI_Status) -> c_int {
        fin(comm, "MPI_Mprobe", mprobe(source, tag, comm, std::ptr::null_mut(), message, status, true))
    }
    fn MPI_Improbe / PMPI_Improbe(source: c_int, tag: c_int, comm: MPI_Comm, flag: *mut c_int, message: *mut MPI_Message, status: *mut MPI_Status) -> c_int {
        fin(comm, "MPI_Improbe", mprobe(source, tag, comm, flag, message, status, false))
    }
    fn MPI_Mrecv / PMPI_Mrecv(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, message: *mut MPI_Message, status: *mut MPI_Status) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = (|| -> R {
            let st = state()?;
            let Some((id, ci, tmp)) = mrecv_start(st, buf, count, datatype, message)? else {
                St::PROC_NULL.write(status);
                return Ok(());
            };
            ec = comm_handle(ci);
            let mut e = st.fab.engine();
            e.wait_until(Op::Recv, |e| e.is_done(id)).map_err(from_core)?;
            let (s, er) = e.take_full(id).map_err(from_core)?;
            let s = st_from(st.comms[ci].as_ref().unwrap(), s);
            if let Some(t) = tmp {
                crate::datatype::unpack_from(&t, s.bytes, buf as *mut u8, count as usize, datatype)?;
            }
            s.write(status);
            core_err(er)
        })();
        fin(ec, "MPI_Mrecv", r)
    }
    fn MPI_Imrecv / PMPI_Imrecv(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, message: *mut MPI_Message, request: *mut MPI_Request) -> c_int {
        let mut ec = MPI_COMM_WORLD;
        let r = (|| -> R {
            let st = state()?;
            if request.is_null() {
                return err(MPI_ERR_ARG, "request pointer is NULL");
            }
            let (eng, fin, ci, tmp) = match mrecv_start(st, buf, count, datatype, message)? {
                None => (None, Some(St::PROC_NULL), 0, None),
                Some((id, ci, tmp)) => (Some(id), None, ci, tmp),
            };
            ec = comm_handle(ci);
            let xfer = recv_xfer(st, tmp, buf, count, datatype);
            *request = new_req(st, MReq { is_recv: true, eng, fin, xfer, ..MReq::on(ci) });
            Ok(())
        })();
        fin(ec, "MPI_Imrecv", r)
    }

    fn MPI_Buffer_attach / PMPI_Buffer_attach(buffer: *mut c_void, size: c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if size < 0 {
                return err(MPI_ERR_ARG, format!("size {size} is negative"));
            }
            if buffer.is_null() && size > 0 {
                return err(MPI_ERR_BUFFER, "buffer is NULL");
            }
            if st.bsend_buf.is_some() {
                return err(MPI_ERR_BUFFER, "a buffer is already attached");
            }
            st.bsend_buf = Some((buffer, size as usize));
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Buffer_attach", r)
    }
    fn MPI_Buffer_detach / PMPI_Buffer_detach(buffer_addr: *mut c_void, size: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if buffer_addr.is_null() || size.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            reap(st, true)?;
            let (b, s) = st.bsend_buf.take().unwrap_or((std::ptr::null_mut(), 0));
            *(buffer_addr as *mut *mut c_void) = b;
            *size = s as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Buffer_detach", r)
    }
}

/// MPI_Status_set_elements(_x): as MPICH, the status then says `count * size(datatype)` bytes, so that
/// MPI_Get_elements and MPI_Get_count with `datatype` (a basic type) report `count`.
unsafe fn set_elements(status: *mut MPI_Status, dt: MPI_Datatype, count: MPI_Count) -> R {
    if status.is_null() || status as usize == 1 {
        return err(MPI_ERR_ARG, "status is NULL or MPI_STATUS_IGNORE");
    }
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    let size = crate::datatype::ext_size(dt)?.1 as i64;
    // A status holds 63 bits of byte count (MPICH's layout: 32 low bits, 31 high bits beside the
    // cancelled bit), which is every non-negative MPI_Count.
    let bytes = count.checked_mul(size).ok_or_else(|| MpiErr {
        code: MPI_ERR_COUNT,
        msg: format!("{count} elements of {size} bytes overflow a count"),
    })?;
    set_count(&mut *status, bytes);
    Ok(())
}

fn elements(status: &MPI_Status, dt: MPI_Datatype) -> R<MPI_Count> {
    if crate::datatype::is_derived(dt) || pair_members(dt).is_some() {
        // Members of a partial element count as far as they are whole.
        return Ok(
            crate::datatype::elements_of(dt, get_count(status))?.unwrap_or(MPI_UNDEFINED as i64)
        );
    }
    let size = type_size(dt)? as i64;
    let bytes = get_count(status);
    if size == 0 {
        return Ok(0);
    }
    if bytes % size != 0 {
        return Ok(MPI_UNDEFINED as MPI_Count);
    }
    Ok(bytes / size)
}

const MPI_BYTE: MPI_Datatype = 0x4c00_010d;

/// The data of `count` elements of `dt` at `buf`, packed into a new vector, and its length in bytes: the
/// outgoing side of the `_replace` calls, taken before anything lands in `buf`.
unsafe fn packed_copy(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> R<(Vec<u8>, c_int)> {
    let bytes = lay_bytes(buf, count, dt)?;
    let tmp = match stage(buf, count, dt, bytes, true)? {
        Some(v) => v,
        None if bytes > 0 => std::slice::from_raw_parts(buf as *const u8, bytes).to_vec(),
        None => Vec::new(),
    };
    let n = c_int::try_from(bytes).map_err(|_| MpiErr {
        code: MPI_ERR_COUNT,
        msg: format!("{bytes} bytes exceed INT_MAX"),
    })?;
    Ok((tmp, n))
}

/// MPI_Isendrecv(_replace): a receive request with the send linked to it (both complete together).
/// `owned` is the send data when it is a copy (the replace variant): the send request keeps it alive.
#[allow(clippy::too_many_arguments)]
unsafe fn isendrecv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    owned: Option<Vec<u8>>,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> R {
    if request.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    // Check the send's arguments before posting the receive, so that a bad one posts nothing.
    send_args(state()?, sendbuf, sendcount, sendtype, dest, sendtag, comm)?;
    let mut hr = MPI_REQUEST_NULL;
    recv_nonblocking(recvbuf, recvcount, recvtype, source, recvtag, comm, &mut hr)?;
    let mut hs = MPI_REQUEST_NULL;
    let sent = send_nonblocking(
        sendbuf,
        sendcount,
        sendtype,
        dest,
        sendtag,
        comm,
        Mode::Standard,
        &mut hs,
    );
    let st = state()?;
    let i = req_index(st, hr)?;
    if let Err(e) = sent {
        // Take the receive back (it must not catch a later message); if it already matched, it finishes
        // in the background.
        if let Some(id) = st.reqs[i].eng {
            let cancelled = {
                let mut eng = st.fab.engine();
                eng.cancel_recv(id) && eng.take_full(id).is_ok()
            };
            if cancelled {
                st.reqs[i].eng = None;
                if let Some((_, _, dt)) = st.reqs[i].xfer.take().and_then(|x| x.unpack) {
                    crate::datatype::release(st, dt);
                }
            }
        }
        free_req(st, i)?;
        return Err(e);
    }
    let j = req_index(st, hs)?;
    if let Some(tmp) = owned {
        st.reqs[j].xfer = Some(Box::new(crate::datatype::Xfer { tmp, unpack: None }));
    }
    st.reqs[i].link = Some(j as u32);
    *request = hr;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
unsafe fn sendrecv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> R {
    let st = state()?;
    let (ci, sbytes, sw) = send_args(st, sendbuf, sendcount, sendtype, dest, sendtag, comm)?;
    let (_, rbytes, rw) = recv_args(st, recvbuf, recvcount, recvtype, source, recvtag, comm)?;
    let pk = stage(sendbuf, sendcount, sendtype, sbytes, true)?;
    let sp = pk.as_ref().map_or(sendbuf as *const u8, |v| v.as_ptr());
    let mut tmp = stage(recvbuf, recvcount, recvtype, rbytes, false)?;
    let rp = tmp.as_mut().map_or(recvbuf as *mut u8, |v| v.as_mut_ptr());
    let pt = st.comms[ci].as_ref().unwrap().pt;
    let rid = match rw {
        Some(w) => Some(
            st.fab
                .engine()
                .irecv(rp, rbytes, w, recvtag, pt)
                .map_err(from_core)?,
        ),
        None => None,
    };
    let sid = match sw {
        Some(w) => match start_send(st, ci, sp, sbytes, w, sendtag, Mode::Standard) {
            Ok(x) => x,
            Err(e) => {
                if let Some(r) = rid {
                    let mut eng = st.fab.engine();
                    if eng.cancel_recv(r) {
                        let _ = eng.take_full(r);
                    } else {
                        st.orphans.push((r, None));
                    }
                }
                return Err(e);
            }
        },
        None => None,
    };
    let mut e = st.fab.engine();
    e.wait_until(Op::Wait, |e| {
        rid.is_none_or(|r| e.is_done(r)) && sid.is_none_or(|s| e.is_done(s))
    })
    .map_err(from_core)?;
    let se = match sid {
        Some(s) => e.take_full(s).map_err(from_core)?.1,
        None => None,
    };
    match rid {
        Some(r) => {
            let (s, er) = e.take_full(r).map_err(from_core)?;
            if let Some(t) = &tmp {
                crate::datatype::unpack_from(
                    t,
                    s.count,
                    recvbuf as *mut u8,
                    recvcount as usize,
                    recvtype,
                )?;
            }
            st_from(st.comms[ci].as_ref().unwrap(), s).write(status);
            core_err(er)?;
        }
        None => St::PROC_NULL.write(status),
    }
    core_err(se)
}
