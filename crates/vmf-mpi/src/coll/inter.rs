//! Collectives on intercommunicators (MPI standard, "intercommunicator collective operations").
//!
//! `c` describes the local group, `x` the remote group (world ranks). Both groups run on the
//! intercommunicator's collective context with the same tag; local and remote traffic are told apart by
//! the sender's world rank (the groups are disjoint). Rooted operations take `root` = MPI_ROOT at the root,
//! MPI_PROC_NULL at the other processes of the root's group (which take no part), and the root's rank in
//! its group at every process of the other group.
//!
//! Algorithms are one-hop: the root talks to every remote process directly (bcast, scatter, gather,
//! reduce: the root reduces the contributions in rank order, so non-commutative ops work); allgather and
//! all-to-all exchange directly between every pair of processes of the two groups; allreduce reduces each
//! group at its rank 0 (in rank order), the two leaders swap their results and broadcast the other
//! group's to their group; reduce_scatter reduces each group at its rank 0 the same way, and each leader
//! scatters the other group's result over its group; barrier gathers each group at its rank 0, the
//! leaders swap, and release.
//! MPI_IN_PLACE is not allowed on intercommunicators (MPI_ERR_ARG).
use super::*;
use crate::intercomm::MPI_ROOT;

enum Root {
    /// This process is the root.
    Me,
    /// Another process of the root's group: nothing to do.
    Idle,
    /// The root is rank r of the remote group.
    Remote(usize),
}

fn root_of(root: c_int, nr: usize) -> R<Root> {
    match root {
        MPI_ROOT => Ok(Root::Me),
        MPI_PROC_NULL => Ok(Root::Idle),
        r if r >= 0 && (r as usize) < nr => Ok(Root::Remote(r as usize)),
        r => err(MPI_ERR_ROOT, format!("root {r} on an intercommunicator must be MPI_ROOT, MPI_PROC_NULL or a rank of the remote group (size {nr})")),
    }
}

fn no_in_place(p: *const c_void) -> R {
    if p == IN_PLACE {
        err(
            MPI_ERR_ARG,
            "MPI_IN_PLACE is not allowed on an intercommunicator",
        )
    } else {
        Ok(())
    }
}

pub(super) fn barrier(s: &mut Sched, c: &Ctx, x: &[usize]) {
    let nul = std::ptr::null_mut();
    if c.me == 0 {
        for k in 1..c.n {
            s.recv(c.w(k), nul, 0);
        }
        s.wait();
        s.recv(x[0] as i64, nul, 0);
        s.send(x[0] as i64, nul, 0);
        s.wait();
        for k in 1..c.n {
            s.send(c.w(k), nul, 0);
        }
        s.wait();
    } else {
        s.send(c.w(0), nul, 0);
        s.recv(c.w(0), nul, 0);
        s.wait();
    }
}

pub(super) unsafe fn bcast(
    s: &mut Sched,
    x: &[usize],
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
) -> R {
    match root_of(root, x.len())? {
        Root::Idle => Ok(()),
        Root::Me => {
            let (p, len) = src(s, buf, count, dt)?;
            for &w in x {
                s.send(w as i64, p, len);
            }
            s.wait();
            Ok(())
        }
        Root::Remote(r) => {
            let mut u = Unp(vec![]);
            let (p, len) = dst(s, &mut u, buf, count, dt)?;
            s.recv(x[r] as i64, p, len);
            s.wait();
            finish_unpack(s, u);
            Ok(())
        }
    }
}

pub(super) unsafe fn reduce(
    st: &mut State,
    s: &mut Sched,
    x: &[usize],
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
) -> R {
    let (red, cnt) = red_of(st, op, dt, count)?;
    let bytes = red_bytes(&red, cnt);
    match root_of(root, x.len())? {
        Root::Idle => Ok(()),
        Root::Remote(r) => {
            no_in_place(sbuf)?;
            if bytes > 0 && sbuf.is_null() {
                return err(MPI_ERR_BUFFER, "NULL buffer");
            }
            s.send(x[r] as i64, sbuf as *const u8, bytes);
            s.wait();
            Ok(())
        }
        Root::Me => {
            if bytes > 0 && rbuf.is_null() {
                return err(MPI_ERR_BUFFER, "NULL buffer");
            }
            let nr = x.len();
            let all = s.tmp(bytes * nr);
            let blk = |k: usize| all.wrapping_add(k * bytes);
            for (k, &w) in x.iter().enumerate() {
                s.recv(w as i64, blk(k), bytes);
            }
            s.wait();
            // rbuf = b0 op (b1 op (... op b(nr-1))): rank order
            s.copy(blk(nr - 1), rbuf as *mut u8, bytes);
            for k in (0..nr - 1).rev() {
                s.reduce(red, blk(k), rbuf as *mut u8, cnt);
            }
            Ok(())
        }
    }
}

/// At a group's rank 0: receive every local contribution, reduce them all (`sp` is the leader's own) in
/// rank order, and swap the result with the remote leader, whose group's result lands in `into`.
unsafe fn leader_swap(
    s: &mut Sched,
    c: &Ctx,
    x: &[usize],
    sp: *const u8,
    into: *mut u8,
    red: Red,
    cnt: usize,
) {
    let (n, bytes) = (c.n, red_bytes(&red, cnt));
    let all = s.tmp(bytes * n);
    let blk = |k: usize| all.wrapping_add(k * bytes);
    for k in 1..n {
        s.recv(c.w(k), blk(k), bytes);
    }
    s.wait();
    s.copy(sp, blk(0), bytes);
    let acc = s.tmp(bytes);
    s.copy(blk(n - 1), acc, bytes);
    for k in (0..n - 1).rev() {
        s.reduce(red, blk(k), acc, cnt);
    }
    s.recv(x[0] as i64, into, bytes);
    s.send(x[0] as i64, acc, bytes);
    s.wait();
}

pub(super) unsafe fn allreduce(
    st: &mut State,
    s: &mut Sched,
    c: &Ctx,
    x: &[usize],
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
) -> R {
    no_in_place(sbuf)?;
    let (red, cnt) = red_of(st, op, dt, count)?;
    let bytes = red_bytes(&red, cnt);
    if bytes > 0 && (rbuf.is_null() || sbuf.is_null()) {
        return err(MPI_ERR_BUFFER, "NULL buffer");
    }
    let (sp, rp) = (sbuf as *const u8, rbuf as *mut u8);
    if c.me != 0 {
        s.send(c.w(0), sp, bytes);
        s.recv(c.w(0), rp, bytes);
        s.wait();
        return Ok(());
    }
    // leader: the other group's result into rbuf, then broadcast it
    leader_swap(s, c, x, sp, rp, red, cnt);
    for k in 1..c.n {
        s.send(c.w(k), rp, bytes);
    }
    s.wait();
    Ok(())
}

/// Reduce_scatter(_block): each group's vectors (sum of `counts` elements, the same total in both groups)
/// are reduced in rank order at the group's rank 0; the leaders swap their results, and each scatters the
/// other group's result over its own group by `counts` (this rank gets `counts[me]` elements).
pub(super) unsafe fn reduce_scatter(
    st: &mut State,
    s: &mut Sched,
    c: &Ctx,
    x: &[usize],
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: &[c_int],
    dt: MPI_Datatype,
    op: MPI_Op,
) -> R {
    no_in_place(sbuf)?;
    if let Some(&bad) = counts.iter().find(|&&k| k < 0) {
        return err(MPI_ERR_COUNT, format!("receive count {bad} is negative"));
    }
    let total: c_int = counts.iter().sum();
    let (red, cnt) = red_of(st, op, dt, total)?;
    let per = if total > 0 {
        red.elem * (cnt / total as usize)
    } else {
        0
    };
    let bytes = red_bytes(&red, cnt);
    let mine = counts[c.me] as usize * per;
    if (bytes > 0 && sbuf.is_null()) || (mine > 0 && rbuf.is_null()) {
        return err(MPI_ERR_BUFFER, "NULL buffer");
    }
    let (sp, rp) = (sbuf as *const u8, rbuf as *mut u8);
    if c.me != 0 {
        s.send(c.w(0), sp, bytes);
        s.recv(c.w(0), rp, mine);
        s.wait();
        return Ok(());
    }
    // The other group's result; then its segments to this group's ranks.
    let other = s.tmp(bytes);
    leader_swap(s, c, x, sp, other, red, cnt);
    let mut off = counts[0] as usize * per;
    for (k, &ck) in counts.iter().enumerate().skip(1) {
        let len = ck as usize * per;
        s.send(c.w(k), other.wrapping_add(off), len);
        off += len;
    }
    s.copy(other, rp, mine);
    s.wait();
    Ok(())
}

/// Counts and element displacements of a v-collective over the remote group (`None`: fixed blocks).
unsafe fn counts_displs(
    nr: usize,
    counts: Option<*const c_int>,
    count: c_int,
    displs: Option<*const c_int>,
) -> R<(Vec<c_int>, Vec<c_int>)> {
    let cs = match counts {
        Some(p) => arr_i(p, nr)?,
        None => vec![count; nr],
    };
    let ds = match displs {
        Some(p) => arr_i(p, nr)?,
        None => (0..nr as c_int).map(|i| i * count).collect(),
    };
    Ok((cs, ds))
}

pub(super) unsafe fn gatherv(
    s: &mut Sched,
    x: &[usize],
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: Option<*const c_int>,
    rcount: c_int,
    displs: Option<*const c_int>,
    rtype: MPI_Datatype,
    root: c_int,
) -> R {
    match root_of(root, x.len())? {
        Root::Idle => Ok(()),
        Root::Remote(r) => {
            no_in_place(sbuf)?;
            let (p, len) = src(s, sbuf, scount, stype)?;
            s.send(x[r] as i64, p, len);
            s.wait();
            Ok(())
        }
        Root::Me => {
            let (ext, _) = datatype::ext_size(rtype)?;
            let (cs, ds) = counts_displs(x.len(), rcounts, rcount, displs)?;
            let mut u = Unp(vec![]);
            for (i, &w) in x.iter().enumerate() {
                let b = (rbuf as *mut u8).wrapping_offset(ds[i] as isize * ext) as *mut c_void;
                let (p, len) = dst(s, &mut u, b, cs[i], rtype)?;
                s.recv(w as i64, p, len);
            }
            s.wait();
            finish_unpack(s, u);
            Ok(())
        }
    }
}

pub(super) unsafe fn scatterv(
    s: &mut Sched,
    x: &[usize],
    sbuf: *const c_void,
    scounts: Option<*const c_int>,
    scount: c_int,
    displs: Option<*const c_int>,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
) -> R {
    match root_of(root, x.len())? {
        Root::Idle => Ok(()),
        Root::Remote(r) => {
            no_in_place(rbuf)?;
            let mut u = Unp(vec![]);
            let (p, len) = dst(s, &mut u, rbuf, rcount, rtype)?;
            s.recv(x[r] as i64, p, len);
            s.wait();
            finish_unpack(s, u);
            Ok(())
        }
        Root::Me => {
            let (ext, _) = datatype::ext_size(stype)?;
            let (cs, ds) = counts_displs(x.len(), scounts, scount, displs)?;
            for (i, &w) in x.iter().enumerate() {
                let b = (sbuf as *const u8).wrapping_offset(ds[i] as isize * ext) as *const c_void;
                let (p, len) = src(s, b, cs[i], stype)?;
                s.send(w as i64, p, len);
            }
            s.wait();
            Ok(())
        }
    }
}

pub(super) unsafe fn allgatherv(
    s: &mut Sched,
    x: &[usize],
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: Option<*const c_int>,
    rcount: c_int,
    displs: Option<*const c_int>,
    rtype: MPI_Datatype,
) -> R {
    no_in_place(sbuf)?;
    let (ext, _) = datatype::ext_size(rtype)?;
    let (cs, ds) = counts_displs(x.len(), rcounts, rcount, displs)?;
    let mut u = Unp(vec![]);
    for (i, &w) in x.iter().enumerate() {
        let b = (rbuf as *mut u8).wrapping_offset(ds[i] as isize * ext) as *mut c_void;
        let (p, len) = dst(s, &mut u, b, cs[i], rtype)?;
        s.recv(w as i64, p, len);
    }
    let (p, len) = src(s, sbuf, scount, stype)?;
    for &w in x {
        s.send(w as i64, p, len);
    }
    s.wait();
    finish_unpack(s, u);
    Ok(())
}

/// All-to-all(v,w): `sb` block i goes to remote rank i, block i of `rb` comes from remote rank i
/// (byte displacements, per-peer datatypes).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn alltoallw(
    s: &mut Sched,
    x: &[usize],
    sbuf: *const c_void,
    sc: &[c_int],
    sd: &[isize],
    stp: &[MPI_Datatype],
    rbuf: *mut c_void,
    rc: &[c_int],
    rd: &[isize],
    rt: &[MPI_Datatype],
) -> R {
    no_in_place(sbuf)?;
    let mut u = Unp(vec![]);
    for (i, &w) in x.iter().enumerate() {
        let b = (rbuf as *mut u8).wrapping_offset(rd[i]) as *mut c_void;
        let (p, len) = dst(s, &mut u, b, rc[i], rt[i])?;
        s.recv(w as i64, p, len);
    }
    for (i, &w) in x.iter().enumerate() {
        let b = (sbuf as *const u8).wrapping_offset(sd[i]) as *const c_void;
        let (p, len) = src(s, b, sc[i], stp[i])?;
        s.send(w as i64, p, len);
    }
    s.wait();
    finish_unpack(s, u);
    Ok(())
}
