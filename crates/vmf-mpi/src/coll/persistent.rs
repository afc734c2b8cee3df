//! Persistent collectives (MPI 4.0: MPI_Barrier_init, MPI_Bcast_init, ... MPI_Exscan_init).
//!
//! An `_init` call creates an inactive persistent request that keeps the collective's *builder* (the
//! same closure the blocking and nonblocking forms use, capturing the arguments; v/w count arrays are
//! copied at init). The init takes the communicator's next collective tag and keeps it: persistent
//! collectives match in the order of their `_init` calls, not of their starts (MPI 4.0 §6.13), so
//! members may start two of them in different orders. Each start of one request reuses its tag; the
//! instances of one request cannot mix, because every member runs them in the same order and
//! point-to-point matching is ordered per sender and tag. Each MPI_Start builds a fresh schedule
//! and starts it exactly like a nonblocking collective, so Wait/Test (and every other Wait*/Test*)
//! advance and complete it; completion leaves the request inactive for the next Start, and
//! MPI_Request_free releases it (finishing a started one first). The builder lives in
//! `State::pcolls`, indexed like the request table. Argument errors the builder detects (root, counts,
//! datatypes, ops) are reported by MPI_Start; the communicator and the request pointer are checked at
//! init. Like all `_init` calls these are collective: every member calls them in the same order.
use super::*;
use crate::p2p::new_req;

/// A collective's schedule builder (what `go()` runs for the blocking and nonblocking forms).
type Builder = Box<dyn FnMut(&mut State, &mut Sched, &Ctx) -> R>;

/// The builder of one persistent collective, and the datatypes it builds schedules with (held, so that
/// MPI_Type_free between starts does not let another type take their handles).
pub(crate) struct PColl {
    build: Builder,
    types: Vec<MPI_Datatype>,
    /// The collective tag taken at init.
    tag: i32,
    /// Data the builder reads through pointers at each start (count arrays the large-count `_c` forms
    /// converted), freed with the request.
    keep: Vec<Box<dyn std::any::Any>>,
}

/// Keep `data` as long as persistent collective `request` lives (MPI_Request_free drops it). The `_c`
/// forms of the v-collectives pass count arrays they converted to `int`: the builder reads them at every
/// MPI_Start, so they must outlive the call.
pub(crate) fn keep(request: MPI_Request, data: Box<dyn std::any::Any>) {
    let Ok(st) = state() else { return };
    let i = ((request as u32) & 0x03ff_ffff) as usize;
    if let Some(Some(p)) = st.pcolls.get_mut(i) {
        p.keep.push(data);
    }
}

/// Create the inactive request for a persistent collective on `comm`.
pub(crate) unsafe fn init(
    comm: MPI_Comm,
    info: MPI_Info,
    request: *mut MPI_Request,
    types: Vec<MPI_Datatype>,
    build: Builder,
) -> R {
    let st = state()?;
    let (ci, _) = st.comm(comm)?;
    if request.is_null() {
        return err(MPI_ERR_ARG, "request pointer is NULL");
    }
    // No hint changes how a collective runs; the info object is only checked.
    crate::info::check(info)?;
    let h = new_req(
        st,
        MReq {
            active: false,
            ..MReq::on(ci)
        },
    );
    let i = ((h as u32) & 0x03ff_ffff) as usize;
    if st.pcolls.len() <= i {
        st.pcolls.resize_with(i + 1, || None);
    }
    // Only live derived types are held (and so released at MPI_Request_free); a bad handle is MPI_Start's error.
    let types: Vec<MPI_Datatype> = types
        .into_iter()
        .filter(|&t| crate::datatype::is_derived(t) && crate::datatype::get(st, t).is_ok())
        .collect();
    types.iter().for_each(|&t| crate::datatype::hold(st, t));
    let tag = st.comms[ci].as_mut().unwrap().next_nbc_tag();
    st.pcolls[i] = Some(Box::new(PColl {
        build,
        types,
        tag,
        keep: Vec::new(),
    }));
    *request = h;
    Ok(())
}

/// MPI_Start of persistent collective request `i`.
pub(crate) fn start(st: &mut State, i: usize) -> R {
    if st.reqs[i].active {
        return err(
            MPI_ERR_REQUEST,
            "MPI_Start on a persistent collective request that is already active",
        );
    }
    let ci = st.reqs[i].comm;
    if st.comms.get(ci).is_none_or(|c| c.is_none()) {
        return err(MPI_ERR_COMM, "the request's communicator was freed");
    }
    let mut pc = st.pcolls[i].take().expect("persistent collective");
    let (mut s, c) = begin_tagged(st, ci, pc.tag);
    let r = (pc.build)(st, &mut s, &c);
    st.pcolls[i] = Some(pc);
    r?;
    let _ = s.advance(&mut st.fab.engine());
    let r = &mut st.reqs[i];
    r.sched = Some(s);
    r.fin = None;
    r.eng = None;
    r.active = true;
    st.nbc_active += 1;
    Ok(())
}

/// Drop the builder of request `i` (MPI_Request_free).
pub(crate) fn forget(st: &mut State, i: usize) {
    if let Some(p) = st.pcolls.get_mut(i).and_then(|p| p.take()) {
        p.types
            .iter()
            .for_each(|&t| crate::datatype::release(st, t));
    }
}

/// Alltoallv_init (`types` None: one datatype, element displacements) and Alltoallw_init (per-peer
/// datatypes, byte displacements): the count and displacement arrays are copied now.
#[allow(clippy::too_many_arguments)]
unsafe fn a2aw_init(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: Option<*const MPI_Datatype>,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: Option<*const MPI_Datatype>,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    info: MPI_Info,
    request: *mut MPI_Request,
) -> R {
    let st = state()?;
    let w = stypes.is_some();
    let r = v_args(st, comm, rcounts, rdispls, rtypes, rtype, w)?;
    let s = if sbuf == IN_PLACE {
        r.clone()
    } else {
        v_args(st, comm, scounts, sdispls, stypes, stype, w)?
    };
    let (sc, sd, stp, rc, rd, rt) = six(s, r);
    let types = stp.iter().chain(rt.iter()).copied().collect();
    init(
        comm,
        info,
        request,
        types,
        Box::new(alltoallw(sbuf, sc, sd, stp, rbuf, rc, rd, rt)),
    )
}

macro_rules! pcoll_init {
    ($( fn $name:ident / $pname:ident ( $($a:ident : $t:ty),* ) types [$($ty:ident),*] => $body:expr; )*) => {$(
        mpi_api! {
            fn $name / $pname($($a: $t,)* comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
                let r = init(comm, info, request, vec![$($ty),*], Box::new($body));
                fin(comm, stringify!($name), r)
            }
        }
    )*};
}

pcoll_init! {
    fn MPI_Bcast_init / PMPI_Bcast_init(buffer: *mut c_void, count: c_int, datatype: MPI_Datatype, root: c_int) types [datatype]
        => bcast(buffer, count, datatype, root);
    fn MPI_Reduce_init / PMPI_Reduce_init(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op, root: c_int) types [datatype]
        => reduce(sendbuf, recvbuf, count, datatype, op, root);
    fn MPI_Allreduce_init / PMPI_Allreduce_init(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op) types [datatype]
        => allreduce(sendbuf, recvbuf, count, datatype, op);
    fn MPI_Gather_init / PMPI_Gather_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int) types [sendtype, recvtype]
        => gatherv(sendbuf, sendcount, sendtype, recvbuf, None, recvcount, None, recvtype, root);
    fn MPI_Gatherv_init / PMPI_Gatherv_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, root: c_int) types [sendtype, recvtype]
        => gatherv(sendbuf, sendcount, sendtype, recvbuf, Some(recvcounts), 0, Some(displs), recvtype, root);
    fn MPI_Scatter_init / PMPI_Scatter_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int) types [sendtype, recvtype]
        => scatterv(sendbuf, None, sendcount, None, sendtype, recvbuf, recvcount, recvtype, root);
    fn MPI_Scatterv_init / PMPI_Scatterv_init(sendbuf: *const c_void, sendcounts: *const c_int, displs: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int) types [sendtype, recvtype]
        => scatterv(sendbuf, Some(sendcounts), 0, Some(displs), sendtype, recvbuf, recvcount, recvtype, root);
    fn MPI_Allgather_init / PMPI_Allgather_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype) types [sendtype, recvtype]
        => allgatherv(sendbuf, sendcount, sendtype, recvbuf, None, recvcount, None, recvtype);
    fn MPI_Allgatherv_init / PMPI_Allgatherv_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype) types [sendtype, recvtype]
        => allgatherv(sendbuf, sendcount, sendtype, recvbuf, Some(recvcounts), 0, Some(displs), recvtype);
    fn MPI_Alltoall_init / PMPI_Alltoall_init(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype) types [sendtype, recvtype]
        => alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype);
    fn MPI_Reduce_scatter_init / PMPI_Reduce_scatter_init(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const c_int, datatype: MPI_Datatype, op: MPI_Op) types [datatype]
        => reduce_scatter(sendbuf, recvbuf, Some(recvcounts), 0, datatype, op);
    fn MPI_Reduce_scatter_block_init / PMPI_Reduce_scatter_block_init(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: c_int, datatype: MPI_Datatype, op: MPI_Op) types [datatype]
        => reduce_scatter(sendbuf, recvbuf, None, recvcount, datatype, op);
    fn MPI_Scan_init / PMPI_Scan_init(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op) types [datatype]
        => scan(sendbuf, recvbuf, count, datatype, op, false);
    fn MPI_Exscan_init / PMPI_Exscan_init(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op) types [datatype]
        => scan(sendbuf, recvbuf, count, datatype, op, true);
}

mpi_api! {
    fn MPI_Barrier_init / PMPI_Barrier_init(comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let b = |_st: &mut State, s: &mut Sched, c: &Ctx| -> R { barrier_s(s, c); Ok(()) };
        let r = init(comm, info, request, Vec::new(), Box::new(b));
        fin(comm, "MPI_Barrier_init", r)
    }
    fn MPI_Alltoallv_init / PMPI_Alltoallv_init(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = a2aw_init(sendbuf, sendcounts, sdispls, None, sendtype, recvbuf, recvcounts, rdispls, None, recvtype, comm, info, request);
        fin(comm, "MPI_Alltoallv_init", r)
    }
    fn MPI_Alltoallw_init / PMPI_Alltoallw_init(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtypes: *const MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = a2aw_init(sendbuf, sendcounts, sdispls, Some(sendtypes), 0, recvbuf, recvcounts, rdispls, Some(recvtypes), 0, comm, info, request);
        fin(comm, "MPI_Alltoallw_init", r)
    }
}
