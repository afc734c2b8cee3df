//! Intercommunicators: MPI_Intercomm_create, MPI_Intercomm_merge, MPI_Comm_remote_size/remote_group,
//! MPI_Comm_test_inter.
//!
//! An intercommunicator is a `Comm` whose `remote` holds the remote group (world ranks); `rank`, `size`
//! and `world` describe the local group. Point-to-point ranks name the remote group (`Comm::peer_*`,
//! used by `p2p.rs`). Both groups use the same two contexts: a process only ever receives point-to-point
//! traffic from the remote group on it, and collectives (`coll/inter.rs`) tell local from remote traffic
//! by the sender's world rank.
//!
//! **Context ids.** Intercomm_create agrees on the pair among *both* groups: each group agrees on the
//! maximum of its members' next free ids over the local communicator (as every constructor does), the
//! two leaders exchange theirs over the peer communicator, and each leader broadcasts the larger to its
//! group, which then moves its next free id past it. The pair is therefore above every id any member of
//! either group has used, so it can never clash with an intracommunicator any member belongs to. Dup,
//! Merge and the other constructors over an intercommunicator agree over the union of both groups.
//!
//! The leaders' exchange uses the peer communicator's collective context with a tag derived from the
//! program's tag (as Comm_create_group does), so it never matches the program's own messages.
use crate::comm::{add_comm, group_handle, new_ctx, MPI_Group};
use crate::*;
use std::ffi::c_int;
use vmf_core::{Op as COp, SendMode};

pub const MPI_ROOT: c_int = -3;

/// Fail with MPI_ERR_COMM when `c` is an intercommunicator and `what` is only defined on intracommunicators.
pub(crate) fn intra_only(c: &Comm, what: &str) -> R {
    if c.remote.is_some() {
        err(
            MPI_ERR_COMM,
            format!("{what} is not supported on an intercommunicator"),
        )
    } else {
        Ok(())
    }
}

/// Members over which a new context for communicator `c` is agreed, and this process's index among them:
/// the group of an intracommunicator, both groups of an intercommunicator (ordered by process identity,
/// which every process of both groups sees alike even when they belong to different jobs).
pub(crate) fn ctx_members(st: &State, c: &Comm) -> (Vec<usize>, usize) {
    let local: Vec<usize> = (0..c.size).map(|r| c.to_world(r)).collect();
    match &c.remote {
        None => (local, c.rank as usize),
        Some(rem) => {
            let me = local[c.rank as usize];
            let mut all: Vec<usize> = local.iter().chain(rem.iter()).copied().collect();
            let e = st.fab.engine();
            all.sort_unstable_by_key(|&w| e.identity(w));
            let i = all.iter().position(|&w| w == me).unwrap();
            (all, i)
        }
    }
}

/// Take the next collective tag of communicator `ci`.
fn next_tag(st: &mut State, ci: usize) -> i32 {
    st.comms[ci].as_mut().unwrap().next_coll_tag()
}

/// Send `data` to each of `to` and receive `n` ints from each of `from` (world ranks), on `ctx`/`tag`.
pub(crate) fn exchange(
    st: &mut State,
    ctx: u32,
    tag: i32,
    to: &[usize],
    data: &[i32],
    from: &[usize],
    n: usize,
) -> R<Vec<Vec<i32>>> {
    let mut e = st.fab.engine();
    let mut out: Vec<Vec<i32>> = from.iter().map(|_| vec![0i32; n]).collect();
    let mut ids = Vec::new();
    for (k, &f) in from.iter().enumerate() {
        // SAFETY: `out[k]` has n ints and lives until the receive completes below.
        ids.push(
            unsafe { e.irecv(out[k].as_mut_ptr() as *mut u8, 4 * n, f as i64, tag, ctx) }
                .map_err(from_core)?,
        );
    }
    for &t in to {
        // SAFETY: `data` outlives the send (completed below).
        ids.push(
            unsafe {
                e.isend(
                    data.as_ptr() as *const u8,
                    4 * data.len(),
                    t as i64,
                    tag,
                    ctx,
                    SendMode::Standard,
                )
            }
            .map_err(from_core)?,
        );
    }
    e.wait_until(COp::Wait, |e| ids.iter().all(|id| e.is_done(*id)))
        .map_err(from_core)?;
    let mut first = None;
    for id in ids {
        if let (_, Some(x)) = e.take_full(id).map_err(from_core)? {
            first.get_or_insert(from_core(x));
        }
    }
    match first {
        Some(x) => Err(x),
        None => Ok(out),
    }
}

/// Leader `lw` (world rank) of a group of world ranks `group` broadcasts `v` (length `n`; significant at
/// the leader) on `ctx`/`tag`.
pub(crate) fn leader_bcast(
    st: &mut State,
    ctx: u32,
    tag: i32,
    group: &[usize],
    lw: usize,
    me: usize,
    v: &[i32],
    n: usize,
) -> R<Vec<i32>> {
    if me == lw {
        let others: Vec<usize> = group.iter().copied().filter(|&w| w != lw).collect();
        exchange(st, ctx, tag, &others, v, &[], 0)?;
        Ok(v.to_vec())
    } else {
        Ok(exchange(st, ctx, tag, &[], &[], &[lw], n)?.pop().unwrap())
    }
}

/// Processes as (job hash low, high, rank) triples.
fn identities(st: &State, procs: &[usize]) -> Vec<i32> {
    let e = st.fab.engine();
    procs
        .iter()
        .flat_map(|&w| {
            let (j, r) = e.identity(w);
            [j as i32, (j >> 32) as i32, r as i32]
        })
        .collect()
}

fn job_of(t: &[i32]) -> u64 {
    (t[0] as u32 as u64) | ((t[1] as u32 as u64) << 32)
}

/// The peer indices of (job hash low, high, rank) triples; a process this one has never met is an error.
fn indices(st: &State, ids: &[i32]) -> R<Vec<usize>> {
    let e = st.fab.engine();
    ids.chunks(3)
        .map(|t| {
            e.index_of(job_of(t), t[2] as u32).ok_or_else(|| MpiErr {
                code: MPI_ERR_COMM,
                msg: format!(
                    "the remote group holds rank {} of a job this process is not connected to",
                    t[2]
                ),
            })
        })
        .collect()
}

pub(crate) unsafe fn create(
    local_comm: MPI_Comm,
    local_leader: c_int,
    peer_comm: MPI_Comm,
    remote_leader: c_int,
    tag: c_int,
    newintercomm: *mut MPI_Comm,
) -> R {
    let st = state()?;
    if newintercomm.is_null() {
        return err(MPI_ERR_ARG, "newintercomm is NULL");
    }
    let (lci, lc) = st.comm(local_comm)?;
    intra_only(lc, "MPI_Intercomm_create's local_comm")?;
    if local_leader < 0 || local_leader >= lc.size {
        return err(
            MPI_ERR_RANK,
            format!(
                "local_leader {local_leader} is not in local_comm (size {})",
                lc.size
            ),
        );
    }
    if tag < 0 {
        return err(MPI_ERR_TAG, format!("tag {tag} is invalid"));
    }
    let local: Vec<usize> = (0..lc.size).map(|r| lc.to_world(r)).collect();
    let (my_rank, eh, lcoll) = (lc.rank, lc.eh, lc.coll);
    let me = local[my_rank as usize];
    let leader_w = local[local_leader as usize];
    // 1. the local group's maximum next free context
    let lmax = new_ctx(st, lci)? as i32;
    let btag = next_tag(st, lci);
    // 2. leaders exchange (max, group) over the peer communicator; a failure there is broadcast as -1 so
    //    the rest of the local group does not wait for ever.
    let mut fail: Option<MpiErr> = None;
    let mut rec: Vec<i32> = Vec::new();
    let mut peer = (0usize, 0u32, 0i32);
    if my_rank == local_leader {
        let r = (|| -> R<Vec<i32>> {
            // peer_comm may be an intercommunicator: remote_leader then names its remote group.
            let (_, pc) = st.comm(peer_comm)?;
            let psize = pc.remote.as_ref().map_or(pc.size as usize, |r| r.len());
            if remote_leader < 0 || remote_leader as usize >= psize {
                return err(
                    MPI_ERR_RANK,
                    format!("remote_leader {remote_leader} is not in peer_comm (size {psize})"),
                );
            }
            let pw = match &pc.remote {
                Some(r) => r[remote_leader as usize],
                None => pc.to_world(remote_leader),
            };
            let pctx = pc.coll;
            if pw == me {
                return err(
                    MPI_ERR_RANK,
                    "remote_leader is this process: the two groups must be disjoint",
                );
            }
            let ptag = 0x4000_0000 | (tag & 0x3fff_ffff);
            peer = (pw, pctx, ptag);
            let hdr = exchange(st, pctx, ptag, &[pw], &[lmax, local.len() as i32], &[pw], 2)?
                .pop()
                .unwrap();
            let (rmax, nr) = (hdr[0], hdr[1]);
            if nr <= 0 {
                return err(MPI_ERR_OTHER, "the remote leader reported an empty group");
            }
            // Processes are named by identity (job hash, rank): indices differ between jobs.
            let mine = identities(st, &local);
            let list = exchange(st, pctx, ptag, &[pw], &mine, &[pw], 3 * nr as usize)?
                .pop()
                .unwrap();
            let e = st.fab.engine();
            if list.chunks(3).any(|t| {
                e.index_of(job_of(t), t[2] as u32)
                    .is_some_and(|w| local.contains(&w))
            }) {
                return err(MPI_ERR_COMM, "the local and remote groups overlap (intercommunicator groups must be disjoint)");
            }
            drop(e);
            let mut v = vec![lmax.max(rmax), nr];
            v.extend(list);
            Ok(v)
        })();
        match r {
            Ok(v) => rec = v,
            Err(e) => {
                rec = vec![-1, 0];
                fail = Some(e);
            }
        }
    }
    // 3. the leader broadcasts (context, remote size) then the remote group
    let hdr = leader_bcast(
        st,
        lcoll,
        btag,
        &local,
        leader_w,
        me,
        &rec[..rec.len().min(2)],
        2,
    )?;
    if let Some(e) = fail {
        return Err(e);
    }
    if hdr[0] < 0 {
        return err(
            MPI_ERR_OTHER,
            "MPI_Intercomm_create failed at the local leader (see its error)",
        );
    }
    let btag2 = next_tag(st, lci);
    let list = leader_bcast(
        st,
        lcoll,
        btag2,
        &local,
        leader_w,
        me,
        if rec.len() > 2 { &rec[2..] } else { &[] },
        3 * hdr[1] as usize,
    )?;
    // Groups of several jobs (dynamic processes): processes that have not met yet do now.
    let my_job = st.fab.engine().identity(me).0;
    let multi = local.iter().any(|&w| w >= st.fab.size())
        || list.chunks(3).any(|t| job_of(t) != my_job);
    if multi {
        let st = state()?;
        let lead = (my_rank == local_leader).then_some(peer);
        crate::spawn::meet_over(st, local_comm, (lcoll, &local, leader_w, me), lead)?;
    }
    let st = state()?;
    let remote = indices(st, &list)?;
    let ctx = hdr[0] as u32;
    crate::comm::ctx_agreed(st, ctx);
    let n = local.len() as i32;
    let mut c = Comm::new(ctx, my_rank, Some(local), n, eh);
    c.remote = Some(remote);
    *newintercomm = add_comm(st, c);
    Ok(())
}

/// MPI_Comm_split on an intercommunicator: the members of each group with one color form the two groups
/// of a new intercommunicator, each ordered by (key, rank in its old group). A color that has members
/// in only one group gives MPI_COMM_NULL there, as MPI_UNDEFINED does. Every member of both groups
/// sends (color, key, next free context) to every other member: construction is rare and groups are
/// small, and one exchange both decides the groups and agrees on a context above every member's.
pub(crate) fn split(st: &mut State, ci: usize, color: c_int, key: c_int) -> R<MPI_Comm> {
    let c = st.comms[ci].as_ref().unwrap();
    let local: Vec<usize> = (0..c.size).map(|r| c.to_world(r)).collect();
    let remote = c.remote.clone().expect("an intercommunicator");
    let (ctx, eh) = (c.coll, c.eh);
    let me = local[c.rank as usize];
    let tag = next_tag(st, ci);
    let others: Vec<usize> = local
        .iter()
        .chain(remote.iter())
        .copied()
        .filter(|&w| w != me)
        .collect();
    let mine = [color, key, crate::comm::ctx_propose(st)? as i32];
    let got = exchange(st, ctx, tag, &others, &mine, &others, 3)?;
    let rec = |w: usize| -> &[i32] {
        if w == me {
            &mine
        } else {
            &got[others.iter().position(|&o| o == w).unwrap()]
        }
    };
    let newctx = others
        .iter()
        .map(|&w| rec(w)[2])
        .chain([mine[2]])
        .max()
        .unwrap() as u32;
    // The same context serves every color: a process is in one of the new communicators at most.
    crate::comm::ctx_agreed(st, newctx);
    if color == MPI_UNDEFINED {
        return Ok(MPI_COMM_NULL);
    }
    let pick = |g: &[usize]| -> Vec<usize> {
        let mut v: Vec<(i32, usize, usize)> = g
            .iter()
            .enumerate()
            .filter(|&(_, &w)| rec(w)[0] == color)
            .map(|(i, &w)| (rec(w)[1], i, w))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, _, w)| w).collect()
    };
    let (l, r) = (pick(&local), pick(&remote));
    if r.is_empty() {
        return Ok(MPI_COMM_NULL);
    }
    let pos = l.iter().position(|&w| w == me).unwrap() as i32;
    let n = l.len() as i32;
    let mut nc = Comm::new(newctx, pos, Some(l), n, eh);
    nc.remote = Some(r);
    Ok(add_comm(st, nc))
}

unsafe fn intercomm_merge(intercomm: MPI_Comm, high: c_int, newintracomm: *mut MPI_Comm) -> R {
    let st = state()?;
    if newintracomm.is_null() {
        return err(MPI_ERR_ARG, "newintracomm is NULL");
    }
    let (ci, c) = st.comm(intercomm)?;
    let Some(remote) = c.remote.clone() else {
        return err(
            MPI_ERR_COMM,
            "MPI_Intercomm_merge needs an intercommunicator",
        );
    };
    let local: Vec<usize> = (0..c.size).map(|r| c.to_world(r)).collect();
    let (ctx, eh, rank) = (c.coll, c.eh, c.rank as usize);
    let me = local[rank];
    // Leaders (rank 0 of each group) exchange their group's `high`, then tell their group.
    let tag = next_tag(st, ci);
    let mine = [(high != 0) as i32];
    let theirs = if rank == 0 {
        exchange(st, ctx, tag, &[remote[0]], &mine, &[remote[0]], 1)?
            .pop()
            .unwrap()
    } else {
        vec![0]
    };
    let theirs = leader_bcast(st, ctx, tag, &local, local[0], me, &theirs, 1)?;
    // Group with high = false first; on a tie, the group whose leader has the lower identity (job, rank).
    let mine_first = if mine[0] != theirs[0] {
        mine[0] == 0
    } else {
        let e = st.fab.engine();
        e.identity(local[0]) < e.identity(remote[0])
    };
    let all: Vec<usize> = if mine_first {
        local.iter().chain(remote.iter()).copied().collect()
    } else {
        remote.iter().chain(local.iter()).copied().collect()
    };
    let pos = all.iter().position(|&w| w == me).unwrap();
    let tag2 = next_tag(st, ci);
    let mut v = [crate::comm::ctx_propose(st)? as i32];
    crate::coll::allreduce_max_group(st, ctx, tag2, &all, pos, &mut v)?;
    crate::comm::ctx_agreed(st, v[0] as u32);
    let n = Comm::new(
        v[0] as u32,
        pos as i32,
        Some(all.clone()),
        all.len() as i32,
        eh,
    );
    *newintracomm = add_comm(st, n);
    Ok(())
}

mpi_api! {
    fn MPI_Intercomm_create / PMPI_Intercomm_create(local_comm: MPI_Comm, local_leader: c_int, peer_comm: MPI_Comm, remote_leader: c_int, tag: c_int, newintercomm: *mut MPI_Comm) -> c_int {
        fin(local_comm, "MPI_Intercomm_create", create(local_comm, local_leader, peer_comm, remote_leader, tag, newintercomm))
    }
    fn MPI_Intercomm_merge / PMPI_Intercomm_merge(intercomm: MPI_Comm, high: c_int, newintracomm: *mut MPI_Comm) -> c_int {
        fin(intercomm, "MPI_Intercomm_merge", intercomm_merge(intercomm, high, newintracomm))
    }
    fn MPI_Comm_test_inter / PMPI_Comm_test_inter(comm: MPI_Comm, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            if flag.is_null() {
                return err(MPI_ERR_ARG, "flag is NULL");
            }
            *flag = c.remote.is_some() as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Comm_test_inter", r)
    }
    fn MPI_Comm_remote_size / PMPI_Comm_remote_size(comm: MPI_Comm, size: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            let Some(rem) = &c.remote else { return err(MPI_ERR_COMM, "MPI_Comm_remote_size needs an intercommunicator") };
            if size.is_null() {
                return err(MPI_ERR_ARG, "size is NULL");
            }
            *size = rem.len() as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Comm_remote_size", r)
    }
    fn MPI_Comm_remote_group / PMPI_Comm_remote_group(comm: MPI_Comm, group: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            let Some(rem) = c.remote.clone() else { return err(MPI_ERR_COMM, "MPI_Comm_remote_group needs an intercommunicator") };
            if group.is_null() {
                return err(MPI_ERR_ARG, "group is NULL");
            }
            *group = group_handle(st, rem);
            Ok(())
        })();
        fin(comm, "MPI_Comm_remote_group", r)
    }
}
