//! RMA synchronisation (MPI 4.0 §12.5): fence, post/start/complete/wait/test (general active target),
//! lock/unlock and lock_all/unlock_all (passive target), flush and sync.
//!
//! - **Fence**: complete every operation of this process (at its targets), then a barrier over the
//!   window's communicator: after it every member's operations are visible everywhere.
//! - **Post/start/complete/wait**: zero-byte messages on the window's communicator: `post` sends one to
//!   each origin of its group, `start` waits for one from each target of its group, `complete` completes
//!   the operations to each target and sends it one, `wait` (or `test`) takes one from each origin.
//!   Matching is by count, so consecutive epochs never mix.
//! - **Lock**: the target's lock word in its control block, taken by the origin itself (CPU atomics on
//!   shared memory) or by the target's agent (over TCP), never by the target process: a passive target
//!   takes no part. `lock` is taken at the call (spinning, then yielding, while held in a conflicting
//!   mode, with this rank's traffic moving meanwhile); `lock_all` takes each target's shared lock when
//!   the first operation goes to it, so an epoch over many ranks touches only those it uses.
//! - **Flush**: remote completion, which on shared memory and single copy is immediate (the stores are
//!   done when the call returns) and over TCP waits for the agent's answers.
use super::*;

const TAG_POST: c_int = 1;
const TAG_COMPLETE: c_int = 2;

/// Take target `t`'s passive-target lock of window `wi`, waiting while it is held in a conflicting mode.
pub(crate) fn acquire(mut st: &mut State, wi: usize, t: usize, excl: bool) -> R {
    let mut spins = 0u32;
    loop {
        // The holder may be another thread of this process (MPI_THREAD_MULTIPLE): let it in.
        st = crate::mt::relax(st);
        let w = &mut st.wins[wi].as_mut().unwrap().w;
        if w.try_lock(t, excl).map_err(rma_err)? {
            return Ok(());
        }
        // A holder may be waiting for a message from us: keep our traffic moving.
        st.fab.engine().progress().map_err(from_core)?;
        spins += 1;
        if spins > 16 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn check_assert(a: c_int) -> R {
    if a & !MODES != 0 {
        err(MPI_ERR_ASSERT, format!("invalid assertion {a:#x}"))
    } else {
        Ok(())
    }
}

fn check_rank(w: &MWin, rank: c_int) -> R<usize> {
    let n = w.w.size();
    if rank < 0 || rank as usize >= n {
        err(MPI_ERR_RANK, format!("rank {rank} is not in a window of {n}"))
    } else {
        Ok(rank as usize)
    }
}

/// Send a zero-byte message with `tag` on the window's communicator to each of `to` (window ranks).
fn notify(st: &mut State, wi: usize, to: &[usize], tag: c_int) -> R {
    let w = st.wins[wi].as_ref().unwrap();
    let ctx = st.comms[w.ci].as_ref().unwrap().pt;
    let world: Vec<usize> = to.iter().map(|&r| w.world[r]).collect();
    let mut e = st.fab.engine();
    let mut ids = Vec::with_capacity(world.len());
    for p in world {
        // SAFETY: zero bytes.
        ids.push(unsafe { e.isend(std::ptr::null(), 0, p as i64, tag, ctx, vmf_core::SendMode::Standard) }.map_err(from_core)?);
    }
    e.wait_until(vmf_core::Op::Wait, |e| ids.iter().all(|&i| e.is_done(i)))
        .map_err(from_core)?;
    for i in ids {
        e.take(i).map_err(from_core)?;
    }
    Ok(())
}

/// Receive one zero-byte message with `tag` from each of `from` (window ranks).
fn collect(st: &mut State, wi: usize, from: &[usize], tag: c_int) -> R {
    let w = st.wins[wi].as_ref().unwrap();
    let ctx = st.comms[w.ci].as_ref().unwrap().pt;
    let world: Vec<usize> = from.iter().map(|&r| w.world[r]).collect();
    let mut e = st.fab.engine();
    let mut ids = Vec::with_capacity(world.len());
    for p in world {
        // SAFETY: zero bytes.
        ids.push(unsafe { e.irecv(std::ptr::null_mut(), 0, p as i64, tag, ctx) }.map_err(from_core)?);
    }
    e.wait_until(vmf_core::Op::Wait, |e| ids.iter().all(|&i| e.is_done(i)))
        .map_err(from_core)?;
    for i in ids {
        e.take(i).map_err(from_core)?;
    }
    Ok(())
}

fn passive(w: &MWin, t: Option<usize>) -> R {
    let ok = w.ep.lock_all || t.map_or(w.ep.nlocks > 0, |t| w.ep.locks[t] != 0);
    if ok {
        Ok(())
    } else {
        err(MPI_ERR_RMA_SYNC, "flush outside a lock or lock_all epoch covering the target")
    }
}

unsafe fn lock(lock_type: c_int, rank: c_int, assert: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let (wi, w) = self::win(st, win)?;
    if lock_type != MPI_LOCK_EXCLUSIVE && lock_type != MPI_LOCK_SHARED {
        return err(MPI_ERR_LOCKTYPE, format!("invalid lock type {lock_type}"));
    }
    check_assert(assert)?;
    if rank == MPI_PROC_NULL {
        return Ok(());
    }
    let t = check_rank(w, rank)?;
    let ep = &mut w.ep;
    if ep.lock_all || ep.start.is_some() || ep.fence_ops {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_lock during another access epoch (lock_all, start or fence)");
    }
    if ep.locks[t] != 0 {
        return err(MPI_ERR_RMA_SYNC, format!("this process already holds a lock on target {t}"));
    }
    ep.fence = false;
    let excl = lock_type == MPI_LOCK_EXCLUSIVE;
    let code = if excl { 2 } else { 1 };
    if assert & MPI_MODE_NOCHECK != 0 {
        ep.locks[t] = code | 4;
    } else {
        acquire(st, wi, t, excl)?;
        st.wins[wi].as_mut().unwrap().ep.locks[t] = code;
    }
    st.wins[wi].as_mut().unwrap().ep.nlocks += 1;
    Ok(())
}

unsafe fn unlock(rank: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let w = self::win(st, win)?.1;
    if rank == MPI_PROC_NULL {
        return Ok(());
    }
    let t = check_rank(w, rank)?;
    let l = w.ep.locks[t];
    if l == 0 {
        return err(MPI_ERR_RMA_SYNC, format!("MPI_Win_unlock of target {t}, which this process has not locked"));
    }
    // The epoch ends whatever the operations reported: the lock goes and the first error is returned.
    let flushed = w.w.flush(t).map_err(rma_err);
    let released = if l & 4 == 0 {
        w.w.unlock(t, l == 2).map_err(rma_err)
    } else {
        Ok(())
    };
    w.ep.locks[t] = 0;
    w.ep.nlocks -= 1;
    flushed.and(released)
}

unsafe fn lock_all(assert: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let w = self::win(st, win)?.1;
    check_assert(assert)?;
    let ep = &mut w.ep;
    if ep.lock_all || ep.nlocks > 0 || ep.start.is_some() || ep.fence_ops {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_lock_all during another access epoch");
    }
    ep.fence = false;
    ep.lock_all = true;
    ep.lock_all_nocheck = assert & MPI_MODE_NOCHECK != 0;
    ep.held.iter_mut().for_each(|h| *h = false);
    Ok(())
}

unsafe fn unlock_all(win: MPI_Win) -> R {
    let st = state()?;
    let w = self::win(st, win)?.1;
    if !w.ep.lock_all {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_unlock_all without MPI_Win_lock_all");
    }
    let mut first = w.w.flush_all().map_err(rma_err);
    for t in 0..w.ep.held.len() {
        if std::mem::take(&mut w.ep.held[t]) {
            if let Err(e) = w.w.unlock(t, false) {
                if first.is_ok() {
                    first = Err(rma_err(e));
                }
            }
        }
    }
    w.ep.lock_all = false;
    w.ep.lock_all_nocheck = false;
    first
}

unsafe fn fence(assert: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let (_, w) = self::win(st, win)?;
    check_assert(assert)?;
    if w.ep.nlocks > 0 || w.ep.lock_all || w.ep.start.is_some() || w.ep.post.is_some() {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_fence during a lock, lock_all, start or post epoch");
    }
    w.w.flush_all().map_err(rma_err)?;
    let wch = w.comm;
    crate::coll::barrier(st, wch)?;
    let (_, w) = self::win(st, win)?;
    w.ep.fence = assert & MPI_MODE_NOSUCCEED == 0;
    w.ep.fence_ops = false;
    Ok(())
}

unsafe fn post(group: MPI_Group, assert: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let (wi, _) = self::win(st, win)?;
    check_assert(assert)?;
    let ranks = group_ranks(st, st.wins[wi].as_ref().unwrap(), group)?;
    let w = st.wins[wi].as_mut().unwrap();
    if w.ep.post.is_some() {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_post while an exposure epoch is open");
    }
    if w.ep.fence_ops {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_post during a fence epoch");
    }
    w.ep.post = Some(ranks.clone());
    if assert & MPI_MODE_NOCHECK == 0 {
        notify(st, wi, &ranks, TAG_POST)?;
    }
    Ok(())
}

unsafe fn start(group: MPI_Group, assert: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let (wi, _) = self::win(st, win)?;
    check_assert(assert)?;
    let ranks = group_ranks(st, st.wins[wi].as_ref().unwrap(), group)?;
    let w = st.wins[wi].as_mut().unwrap();
    if w.ep.start.is_some() || w.ep.lock_all || w.ep.nlocks > 0 || w.ep.fence_ops {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_start during another access epoch");
    }
    w.ep.fence = false;
    if assert & MPI_MODE_NOCHECK == 0 {
        collect(st, wi, &ranks, TAG_POST)?;
    }
    st.wins[wi].as_mut().unwrap().ep.start = Some(ranks);
    Ok(())
}

unsafe fn complete(win: MPI_Win) -> R {
    let st = state()?;
    let (wi, w) = self::win(st, win)?;
    let Some(ranks) = w.ep.start.take() else {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_complete without MPI_Win_start");
    };
    for &t in &ranks {
        w.w.flush(t).map_err(rma_err)?;
    }
    notify(st, wi, &ranks, TAG_COMPLETE)
}

unsafe fn wait(win: MPI_Win) -> R {
    let st = state()?;
    let (wi, w) = self::win(st, win)?;
    let Some(ranks) = w.ep.post.take() else {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_wait without MPI_Win_post");
    };
    collect(st, wi, &ranks, TAG_COMPLETE)
}

unsafe fn test(win: MPI_Win, flag: *mut c_int) -> R {
    let st = state()?;
    if flag.is_null() {
        return err(MPI_ERR_ARG, "flag is NULL");
    }
    let (wi, w) = self::win(st, win)?;
    let Some(ranks) = w.ep.post.clone() else {
        return err(MPI_ERR_RMA_SYNC, "MPI_Win_test without MPI_Win_post");
    };
    let world: Vec<usize> = ranks.iter().map(|&r| w.world[r]).collect();
    let ci = w.ci;
    let ctx = st.comms[ci].as_ref().unwrap().pt;
    // Take the completions that arrived; the epoch ends when every origin's is in.
    let mut left = Vec::new();
    {
        let mut e = st.fab.engine();
        for (k, &p) in world.iter().enumerate() {
            if e.iprobe(p as i64, TAG_COMPLETE, ctx).map_err(from_core)?.is_some() {
                // SAFETY: zero bytes.
                let id = e.irecv(std::ptr::null_mut(), 0, p as i64, TAG_COMPLETE, ctx).map_err(from_core)?;
                e.wait_until(vmf_core::Op::Wait, |e| e.is_done(id)).map_err(from_core)?;
                e.take(id).map_err(from_core)?;
            } else {
                left.push(ranks[k]);
            }
        }
    }
    let w = st.wins[wi].as_mut().unwrap();
    if left.is_empty() {
        w.ep.post = None;
        *flag = 1;
    } else {
        w.ep.post = Some(left);
        *flag = 0;
    }
    Ok(())
}

unsafe fn flush(rank: c_int, win: MPI_Win) -> R {
    let st = state()?;
    let w = self::win(st, win)?.1;
    if rank == MPI_PROC_NULL {
        return Ok(());
    }
    let t = check_rank(w, rank)?;
    passive(w, Some(t))?;
    w.w.flush(t).map_err(rma_err)
}

unsafe fn flush_all(win: MPI_Win) -> R {
    let st = state()?;
    let w = self::win(st, win)?.1;
    passive(w, None)?;
    w.w.flush_all().map_err(rma_err)
}

mpi_api! {
    fn MPI_Win_fence / PMPI_Win_fence(assert: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_fence", fence(assert, win))
    }
    fn MPI_Win_post / PMPI_Win_post(group: MPI_Group, assert: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_post", post(group, assert, win))
    }
    fn MPI_Win_start / PMPI_Win_start(group: MPI_Group, assert: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_start", start(group, assert, win))
    }
    fn MPI_Win_complete / PMPI_Win_complete(win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_complete", complete(win))
    }
    fn MPI_Win_wait / PMPI_Win_wait(win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_wait", wait(win))
    }
    fn MPI_Win_test / PMPI_Win_test(win: MPI_Win, flag: *mut c_int) -> c_int {
        fin_win(win, "MPI_Win_test", test(win, flag))
    }
    fn MPI_Win_lock / PMPI_Win_lock(lock_type: c_int, rank: c_int, assert: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_lock", lock(lock_type, rank, assert, win))
    }
    fn MPI_Win_unlock / PMPI_Win_unlock(rank: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_unlock", unlock(rank, win))
    }
    fn MPI_Win_lock_all / PMPI_Win_lock_all(assert: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_lock_all", lock_all(assert, win))
    }
    fn MPI_Win_unlock_all / PMPI_Win_unlock_all(win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_unlock_all", unlock_all(win))
    }
    fn MPI_Win_flush / PMPI_Win_flush(rank: c_int, win: MPI_Win) -> c_int {
        // Fast path: a target reached by loads and stores, whose operations are complete when issued.
        if let Ok(st) = state() {
            if let Some(Some(w)) = win_index(win).and_then(|i| st.wins.get(i)) {
                if let Ok(t) = usize::try_from(rank) {
                    if t < w.ep.locks.len() && (w.ep.lock_all || w.ep.locks[t] != 0) && w.w.agent_idle(t) {
                        vmf_rma::window::full_fence();
                        return MPI_SUCCESS;
                    }
                }
            }
        }
        fin_win(win, "MPI_Win_flush", flush(rank, win))
    }
    fn MPI_Win_flush_local / PMPI_Win_flush_local(rank: c_int, win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_flush_local", flush(rank, win))
    }
    fn MPI_Win_flush_all / PMPI_Win_flush_all(win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_flush_all", flush_all(win))
    }
    fn MPI_Win_flush_local_all / PMPI_Win_flush_local_all(win: MPI_Win) -> c_int {
        fin_win(win, "MPI_Win_flush_local_all", flush_all(win))
    }
    fn MPI_Win_sync / PMPI_Win_sync(win: MPI_Win) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            self::win(st, win)?;
            // Puts and gets whose copies the helper thread may still be finishing complete here too.
            vmf_bb::copier::settle();
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })();
        fin_win(win, "MPI_Win_sync", r)
    }
}
