//! The MPI 4.0 large-count (`_c`) entry points MPICH 4.0 exports for the calls benchmarks and
//! applications use. Datatype queries report full `MPI_Count` values; the communication calls accept
//! counts up to `INT_MAX` elements (a larger count is `MPI_ERR_COUNT`) and then run the normal path.
use crate::datatype::{self as dt, Disps};
use crate::op::MPI_Op;
use crate::*;
use std::ffi::{c_char, c_int, c_void};

/// What the count arrays of a v/w collective on a communicator describe.
struct Shape {
    /// Blocks in the arrays (the remote group's size on an intercommunicator).
    peers: usize,
    /// The local group's size (MPI_Reduce_scatter's counts).
    size: usize,
    rank: c_int,
    inter: bool,
}

impl Shape {
    fn of(comm: MPI_Comm) -> R<Shape> {
        let (_, c) = state()?.comm(comm)?;
        Ok(Shape {
            peers: c.remote.as_ref().map_or(c.size as usize, |r| r.len()),
            size: c.size as usize,
            rank: c.rank,
            inter: c.remote.is_some(),
        })
    }
    /// Whether a rooted collective's arrays are significant here.
    fn rooted(&self, root: c_int) -> bool {
        if self.inter {
            root == crate::intercomm::MPI_ROOT
        } else {
            root == self.rank
        }
    }
}

/// A count or displacement array as ints when `used` (each value must fit); None when unused or NULL.
unsafe fn arr(p: *const i64, n: usize, used: bool) -> R<Option<Vec<c_int>>> {
    if !used || p.is_null() {
        return Ok(None);
    }
    (0..n)
        .map(|i| ci(*p.add(i)))
        .collect::<R<Vec<c_int>>>()
        .map(Some)
}

/// A persistent v-collective made with count arrays converted here: they live with its request (its
/// builder reads them at every MPI_Start; the `Vec`s' heap buffers do not move).
unsafe fn keep_counts(rc: c_int, request: *mut MPI_Request, arrays: Vec<Option<Vec<c_int>>>) {
    if rc == MPI_SUCCESS && !request.is_null() {
        crate::coll::persistent::keep(*request, Box::new(arrays));
    }
}

fn ptr(v: &Option<Vec<c_int>>) -> *const c_int {
    v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr())
}

/// A large count as an int (counts of bytes and of array entries).
#[inline]
pub(crate) fn ci(n: MPI_Count) -> R<c_int> {
    c_int::try_from(n).map_err(|_| MpiErr {
        code: MPI_ERR_COUNT,
        msg: format!(
            "count {n} exceeds INT_MAX (only the element count of a buffer may, not an array entry or a byte size)"
        ),
    })
}

/// `count` elements of `dt` as an int count and a datatype: themselves when the count fits an int, else
/// one element of a contiguous type of `count` elements of `dt` (made once per (type, count) and kept
/// until `dt` is freed, so nonblocking calls can still use it). The normal path then moves the data; a
/// status counts bytes, so MPI_Get_count_c with `dt` reports the large count.
pub(crate) fn wide(count: MPI_Count, dt: MPI_Datatype) -> R<(c_int, MPI_Datatype)> {
    if let Ok(c) = c_int::try_from(count) {
        return Ok((c, dt));
    }
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    if let Some(&h) = state()?.big_types.get(&(dt, count)) {
        return Ok((1, h));
    }
    let mut h = MPI_DATATYPE_NULL;
    // SAFETY: `h` is a valid out-pointer.
    unsafe { dt::type_contiguous(count, dt, &mut h)? };
    let st = state()?;
    dt::commit(st, h)?;
    st.big_types.insert((dt, count), h);
    Ok((1, h))
}

/// Whether `dt` is one of the stand-in types of [`wide`] (user-defined reductions cannot take them:
/// their functions expect the program's own datatype).
pub(crate) fn is_wide(st: &State, dt: MPI_Datatype) -> bool {
    !st.big_types.is_empty() && st.big_types.values().any(|&h| h == dt)
}

/// Narrow the large-count arguments of a `_c` call, then make the int call: `count: datatype` pairs go
/// through [`wide`], bare byte counts through [`ci`].
macro_rules! conv {
    ($comm:expr, $name:expr, $($c:ident $(: $t:ident)?),* ; $call:expr) => {{
        $( conv!(@one $comm, $name, $c $(, $t)?); )*
        $call
    }};
    (@one $comm:expr, $name:expr, $c:ident, $t:ident) => {
        let ($c, $t) = match wide($c, $t) { Ok(v) => v, Err(e) => return raise($comm, $name, e) };
    };
    (@one $comm:expr, $name:expr, $c:ident) => {
        let $c = match ci($c) { Ok(v) => v, Err(e) => return raise($comm, $name, e) };
    };
}

mpi_api! {
    fn MPI_Send_c / PMPI_Send_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Send_c", count: datatype; crate::p2p::PMPI_Send(buf, count, datatype, dest, tag, comm))
    }
    fn MPI_Ssend_c / PMPI_Ssend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Ssend_c", count: datatype; crate::p2p::PMPI_Ssend(buf, count, datatype, dest, tag, comm))
    }
    fn MPI_Recv_c / PMPI_Recv_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        conv!(comm, "MPI_Recv_c", count: datatype; crate::p2p::PMPI_Recv(buf, count, datatype, source, tag, comm, status))
    }
    fn MPI_Isend_c / PMPI_Isend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Isend_c", count: datatype; crate::p2p::PMPI_Isend(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Irecv_c / PMPI_Irecv_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Irecv_c", count: datatype; crate::p2p::PMPI_Irecv(buf, count, datatype, source, tag, comm, request))
    }
    fn MPI_Sendrecv_c / PMPI_Sendrecv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, dest: c_int, sendtag: c_int,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        conv!(comm, "MPI_Sendrecv_c", sendcount: sendtype, recvcount: recvtype; crate::p2p::PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm, status))
    }
    fn MPI_Isendrecv_c / PMPI_Isendrecv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, dest: c_int, sendtag: c_int,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, source: c_int, recvtag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Isendrecv_c", sendcount: sendtype, recvcount: recvtype; crate::p2p::PMPI_Isendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm, request))
    }
    fn MPI_Isendrecv_replace_c / PMPI_Isendrecv_replace_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
        source: c_int, recvtag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Isendrecv_replace_c", count: datatype; crate::p2p::PMPI_Isendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, request))
    }
    fn MPI_Sendrecv_replace_c / PMPI_Sendrecv_replace_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
        source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        conv!(comm, "MPI_Sendrecv_replace_c", count: datatype; crate::p2p::PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, status))
    }
    fn MPI_Bcast_c / PMPI_Bcast_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Bcast_c", count: datatype; crate::coll::PMPI_Bcast(buffer, count, datatype, root, comm))
    }
    fn MPI_Reduce_c / PMPI_Reduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Reduce_c", count: datatype; crate::coll::PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm))
    }
    fn MPI_Allreduce_c / PMPI_Allreduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Allreduce_c", count: datatype; crate::coll::PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm))
    }
    fn MPI_Gather_c / PMPI_Gather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Gather_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm))
    }
    fn MPI_Scatter_c / PMPI_Scatter_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Scatter_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Scatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm))
    }
    fn MPI_Allgather_c / PMPI_Allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Allgather_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
    }
    fn MPI_Alltoall_c / PMPI_Alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Alltoall_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
    }
    fn MPI_Reduce_scatter_block_c / PMPI_Reduce_scatter_block_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Reduce_scatter_block_c", recvcount: datatype; crate::coll::PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm))
    }
    fn MPI_Scan_c / PMPI_Scan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Scan_c", count: datatype; crate::coll::PMPI_Scan(sendbuf, recvbuf, count, datatype, op, comm))
    }
    fn MPI_Exscan_c / PMPI_Exscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Exscan_c", count: datatype; crate::coll::PMPI_Exscan(sendbuf, recvbuf, count, datatype, op, comm))
    }
    fn MPI_Reduce_local_c / PMPI_Reduce_local_c(inbuf: *const c_void, inoutbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Reduce_local_c", count: datatype; crate::op::PMPI_Reduce_local(inbuf, inoutbuf, count, datatype, op))
    }
    fn MPI_Ibcast_c / PMPI_Ibcast_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ibcast_c", count: datatype; crate::coll::PMPI_Ibcast(buffer, count, datatype, root, comm, request))
    }
    fn MPI_Iallreduce_c / PMPI_Iallreduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Iallreduce_c", count: datatype; crate::coll::PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request))
    }
    fn MPI_Type_size_c / PMPI_Type_size_c(datatype: MPI_Datatype, size: *mut MPI_Count) -> c_int {
        crate::datatype::PMPI_Type_size_x(datatype, size)
    }
    fn MPI_Type_get_extent_c / PMPI_Type_get_extent_c(datatype: MPI_Datatype, lb: *mut MPI_Count, extent: *mut MPI_Count) -> c_int {
        crate::datatype::PMPI_Type_get_extent_x(datatype, lb, extent)
    }
    fn MPI_Type_get_true_extent_c / PMPI_Type_get_true_extent_c(datatype: MPI_Datatype, true_lb: *mut MPI_Count, true_extent: *mut MPI_Count) -> c_int {
        crate::datatype::PMPI_Type_get_true_extent_x(datatype, true_lb, true_extent)
    }
    fn MPI_Get_count_c / PMPI_Get_count_c(status: *const MPI_Status, datatype: MPI_Datatype, count: *mut MPI_Count) -> c_int {
        let r = (|| -> R {
            if status.is_null() || status as usize == 1 || count.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            let size = crate::datatype::ext_size(datatype)?.1 as i64;
            let bytes = get_count(&*status);
            *count = if size == 0 { 0 } else if bytes % size != 0 { MPI_UNDEFINED as MPI_Count } else { bytes / size };
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Get_count_c", r)
    }
    fn MPI_Get_elements_c / PMPI_Get_elements_c(status: *const MPI_Status, datatype: MPI_Datatype, count: *mut MPI_Count) -> c_int {
        crate::p2p::PMPI_Get_elements_x(status, datatype, count)
    }
    fn MPI_Pack_size_c / PMPI_Pack_size_c(incount: MPI_Count, datatype: MPI_Datatype, _comm: MPI_Comm, size: *mut MPI_Count) -> c_int {
        let r = (|| -> R {
            let (_, s) = crate::datatype::ext_size(datatype)?;
            if size.is_null() || incount < 0 {
                return err(MPI_ERR_ARG, "invalid argument");
            }
            *size = s as MPI_Count * incount;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Pack_size_c", r)
    }
    fn MPI_Bsend_c / PMPI_Bsend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Bsend_c", count: datatype; crate::p2p::PMPI_Bsend(buf, count, datatype, dest, tag, comm))
    }
    fn MPI_Rsend_c / PMPI_Rsend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Rsend_c", count: datatype; crate::p2p::PMPI_Rsend(buf, count, datatype, dest, tag, comm))
    }
    fn MPI_Ibsend_c / PMPI_Ibsend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ibsend_c", count: datatype; crate::p2p::PMPI_Ibsend(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Irsend_c / PMPI_Irsend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Irsend_c", count: datatype; crate::p2p::PMPI_Irsend(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Issend_c / PMPI_Issend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Issend_c", count: datatype; crate::p2p::PMPI_Issend(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Send_init_c / PMPI_Send_init_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Send_init_c", count: datatype; crate::p2p::PMPI_Send_init(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Recv_init_c / PMPI_Recv_init_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Recv_init_c", count: datatype; crate::p2p::PMPI_Recv_init(buf, count, datatype, source, tag, comm, request))
    }
    fn MPI_Bsend_init_c / PMPI_Bsend_init_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Bsend_init_c", count: datatype; crate::p2p::PMPI_Bsend_init(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Rsend_init_c / PMPI_Rsend_init_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Rsend_init_c", count: datatype; crate::p2p::PMPI_Rsend_init(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Ssend_init_c / PMPI_Ssend_init_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ssend_init_c", count: datatype; crate::p2p::PMPI_Ssend_init(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Mrecv_c / PMPI_Mrecv_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, message: *mut MPI_Message, status: *mut MPI_Status) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Mrecv_c", count: datatype; crate::p2p::PMPI_Mrecv(buf, count, datatype, message, status))
    }
    fn MPI_Imrecv_c / PMPI_Imrecv_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, message: *mut MPI_Message, request: *mut MPI_Request) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Imrecv_c", count: datatype; crate::p2p::PMPI_Imrecv(buf, count, datatype, message, request))
    }
    fn MPI_Igather_c / PMPI_Igather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Igather_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Igather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm, request))
    }
    fn MPI_Iscatter_c / PMPI_Iscatter_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Iscatter_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Iscatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm, request))
    }
    fn MPI_Iallgather_c / PMPI_Iallgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Iallgather_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request))
    }
    fn MPI_Ialltoall_c / PMPI_Ialltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ialltoall_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Ialltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request))
    }
    fn MPI_Ireduce_c / PMPI_Ireduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ireduce_c", count: datatype; crate::coll::PMPI_Ireduce(sendbuf, recvbuf, count, datatype, op, root, comm, request))
    }
    fn MPI_Iscan_c / PMPI_Iscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Iscan_c", count: datatype; crate::coll::PMPI_Iscan(sendbuf, recvbuf, count, datatype, op, comm, request))
    }
    fn MPI_Iexscan_c / PMPI_Iexscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Iexscan_c", count: datatype; crate::coll::PMPI_Iexscan(sendbuf, recvbuf, count, datatype, op, comm, request))
    }
    fn MPI_Ireduce_scatter_block_c / PMPI_Ireduce_scatter_block_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ireduce_scatter_block_c", recvcount: datatype; crate::coll::PMPI_Ireduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm, request))
    }
    fn MPI_Neighbor_allgather_c / PMPI_Neighbor_allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Neighbor_allgather_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Neighbor_allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
    }
    fn MPI_Neighbor_alltoall_c / PMPI_Neighbor_alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Neighbor_alltoall_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Neighbor_alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
    }
    fn MPI_Ineighbor_allgather_c / PMPI_Ineighbor_allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ineighbor_allgather_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Ineighbor_allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request))
    }
    fn MPI_Ineighbor_alltoall_c / PMPI_Ineighbor_alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ineighbor_alltoall_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Ineighbor_alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request))
    }
    fn MPI_Neighbor_allgather_init_c / PMPI_Neighbor_allgather_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Neighbor_allgather_init_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Neighbor_allgather_init(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, info, request))
    }
    fn MPI_Neighbor_alltoall_init_c / PMPI_Neighbor_alltoall_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Neighbor_alltoall_init_c", sendcount: sendtype, recvcount: recvtype; crate::coll::PMPI_Neighbor_alltoall_init(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, info, request))
    }
    fn MPI_Bcast_init_c / PMPI_Bcast_init_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Bcast_init_c", count: datatype; crate::coll::persistent::PMPI_Bcast_init(buffer, count, datatype, root, comm, info, request))
    }
    fn MPI_Reduce_init_c / PMPI_Reduce_init_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, root: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Reduce_init_c", count: datatype; crate::coll::persistent::PMPI_Reduce_init(sendbuf, recvbuf, count, datatype, op, root, comm, info, request))
    }
    fn MPI_Allreduce_init_c / PMPI_Allreduce_init_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Allreduce_init_c", count: datatype; crate::coll::persistent::PMPI_Allreduce_init(sendbuf, recvbuf, count, datatype, op, comm, info, request))
    }
    fn MPI_Gather_init_c / PMPI_Gather_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Gather_init_c", sendcount: sendtype, recvcount: recvtype; crate::coll::persistent::PMPI_Gather_init(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm, info, request))
    }
    fn MPI_Scatter_init_c / PMPI_Scatter_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Scatter_init_c", sendcount: sendtype, recvcount: recvtype; crate::coll::persistent::PMPI_Scatter_init(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm, info, request))
    }
    fn MPI_Allgather_init_c / PMPI_Allgather_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Allgather_init_c", sendcount: sendtype, recvcount: recvtype; crate::coll::persistent::PMPI_Allgather_init(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, info, request))
    }
    fn MPI_Alltoall_init_c / PMPI_Alltoall_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Alltoall_init_c", sendcount: sendtype, recvcount: recvtype; crate::coll::persistent::PMPI_Alltoall_init(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, info, request))
    }
    fn MPI_Scan_init_c / PMPI_Scan_init_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Scan_init_c", count: datatype; crate::coll::persistent::PMPI_Scan_init(sendbuf, recvbuf, count, datatype, op, comm, info, request))
    }
    fn MPI_Exscan_init_c / PMPI_Exscan_init_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Exscan_init_c", count: datatype; crate::coll::persistent::PMPI_Exscan_init(sendbuf, recvbuf, count, datatype, op, comm, info, request))
    }
    fn MPI_Reduce_scatter_block_init_c / PMPI_Reduce_scatter_block_init_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Reduce_scatter_block_init_c", recvcount: datatype; crate::coll::persistent::PMPI_Reduce_scatter_block_init(sendbuf, recvbuf, recvcount, datatype, op, comm, info, request))
    }
    fn MPI_Type_contiguous_c / PMPI_Type_contiguous_c(count: MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_contiguous_c", dt::type_contiguous(count, oldtype, newtype))
    }
    fn MPI_Type_vector_c / PMPI_Type_vector_c(count: MPI_Count, blocklength: MPI_Count, stride: MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_vector_c", dt::type_vector(count, blocklength, Ok(stride), oldtype, newtype))
    }
    fn MPI_Type_create_hvector_c / PMPI_Type_create_hvector_c(count: MPI_Count, blocklength: MPI_Count, stride: MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_hvector_c", dt::type_vector(count, blocklength, Err(stride as MPI_Aint), oldtype, newtype))
    }
    fn MPI_Type_create_resized_c / PMPI_Type_create_resized_c(oldtype: MPI_Datatype, lb: MPI_Count, extent: MPI_Count, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_resized_c", dt::type_resized::<MPI_Count>(oldtype, lb as MPI_Aint, extent as MPI_Aint, newtype))
    }
    // MPI_Count and MPI_Aint are both 64-bit here: byte-displacement arrays are passed as they are.
    fn MPI_Type_create_hindexed_block_c / PMPI_Type_create_hindexed_block_c(count: MPI_Count, blocklength: MPI_Count, array_of_displacements: *const MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_hindexed_block_c", dt::type_indexed_block(count, blocklength, Disps::Bytes(array_of_displacements as *const MPI_Aint), oldtype, newtype))
    }
    fn MPI_Type_create_indexed_block_c / PMPI_Type_create_indexed_block_c(count: MPI_Count, blocklength: MPI_Count, array_of_displacements: *const MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_indexed_block_c", dt::type_indexed_block(count, blocklength, Disps::Elems(array_of_displacements), oldtype, newtype))
    }
    fn MPI_Type_indexed_c / PMPI_Type_indexed_c(count: MPI_Count, array_of_blocklengths: *const MPI_Count, array_of_displacements: *const MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_indexed_c", dt::type_indexed(count, array_of_blocklengths, Disps::Elems(array_of_displacements), oldtype, newtype))
    }
    fn MPI_Type_create_hindexed_c / PMPI_Type_create_hindexed_c(count: MPI_Count, array_of_blocklengths: *const MPI_Count, array_of_displacements: *const MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_hindexed_c", dt::type_indexed(count, array_of_blocklengths, Disps::Bytes(array_of_displacements as *const MPI_Aint), oldtype, newtype))
    }
    fn MPI_Type_create_struct_c / PMPI_Type_create_struct_c(count: MPI_Count, array_of_blocklengths: *const MPI_Count, array_of_displacements: *const MPI_Count, array_of_types: *const MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_struct_c", dt::type_struct(count, array_of_blocklengths, array_of_displacements as *const MPI_Aint, array_of_types, newtype))
    }
    fn MPI_Type_create_subarray_c / PMPI_Type_create_subarray_c(ndims: c_int, array_of_sizes: *const MPI_Count, array_of_subsizes: *const MPI_Count, array_of_starts: *const MPI_Count, order: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_subarray_c", dt::type_subarray(ndims, array_of_sizes, array_of_subsizes, array_of_starts, order, oldtype, newtype))
    }
    fn MPI_Type_create_darray_c / PMPI_Type_create_darray_c(size: c_int, rank: c_int, ndims: c_int, array_of_gsizes: *const MPI_Count, array_of_distribs: *const c_int, array_of_dargs: *const c_int, array_of_psizes: *const c_int, order: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_darray_c", dt::type_darray(size, rank, ndims, array_of_gsizes, array_of_distribs, array_of_dargs, array_of_psizes, order, oldtype, newtype))
    }
    fn MPI_Type_get_envelope_c / PMPI_Type_get_envelope_c(datatype: MPI_Datatype, num_integers: *mut MPI_Count, num_addresses: *mut MPI_Count, num_large_counts: *mut MPI_Count, num_datatypes: *mut MPI_Count, combiner: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (ni, na, nc, nd, c) = dt::envelope(datatype)?;
            if num_integers.is_null() || num_addresses.is_null() || num_large_counts.is_null() || num_datatypes.is_null() || combiner.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            (*num_integers, *num_addresses, *num_large_counts, *num_datatypes) = (ni as MPI_Count, na as MPI_Count, nc as MPI_Count, nd as MPI_Count);
            *combiner = c;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_get_envelope_c", r)
    }
    fn MPI_Type_get_contents_c / PMPI_Type_get_contents_c(datatype: MPI_Datatype, max_integers: MPI_Count, max_addresses: MPI_Count, max_large_counts: MPI_Count, max_datatypes: MPI_Count, array_of_integers: *mut c_int, array_of_addresses: *mut MPI_Aint, array_of_large_counts: *mut MPI_Count, array_of_datatypes: *mut MPI_Datatype) -> c_int {
        let m = |v: MPI_Count| usize::try_from(v).unwrap_or(0);
        let r = dt::contents(datatype, [m(max_integers), m(max_addresses), m(max_large_counts), m(max_datatypes)], array_of_integers, array_of_addresses, array_of_large_counts, array_of_datatypes);
        fin(MPI_COMM_WORLD, "MPI_Type_get_contents_c", r)
    }
    fn MPI_Pack_external_size_c / PMPI_Pack_external_size_c(datarep: *const c_char, incount: MPI_Count, datatype: MPI_Datatype, size: *mut MPI_Count) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Pack_external_size_c", incount: datatype; crate::datatype::PMPI_Pack_external_size(datarep, incount, datatype, size as *mut MPI_Aint))
    }
    fn MPI_Pack_external_c / PMPI_Pack_external_c(datarep: *const c_char, inbuf: *const c_void, incount: MPI_Count, datatype: MPI_Datatype, outbuf: *mut c_void, outsize: MPI_Count, position: *mut MPI_Count) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Pack_external_c", incount: datatype; crate::datatype::PMPI_Pack_external(datarep, inbuf, incount, datatype, outbuf, outsize as MPI_Aint, position as *mut MPI_Aint))
    }
    fn MPI_Unpack_external_c / PMPI_Unpack_external_c(datarep: *const c_char, inbuf: *const c_void, insize: MPI_Count, position: *mut MPI_Count, outbuf: *mut c_void, outcount: MPI_Count, datatype: MPI_Datatype) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Unpack_external_c", outcount: datatype; crate::datatype::PMPI_Unpack_external(datarep, inbuf, insize as MPI_Aint, position as *mut MPI_Aint, outbuf, outcount, datatype))
    }
    fn MPI_Pack_c / PMPI_Pack_c(inbuf: *const c_void, incount: MPI_Count, datatype: MPI_Datatype, outbuf: *mut c_void, outsize: MPI_Count, position: *mut MPI_Count, comm: MPI_Comm) -> c_int {
        if position.is_null() {
            return raise(comm, "MPI_Pack_c", MpiErr { code: MPI_ERR_ARG, msg: "position is NULL".into() });
        }
        let mut pos = match ci(*position) { Ok(v) => v, Err(e) => return raise(comm, "MPI_Pack_c", e) };
        let rc = conv!(comm, "MPI_Pack_c", incount: datatype, outsize; crate::datatype::PMPI_Pack(inbuf, incount, datatype, outbuf, outsize, &mut pos, comm));
        *position = pos as MPI_Count;
        rc
    }
    fn MPI_Unpack_c / PMPI_Unpack_c(inbuf: *const c_void, insize: MPI_Count, position: *mut MPI_Count, outbuf: *mut c_void, outcount: MPI_Count, datatype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        if position.is_null() {
            return raise(comm, "MPI_Unpack_c", MpiErr { code: MPI_ERR_ARG, msg: "position is NULL".into() });
        }
        let mut pos = match ci(*position) { Ok(v) => v, Err(e) => return raise(comm, "MPI_Unpack_c", e) };
        let rc = conv!(comm, "MPI_Unpack_c", insize, outcount: datatype; crate::datatype::PMPI_Unpack(inbuf, insize, &mut pos, outbuf, outcount, datatype, comm));
        *position = pos as MPI_Count;
        rc
    }
    fn MPI_Buffer_attach_c / PMPI_Buffer_attach_c(buffer: *mut c_void, size: MPI_Count) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Buffer_attach_c", size; crate::p2p::PMPI_Buffer_attach(buffer, size))
    }
    fn MPI_Buffer_detach_c / PMPI_Buffer_detach_c(buffer_addr: *mut c_void, size: *mut MPI_Count) -> c_int {
        if size.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Buffer_detach_c", MpiErr { code: MPI_ERR_ARG, msg: "size is NULL".into() });
        }
        let mut n: c_int = 0;
        let rc = crate::p2p::PMPI_Buffer_detach(buffer_addr, &mut n);
        *size = n as MPI_Count;
        rc
    }

    fn MPI_Gatherv_c / PMPI_Gatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let at = v.rooted(root);
            let (rc, rd) = (arr(recvcounts, v.peers, at)?, arr(displs as *const i64, v.peers, at)?);
            let sc = ci(sendcount)?;
            Ok(crate::coll::PMPI_Gatherv(sendbuf, sc, sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, root, comm))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Gatherv_c", e),
        }
    }
    fn MPI_Igatherv_c / PMPI_Igatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let at = v.rooted(root);
            let (rc, rd) = (arr(recvcounts, v.peers, at)?, arr(displs as *const i64, v.peers, at)?);
            let sc = ci(sendcount)?;
            Ok(crate::coll::PMPI_Igatherv(sendbuf, sc, sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, root, comm, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Igatherv_c", e),
        }
    }
    fn MPI_Gatherv_init_c / PMPI_Gatherv_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let at = v.rooted(root);
            let (rc, rd) = (arr(recvcounts, v.peers, at)?, arr(displs as *const i64, v.peers, at)?);
            let sc = ci(sendcount)?;
            let x = crate::coll::persistent::PMPI_Gatherv_init(sendbuf, sc, sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, root, comm, info, request);
            keep_counts(x, request, vec![rc, rd]);
            Ok(x)
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Gatherv_init_c", e),
        }
    }
    fn MPI_Scatterv_c / PMPI_Scatterv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, displs: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let at = v.rooted(root);
            let (sc, sd) = (arr(sendcounts, v.peers, at)?, arr(displs as *const i64, v.peers, at)?);
            let rc = ci(recvcount)?;
            Ok(crate::coll::PMPI_Scatterv(sendbuf, ptr(&sc), ptr(&sd), sendtype, recvbuf, rc, recvtype, root, comm))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Scatterv_c", e),
        }
    }
    fn MPI_Iscatterv_c / PMPI_Iscatterv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, displs: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let at = v.rooted(root);
            let (sc, sd) = (arr(sendcounts, v.peers, at)?, arr(displs as *const i64, v.peers, at)?);
            let rc = ci(recvcount)?;
            Ok(crate::coll::PMPI_Iscatterv(sendbuf, ptr(&sc), ptr(&sd), sendtype, recvbuf, rc, recvtype, root, comm, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Iscatterv_c", e),
        }
    }
    fn MPI_Scatterv_init_c / PMPI_Scatterv_init_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, displs: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let at = v.rooted(root);
            let (sc, sd) = (arr(sendcounts, v.peers, at)?, arr(displs as *const i64, v.peers, at)?);
            let rc = ci(recvcount)?;
            let x = crate::coll::persistent::PMPI_Scatterv_init(sendbuf, ptr(&sc), ptr(&sd), sendtype, recvbuf, rc, recvtype, root, comm, info, request);
            keep_counts(x, request, vec![sc, sd]);
            Ok(x)
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Scatterv_init_c", e),
        }
    }
    fn MPI_Allgatherv_c / PMPI_Allgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(displs as *const i64, v.peers, true)?);
            let sc = ci(sendcount)?;
            Ok(crate::coll::PMPI_Allgatherv(sendbuf, sc, sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, comm))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Allgatherv_c", e),
        }
    }
    fn MPI_Iallgatherv_c / PMPI_Iallgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(displs as *const i64, v.peers, true)?);
            let sc = ci(sendcount)?;
            Ok(crate::coll::PMPI_Iallgatherv(sendbuf, sc, sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, comm, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Iallgatherv_c", e),
        }
    }
    fn MPI_Allgatherv_init_c / PMPI_Allgatherv_init_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(displs as *const i64, v.peers, true)?);
            let sc = ci(sendcount)?;
            let x = crate::coll::persistent::PMPI_Allgatherv_init(sendbuf, sc, sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, comm, info, request);
            keep_counts(x, request, vec![rc, rd]);
            Ok(x)
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Allgatherv_init_c", e),
        }
    }
    fn MPI_Alltoallv_c / PMPI_Alltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let s_on = sendbuf != crate::coll::IN_PLACE;
            let (sc, sd) = (arr(sendcounts, v.peers, s_on)?, arr(sdispls as *const i64, v.peers, s_on)?);
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(rdispls as *const i64, v.peers, true)?);
            Ok(crate::coll::PMPI_Alltoallv(sendbuf, ptr(&sc), ptr(&sd), sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, comm))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Alltoallv_c", e),
        }
    }
    fn MPI_Ialltoallv_c / PMPI_Ialltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let s_on = sendbuf != crate::coll::IN_PLACE;
            let (sc, sd) = (arr(sendcounts, v.peers, s_on)?, arr(sdispls as *const i64, v.peers, s_on)?);
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(rdispls as *const i64, v.peers, true)?);
            Ok(crate::coll::PMPI_Ialltoallv(sendbuf, ptr(&sc), ptr(&sd), sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, comm, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Ialltoallv_c", e),
        }
    }
    fn MPI_Alltoallv_init_c / PMPI_Alltoallv_init_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let s_on = sendbuf != crate::coll::IN_PLACE;
            let (sc, sd) = (arr(sendcounts, v.peers, s_on)?, arr(sdispls as *const i64, v.peers, s_on)?);
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(rdispls as *const i64, v.peers, true)?);
            Ok(crate::coll::persistent::PMPI_Alltoallv_init(sendbuf, ptr(&sc), ptr(&sd), sendtype, recvbuf, ptr(&rc), ptr(&rd), recvtype, comm, info, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Alltoallv_init_c", e),
        }
    }
    fn MPI_Alltoallw_c / PMPI_Alltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype, comm: MPI_Comm) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let s_on = sendbuf != crate::coll::IN_PLACE;
            let (sc, sd) = (arr(sendcounts, v.peers, s_on)?, arr(sdispls as *const i64, v.peers, s_on)?);
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(rdispls as *const i64, v.peers, true)?);
            Ok(crate::coll::PMPI_Alltoallw(sendbuf, ptr(&sc), ptr(&sd), sendtypes, recvbuf, ptr(&rc), ptr(&rd), recvtypes, comm))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Alltoallw_c", e),
        }
    }
    fn MPI_Ialltoallw_c / PMPI_Ialltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let s_on = sendbuf != crate::coll::IN_PLACE;
            let (sc, sd) = (arr(sendcounts, v.peers, s_on)?, arr(sdispls as *const i64, v.peers, s_on)?);
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(rdispls as *const i64, v.peers, true)?);
            Ok(crate::coll::PMPI_Ialltoallw(sendbuf, ptr(&sc), ptr(&sd), sendtypes, recvbuf, ptr(&rc), ptr(&rd), recvtypes, comm, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Ialltoallw_c", e),
        }
    }
    fn MPI_Alltoallw_init_c / PMPI_Alltoallw_init_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let s_on = sendbuf != crate::coll::IN_PLACE;
            let (sc, sd) = (arr(sendcounts, v.peers, s_on)?, arr(sdispls as *const i64, v.peers, s_on)?);
            let (rc, rd) = (arr(recvcounts, v.peers, true)?, arr(rdispls as *const i64, v.peers, true)?);
            Ok(crate::coll::persistent::PMPI_Alltoallw_init(sendbuf, ptr(&sc), ptr(&sd), sendtypes, recvbuf, ptr(&rc), ptr(&rd), recvtypes, comm, info, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Alltoallw_init_c", e),
        }
    }
    fn MPI_Reduce_scatter_c / PMPI_Reduce_scatter_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let rc = arr(recvcounts, v.size, true)?;
            Ok(crate::coll::PMPI_Reduce_scatter(sendbuf, recvbuf, ptr(&rc), datatype, op, comm))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Reduce_scatter_c", e),
        }
    }
    fn MPI_Ireduce_scatter_c / PMPI_Ireduce_scatter_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let rc = arr(recvcounts, v.size, true)?;
            Ok(crate::coll::PMPI_Ireduce_scatter(sendbuf, recvbuf, ptr(&rc), datatype, op, comm, request))
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Ireduce_scatter_c", e),
        }
    }
    fn MPI_Reduce_scatter_init_c / PMPI_Reduce_scatter_init_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request) -> c_int {
        let r = (|| -> R<c_int> {
            let v = Shape::of(comm)?;
            let rc = arr(recvcounts, v.size, true)?;
            let x = crate::coll::persistent::PMPI_Reduce_scatter_init(sendbuf, recvbuf, ptr(&rc), datatype, op, comm, info, request);
            keep_counts(x, request, vec![rc]);
            Ok(x)
        })();
        match r {
            Ok(rc) => rc,
            Err(e) => raise(comm, "MPI_Reduce_scatter_init_c", e),
        }
    }

}
