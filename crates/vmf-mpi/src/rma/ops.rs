//! RMA communication calls (MPI 4.0 §12.3): put, get, accumulate, get-accumulate, fetch-and-op,
//! compare-and-swap, their request-based forms and their large-count forms.
//!
//! The origin's data moves packed: a contiguous origin buffer is used in place, any other is packed (or,
//! for results, staged and unpacked). The target datatype travels as its flattened runs, so the target
//! side (`vmf_rma::exec`) applies it wherever it executes. Request-based operations complete locally at
//! once on shared memory; on the agent path their requests complete when the target has answered.
use super::*;
use crate::datatype::{self, Run};
use crate::op::MPI_Op;
use vmf_rma::{Done, Elem, Layout, ROp};

/// The runs of a target layout: one contiguous run on the stack, or a derived type's runs.
enum Runs {
    One([Run; 1]),
    Many(Vec<Run>),
}

impl Runs {
    fn as_slice(&self) -> &[Run] {
        match self {
            Runs::One(r) => r,
            Runs::Many(v) => v,
        }
    }
}

/// A target datatype: runs, element count, extent, bytes.
struct TLay {
    runs: Runs,
    count: usize,
    extent: isize,
    bytes: usize,
}

impl TLay {
    fn layout(&self) -> Layout<'_> {
        Layout {
            runs: self.runs.as_slice(),
            count: self.count,
            extent: self.extent,
        }
    }
}

/// Bytes of `count` elements of `dt` and whether they lie contiguously at the buffer.
#[inline]
fn lay(st: &State, count: usize, dt: MPI_Datatype) -> R<(usize, bool)> {
    if datatype::is_simple(dt) {
        let s = type_size(dt)?;
        return s
            .checked_mul(count)
            .map(|b| (b, true))
            .ok_or_else(|| MpiErr {
                code: MPI_ERR_COUNT,
                msg: "count too large".into(),
            });
    }
    if !datatype::is_derived(dt) {
        return Ok((type_size(dt)? * count, false)); // a padded pair type
    }
    let d = datatype::get(st, dt)?;
    if !d.committed {
        return err(MPI_ERR_TYPE, "datatype is not committed");
    }
    Ok((d.size * count, d.contig))
}

/// The layout of `count` elements of `dt` at the target.
#[inline]
fn tlay(st: &State, count: usize, dt: MPI_Datatype) -> R<TLay> {
    if datatype::is_simple(dt) {
        let bytes = type_size(dt)?
            .checked_mul(count)
            .ok_or_else(|| MpiErr {
                code: MPI_ERR_COUNT,
                msg: "count too large".into(),
            })?;
        return Ok(TLay {
            runs: Runs::One(vmf_rma::layout::contig_run(bytes)),
            count: 1,
            extent: bytes as isize,
            bytes,
        });
    }
    let d = datatype::desc(st, dt)?;
    if datatype::is_derived(dt) && !d.committed {
        return err(MPI_ERR_TYPE, "target datatype is not committed");
    }
    Ok(TLay {
        runs: Runs::Many(d.blocks.clone()),
        count,
        extent: d.extent(),
        bytes: d.size * count,
    })
}

/// The element kind accumulates work on for `dt` (its one basic type).
fn elem_of(st: &State, dt: MPI_Datatype) -> R<Elem> {
    let basic = if datatype::is_derived(dt) {
        let d = datatype::get(st, dt)?;
        if d.basic == MPI_DATATYPE_NULL {
            return err(
                MPI_ERR_TYPE,
                "accumulate on a derived datatype of more than one basic type",
            );
        }
        d.basic
    } else {
        dt
    };
    crate::op::kind(basic).ok_or_else(|| MpiErr {
        code: MPI_ERR_TYPE,
        msg: format!("datatype {basic:#x} has no reduction element type"),
    })
}

fn reduction(op: MPI_Op) -> R<ROp> {
    crate::op::rop(op).ok_or_else(|| MpiErr {
        code: MPI_ERR_OP,
        msg: format!("op {op:#x}: one-sided accumulates take predefined operations only"),
    })
}

/// Pack `count` elements of `dt` at `buf` (non-contiguous origin data).
unsafe fn pack(st: &State, buf: *const u8, count: usize, dt: MPI_Datatype, bytes: usize) -> R<Vec<u8>> {
    let d = datatype::desc(st, dt)?;
    let mut v = vec![0u8; bytes];
    datatype::pack(&d, buf, count, v.as_mut_ptr());
    Ok(v)
}

unsafe fn unpack(st: &State, tmp: &[u8], buf: *mut u8, count: usize, dt: MPI_Datatype) -> R {
    let d = datatype::desc(st, dt)?;
    datatype::unpack(&d, tmp.as_ptr(), tmp.len(), buf, count);
    Ok(())
}

/// The window `wi`, target `t` and byte displacement of an operation.
pub(crate) struct Tgt {
    pub wi: usize,
    pub t: usize,
    pub disp: u64,
}

/// Check the window, the target and the epoch. `None` for MPI_PROC_NULL (nothing to do). `passive`:
/// request-based operations, legal only in passive-target epochs.
#[inline]
pub(crate) fn target(
    st: &mut State,
    win: MPI_Win,
    rank: c_int,
    disp: MPI_Aint,
    passive: bool,
) -> R<Option<Tgt>> {
    let (wi, w) = self::win(st, win)?;
    if rank == MPI_PROC_NULL {
        return Ok(None);
    }
    let n = w.w.size();
    if rank < 0 || rank as usize >= n {
        return err(MPI_ERR_RANK, format!("target rank {rank} is not in a window of {n}"));
    }
    if disp < 0 {
        return err(MPI_ERR_DISP, format!("target displacement {disp} is negative"));
    }
    let t = rank as usize;
    let ep = &mut w.ep;
    let ok = if ep.lock_all {
        if !ep.lock_all_nocheck && !ep.held[t] {
            super::sync::acquire(st, wi, t, false)?;
            st.wins[wi].as_mut().unwrap().ep.held[t] = true;
        }
        true
    } else if ep.locks[t] != 0 {
        true
    } else if passive {
        false
    } else if ep.start.as_ref().is_some_and(|g| g.contains(&t)) {
        true
    } else if ep.fence {
        ep.fence_ops = true;
        true
    } else {
        false
    };
    if !ok {
        return err(
            MPI_ERR_RMA_SYNC,
            if passive {
                format!("request-based operation on target {t} outside a lock or lock_all epoch")
            } else {
                format!("operation on target {t} outside an access epoch (no fence, start, lock or lock_all covers it)")
            },
        );
    }
    let w = st.wins[wi].as_ref().unwrap();
    let disp = if w.flavor() == MPI_WIN_FLAVOR_DYNAMIC {
        disp as u64
    } else {
        let du = w.w.member(t).map_or(1, |m| m.1) as u64;
        (disp as u64).checked_mul(du).ok_or_else(|| MpiErr {
            code: MPI_ERR_DISP,
            msg: "displacement overflows".into(),
        })?
    };
    Ok(Some(Tgt { wi, t, disp }))
}

fn mismatch(o: usize, t: usize) -> MpiErr {
    MpiErr {
        code: MPI_ERR_TYPE,
        msg: format!("the origin moves {o} bytes but the target layout holds {t}"),
    }
}

/// Complete `d` now (the agent path of an operation whose result must be unpacked, and request-based
/// operations).
fn settle(st: &mut State, wi: usize, d: Done) -> R {
    if let Done::Later { target, .. } = d {
        st.wins[wi]
            .as_mut()
            .unwrap()
            .w
            .flush(target)
            .map_err(rma_err)?;
    }
    Ok(())
}

/// The fast path of put, get and the single-element atomics: a predefined contiguous type, a target
/// whose memory is mapped here, inside an epoch that already covers it. Returns the target's memory at
/// the operation's displacement and its control block, or `None` when the general path must run (which
/// also reports every error).
#[inline(always)]
fn fast_target(win: MPI_Win, rank: c_int, disp: MPI_Aint, bytes: usize) -> Option<(*mut u8, *const vmf_rma::ctl::Ctl)> {
    // SAFETY: serialised calls (crate contract); `state` checks the library runs.
    let st = state().ok()?;
    let u = win as u32;
    if u & 0xfc00_0000 != 0xa000_0000 {
        return None;
    }
    let w = st.wins.get_mut((u & 0x03ff_ffff) as usize)?.as_mut()?;
    let t = usize::try_from(rank).ok()?;
    let ep = &mut w.ep;
    let covered = if ep.lock_all {
        ep.lock_all_nocheck || *ep.held.get(t)?
    } else if *ep.locks.get(t)? != 0 {
        true
    } else if ep.fence && ep.start.is_none() {
        ep.fence_ops = true;
        true
    } else {
        false
    };
    if !covered || disp < 0 || w.pre.flavor == MPI_WIN_FLAVOR_DYNAMIC {
        return None;
    }
    let d = w.w.direct(t)?;
    let off = (disp as u64).checked_mul(d.disp_unit as u64)?;
    if off < d.lo || off.checked_add(bytes as u64)? > d.size {
        return None;
    }
    // SAFETY: inside the member's mapped memory (checked against its bounds).
    Some((unsafe { d.base.add(off as usize) }, d.ctl))
}

/// Copy `n` bytes of a put or get, inline for the sizes of single elements (no call into libc's memcpy).
/// Large copies are shared with the helper thread when that is on and may still be in progress on
/// return (`vmf_bb::copier::copy_deferred`): the operation completes at the next flush, unlock, fence or
/// complete, all of which settle the copier (`vmf_rma::window::full_fence`), as MPI allows.
#[inline(always)]
pub(crate) unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    match n {
        8 => (dst as *mut u64).write_unaligned((src as *const u64).read_unaligned()),
        4 => (dst as *mut u32).write_unaligned((src as *const u32).read_unaligned()),
        16 => (dst as *mut u128).write_unaligned((src as *const u128).read_unaligned()),
        _ => vmf_bb::copier::copy_deferred(dst, src, n),
    }
}

/// Bytes of `count` elements of a predefined contiguous type, for the fast paths.
#[inline(always)]
fn fast_bytes(count: c_int, dt: MPI_Datatype) -> Option<usize> {
    if count < 0 || !datatype::is_simple(dt) {
        return None;
    }
    type_size(dt).ok()?.checked_mul(count as usize)
}

/// MPI_Put and MPI_Rput.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn put(
    obuf: *const c_void,
    ocount: usize,
    odt: MPI_Datatype,
    rank: c_int,
    tdisp: MPI_Aint,
    tcount: usize,
    tdt: MPI_Datatype,
    win: MPI_Win,
    passive: bool,
) -> R<Option<(usize, Done)>> {
    let st = state()?;
    let (obytes, ocontig) = lay(st, ocount, odt)?;
    let tl = tlay(st, tcount, tdt)?;
    let Some(g) = target(st, win, rank, tdisp, passive)? else {
        return Ok(None);
    };
    if obytes != tl.bytes {
        return Err(mismatch(obytes, tl.bytes));
    }
    if obytes == 0 {
        return Ok(Some((g.wi, Done::Now)));
    }
    if obuf.is_null() && !datatype::is_derived(odt) {
        return err(MPI_ERR_BUFFER, "origin buffer is NULL");
    }
    let packed = if ocontig {
        None
    } else {
        Some(pack(st, obuf as *const u8, ocount, odt, obytes)?)
    };
    let p = packed.as_ref().map_or(obuf as *const u8, |v| v.as_ptr());
    let w = &mut st.wins[g.wi].as_mut().unwrap().w;
    let d = w.put(g.t, g.disp, &tl.layout(), p).map_err(rma_err)?;
    Ok(Some((g.wi, d)))
}

/// MPI_Get and MPI_Rget.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn get(
    obuf: *mut c_void,
    ocount: usize,
    odt: MPI_Datatype,
    rank: c_int,
    tdisp: MPI_Aint,
    tcount: usize,
    tdt: MPI_Datatype,
    win: MPI_Win,
    passive: bool,
) -> R<Option<(usize, Done)>> {
    let st = state()?;
    let (obytes, ocontig) = lay(st, ocount, odt)?;
    let tl = tlay(st, tcount, tdt)?;
    let Some(g) = target(st, win, rank, tdisp, passive)? else {
        return Ok(None);
    };
    if obytes != tl.bytes {
        return Err(mismatch(obytes, tl.bytes));
    }
    if obytes == 0 {
        return Ok(Some((g.wi, Done::Now)));
    }
    if obuf.is_null() && !datatype::is_derived(odt) {
        return err(MPI_ERR_BUFFER, "origin buffer is NULL");
    }
    if ocontig {
        let w = &mut st.wins[g.wi].as_mut().unwrap().w;
        let d = w.get(g.t, g.disp, &tl.layout(), obuf as *mut u8).map_err(rma_err)?;
        return Ok(Some((g.wi, d)));
    }
    let mut tmp = vec![0u8; obytes];
    let d = {
        let w = &mut st.wins[g.wi].as_mut().unwrap().w;
        w.get(g.t, g.disp, &tl.layout(), tmp.as_mut_ptr()).map_err(rma_err)?
    };
    settle(st, g.wi, d)?;
    unpack(st, &tmp, obuf as *mut u8, ocount, odt)?;
    Ok(Some((g.wi, Done::Now)))
}

/// MPI_Accumulate, MPI_Get_accumulate and their request-based forms (`result`: the get-accumulate's
/// result buffer, count and datatype).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate(
    obuf: *const c_void,
    ocount: usize,
    odt: MPI_Datatype,
    result: Option<(*mut c_void, usize, MPI_Datatype)>,
    rank: c_int,
    tdisp: MPI_Aint,
    tcount: usize,
    tdt: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
    passive: bool,
) -> R<Option<(usize, Done)>> {
    let st = state()?;
    let o = reduction(op)?;
    let tl = tlay(st, tcount, tdt)?;
    if tl.bytes == 0 {
        // Nothing moves (MPICH accepts any combination of zero counts and zero-size types here).
        let ob = if o == ROp::NoOp { 0 } else { lay(st, ocount, odt)?.0 };
        let rb = match result {
            Some((_, rc, rdt)) => lay(st, rc, rdt)?.0,
            None => 0,
        };
        if ob != 0 || rb != 0 {
            return Err(mismatch(ob.max(rb), 0));
        }
        return Ok(target(st, win, rank, tdisp, passive)?.map(|g| (g.wi, Done::Now)));
    }
    let elem = elem_of(st, tdt)?;
    if !vmf_rma::reduce::allowed(o, elem) {
        return err(MPI_ERR_OP, format!("op {op:#x} is not defined on the target datatype"));
    }
    // MPI_NO_OP ignores the origin buffer (it may be NULL).
    let (obytes, ocontig) = if o == ROp::NoOp {
        (tl.bytes, true)
    } else {
        if elem_of(st, odt)? != elem {
            return err(MPI_ERR_TYPE, "origin and target datatypes have different basic types");
        }
        lay(st, ocount, odt)?
    };
    let rl = match result {
        Some((_, rc, rdt)) => Some(lay(st, rc, rdt)?),
        None => None,
    };
    let Some(g) = target(st, win, rank, tdisp, passive)? else {
        return Ok(None);
    };
    if obytes != tl.bytes {
        return Err(mismatch(obytes, tl.bytes));
    }
    if let Some((rb, _)) = rl {
        if rb != tl.bytes {
            return Err(mismatch(rb, tl.bytes));
        }
    }
    if tl.bytes == 0 {
        return Ok(Some((g.wi, Done::Now)));
    }
    let zeros;
    let packed;
    let p: *const u8 = if o == ROp::NoOp {
        zeros = vec![0u8; tl.bytes];
        zeros.as_ptr()
    } else if obuf.is_null() && !datatype::is_derived(odt) {
        return err(MPI_ERR_BUFFER, "origin buffer is NULL");
    } else if ocontig {
        obuf as *const u8
    } else {
        packed = pack(st, obuf as *const u8, ocount, odt, obytes)?;
        packed.as_ptr()
    };
    match (result, rl) {
        (None, _) => {
            let w = &mut st.wins[g.wi].as_mut().unwrap().w;
            let d = w.accumulate(g.t, g.disp, &tl.layout(), elem, o, p, None).map_err(rma_err)?;
            Ok(Some((g.wi, d)))
        }
        (Some((rbuf, _, _)), Some((_, true))) => {
            if rbuf.is_null() {
                return err(MPI_ERR_BUFFER, "result buffer is NULL");
            }
            let w = &mut st.wins[g.wi].as_mut().unwrap().w;
            let d = w
                .accumulate(g.t, g.disp, &tl.layout(), elem, o, p, Some(rbuf as *mut u8))
                .map_err(rma_err)?;
            Ok(Some((g.wi, d)))
        }
        (Some((rbuf, rc, rdt)), _) => {
            let mut tmp = vec![0u8; tl.bytes];
            let d = {
                let w = &mut st.wins[g.wi].as_mut().unwrap().w;
                w.accumulate(g.t, g.disp, &tl.layout(), elem, o, p, Some(tmp.as_mut_ptr()))
                    .map_err(rma_err)?
            };
            settle(st, g.wi, d)?;
            unpack(st, &tmp, rbuf as *mut u8, rc, rdt)?;
            Ok(Some((g.wi, Done::Now)))
        }
    }
}

/// MPI_Compare_and_swap.
unsafe fn compare_and_swap(
    origin: *const c_void,
    compare: *const c_void,
    result: *mut c_void,
    dt: MPI_Datatype,
    rank: c_int,
    tdisp: MPI_Aint,
    win: MPI_Win,
) -> R<Option<(usize, Done)>> {
    let st = state()?;
    if !datatype::is_simple(dt) {
        return err(MPI_ERR_TYPE, "MPI_Compare_and_swap takes a predefined datatype");
    }
    let elem = crate::op::kind(dt).ok_or_else(|| MpiErr {
        code: MPI_ERR_TYPE,
        msg: format!("datatype {dt:#x} cannot be compared and swapped"),
    })?;
    if elem.packed_size() != type_size(dt)? {
        return err(MPI_ERR_TYPE, "MPI_Compare_and_swap takes a single-element datatype");
    }
    let Some(g) = target(st, win, rank, tdisp, false)? else {
        return Ok(None);
    };
    if origin.is_null() || compare.is_null() || result.is_null() {
        return err(MPI_ERR_BUFFER, "a buffer is NULL");
    }
    let w = &mut st.wins[g.wi].as_mut().unwrap().w;
    let d = w
        .compare_and_swap(g.t, g.disp, elem, compare as *const u8, origin as *const u8, result as *mut u8)
        .map_err(rma_err)?;
    Ok(Some((g.wi, d)))
}

fn count(n: c_int, what: &str) -> R<usize> {
    if n < 0 {
        err(MPI_ERR_COUNT, format!("{what} {n} is negative"))
    } else {
        Ok(n as usize)
    }
}

fn count_c(n: MPI_Count, what: &str) -> R<usize> {
    usize::try_from(n).map_err(|_| MpiErr {
        code: MPI_ERR_COUNT,
        msg: format!("{what} {n} is negative"),
    })
}

/// A request for a request-based operation: complete once the operation is (shared memory: at once).
unsafe fn request(r: R<Option<(usize, Done)>>, request: *mut MPI_Request, win: MPI_Win) -> R {
    if request.is_null() {
        return err(MPI_ERR_ARG, "request is NULL");
    }
    let st = state()?;
    if let Some((wi, d)) = r? {
        settle(st, wi, d)?;
    }
    let (_, w) = self::win(st, win)?;
    let ci = w.ci;
    *request = crate::p2p::new_req(
        st,
        MReq {
            fin: Some(St::EMPTY),
            ..MReq::on(ci)
        },
    );
    Ok(())
}

mpi_api! {
    fn MPI_Put / PMPI_Put(origin_addr: *const c_void, origin_count: c_int, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, win: MPI_Win) -> c_int {
        if origin_datatype == target_datatype && origin_count == target_count && !origin_addr.is_null() {
            if let Some(b) = fast_bytes(origin_count, origin_datatype) {
                if let Some((p, _)) = fast_target(win, target_rank, target_disp, b) {
                    copy_small(origin_addr as *const u8, p, b);
                    return MPI_SUCCESS;
                }
            }
        }
        let r = (|| -> R {
            put(origin_addr, count(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count(target_count, "target count")?, target_datatype, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Put", r)
    }
    fn MPI_Put_c / PMPI_Put_c(origin_addr: *const c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, win: MPI_Win) -> c_int {
        let r = (|| -> R {
            put(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Put_c", r)
    }
    fn MPI_Get / PMPI_Get(origin_addr: *mut c_void, origin_count: c_int, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, win: MPI_Win) -> c_int {
        if origin_datatype == target_datatype && origin_count == target_count && !origin_addr.is_null() {
            if let Some(b) = fast_bytes(origin_count, origin_datatype) {
                if let Some((p, _)) = fast_target(win, target_rank, target_disp, b) {
                    copy_small(p as *const u8, origin_addr as *mut u8, b);
                    return MPI_SUCCESS;
                }
            }
        }
        let r = (|| -> R {
            get(origin_addr, count(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count(target_count, "target count")?, target_datatype, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Get", r)
    }
    fn MPI_Get_c / PMPI_Get_c(origin_addr: *mut c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, win: MPI_Win) -> c_int {
        let r = (|| -> R {
            get(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Get_c", r)
    }
    fn MPI_Accumulate / PMPI_Accumulate(origin_addr: *const c_void, origin_count: c_int, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win) -> c_int {
        let r = (|| -> R {
            accumulate(origin_addr, count(origin_count, "origin count")?, origin_datatype, None, target_rank, target_disp, count(target_count, "target count")?, target_datatype, op, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Accumulate", r)
    }
    fn MPI_Accumulate_c / PMPI_Accumulate_c(origin_addr: *const c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win) -> c_int {
        let r = (|| -> R {
            accumulate(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, None, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, op, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Accumulate_c", r)
    }
    fn MPI_Get_accumulate / PMPI_Get_accumulate(origin_addr: *const c_void, origin_count: c_int, origin_datatype: MPI_Datatype, result_addr: *mut c_void, result_count: c_int, result_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win) -> c_int {
        let r = (|| -> R {
            let res = Some((result_addr, count(result_count, "result count")?, result_datatype));
            accumulate(origin_addr, count(origin_count, "origin count")?, origin_datatype, res, target_rank, target_disp, count(target_count, "target count")?, target_datatype, op, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Get_accumulate", r)
    }
    fn MPI_Get_accumulate_c / PMPI_Get_accumulate_c(origin_addr: *const c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, result_addr: *mut c_void, result_count: MPI_Count, result_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win) -> c_int {
        let r = (|| -> R {
            let res = Some((result_addr, count_c(result_count, "result count")?, result_datatype));
            accumulate(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, res, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, op, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Get_accumulate_c", r)
    }
    fn MPI_Fetch_and_op / PMPI_Fetch_and_op(origin_addr: *const c_void, result_addr: *mut c_void, datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, op: MPI_Op, win: MPI_Win) -> c_int {
        if let (Some(o), Some(e), false) = (crate::op::rop(op), crate::op::kind(datatype), result_addr.is_null()) {
            let s = e.packed_size();
            if datatype::is_simple(datatype) && (!origin_addr.is_null() || o == ROp::NoOp) && vmf_rma::reduce::allowed(o, e) {
                if let Some((p, ctl)) = fast_target(win, target_rank, target_disp, s) {
                    let zero = [0u8; 32];
                    let src = if origin_addr.is_null() { zero.as_ptr() } else { origin_addr as *const u8 };
                    let c = &*ctl;
                    c.acc_lock();
                    std::ptr::copy_nonoverlapping(p, result_addr as *mut u8, s);
                    vmf_rma::reduce::apply(o, e, src, p, 1, s);
                    c.acc_unlock();
                    return MPI_SUCCESS;
                }
            }
        }
        let r = (|| -> R {
            if !datatype::is_simple(datatype) && !matches!(datatype as u32 & 0xffff_fff8, 0x8c00_0000) {
                return err(MPI_ERR_TYPE, "MPI_Fetch_and_op takes a predefined datatype");
            }
            accumulate(origin_addr, 1, datatype, Some((result_addr, 1, datatype)), target_rank, target_disp, 1, datatype, op, win, false).map(|_| ())
        })();
        fin_win(win, "MPI_Fetch_and_op", r)
    }
    fn MPI_Compare_and_swap / PMPI_Compare_and_swap(origin_addr: *const c_void, compare_addr: *const c_void, result_addr: *mut c_void, datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, win: MPI_Win) -> c_int {
        if let (Some(e), false) = (crate::op::kind(datatype), origin_addr.is_null() || compare_addr.is_null() || result_addr.is_null()) {
            let s = e.packed_size();
            if datatype::is_simple(datatype) && type_size(datatype).ok() == Some(s) {
                if let Some((p, ctl)) = fast_target(win, target_rank, target_disp, s) {
                    let c = &*ctl;
                    c.acc_lock();
                    let mut cur = [0u8; 32];
                    std::ptr::copy_nonoverlapping(p, cur.as_mut_ptr(), s);
                    if std::slice::from_raw_parts(compare_addr as *const u8, s) == &cur[..s] {
                        std::ptr::copy_nonoverlapping(origin_addr as *const u8, p, s);
                    }
                    c.acc_unlock();
                    std::ptr::copy_nonoverlapping(cur.as_ptr(), result_addr as *mut u8, s);
                    return MPI_SUCCESS;
                }
            }
        }
        let r: R = compare_and_swap(origin_addr, compare_addr, result_addr, datatype, target_rank, target_disp, win).map(|_| ());
        fin_win(win, "MPI_Compare_and_swap", r)
    }
    fn MPI_Rput / PMPI_Rput(origin_addr: *const c_void, origin_count: c_int, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let x = put(origin_addr, count(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count(target_count, "target count")?, target_datatype, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Rput", r)
    }
    fn MPI_Rput_c / PMPI_Rput_c(origin_addr: *const c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let x = put(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Rput_c", r)
    }
    fn MPI_Rget / PMPI_Rget(origin_addr: *mut c_void, origin_count: c_int, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let x = get(origin_addr, count(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count(target_count, "target count")?, target_datatype, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Rget", r)
    }
    fn MPI_Rget_c / PMPI_Rget_c(origin_addr: *mut c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let x = get(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Rget_c", r)
    }
    fn MPI_Raccumulate / PMPI_Raccumulate(origin_addr: *const c_void, origin_count: c_int, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let x = accumulate(origin_addr, count(origin_count, "origin count")?, origin_datatype, None, target_rank, target_disp, count(target_count, "target count")?, target_datatype, op, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Raccumulate", r)
    }
    fn MPI_Raccumulate_c / PMPI_Raccumulate_c(origin_addr: *const c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let x = accumulate(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, None, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, op, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Raccumulate_c", r)
    }
    fn MPI_Rget_accumulate / PMPI_Rget_accumulate(origin_addr: *const c_void, origin_count: c_int, origin_datatype: MPI_Datatype, result_addr: *mut c_void, result_count: c_int, result_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: c_int, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let res = Some((result_addr, count(result_count, "result count")?, result_datatype));
            let x = accumulate(origin_addr, count(origin_count, "origin count")?, origin_datatype, res, target_rank, target_disp, count(target_count, "target count")?, target_datatype, op, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Rget_accumulate", r)
    }
    fn MPI_Rget_accumulate_c / PMPI_Rget_accumulate_c(origin_addr: *const c_void, origin_count: MPI_Count, origin_datatype: MPI_Datatype, result_addr: *mut c_void, result_count: MPI_Count, result_datatype: MPI_Datatype, target_rank: c_int, target_disp: MPI_Aint, target_count: MPI_Count, target_datatype: MPI_Datatype, op: MPI_Op, win: MPI_Win, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R {
            let res = Some((result_addr, count_c(result_count, "result count")?, result_datatype));
            let x = accumulate(origin_addr, count_c(origin_count, "origin count")?, origin_datatype, res, target_rank, target_disp, count_c(target_count, "target count")?, target_datatype, op, win, true);
            self::request(x, request, win)
        })();
        fin_win(win, "MPI_Rget_accumulate_c", r)
    }
}
