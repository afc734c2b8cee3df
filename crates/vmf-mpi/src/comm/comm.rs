//! Communicators, groups, attributes and topologies.
//!
//! **Context ids.** Every communicator owns two engine contexts (point-to-point, collective). A new
//! communicator's pair is agreed by the members with an allreduce(MAX) of each process's next free id over
//! the parent (Comm_split/split_type/create/dup) or over the group itself (Comm_create_group, on the
//! parent's collective context with a tag derived from the user's tag); every member then moves its next
//! free id past the agreed one. Disjoint communicators from one split may share a pair: they have no
//! member in common, so their traffic can never meet.
//!
//! Intercommunicators live in `intercomm.rs`; splitting and the other constructors here refuse them
//! (MPI_ERR_COMM), Dup copies them (agreeing over both groups).
use crate::coll;
use crate::p2p::comm_handle;
use crate::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use vmf_core::engine::Route;

pub type MPI_Group = c_int;
pub const MPI_GROUP_NULL: MPI_Group = 0x0800_0000;
pub const MPI_GROUP_EMPTY: MPI_Group = 0x4800_0000;
const GROUP_BASE: u32 = 0x8800_0000;
pub const MPI_KEYVAL_INVALID: c_int = 0x2400_0000;
const KEYVAL_BASE: u32 = 0x2400_0000;
pub const MPI_IDENT: c_int = 0;
pub const MPI_CONGRUENT: c_int = 1;
pub const MPI_SIMILAR: c_int = 2;
pub const MPI_UNEQUAL: c_int = 3;
pub const MPI_GRAPH: c_int = 1;
pub const MPI_CART: c_int = 2;
pub const MPI_DIST_GRAPH: c_int = 3;

pub type CopyFn = unsafe extern "C" fn(
    MPI_Comm,
    c_int,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_int,
) -> c_int;
pub type DeleteFn = unsafe extern "C" fn(MPI_Comm, c_int, *mut c_void, *mut c_void) -> c_int;

/// An attribute key.
#[derive(Clone, Copy)]
pub(crate) struct Keyval {
    pub copy: Option<CopyFn>,
    pub delete: Option<DeleteFn>,
    pub extra: *mut c_void,
}

/// A virtual topology.
#[derive(Clone, Debug)]
pub(crate) enum Topo {
    Cart {
        dims: Vec<c_int>,
        periods: Vec<c_int>,
    },
    DistGraph {
        src: Vec<c_int>,
        sw: Option<Vec<c_int>>,
        dst: Vec<c_int>,
        dw: Option<Vec<c_int>>,
    },
    /// MPI_Graph_create: `index`/`edges` as the program gave them (see `graph.rs`).
    Graph {
        index: Vec<c_int>,
        edges: Vec<c_int>,
    },
}

/// MPI_Comm_split_type's types (MPICH's values).
const MPI_COMM_TYPE_SHARED: c_int = 1;
const MPI_COMM_TYPE_HW_GUIDED: c_int = 2;
const MPI_COMM_TYPE_HW_UNGUIDED: c_int = 3;
const MPIX_COMM_TYPE_NEIGHBORHOOD: c_int = 4;

fn members(c: &Comm) -> Vec<usize> {
    (0..c.size).map(|r| c.to_world(r)).collect()
}

// ------------------------------------------------------------------------------------------------ groups

pub(crate) fn group_handle(st: &mut State, g: Vec<usize>) -> MPI_Group {
    if g.is_empty() {
        return MPI_GROUP_EMPTY;
    }
    let i = put_in_free_slot(&mut st.groups, 0, g);
    (GROUP_BASE | i as u32) as c_int
}

pub(crate) fn group(st: &State, h: MPI_Group) -> R<Vec<usize>> {
    if h == MPI_GROUP_EMPTY {
        return Ok(Vec::new());
    }
    let u = h as u32;
    if u & 0xfc00_0000 == GROUP_BASE {
        if let Some(Some(g)) = st.groups.get((u & 0x03ff_ffff) as usize) {
            return Ok(g.clone());
        }
    }
    err(MPI_ERR_GROUP, format!("invalid group handle {h:#x}"))
}

fn my_world(st: &State) -> usize {
    st.fab.rank()
}

fn compare_lists(a: &[usize], b: &[usize]) -> c_int {
    if a == b {
        return MPI_IDENT;
    }
    let mut x = a.to_vec();
    let mut y = b.to_vec();
    x.sort_unstable();
    y.sort_unstable();
    if x == y {
        MPI_SIMILAR
    } else {
        MPI_UNEQUAL
    }
}

// ------------------------------------------------------------------------------------------------ creation

/// Add a communicator to the table; returns its handle.
pub(crate) fn add_comm(st: &mut State, c: Comm) -> MPI_Comm {
    // WORLD, SELF and the hidden bridge of `session.rs` come first.
    let i = put_in_free_slot(&mut st.comms, 3, c);
    comm_handle(i)
}

/// Agree on a new context pair among the members of communicator `ci` (collective over it).
pub(crate) fn new_ctx(st: &mut State, ci: usize) -> R<u32> {
    let c = st.comms[ci].as_ref().unwrap();
    let (mem, me) = crate::intercomm::ctx_members(st, c);
    let ctx = c.coll;
    let tag = st.comms[ci].as_mut().unwrap().next_coll_tag();
    let mut v = [ctx_propose(st)? as i32];
    coll::allreduce_max_group(st, ctx, tag, &mem, me, &mut v)?;
    ctx_agreed(st, v[0] as u32);
    Ok(v[0] as u32)
}

/// First context id of the space blocking constructions use under MPI_THREAD_MULTIPLE (below it: the
/// single-threaded ids from `State::next_ctx`; from IDUP_CTX_BASE on: MPI_Comm_idup's).
const MT_CTX_BASE: u64 = 0x1000_0000;

/// A context id that is not taken yet, to be striped by world rank (see [`ctx_propose`]), from the space
/// `[base, end)` with this process's counter `seq`.
fn striped(st: &State, seq: &mut u64, base: u64, end: u64) -> R<u32> {
    let (r, w) = (st.fab.rank() as u64, st.fab.size() as u64);
    let v = base + 2 * (*seq * w + r);
    if v + 1 >= end {
        return err(
            MPI_ERR_OTHER,
            "this process has made more communicators than its share of context ids under MPI_THREAD_MULTIPLE",
        );
    }
    *seq += 1;
    Ok(v as u32)
}

/// This process's proposal in an agreement on a new context pair; the members agree on the largest.
/// Single-threaded: the next id above every one this process has used (`State::next_ctx`). Under
/// MPI_THREAD_MULTIPLE, where agreements of several threads run at once in one process and each may
/// finish on another member's proposal, every proposal is a value no other process and no other call
/// ever proposes (`base + 2 * (count * world_size + world_rank)`), so the agreed ids of any two
/// agreements differ and no reservation is needed.
pub(crate) fn ctx_propose(st: &mut State) -> R<u32> {
    if crate::mt::on() {
        let mut seq = st.mt_ctx_seq;
        let v = striped(st, &mut seq, MT_CTX_BASE, IDUP_CTX_BASE as u64)?;
        st.mt_ctx_seq = seq;
        Ok(v)
    } else {
        Ok(st.next_ctx)
    }
}

/// Record the context pair an agreement settled on.
pub(crate) fn ctx_agreed(st: &mut State, v: u32) {
    if !crate::mt::on() {
        st.next_ctx = st.next_ctx.max(v + 2);
    }
}

/// [`ctx_propose`] for MPI_Comm_idup's space (from IDUP_CTX_BASE): the proposal is taken at once.
pub(crate) fn ictx_propose(st: &mut State) -> R<u32> {
    if crate::mt::on() {
        let mut seq = st.mt_ictx_seq;
        let v = striped(st, &mut seq, IDUP_CTX_BASE as u64, 0x8000_0000)?;
        st.mt_ictx_seq = seq;
        Ok(v)
    } else {
        let v = st.next_ictx;
        st.next_ictx += 2;
        Ok(v)
    }
}

/// Run copy callbacks of `ci`'s attributes for a duplicate.
unsafe fn copy_attrs(st: &mut State, ci: usize) -> R<Vec<(c_int, *mut c_void)>> {
    let old = comm_handle(ci);
    let attrs = st.comms[ci].as_ref().unwrap().attrs.clone();
    let mut out = Vec::new();
    for (k, v) in attrs {
        let Some(Some(kv)) = st
            .keyvals
            .get((k as u32 & 0x00ff_ffff) as usize - 1)
            .copied()
        else {
            continue;
        };
        if let Some(f) = kv.copy {
            let mut newv: *mut c_void = std::ptr::null_mut();
            let mut flag: c_int = 0;
            let rc = f(
                old,
                k,
                kv.extra,
                v,
                &mut newv as *mut *mut c_void as *mut c_void,
                &mut flag,
            );
            if rc != MPI_SUCCESS {
                return err(rc, "attribute copy callback failed");
            }
            if flag != 0 {
                out.push((k, newv));
            }
        }
    }
    Ok(out)
}

/// Run the delete callback of attribute `k` (value `v`) of object `h` (communicator or datatype).
pub(crate) unsafe fn delete_obj_attr(st: &mut State, h: c_int, k: c_int, v: *mut c_void) -> R {
    delete_attr(st, h, k, v)
}

/// Run the copy callbacks of `attrs` of object `old` (datatype duplication).
pub(crate) unsafe fn copy_obj_attrs(
    st: &mut State,
    old: c_int,
    attrs: &[(c_int, *mut c_void)],
) -> R<Vec<(c_int, *mut c_void)>> {
    let mut out = Vec::new();
    for &(k, v) in attrs {
        let Some(Some(kv)) = st
            .keyvals
            .get(((k as u32 & 0x00ff_ffff) as usize).wrapping_sub(1))
            .copied()
        else {
            continue;
        };
        if let Some(f) = kv.copy {
            let mut newv: *mut c_void = std::ptr::null_mut();
            let mut flag: c_int = 0;
            let rc = f(
                old,
                k,
                kv.extra,
                v,
                &mut newv as *mut *mut c_void as *mut c_void,
                &mut flag,
            );
            if rc != MPI_SUCCESS {
                return err(rc, "attribute copy callback failed");
            }
            if flag != 0 {
                out.push((k, newv));
            }
        }
    }
    Ok(out)
}

/// MPI_Finalize's first act (MPI 4.0 §11.2.2): MPI_COMM_SELF is freed as if by MPI_Comm_free, so its
/// attributes' delete callbacks run, the last set first.
pub(crate) unsafe fn free_self_attrs(st: &mut State) -> R {
    let (ci, _) = st.comm(MPI_COMM_SELF)?;
    let attrs = std::mem::take(&mut st.comms[ci].as_mut().unwrap().attrs);
    for (k, v) in attrs.iter().rev() {
        delete_attr(st, MPI_COMM_SELF, *k, *v)?;
    }
    Ok(())
}

unsafe fn delete_attr(st: &mut State, h: MPI_Comm, k: c_int, v: *mut c_void) -> R {
    if let Some(Some(kv)) = st
        .keyvals
        .get(((k as u32 & 0x00ff_ffff) as usize).wrapping_sub(1))
        .copied()
    {
        if let Some(f) = kv.delete {
            let rc = f(h, k, v, kv.extra);
            if rc != MPI_SUCCESS {
                return err(rc, "attribute delete callback failed");
            }
        }
    }
    Ok(())
}

/// MPI_Comm_idup(_with_info): does not block. Attributes are copied and hints taken at the call; the
/// context is agreed by a nonblocking allreduce-max, and the new communicator is made, and `*newcomm`
/// written, when the request completes (MPI 4.0 §7.4.2: newcomm may not be used before). Until then
/// `*newcomm` is MPI_COMM_NULL.
///
/// The ids come from a space of their own (`State::next_ictx`), and each member moves past its own
/// contribution at the call, so idups outstanding together on one communicator, and blocking
/// constructions made meanwhile, never get the same id. What this does not rule out: two idups over
/// *different* groups outstanding at once on one process, where the groups' maxima happen to be equal.
unsafe fn idup(
    comm: MPI_Comm,
    info: Option<MPI_Info>,
    newcomm: *mut MPI_Comm,
    request: *mut MPI_Request,
) -> R {
    let st = state()?;
    if request.is_null() {
        return err(MPI_ERR_ARG, "request is NULL");
    }
    if newcomm.is_null() {
        return err(MPI_ERR_ARG, "newcomm is NULL");
    }
    let (ci, _) = st.comm(comm)?;
    let hints = dup_hints(st, ci, info)?;
    let mut n = twin(st, ci, hints, 0)?;
    let c = st.comms[ci].as_ref().unwrap();
    let (mem, me) = crate::intercomm::ctx_members(st, c);
    let ctx = c.coll;
    let tag = st.comms[ci].as_mut().unwrap().next_nbc_tag();
    *newcomm = MPI_COMM_NULL;
    let mine = ictx_propose(st)? as i32;
    *request = coll::iallreduce_max_group(st, ci, (ctx, tag), &mem, me, mine, move |st, v| {
        let v = v as u32;
        if !crate::mt::on() {
            st.next_ictx = st.next_ictx.max(v + 2);
        }
        n.pt = v;
        n.coll = v + 1;
        *newcomm = add_comm(st, n);
        Ok(())
    });
    Ok(())
}

/// MPI_Comm_dup (`info` None: the hints are copied) and MPI_Comm_dup_with_info (the new communicator's
/// hints are those of `info`). On failure (a copy callback's error, say) `*newcomm` is MPI_COMM_NULL.
unsafe fn dup(st: &mut State, comm: MPI_Comm, info: Option<MPI_Info>, newcomm: *mut MPI_Comm) -> R {
    if newcomm.is_null() {
        return err(MPI_ERR_ARG, "newcomm is NULL");
    }
    *newcomm = MPI_COMM_NULL;
    let (ci, _) = st.comm(comm)?;
    let hints = dup_hints(st, ci, info)?;
    let ctx = new_ctx(st, ci)?;
    let n = twin(st, ci, hints, ctx)?;
    *newcomm = add_comm(st, n);
    Ok(())
}

/// A duplicate's hints: those of `info` (the `_with_info` forms), else the parent's.
fn dup_hints(st: &State, ci: usize, info: Option<MPI_Info>) -> R<crate::info::Pairs> {
    match info {
        Some(i) => crate::info::comm_hints(i),
        None => Ok(st.comms[ci].as_ref().unwrap().hints.clone()),
    }
}

/// A duplicate of communicator `ci` on context `ctx`: same group(s) and topology, copied attributes
/// (the copy callbacks run here), `hints`.
unsafe fn twin(st: &mut State, ci: usize, hints: crate::info::Pairs, ctx: u32) -> R<Comm> {
    let attrs = copy_attrs(st, ci)?;
    let c = st.comms[ci].as_ref().unwrap();
    let mut n = Comm::new(ctx, c.rank, c.world.clone(), c.size, c.eh);
    n.topo = c.topo.clone();
    n.remote = c.remote.clone();
    n.attrs = attrs;
    n.hints = hints;
    Ok(n)
}

/// Split communicator `ci` by (color, key); returns the new handle (MPI_COMM_NULL for MPI_UNDEFINED).
pub(crate) fn split(st: &mut State, ci: usize, color: c_int, key: c_int) -> R<MPI_Comm> {
    crate::intercomm::intra_only(
        st.comms[ci].as_ref().unwrap(),
        "splitting by type or topology (MPI_Comm_split_type, MPI_Cart_create, MPI_Cart_sub)",
    )?;
    let prop = ctx_propose(st)? as i32;
    let recs = coll::allgather_ints(st, ci, &[color, key, prop])?;
    let ctx = recs.chunks(3).map(|r| r[2]).max().unwrap() as u32;
    ctx_agreed(st, ctx);
    if color == MPI_UNDEFINED {
        return Ok(MPI_COMM_NULL);
    }
    let c = st.comms[ci].as_ref().unwrap();
    let mut mine: Vec<(c_int, usize)> = recs
        .chunks(3)
        .enumerate()
        .filter(|(_, r)| r[0] == color)
        .map(|(i, r)| (r[1], i))
        .collect();
    mine.sort();
    let world: Vec<usize> = mine.iter().map(|&(_, i)| c.to_world(i as i32)).collect();
    let me = mine.iter().position(|&(_, i)| i as i32 == c.rank).unwrap() as i32;
    let n = Comm::new(ctx, me, Some(world), mine.len() as i32, c.eh);
    Ok(add_comm(st, n))
}

// ------------------------------------------------------------------------------------------------ topology

fn cart_coords(dims: &[c_int], mut r: c_int) -> Vec<c_int> {
    let mut c = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        c[i] = r % dims[i];
        r /= dims[i];
    }
    c
}

fn cart_rank(dims: &[c_int], periods: &[c_int], coords: &[c_int]) -> R<c_int> {
    let mut r = 0;
    for i in 0..dims.len() {
        let mut x = coords[i];
        if x < 0 || x >= dims[i] {
            if periods[i] != 0 {
                x = x.rem_euclid(dims[i]);
            } else {
                return err(
                    MPI_ERR_ARG,
                    format!("coordinate {x} out of range in dimension {i}"),
                );
            }
        }
        r = r * dims[i] + x;
    }
    Ok(r)
}

fn shift(dims: &[c_int], periods: &[c_int], me: c_int, dir: usize, disp: c_int) -> (c_int, c_int) {
    let co = cart_coords(dims, me);
    let at = |d: c_int| {
        let mut c = co.clone();
        c[dir] += d;
        if periods[dir] == 0 && (c[dir] < 0 || c[dir] >= dims[dir]) {
            MPI_PROC_NULL
        } else {
            cart_rank(dims, periods, &c).unwrap()
        }
    };
    (at(-disp), at(disp))
}

/// In- and out-neighbours of the topology of `c`.
pub(crate) fn topo_neighbors(c: &Comm) -> R<(Vec<c_int>, Vec<c_int>)> {
    match &c.topo {
        Some(Topo::Cart { dims, periods }) => {
            let mut v = Vec::new();
            for d in 0..dims.len() {
                let (lo, hi) = shift(dims, periods, c.rank, d, 1);
                v.push(lo);
                v.push(hi);
            }
            Ok((v.clone(), v))
        }
        Some(Topo::DistGraph { src, dst, .. }) => Ok((src.clone(), dst.clone())),
        Some(Topo::Graph { index, edges }) => {
            let v = crate::graph::neighbors_of(index, edges, c.rank).to_vec();
            Ok((v.clone(), v))
        }
        None => err(MPI_ERR_TOPOLOGY, "communicator has no topology"),
    }
}

fn cart(st: &mut State, comm: MPI_Comm) -> R<(&Vec<c_int>, &Vec<c_int>, c_int)> {
    let c = st.comm(comm)?.1;
    match &c.topo {
        Some(Topo::Cart { dims, periods }) => Ok((dims, periods, c.rank)),
        _ => err(MPI_ERR_TOPOLOGY, "communicator has no cartesian topology"),
    }
}

pub(crate) unsafe fn ints(p: *const c_int, n: c_int) -> R<Vec<c_int>> {
    if n < 0 {
        return err(MPI_ERR_ARG, "negative count");
    }
    if n > 0 && p.is_null() {
        return err(MPI_ERR_ARG, "array argument is NULL");
    }
    Ok((0..n as usize).map(|i| *p.add(i)).collect())
}

fn weights(p: *const c_int, n: c_int) -> R<Option<Vec<c_int>>> {
    let uw = crate::env::MPI_UNWEIGHTED.0;
    let we = crate::env::MPI_WEIGHTS_EMPTY.0;
    // NULL is not MPI_UNWEIGHTED: it is an (empty) array of weights, as MPICH reads it.
    if p == uw {
        Ok(None)
    } else if p == we || (p.is_null() && n == 0) {
        Ok(Some(vec![]))
    } else {
        // SAFETY: the program passes n weights.
        unsafe { ints(p, n).map(Some) }
    }
}

/// The factorisation of `n` into `k` factors, non-increasing, whose largest and smallest differ least;
/// among those, the one whose smallest factor is largest, then second smallest, and so on. That is
/// MPICH's choice (checked against its test table baddims.h), e.g. 72 in 2-D is 9 x 8, not 12 x 6,
/// and 5040 in 3-D is 21 x 16 x 15, not 20 x 18 x 14.
fn balanced(n: i64, k: usize) -> Vec<i64> {
    /// Try every non-increasing factor list from `divs` (the divisors of the original n, largest first).
    fn go(
        n: i64,
        k: usize,
        max: i64,
        divs: &[i64],
        cur: &mut Vec<i64>,
        best: &mut Option<(i64, Vec<i64>)>,
    ) {
        if k == 1 {
            if n <= max {
                cur.push(n);
                let diff = cur[0] - n;
                // on a tie, the larger smallest factor, then the larger second smallest, and so on
                let wider = |v: &Vec<i64>| cur.iter().rev().gt(v.iter().rev());
                if best
                    .as_ref()
                    .is_none_or(|(d, v)| diff < *d || (diff == *d && wider(v)))
                {
                    *best = Some((diff, cur.clone()));
                }
                cur.pop();
            }
            return;
        }
        for &f in divs.iter().filter(|&&f| f <= max.min(n)) {
            if (f as i128)
                .checked_pow(k as u32)
                .is_some_and(|p| p < n as i128)
            {
                break; // k factors of at most f cannot reach n, nor can smaller ones
            }
            if n % f == 0 {
                let hi = cur.first().copied().unwrap_or(f);
                // every later factor is at most f, so the spread is already at least hi - f
                if best.as_ref().is_none_or(|(d, _)| hi - f <= *d) {
                    cur.push(f);
                    go(n / f, k - 1, f, divs, cur, best);
                    cur.pop();
                }
            }
        }
    }
    let mut divs: Vec<i64> = (1..)
        .take_while(|d| d * d <= n)
        .filter(|d| n % d == 0)
        .flat_map(|d| [d, n / d])
        .collect();
    divs.sort_unstable_by(|a, b| b.cmp(a));
    divs.dedup();
    let mut best = None;
    go(n, k, n, &divs, &mut Vec::with_capacity(k), &mut best);
    best.map(|(_, v)| v).unwrap_or_else(|| vec![1; k])
}

/// Dims_create: fill zero entries of `dims` with a balanced factorisation of the rest of `nnodes`.
fn dims_create(nnodes: c_int, dims: &mut [c_int]) -> R {
    let fixed: i64 = dims.iter().filter(|&&d| d > 0).map(|&d| d as i64).product();
    if dims.iter().any(|&d| d < 0) {
        return err(MPI_ERR_DIMS, "negative dimension");
    }
    if fixed == 0 || nnodes as i64 % fixed != 0 {
        return err(
            MPI_ERR_DIMS,
            format!("{nnodes} nodes cannot be divided over the fixed dimensions"),
        );
    }
    let free: Vec<usize> = (0..dims.len()).filter(|&i| dims[i] == 0).collect();
    if free.is_empty() {
        return if fixed == nnodes as i64 {
            Ok(())
        } else {
            err(MPI_ERR_DIMS, "dimensions do not multiply to nnodes")
        };
    }
    let rest = nnodes as i64 / fixed;
    let mut vals = balanced(rest, free.len());
    vals.sort_unstable_by(|a, b| b.cmp(a));
    for (k, &i) in free.iter().enumerate() {
        dims[i] = vals[k] as c_int;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------ entry points

unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

pub(crate) unsafe fn keyval_create(
    copy: Option<CopyFn>,
    delete: Option<DeleteFn>,
    keyval: *mut c_int,
    extra: *mut c_void,
) -> R {
    let st = state()?;
    if keyval.is_null() {
        return err(MPI_ERR_ARG, "keyval is NULL");
    }
    st.keyvals.push(Some(Keyval {
        copy,
        delete,
        extra,
    }));
    *keyval = (KEYVAL_BASE | st.keyvals.len() as u32) as c_int;
    Ok(())
}

pub(crate) fn user_key(st: &State, k: c_int) -> R<usize> {
    let u = k as u32;
    let i = (u & 0x00ff_ffff) as usize;
    if u & 0xff00_0000 == KEYVAL_BASE
        && i >= 1
        && st.keyvals.get(i - 1).is_some_and(|x| x.is_some())
    {
        Ok(i - 1)
    } else {
        err(MPI_ERR_KEYVAL, format!("invalid attribute key {k:#x}"))
    }
}

unsafe fn set_attr(comm: MPI_Comm, keyval: c_int, val: *mut c_void) -> R {
    let st = state()?;
    let (ci, _) = st.comm(comm)?;
    user_key(st, keyval)?;
    let old = st.comms[ci]
        .as_ref()
        .unwrap()
        .attrs
        .iter()
        .find(|a| a.0 == keyval)
        .map(|a| a.1);
    if let Some(v) = old {
        delete_attr(st, comm, keyval, v)?;
    }
    let c = st.comms[ci].as_mut().unwrap();
    match c.attrs.iter_mut().find(|a| a.0 == keyval) {
        Some(a) => a.1 = val,
        None => c.attrs.push((keyval, val)),
    }
    Ok(())
}

unsafe fn del_attr(comm: MPI_Comm, keyval: c_int) -> R {
    let st = state()?;
    let (ci, _) = st.comm(comm)?;
    user_key(st, keyval)?;
    let c = st.comms[ci].as_ref().unwrap();
    let Some(pos) = c.attrs.iter().position(|a| a.0 == keyval) else {
        return err(MPI_ERR_KEYVAL, "attribute not set on this communicator");
    };
    let v = c.attrs[pos].1;
    delete_attr(st, comm, keyval, v)?;
    st.comms[ci].as_mut().unwrap().attrs.remove(pos);
    Ok(())
}

/// User attribute lookup (predefined keys are answered by env.rs).
pub(crate) fn get_user_attr(
    st: &mut State,
    comm: MPI_Comm,
    keyval: c_int,
) -> R<Option<Option<*mut c_void>>> {
    if (keyval as u32) & 0xff00_0000 != KEYVAL_BASE {
        return Ok(None);
    }
    let (ci, _) = st.comm(comm)?;
    user_key(st, keyval)?;
    Ok(Some(
        st.comms[ci]
            .as_ref()
            .unwrap()
            .attrs
            .iter()
            .find(|a| a.0 == keyval)
            .map(|a| a.1),
    ))
}

pub(crate) unsafe fn free_comm(st: &mut State, comm: *mut MPI_Comm) -> R {
    if comm.is_null() {
        return err(MPI_ERR_ARG, "comm is NULL");
    }
    let h = *comm;
    let (ci, _) = st.comm(h)?;
    if ci < 3 {
        return err(MPI_ERR_COMM, "cannot free a predefined communicator");
    }
    let attrs = std::mem::take(&mut st.comms[ci].as_mut().unwrap().attrs);
    for (k, v) in attrs.iter().rev() {
        delete_attr(st, h, *k, *v)?;
    }
    // Shared-memory collectives are blocking, so none is in flight: let go of the areas now.
    let shm = std::mem::replace(
        &mut st.comms[ci].as_mut().unwrap().shm,
        crate::shmcoll::Shm::Off,
    );
    crate::shmcoll::release(st, shm);
    // Pending requests on the communicator keep its index alive: free lazily only when none refers to it.
    if st.reqs.iter().any(|r| r.live && r.comm == ci) {
        // keep the entry (requests still use it); the handle becomes invalid for the program
        let c = st.comms[ci].as_mut().unwrap();
        c.name = String::from("(freed)");
    } else {
        st.comms[ci] = None;
    }
    *comm = MPI_COMM_NULL;
    Ok(())
}

mpi_api! {
    fn MPI_Comm_dup / PMPI_Comm_dup(comm: MPI_Comm, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R { dup(state()?, comm, None, newcomm) })();
        fin(comm, "MPI_Comm_dup", r)
    }
    fn MPI_Comm_dup_with_info / PMPI_Comm_dup_with_info(comm: MPI_Comm, info: MPI_Info, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R { dup(state()?, comm, Some(info), newcomm) })();
        fin(comm, "MPI_Comm_dup_with_info", r)
    }
    fn MPI_Comm_idup / PMPI_Comm_idup(comm: MPI_Comm, newcomm: *mut MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Comm_idup", idup(comm, None, newcomm, request))
    }
    fn MPI_Comm_idup_with_info / PMPI_Comm_idup_with_info(comm: MPI_Comm, info: MPI_Info, newcomm: *mut MPI_Comm, request: *mut MPI_Request) -> c_int {
        fin(comm, "MPI_Comm_idup_with_info", idup(comm, Some(info), newcomm, request))
    }
    fn MPI_Comm_set_info / PMPI_Comm_set_info(comm: MPI_Comm, info: MPI_Info) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (ci, _) = st.comm(comm)?;
            let add = crate::info::comm_hints(info)?;
            let h = &mut st.comms[ci].as_mut().unwrap().hints;
            for (k, v) in add {
                match h.iter_mut().find(|(key, _)| *key == k) {
                    Some(e) => e.1 = v,
                    None => h.push((k, v)),
                }
            }
            Ok(())
        })();
        fin(comm, "MPI_Comm_set_info", r)
    }
    fn MPI_Comm_get_info / PMPI_Comm_get_info(comm: MPI_Comm, info_used: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (_, c) = st.comm(comm)?;
            if info_used.is_null() {
                return err(MPI_ERR_ARG, "info_used is NULL");
            }
            *info_used = crate::info::create(c.hints.clone());
            Ok(())
        })();
        fin(comm, "MPI_Comm_get_info", r)
    }
    fn MPI_Comm_split / PMPI_Comm_split(comm: MPI_Comm, color: c_int, key: c_int, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if newcomm.is_null() {
                return err(MPI_ERR_ARG, "newcomm is NULL");
            }
            if color < 0 && color != MPI_UNDEFINED {
                return err(MPI_ERR_ARG, format!("invalid color {color}"));
            }
            let (ci, c) = st.comm(comm)?;
            *newcomm = if c.remote.is_some() {
                crate::intercomm::split(st, ci, color, key)?
            } else {
                split(st, ci, color, key)?
            };
            Ok(())
        })();
        fin(comm, "MPI_Comm_split", r)
    }
    fn MPI_Comm_split_type / PMPI_Comm_split_type(comm: MPI_Comm, split_type: c_int, key: c_int, info: MPI_Info, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            crate::info::check(info)?;
            if newcomm.is_null() {
                return err(MPI_ERR_ARG, "newcomm is NULL");
            }
            let (ci, c) = st.comm(comm)?;
            // Ranks reachable through shared memory (or myself) form one host/region: its colour is
            // the lowest world rank among them. On an intercommunicator both groups count, so that
            // both sides name a region alike: the result connects the local and remote processes of
            // each region (as MPI_Comm_split does by colour; MPICH answers the same).
            let inter = c.remote.is_some();
            let mut mem = members(c);
            mem.extend(c.remote.iter().flatten().copied());
            let near: Vec<usize> = {
                let e = st.fab.engine();
                mem.iter().copied().filter(|&w| matches!(e.route(w), Route::Shm | Route::SelfLoop)).collect()
            };
            let region = *near.iter().min().unwrap() as c_int;
            let color = match split_type {
                MPI_UNDEFINED => MPI_UNDEFINED,
                MPI_COMM_TYPE_SHARED => region,
                // MPI 4.0 §7.4.2: the resource is named by the mpi_hw_resource_type hint (the same at
                // every member). The one level this library knows is the shared-memory domain, which
                // "mpi_shared_memory" and hwloc's "machine" name. Without the hint, or for a level
                // it does not know, the process gets MPI_COMM_NULL.
                MPI_COMM_TYPE_HW_GUIDED => match crate::info::get(info, "mpi_hw_resource_type")?.as_deref() {
                    Some("mpi_shared_memory") | Some("machine") => region,
                    _ => MPI_UNDEFINED,
                },
                // The next level below the communicator: the shared-memory domain when the
                // communicator spans several; there is none below a single one (MPI_COMM_NULL). The
                // level's name is returned in the info object.
                MPI_COMM_TYPE_HW_UNGUIDED => {
                    if near.len() < mem.len() {
                        if info != crate::info::INFO_NULL {
                            crate::info::set(info, "mpi_hw_resource_type", "mpi_shared_memory")?;
                        }
                        region
                    } else {
                        MPI_UNDEFINED
                    }
                }
                // MPICH's extension needs hints this library does not act on.
                MPIX_COMM_TYPE_NEIGHBORHOOD => MPI_UNDEFINED,
                t => return err(MPI_ERR_ARG, format!("invalid split_type {t}")),
            };
            *newcomm = if inter {
                crate::intercomm::split(st, ci, color, key)?
            } else {
                split(st, ci, color, key)?
            };
            Ok(())
        })();
        fin(comm, "MPI_Comm_split_type", r)
    }
    fn MPI_Comm_create / PMPI_Comm_create(comm: MPI_Comm, group: MPI_Group, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if newcomm.is_null() {
                return err(MPI_ERR_ARG, "newcomm is NULL");
            }
            let (ci, c) = st.comm(comm)?;
            let inter = c.remote.is_some();
            let g = crate::comm::group(st, group)?;
            let mem = members(st.comms[ci].as_ref().unwrap());
            if g.iter().any(|w| !mem.contains(w)) {
                return err(MPI_ERR_GROUP, "group is not a subset of the communicator's (local) group");
            }
            if inter {
                // Intercommunicator (MPI 2.2): each group names a subgroup of itself; the result joins
                // the two subgroups, ranked in group order. That is a split with one color.
                let me = my_world(st);
                let (color, key) = match g.iter().position(|&w| w == me) {
                    Some(r) => (0, r as c_int),
                    None => (MPI_UNDEFINED, 0),
                };
                *newcomm = crate::intercomm::split(st, ci, color, key)?;
                return Ok(());
            }
            let ctx = new_ctx(st, ci)?;
            let me = my_world(st);
            *newcomm = match g.iter().position(|&w| w == me) {
                None => MPI_COMM_NULL,
                Some(r) => {
                    let eh = st.comms[ci].as_ref().unwrap().eh;
                    let n = Comm::new(ctx, r as i32, Some(g.clone()), g.len() as i32, eh);
                    add_comm(st, n)
                }
            };
            Ok(())
        })();
        fin(comm, "MPI_Comm_create", r)
    }
    fn MPI_Comm_create_group / PMPI_Comm_create_group(comm: MPI_Comm, group: MPI_Group, tag: c_int, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if newcomm.is_null() {
                return err(MPI_ERR_ARG, "newcomm is NULL");
            }
            let (ci, c) = st.comm(comm)?;
            crate::intercomm::intra_only(c, "MPI_Comm_create_group")?;
            let (pctx, eh) = (c.coll, c.eh);
            let g = crate::comm::group(st, group)?;
            let me = my_world(st);
            let Some(r) = g.iter().position(|&w| w == me) else {
                *newcomm = MPI_COMM_NULL;
                return Ok(());
            };
            let _ = ci;
            let mut v = [ctx_propose(st)? as i32];
            coll::allreduce_max_group(st, pctx, 0x4000_0000 | (tag & 0x3fff_ffff), &g, r, &mut v)?;
            ctx_agreed(st, v[0] as u32);
            let n = Comm::new(v[0] as u32, r as i32, Some(g.clone()), g.len() as i32, eh);
            *newcomm = add_comm(st, n);
            Ok(())
        })();
        fin(comm, "MPI_Comm_create_group", r)
    }
    fn MPI_Comm_free / PMPI_Comm_free(comm: *mut MPI_Comm) -> c_int {
        let h = if comm.is_null() { MPI_COMM_WORLD } else { *comm };
        let r = (|| -> R { free_comm(state()?, comm) })();
        fin(h, "MPI_Comm_free", r)
    }
    fn MPI_Comm_disconnect / PMPI_Comm_disconnect(comm: *mut MPI_Comm) -> c_int {
        let h = if comm.is_null() { MPI_COMM_WORLD } else { *comm };
        // Collective: every member's communication on it is complete once all have arrived.
        let r = (|| -> R {
            if comm.is_null() {
                return err(MPI_ERR_ARG, "comm is NULL");
            }
            crate::p2p::reap(state()?, true)?;
            crate::coll::barrier(state()?, h)?;
            free_comm(state()?, comm)
        })();
        fin(h, "MPI_Comm_disconnect", r)
    }
    fn MPI_Comm_compare / PMPI_Comm_compare(comm1: MPI_Comm, comm2: MPI_Comm, result: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if result.is_null() {
                return err(MPI_ERR_ARG, "result is NULL");
            }
            let (i1, c1) = st.comm(comm1)?;
            let m1 = members(c1);
            let (i2, c2) = st.comm(comm2)?;
            let m2 = members(c2);
            *result = if i1 == i2 {
                MPI_IDENT
            } else {
                match compare_lists(&m1, &m2) {
                    MPI_IDENT => MPI_CONGRUENT,
                    x => x,
                }
            };
            Ok(())
        })();
        fin(comm1, "MPI_Comm_compare", r)
    }
    fn MPI_Comm_group / PMPI_Comm_group(comm: MPI_Comm, group: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if group.is_null() {
                return err(MPI_ERR_ARG, "group is NULL");
            }
            let m = members(st.comm(comm)?.1);
            *group = group_handle(st, m);
            Ok(())
        })();
        fin(comm, "MPI_Comm_group", r)
    }
    fn MPI_Comm_set_name / PMPI_Comm_set_name(comm: MPI_Comm, comm_name: *const c_char) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let n = cstr(comm_name);
            st.comm(comm)?.1.name = n;
            Ok(())
        })();
        fin(comm, "MPI_Comm_set_name", r)
    }
    fn MPI_Comm_get_name / PMPI_Comm_get_name(comm: MPI_Comm, comm_name: *mut c_char, resultlen: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let n = st.comm(comm)?.1.name.clone();
            put_str(&n, comm_name, resultlen, 128);
            Ok(())
        })();
        fin(comm, "MPI_Comm_get_name", r)
    }
    fn MPI_Group_size / PMPI_Group_size(group: MPI_Group, size: *mut c_int) -> c_int {
        let r = (|| -> R {
            let g = crate::comm::group(state()?, group)?;
            if size.is_null() { return err(MPI_ERR_ARG, "size is NULL"); }
            *size = g.len() as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_size", r)
    }
    fn MPI_Group_rank / PMPI_Group_rank(group: MPI_Group, rank: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let g = crate::comm::group(st, group)?;
            if rank.is_null() { return err(MPI_ERR_ARG, "rank is NULL"); }
            let me = my_world(st);
            *rank = g.iter().position(|&w| w == me).map_or(MPI_UNDEFINED, |p| p as c_int);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_rank", r)
    }
    fn MPI_Group_incl / PMPI_Group_incl(group: MPI_Group, n: c_int, ranks: *const c_int, newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let g = crate::comm::group(st, group)?;
            let rs = ints(ranks, n)?;
            let mut out = Vec::with_capacity(rs.len());
            for &x in &rs {
                if x < 0 || x as usize >= g.len() { return err(MPI_ERR_RANK, format!("rank {x} not in group")); }
                if out.contains(&g[x as usize]) { return err(MPI_ERR_RANK, format!("rank {x} twice")); }
                out.push(g[x as usize]);
            }
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, out);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_incl", r)
    }
    fn MPI_Group_excl / PMPI_Group_excl(group: MPI_Group, n: c_int, ranks: *const c_int, newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let g = crate::comm::group(st, group)?;
            let rs = ints(ranks, n)?;
            for &x in &rs {
                if x < 0 || x as usize >= g.len() { return err(MPI_ERR_RANK, format!("rank {x} not in group")); }
            }
            let out: Vec<usize> = g.iter().enumerate().filter(|(i, _)| !rs.contains(&(*i as c_int))).map(|(_, &w)| w).collect();
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, out);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_excl", r)
    }
    fn MPI_Group_range_incl / PMPI_Group_range_incl(group: MPI_Group, n: c_int, ranges: *mut [c_int; 3], newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let g = crate::comm::group(st, group)?;
            let idx = range_list(&g, n, ranges)?;
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, idx.iter().map(|&i| g[i]).collect());
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_range_incl", r)
    }
    fn MPI_Group_range_excl / PMPI_Group_range_excl(group: MPI_Group, n: c_int, ranges: *mut [c_int; 3], newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let g = crate::comm::group(st, group)?;
            let idx = range_list(&g, n, ranges)?;
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, (0..g.len()).filter(|i| !idx.contains(i)).map(|i| g[i]).collect());
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_range_excl", r)
    }
    fn MPI_Group_union / PMPI_Group_union(group1: MPI_Group, group2: MPI_Group, newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (a, b) = (crate::comm::group(st, group1)?, crate::comm::group(st, group2)?);
            let mut out = a.clone();
            out.extend(b.iter().filter(|w| !a.contains(w)));
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, out);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_union", r)
    }
    fn MPI_Group_intersection / PMPI_Group_intersection(group1: MPI_Group, group2: MPI_Group, newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (a, b) = (crate::comm::group(st, group1)?, crate::comm::group(st, group2)?);
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, a.into_iter().filter(|w| b.contains(w)).collect());
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_intersection", r)
    }
    fn MPI_Group_difference / PMPI_Group_difference(group1: MPI_Group, group2: MPI_Group, newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (a, b) = (crate::comm::group(st, group1)?, crate::comm::group(st, group2)?);
            if newgroup.is_null() { return err(MPI_ERR_ARG, "newgroup is NULL"); }
            *newgroup = group_handle(st, a.into_iter().filter(|w| !b.contains(w)).collect());
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_difference", r)
    }
    fn MPI_Group_translate_ranks / PMPI_Group_translate_ranks(group1: MPI_Group, n: c_int, ranks1: *const c_int, group2: MPI_Group, ranks2: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (a, b) = (crate::comm::group(st, group1)?, crate::comm::group(st, group2)?);
            let rs = ints(ranks1, n)?;
            for (k, &x) in rs.iter().enumerate() {
                *ranks2.add(k) = if x == MPI_PROC_NULL {
                    MPI_PROC_NULL
                } else if x < 0 || x as usize >= a.len() {
                    return err(MPI_ERR_RANK, format!("rank {x} not in group1"));
                } else {
                    b.iter().position(|&w| w == a[x as usize]).map_or(MPI_UNDEFINED, |p| p as c_int)
                };
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_translate_ranks", r)
    }
    fn MPI_Group_compare / PMPI_Group_compare(group1: MPI_Group, group2: MPI_Group, result: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (a, b) = (crate::comm::group(st, group1)?, crate::comm::group(st, group2)?);
            if result.is_null() { return err(MPI_ERR_ARG, "result is NULL"); }
            *result = compare_lists(&a, &b);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_compare", r)
    }
    fn MPI_Group_free / PMPI_Group_free(group: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if group.is_null() { return err(MPI_ERR_ARG, "group is NULL"); }
            let g = *group;
            crate::comm::group(st, g)?;
            if g != MPI_GROUP_EMPTY {
                st.groups[(g as u32 & 0x03ff_ffff) as usize] = None;
            }
            *group = MPI_GROUP_NULL;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Group_free", r)
    }

    fn MPI_Comm_create_keyval / PMPI_Comm_create_keyval(comm_copy_attr_fn: Option<CopyFn>, comm_delete_attr_fn: Option<DeleteFn>, comm_keyval: *mut c_int, extra_state: *mut c_void) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Comm_create_keyval", keyval_create(comm_copy_attr_fn, comm_delete_attr_fn, comm_keyval, extra_state))
    }
    fn MPI_Keyval_create / PMPI_Keyval_create(copy_fn: Option<CopyFn>, delete_fn: Option<DeleteFn>, keyval: *mut c_int, extra_state: *mut c_void) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Keyval_create", keyval_create(copy_fn, delete_fn, keyval, extra_state))
    }
    fn MPI_Comm_free_keyval / PMPI_Comm_free_keyval(comm_keyval: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if comm_keyval.is_null() { return err(MPI_ERR_ARG, "keyval is NULL"); }
            user_key(st, *comm_keyval)?;
            // The key stays usable by communicators that still carry it (callbacks run on their free).
            *comm_keyval = MPI_KEYVAL_INVALID;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Comm_free_keyval", r)
    }
    fn MPI_Keyval_free / PMPI_Keyval_free(keyval: *mut c_int) -> c_int {
        PMPI_Comm_free_keyval(keyval)
    }
    fn MPI_Comm_set_attr / PMPI_Comm_set_attr(comm: MPI_Comm, comm_keyval: c_int, attribute_val: *mut c_void) -> c_int {
        fin(comm, "MPI_Comm_set_attr", set_attr(comm, comm_keyval, attribute_val))
    }
    fn MPI_Attr_put / PMPI_Attr_put(comm: MPI_Comm, keyval: c_int, attribute_val: *mut c_void) -> c_int {
        fin(comm, "MPI_Attr_put", set_attr(comm, keyval, attribute_val))
    }
    fn MPI_Comm_delete_attr / PMPI_Comm_delete_attr(comm: MPI_Comm, comm_keyval: c_int) -> c_int {
        fin(comm, "MPI_Comm_delete_attr", del_attr(comm, comm_keyval))
    }
    fn MPI_Attr_delete / PMPI_Attr_delete(comm: MPI_Comm, keyval: c_int) -> c_int {
        fin(comm, "MPI_Attr_delete", del_attr(comm, keyval))
    }
    fn MPI_Attr_get / PMPI_Attr_get(comm: MPI_Comm, keyval: c_int, attribute_val: *mut c_void, flag: *mut c_int) -> c_int {
        crate::env::PMPI_Comm_get_attr(comm, keyval, attribute_val, flag)
    }

    fn MPI_Topo_test / PMPI_Topo_test(comm: MPI_Comm, status: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            if status.is_null() { return err(MPI_ERR_ARG, "status is NULL"); }
            *status = match c.topo { Some(Topo::Cart { .. }) => MPI_CART, Some(Topo::DistGraph { .. }) => MPI_DIST_GRAPH, Some(Topo::Graph { .. }) => MPI_GRAPH, None => MPI_UNDEFINED };
            Ok(())
        })();
        fin(comm, "MPI_Topo_test", r)
    }
    fn MPI_Dims_create / PMPI_Dims_create(nnodes: c_int, ndims: c_int, dims: *mut c_int) -> c_int {
        let r = (|| -> R {
            if ndims < 0 || (ndims > 0 && dims.is_null()) { return err(MPI_ERR_ARG, "invalid dims"); }
            let d = std::slice::from_raw_parts_mut(dims, ndims as usize);
            dims_create(nnodes, d)
        })();
        fin(MPI_COMM_WORLD, "MPI_Dims_create", r)
    }
    fn MPI_Cart_create / PMPI_Cart_create(comm_old: MPI_Comm, ndims: c_int, dims: *const c_int, periods: *const c_int, _reorder: c_int, comm_cart: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if comm_cart.is_null() { return err(MPI_ERR_ARG, "comm_cart is NULL"); }
            let (ci, c) = st.comm(comm_old)?;
            let (rank, size) = (c.rank, c.size);
            let d = ints(dims, ndims)?;
            let p = ints(periods, ndims)?;
            if d.iter().any(|&x| x <= 0) { return err(MPI_ERR_DIMS, "dimensions must be positive"); }
            let prod: i64 = d.iter().map(|&x| x as i64).product();
            if prod > size as i64 { return err(MPI_ERR_TOPOLOGY, format!("grid of {prod} does not fit in {size} ranks")); }
            let h = split(st, ci, if (rank as i64) < prod { 0 } else { MPI_UNDEFINED }, rank)?;
            if h != MPI_COMM_NULL {
                st.comm(h)?.1.topo = Some(Topo::Cart { dims: d, periods: p });
            }
            *comm_cart = h;
            Ok(())
        })();
        fin(comm_old, "MPI_Cart_create", r)
    }
    fn MPI_Cart_coords / PMPI_Cart_coords(comm: MPI_Comm, rank: c_int, maxdims: c_int, coords: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let size = st.comm(comm)?.1.size;
            let (d, _, _) = cart(st, comm)?;
            if rank < 0 || rank >= size { return err(MPI_ERR_RANK, format!("rank {rank}")); }
            if (maxdims as usize) < d.len() { return err(MPI_ERR_ARG, "maxdims too small"); }
            for (i, x) in cart_coords(d, rank).into_iter().enumerate() { *coords.add(i) = x; }
            Ok(())
        })();
        fin(comm, "MPI_Cart_coords", r)
    }
    fn MPI_Cart_rank / PMPI_Cart_rank(comm: MPI_Comm, coords: *const c_int, rank: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (d, p, _) = cart(st, comm)?;
            let co = ints(coords, d.len() as c_int)?;
            *rank = cart_rank(d, p, &co)?;
            Ok(())
        })();
        fin(comm, "MPI_Cart_rank", r)
    }
    fn MPI_Cart_shift / PMPI_Cart_shift(comm: MPI_Comm, direction: c_int, disp: c_int, rank_source: *mut c_int, rank_dest: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (d, p, me) = cart(st, comm)?;
            if direction < 0 || direction as usize >= d.len() { return err(MPI_ERR_ARG, format!("direction {direction}")); }
            let (s, t) = shift(d, p, me, direction as usize, disp);
            *rank_source = s;
            *rank_dest = t;
            Ok(())
        })();
        fin(comm, "MPI_Cart_shift", r)
    }
    fn MPI_Cart_get / PMPI_Cart_get(comm: MPI_Comm, maxdims: c_int, dims: *mut c_int, periods: *mut c_int, coords: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (d, p, me) = cart(st, comm)?;
            if (maxdims as usize) < d.len() { return err(MPI_ERR_ARG, "maxdims too small"); }
            let co = cart_coords(d, me);
            for i in 0..d.len() {
                *dims.add(i) = d[i];
                *periods.add(i) = p[i];
                *coords.add(i) = co[i];
            }
            Ok(())
        })();
        fin(comm, "MPI_Cart_get", r)
    }
    fn MPI_Cartdim_get / PMPI_Cartdim_get(comm: MPI_Comm, ndims: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (d, _, _) = cart(st, comm)?;
            *ndims = d.len() as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Cartdim_get", r)
    }
    fn MPI_Cart_sub / PMPI_Cart_sub(comm: MPI_Comm, remain_dims: *const c_int, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (d, p, me) = cart(st, comm)?;
            let (d, p) = (d.clone(), p.clone());
            let keep = ints(remain_dims, d.len() as c_int)?;
            let co = cart_coords(&d, me);
            let (mut color, mut key) = (0, 0);
            let (mut nd, mut np) = (vec![], vec![]);
            for i in 0..d.len() {
                if keep[i] != 0 {
                    key = key * d[i] + co[i];
                    nd.push(d[i]);
                    np.push(p[i]);
                } else {
                    color = color * d[i] + co[i];
                }
            }
            let (ci, c) = st.comm(comm)?;
            if nd.is_empty() {
                // No dimension kept (or a zero-dimensional comm): a zero-dimensional topology, which has
                // one process. As MPICH (and as Cart_create with ndims = 0), rank 0 of `comm` gets it
                // and the others MPI_COMM_NULL.
                color = if c.rank == 0 { 0 } else { MPI_UNDEFINED };
            }
            let h = split(st, ci, color, key)?;
            if h != MPI_COMM_NULL {
                st.comm(h)?.1.topo = Some(Topo::Cart { dims: nd, periods: np });
            }
            *newcomm = h;
            Ok(())
        })();
        fin(comm, "MPI_Cart_sub", r)
    }
    fn MPI_Cart_map / PMPI_Cart_map(comm: MPI_Comm, ndims: c_int, dims: *const c_int, _periods: *const c_int, newrank: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (rank, size) = { let c = st.comm(comm)?.1; (c.rank, c.size) };
            if newrank.is_null() { return err(MPI_ERR_ARG, "newrank is NULL"); }
            let d = ints(dims, ndims)?;
            if d.iter().any(|&x| x <= 0) { return err(MPI_ERR_DIMS, "dimensions must be positive"); }
            let prod: i64 = d.iter().map(|&x| x as i64).product();
            if prod > size as i64 { return err(MPI_ERR_ARG, format!("grid of {prod} does not fit in {size} ranks")); }
            *newrank = if (rank as i64) < prod { rank } else { MPI_UNDEFINED };
            Ok(())
        })();
        fin(comm, "MPI_Cart_map", r)
    }
    fn MPI_Dist_graph_create_adjacent / PMPI_Dist_graph_create_adjacent(comm_old: MPI_Comm, indegree: c_int, sources: *const c_int, sourceweights: *const c_int, outdegree: c_int, destinations: *const c_int, destweights: *const c_int, info: MPI_Info, _reorder: c_int, comm_dist_graph: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            crate::info::check(info)?;
            if comm_dist_graph.is_null() { return err(MPI_ERR_ARG, "comm_dist_graph is NULL"); }
            let c = st.comm(comm_old)?.1;
            crate::intercomm::intra_only(c, "MPI_Dist_graph_create_adjacent")?;
            let size = c.size;
            let src = ints(sources, indegree)?;
            let dst = ints(destinations, outdegree)?;
            if src.iter().chain(dst.iter()).any(|&x| x < 0 || x >= size) { return err(MPI_ERR_RANK, "neighbour rank out of range"); }
            let sw = weights(sourceweights, indegree)?;
            let dw = weights(destweights, outdegree)?;
            let mut h = MPI_COMM_NULL;
            dup(st, comm_old, None, &mut h)?;
            let c = st.comm(h)?.1;
            c.attrs.clear();
            c.topo = Some(Topo::DistGraph { src, sw, dst, dw });
            *comm_dist_graph = h;
            Ok(())
        })();
        fin(comm_old, "MPI_Dist_graph_create_adjacent", r)
    }
    fn MPI_Dist_graph_create / PMPI_Dist_graph_create(comm_old: MPI_Comm, n: c_int, sources: *const c_int, degrees: *const c_int, destinations: *const c_int, weights_: *const c_int, info: MPI_Info, _reorder: c_int, comm_dist_graph: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            crate::info::check(info)?;
            if comm_dist_graph.is_null() { return err(MPI_ERR_ARG, "comm_dist_graph is NULL"); }
            let (ci, c) = st.comm(comm_old)?;
            crate::intercomm::intra_only(c, "MPI_Dist_graph_create")?;
            let (size, me) = (c.size as usize, c.rank);
            let s = ints(sources, n)?;
            let deg = ints(degrees, n)?;
            let total: c_int = deg.iter().sum();
            let d = ints(destinations, total)?;
            let w = weights(weights_, total)?;
            // Every edge (s -> d, w) is announced to everyone: allgather of per-rank edge lists.
            let mut mine = Vec::new();
            let mut k = 0;
            for i in 0..s.len() {
                for _ in 0..deg[i] {
                    mine.push(s[i]);
                    mine.push(d[k]);
                    mine.push(w.as_ref().and_then(|w| w.get(k).copied()).unwrap_or(1));
                    k += 1;
                }
            }
            // (edge-list length, weights given): the graph is weighted if any process gave weights, since
            // processes with no edges may pass NULL or MPI_UNWEIGHTED (MPICH's distgraph1 does).
            let hdr = coll::allgather_ints(st, ci, &[mine.len() as i32, w.is_some() as i32])?;
            let counts: Vec<i32> = hdr.chunks(2).map(|x| x[0]).collect();
            let weighted = hdr.chunks(2).any(|x| x[1] != 0);
            let maxc = *counts.iter().max().unwrap() as usize;
            let mut padded = mine.clone();
            padded.resize(maxc, -1);
            let all = if maxc > 0 { coll::allgather_ints(st, ci, &padded)? } else { vec![] };
            let (mut src, mut sw, mut dst, mut dw) = (vec![], vec![], vec![], vec![]);
            for r in 0..size {
                let recs = &all[r * maxc..r * maxc + counts[r] as usize];
                for e in recs.chunks(3) {
                    if e[1] == me { src.push(e[0]); sw.push(e[2]); }
                    if e[0] == me { dst.push(e[1]); dw.push(e[2]); }
                }
            }
            let mut h = MPI_COMM_NULL;
            dup(st, comm_old, None, &mut h)?;
            let c = st.comm(h)?.1;
            c.attrs.clear();
            c.topo = Some(Topo::DistGraph { src, sw: weighted.then_some(sw), dst, dw: weighted.then_some(dw) });
            *comm_dist_graph = h;
            Ok(())
        })();
        fin(comm_old, "MPI_Dist_graph_create", r)
    }
    fn MPI_Dist_graph_neighbors_count / PMPI_Dist_graph_neighbors_count(comm: MPI_Comm, indegree: *mut c_int, outdegree: *mut c_int, weighted: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            match &c.topo {
                Some(Topo::DistGraph { src, sw, dst, .. }) => {
                    *indegree = src.len() as c_int;
                    *outdegree = dst.len() as c_int;
                    *weighted = sw.is_some() as c_int;
                    Ok(())
                }
                _ => err(MPI_ERR_TOPOLOGY, "communicator has no distributed graph topology"),
            }
        })();
        fin(comm, "MPI_Dist_graph_neighbors_count", r)
    }
    fn MPI_Dist_graph_neighbors / PMPI_Dist_graph_neighbors(comm: MPI_Comm, maxindegree: c_int, sources: *mut c_int, sourceweights: *mut c_int, maxoutdegree: c_int, destinations: *mut c_int, destweights: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            let uw = crate::env::MPI_UNWEIGHTED.0 as *mut c_int;
            match &c.topo {
                Some(Topo::DistGraph { src, sw, dst, dw }) => {
                    for i in 0..src.len().min(maxindegree.max(0) as usize) {
                        *sources.add(i) = src[i];
                        if let Some(w) = sw { if !sourceweights.is_null() && sourceweights != uw { *sourceweights.add(i) = w[i]; } }
                    }
                    for i in 0..dst.len().min(maxoutdegree.max(0) as usize) {
                        *destinations.add(i) = dst[i];
                        if let Some(w) = dw { if !destweights.is_null() && destweights != uw { *destweights.add(i) = w[i]; } }
                    }
                    Ok(())
                }
                _ => err(MPI_ERR_TOPOLOGY, "communicator has no distributed graph topology"),
            }
        })();
        fin(comm, "MPI_Dist_graph_neighbors", r)
    }
}

unsafe fn range_list(g: &[usize], n: c_int, ranges: *mut [c_int; 3]) -> R<Vec<usize>> {
    if n < 0 || (n > 0 && ranges.is_null()) {
        return err(MPI_ERR_ARG, "invalid ranges");
    }
    let mut out = Vec::new();
    for k in 0..n as usize {
        let [first, last, stride] = *ranges.add(k);
        if stride == 0 {
            return err(MPI_ERR_ARG, "stride 0");
        }
        let mut x = first;
        while (stride > 0 && x <= last) || (stride < 0 && x >= last) {
            if x < 0 || x as usize >= g.len() {
                return err(MPI_ERR_RANK, format!("rank {x} not in group"));
            }
            if out.contains(&(x as usize)) {
                return err(MPI_ERR_RANK, format!("rank {x} twice"));
            }
            out.push(x as usize);
            x += stride;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_create_is_as_balanced_as_mpich() {
        // Cases from MPICH's test table (test/mpi/topo/baddims.h) where a greedy split goes wrong.
        for (n, k, want) in [
            (72, 2, vec![9, 8]),
            (180, 2, vec![15, 12]),
            (56592, 4, vec![131, 9, 8, 6]),
            (95580, 4, vec![59, 15, 12, 9]),
            (350784, 3, vec![87, 64, 63]),
            (5040, 3, vec![21, 16, 15]),
            (216000, 4, vec![27, 20, 20, 20]),
            (119952, 5, vec![17, 14, 9, 8, 7]),
            (300000, 7, vec![10, 8, 6, 5, 5, 5, 5]),
            (16, 4, vec![2, 2, 2, 2]),
            (7, 3, vec![7, 1, 1]),
            (1, 2, vec![1, 1]),
        ] {
            assert_eq!(balanced(n, k), want, "{n} in {k}-D");
        }
        let mut d = [0, 3, 0];
        dims_create(24, &mut d).unwrap();
        assert_eq!(d, [4, 3, 2]);
        assert!(dims_create(10, &mut [3, 0]).is_err());
    }
}
