//! The MPI 4.0 large-count (`_c`) entry points MPICH 4.0 exports for the calls benchmarks and
//! applications use. Datatype queries report full `MPI_Count` values; the communication calls accept
//! counts up to `INT_MAX` elements (a larger count is `MPI_ERR_COUNT`) and then run the normal path.
use crate::op::MPI_Op;
use crate::*;
use std::ffi::{c_int, c_void};

#[inline]
fn ci(n: MPI_Count) -> R<c_int> {
    c_int::try_from(n).map_err(|_| MpiErr {
        code: MPI_ERR_COUNT,
        msg: format!("count {n} exceeds INT_MAX (not supported yet)"),
    })
}

macro_rules! conv {
    ($comm:expr, $name:expr, $($c:ident),* ; $call:expr) => {{
        $( let $c = match ci($c) { Ok(v) => v, Err(e) => return raise($comm, $name, e) }; )*
        $call
    }};
}

mpi_api! {
    fn MPI_Send_c / PMPI_Send_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Send_c", count; crate::p2p::PMPI_Send(buf, count, datatype, dest, tag, comm))
    }
    fn MPI_Ssend_c / PMPI_Ssend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Ssend_c", count; crate::p2p::PMPI_Ssend(buf, count, datatype, dest, tag, comm))
    }
    fn MPI_Recv_c / PMPI_Recv_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        conv!(comm, "MPI_Recv_c", count; crate::p2p::PMPI_Recv(buf, count, datatype, source, tag, comm, status))
    }
    fn MPI_Isend_c / PMPI_Isend_c(buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Isend_c", count; crate::p2p::PMPI_Isend(buf, count, datatype, dest, tag, comm, request))
    }
    fn MPI_Irecv_c / PMPI_Irecv_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Irecv_c", count; crate::p2p::PMPI_Irecv(buf, count, datatype, source, tag, comm, request))
    }
    fn MPI_Sendrecv_c / PMPI_Sendrecv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, dest: c_int, sendtag: c_int,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        conv!(comm, "MPI_Sendrecv_c", sendcount, recvcount; crate::p2p::PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm, status))
    }
    fn MPI_Isendrecv_c / PMPI_Isendrecv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, dest: c_int, sendtag: c_int,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, source: c_int, recvtag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Isendrecv_c", sendcount, recvcount; crate::p2p::PMPI_Isendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm, request))
    }
    fn MPI_Isendrecv_replace_c / PMPI_Isendrecv_replace_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
        source: c_int, recvtag: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Isendrecv_replace_c", count; crate::p2p::PMPI_Isendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, request))
    }
    fn MPI_Sendrecv_replace_c / PMPI_Sendrecv_replace_c(buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
        source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
        conv!(comm, "MPI_Sendrecv_replace_c", count; crate::p2p::PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, status))
    }
    fn MPI_Bcast_c / PMPI_Bcast_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Bcast_c", count; crate::coll::PMPI_Bcast(buffer, count, datatype, root, comm))
    }
    fn MPI_Reduce_c / PMPI_Reduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Reduce_c", count; crate::coll::PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm))
    }
    fn MPI_Allreduce_c / PMPI_Allreduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Allreduce_c", count; crate::coll::PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm))
    }
    fn MPI_Gather_c / PMPI_Gather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Gather_c", sendcount, recvcount; crate::coll::PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm))
    }
    fn MPI_Scatter_c / PMPI_Scatter_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Scatter_c", sendcount, recvcount; crate::coll::PMPI_Scatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm))
    }
    fn MPI_Allgather_c / PMPI_Allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Allgather_c", sendcount, recvcount; crate::coll::PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
    }
    fn MPI_Alltoall_c / PMPI_Alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Alltoall_c", sendcount, recvcount; crate::coll::PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
    }
    fn MPI_Reduce_scatter_block_c / PMPI_Reduce_scatter_block_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Reduce_scatter_block_c", recvcount; crate::coll::PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm))
    }
    fn MPI_Scan_c / PMPI_Scan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Scan_c", count; crate::coll::PMPI_Scan(sendbuf, recvbuf, count, datatype, op, comm))
    }
    fn MPI_Exscan_c / PMPI_Exscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) -> c_int {
        conv!(comm, "MPI_Exscan_c", count; crate::coll::PMPI_Exscan(sendbuf, recvbuf, count, datatype, op, comm))
    }
    fn MPI_Reduce_local_c / PMPI_Reduce_local_c(inbuf: *const c_void, inoutbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Reduce_local_c", count; crate::op::PMPI_Reduce_local(inbuf, inoutbuf, count, datatype, op))
    }
    fn MPI_Ibcast_c / PMPI_Ibcast_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Ibcast_c", count; crate::coll::PMPI_Ibcast(buffer, count, datatype, root, comm, request))
    }
    fn MPI_Iallreduce_c / PMPI_Iallreduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
        conv!(comm, "MPI_Iallreduce_c", count; crate::coll::PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request))
    }
    fn MPI_Type_contiguous_c / PMPI_Type_contiguous_c(count: MPI_Count, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        conv!(MPI_COMM_WORLD, "MPI_Type_contiguous_c", count; crate::datatype::PMPI_Type_contiguous(count, oldtype, newtype))
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
}
