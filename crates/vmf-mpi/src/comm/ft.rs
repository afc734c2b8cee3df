//! MPICH's fault-tolerance extension (ULFM: MPIX_Comm_revoke, MPIX_Comm_agree, MPIX_Comm_shrink,
//! MPIX_Comm_failure_ack, MPIX_Comm_failure_get_acked), as MPICH keeps it in src/mpi/comm.
//!
//! **Revocation** is real and asynchronous: `MPIX_Comm_revoke` marks the communicator's two contexts
//! revoked here and sends every other member (both groups of an intercommunicator) a `Revoke` packet
//! (`vmf_core::engine::mpi_ext`). Each process applies it when its progress reads it — inside whatever
//! MPI call it is blocked in — so a receive waiting for a peer that will never send, a probe, a
//! collective (shared-memory ones included) or a nonblocking request on the communicator ends with
//! MPIX_ERR_REVOKED, and every later communication on it fails the same way. Senders whose messages are
//! dropped are released (no send blocks on a revoked communicator). Local calls (rank, size, attributes,
//! free) keep working, as ULFM requires.
//!
//! **Agree and shrink** work on revoked communicators: their traffic runs on a context of its own
//! (`pt | FT_CTX_BIT`, never revoked, disjoint from every context the constructors hand out) with a
//! sequence of their own. Agree is a bitwise AND gathered at the group's leader (local rank 0) and sent
//! back; on an intercommunicator the two leaders swap their groups' results, so each process gets the AND
//! of the remote group's flags (MPICH's definition). Shrink agrees on a fresh context pair over both
//! groups the same way (maximum of the proposals) and builds a communicator over the survivors.
//!
//! **Failures.** vmfabric ends a job when one of its processes dies (the launcher names the rank and the
//! cause), so a failure is never survived: the survivors of an agree or a shrink are all members, and a
//! process that saw a peer die (MPIX_ERR_PROC_FAILED, before the job ends) can acknowledge it —
//! `MPIX_Comm_failure_ack` records the members the engine reported dead, `MPIX_Comm_failure_get_acked`
//! returns them as a group (MPI_GROUP_EMPTY when none).
use crate::comm::{add_comm, ctx_agreed, ctx_propose, group_handle, MPI_Group};
use crate::intercomm::exchange;
use crate::*;
use std::ffi::c_int;

/// Bit that turns a communicator's point-to-point context into its fault-tolerance context. Constructors
/// hand out ids below it (blocking ones below IDUP_CTX_BASE, MPI_Comm_idup's below 0x8000_0000).
const FT_CTX_BIT: u32 = 0x8000_0000;

/// World ranks of the local group of `c`.
fn local_group(c: &Comm) -> Vec<usize> {
    (0..c.size).map(|r| c.to_world(r)).collect()
}

/// Combine one int per member of communicator `ci` with `f` over the fault-tolerance context (works on a
/// revoked communicator). Intracommunicator: every member gets the fold over the group. Intercommunicator:
/// every member gets the fold over the remote group (`remote_only`) or over both groups.
fn ft_allreduce(st: &mut State, ci: usize, v: i32, f: fn(i32, i32) -> i32, remote_only: bool) -> R<i32> {
    let c = st.comms[ci].as_mut().unwrap();
    let tag = c.ft_seq;
    c.ft_seq = (tag + 1) & 0x3fff_ffff;
    let ctx = c.pt | FT_CTX_BIT;
    let local = local_group(c);
    let remote_leader = c.remote.as_ref().map(|r| r[0]);
    let (me, leader) = (c.rank as usize, local[0]);
    if me != 0 {
        // Contribute, then take the leader's answer.
        let got = exchange(st, ctx, tag, &[leader], &[v], &[leader], 1)?;
        return Ok(got[0][0]);
    }
    let others = &local[1..];
    let mine = exchange(st, ctx, tag, &[], &[], others, 1)?
        .iter()
        .fold(v, |a, x| f(a, x[0]));
    let result = match remote_leader {
        None => mine,
        Some(rl) => {
            let theirs = exchange(st, ctx, tag, &[rl], &[mine], &[rl], 1)?[0][0];
            if remote_only {
                theirs
            } else {
                f(mine, theirs)
            }
        }
    };
    exchange(st, ctx, tag, others, &[result], &[], 0)?;
    Ok(result)
}

/// MPIX_Comm_revoke.
fn revoke(st: &mut State, comm: MPI_Comm) -> R {
    let c = st.comm(comm)?.1;
    let mut peers = local_group(c);
    if let Some(r) = &c.remote {
        peers.extend_from_slice(r);
    }
    let ctxs = [c.pt, c.coll];
    st.fab.engine().revoke(&ctxs, &peers).map_err(from_core)
}

/// MPIX_Comm_agree.
unsafe fn agree(st: &mut State, comm: MPI_Comm, flag: *mut c_int) -> R {
    let ci = st.comm(comm)?.0;
    if flag.is_null() {
        return err(MPI_ERR_ARG, "flag is NULL");
    }
    *flag = ft_allreduce(st, ci, *flag, |a, b| a & b, true)?;
    Ok(())
}

/// MPIX_Comm_shrink: a communicator over the members that are alive (all of them; see the module text),
/// on a new context pair, with the parent's groups and error handler (no attributes, no topology).
unsafe fn shrink(st: &mut State, comm: MPI_Comm, newcomm: *mut MPI_Comm) -> R {
    if newcomm.is_null() {
        return err(MPI_ERR_ARG, "newcomm is NULL");
    }
    *newcomm = MPI_COMM_NULL;
    let ci = st.comm(comm)?.0;
    let prop = ctx_propose(st)? as i32;
    let ctx = ft_allreduce(st, ci, prop, i32::max, false)? as u32;
    ctx_agreed(st, ctx);
    let c = st.comms[ci].as_ref().unwrap();
    let mut n = Comm::new(ctx, c.rank, c.world.clone(), c.size, c.eh);
    n.remote = c.remote.clone();
    *newcomm = add_comm(st, n);
    Ok(())
}

/// MPIX_Comm_failure_ack: acknowledge the members this process knows to have failed.
fn failure_ack(st: &mut State, comm: MPI_Comm) -> R {
    let dead = st.fab.engine().failed_peers();
    let c = st.comm(comm)?.1;
    let mut all = local_group(c);
    if let Some(r) = &c.remote {
        all.extend_from_slice(r);
    }
    c.acked = all.into_iter().filter(|w| dead.contains(w)).collect();
    Ok(())
}

/// MPIX_Comm_failure_get_acked.
unsafe fn failure_get_acked(st: &mut State, comm: MPI_Comm, group: *mut MPI_Group) -> R {
    if group.is_null() {
        return err(MPI_ERR_ARG, "failedgrp is NULL");
    }
    let acked = st.comm(comm)?.1.acked.clone();
    *group = group_handle(st, acked);
    Ok(())
}

mpi_api! {
    fn MPIX_Comm_revoke / PMPIX_Comm_revoke(comm: MPI_Comm) -> c_int {
        let r = (|| -> R { revoke(state()?, comm) })();
        fin(comm, "MPIX_Comm_revoke", r)
    }
    fn MPIX_Comm_agree / PMPIX_Comm_agree(comm: MPI_Comm, flag: *mut c_int) -> c_int {
        let r = (|| -> R { agree(state()?, comm, flag) })();
        fin(comm, "MPIX_Comm_agree", r)
    }
    fn MPIX_Comm_shrink / PMPIX_Comm_shrink(comm: MPI_Comm, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R { shrink(state()?, comm, newcomm) })();
        fin(comm, "MPIX_Comm_shrink", r)
    }
    fn MPIX_Comm_failure_ack / PMPIX_Comm_failure_ack(comm: MPI_Comm) -> c_int {
        let r = (|| -> R { failure_ack(state()?, comm) })();
        fin(comm, "MPIX_Comm_failure_ack", r)
    }
    fn MPIX_Comm_failure_get_acked / PMPIX_Comm_failure_get_acked(comm: MPI_Comm, failedgrp: *mut MPI_Group) -> c_int {
        let r = (|| -> R { failure_get_acked(state()?, comm, failedgrp) })();
        fin(comm, "MPIX_Comm_failure_get_acked", r)
    }
}
