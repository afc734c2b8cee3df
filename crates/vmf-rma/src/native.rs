//! The native (Rust) one-sided API over a [`Fabric`]: windows over every rank of the job.
use crate::layout::{contig_run, Layout};
use crate::reduce::{Elem, ROp};
use crate::window::{Done, Flavor, RmaCtx, WinSpec, Window};
use crate::{RmaError, Result};
use vmf_core::engine::Route;
use vmf_core::{Fabric, Op};

/// Context of the native API's window set-up traffic (apart from the MPI library's contexts).
const CTX_RMA: u32 = 0x7fff_fff0;

/// A window over every rank of a job, with MPI-like synchronisation (fence, lock/unlock, flush).
///
/// Operations take byte offsets into the target's window. `put` and `accumulate` return once the data
/// is consumed (local completion); they are complete at the target after [`Win::flush`],
/// [`Win::flush_all`], [`Win::fence`] or [`Win::unlock`]. `get` and the fetching operations return
/// their result.
pub struct Win<'f> {
    fab: &'f Fabric,
    win: Window,
    /// Held passive-target locks: Some(exclusive?) per rank.
    locks: Vec<Option<bool>>,
}

fn allgather(fab: &Fabric, tag: i32, mine: Vec<u8>) -> std::result::Result<Vec<Vec<u8>>, String> {
    let (me, n) = (fab.rank(), fab.size());
    let mut e = fab.engine();
    let mut sends = Vec::with_capacity(n);
    for p in 0..n {
        if p != me {
            // SAFETY: `mine` outlives the sends (waited for below).
            let id = unsafe { e.isend(mine.as_ptr(), mine.len(), p as i64, tag, CTX_RMA, vmf_core::SendMode::Standard) }
                .map_err(|x| x.to_string())?;
            sends.push(id);
        }
    }
    let mut out = vec![Vec::new(); n];
    for (p, o) in out.iter_mut().enumerate() {
        if p == me {
            o.clone_from(&mine);
            continue;
        }
        let st = e.probe(p as i64, tag, CTX_RMA).map_err(|x| x.to_string())?;
        o.resize(st.count, 0);
        // SAFETY: the buffer is live until the receive completes below.
        let id = unsafe { e.irecv(o.as_mut_ptr(), o.len(), p as i64, tag, CTX_RMA) }.map_err(|x| x.to_string())?;
        e.wait_until(Op::Wait, |e| e.is_done(id)).map_err(|x| x.to_string())?;
        e.take(id).map_err(|x| x.to_string())?;
    }
    e.wait_until(Op::Wait, |e| sends.iter().all(|&s| e.is_done(s)))
        .map_err(|x| x.to_string())?;
    for s in sends {
        e.take(s).map_err(|x| x.to_string())?;
    }
    Ok(out)
}

impl<'f> Win<'f> {
    fn make(fab: &'f Fabric, flavor: Flavor, size: usize, base: *mut u8) -> Result<Win<'f>> {
        let n = fab.size();
        let (ctx, near) = {
            let e = fab.engine();
            let near: Vec<bool> = (0..n)
                .map(|p| matches!(e.route(p), Route::Shm | Route::SelfLoop))
                .collect();
            (RmaCtx::from_engine(&e), near)
        };
        let world: Vec<usize> = (0..n).collect();
        let spec = WinSpec {
            flavor,
            size,
            disp_unit: 1,
            base,
            noncontig: false,
            me: fab.rank(),
            near: &near,
            world: &world,
        };
        let mut round = 0;
        let mut ex = |b: Vec<u8>| {
            round += 1;
            allgather(fab, round, b)
        };
        let mut pool = |len: usize| fab.engine().pool_alloc(len, 4096);
        let win = Window::create(&ctx, &spec, &mut ex, &mut pool)?;
        if crate::agent::Agent::running().is_some() {
            crate::agent::Agent::hook_into(&mut fab.engine());
        }
        fab.barrier()?;
        Ok(Win {
            fab,
            win,
            locks: vec![None; n],
        })
    }

    /// A window of `bytes` bytes per rank, allocated by the fabric (shared memory between co-resident
    /// ranks). Collective.
    pub fn allocate(fab: &'f Fabric, bytes: usize) -> Result<Win<'f>> {
        Self::make(fab, Flavor::Allocate, bytes, std::ptr::null_mut())
    }

    /// A window over `mem` (ordinary memory of this rank: co-resident peers reach it by single copy,
    /// others through the agent). Collective.
    ///
    /// # Safety
    /// `mem` must stay valid, and be accessed by this rank only in ways the epochs allow, until the
    /// window is dropped.
    pub unsafe fn create(fab: &'f Fabric, mem: *mut u8, bytes: usize) -> Result<Win<'f>> {
        Self::make(fab, Flavor::Create, bytes, mem)
    }

    /// The underlying window (for routes, local memory and raw operations).
    pub fn raw(&mut self) -> &mut Window {
        &mut self.win
    }

    /// This rank's memory of the window.
    pub fn local_ptr(&self) -> *mut u8 {
        self.win.base()
    }

    /// Write `data` at byte `offset` of `target`'s window.
    pub fn put(&mut self, target: usize, offset: usize, data: &[u8]) -> Result<()> {
        let r = contig_run(data.len());
        // SAFETY: `data` is consumed before put returns.
        unsafe { self.win.put(target, offset as u64, &Layout::contig(&r), data.as_ptr()) }?;
        Ok(())
    }

    /// Read `out.len()` bytes at byte `offset` of `target`'s window.
    pub fn get(&mut self, target: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = contig_run(out.len());
        // SAFETY: `out` is borrowed until the operation completes below.
        let d = unsafe { self.win.get(target, offset as u64, &Layout::contig(&r), out.as_mut_ptr()) }?;
        self.complete(d)
    }

    fn complete(&mut self, d: Done) -> Result<()> {
        if let Done::Later { target, .. } = d {
            self.win.flush(target)?;
        }
        Ok(())
    }

    /// Accumulate `data` (elements of `elem`) into `target`'s window at `offset` with `op`.
    pub fn accumulate(&mut self, target: usize, offset: usize, elem: Elem, op: ROp, data: &[u8]) -> Result<()> {
        let r = contig_run(data.len());
        // SAFETY: `data` is consumed before accumulate returns.
        unsafe { self.win.accumulate(target, offset as u64, &Layout::contig(&r), elem, op, data.as_ptr(), None) }?;
        Ok(())
    }

    /// Accumulate and return the previous contents.
    pub fn get_accumulate(
        &mut self,
        target: usize,
        offset: usize,
        elem: Elem,
        op: ROp,
        data: &[u8],
        result: &mut [u8],
    ) -> Result<()> {
        if result.len() != data.len() {
            return Err(RmaError::Bad {
                target,
                what: "the result buffer differs in length from the operand".into(),
            });
        }
        let r = contig_run(data.len());
        // SAFETY: both buffers are borrowed until completion below.
        let d = unsafe {
            self.win.accumulate(target, offset as u64, &Layout::contig(&r), elem, op, data.as_ptr(), Some(result.as_mut_ptr()))
        }?;
        self.complete(d)
    }

    /// Atomically add `v` to the 8-byte word at `offset` of `target`; returns the previous value.
    pub fn fetch_add_u64(&mut self, target: usize, offset: usize, v: u64) -> Result<u64> {
        let mut old = [0u8; 8];
        self.get_accumulate(target, offset, Elem::U64, ROp::Sum, &v.to_ne_bytes(), &mut old)?;
        Ok(u64::from_ne_bytes(old))
    }

    /// Atomically replace the 8-byte word at `offset` of `target` by `v`; returns the previous value.
    pub fn swap_u64(&mut self, target: usize, offset: usize, v: u64) -> Result<u64> {
        let mut old = [0u8; 8];
        self.get_accumulate(target, offset, Elem::U64, ROp::Replace, &v.to_ne_bytes(), &mut old)?;
        Ok(u64::from_ne_bytes(old))
    }

    /// Atomically: if the 8-byte word at `offset` of `target` equals `compare`, store `new`. Returns the
    /// previous value.
    pub fn compare_swap_u64(&mut self, target: usize, offset: usize, compare: u64, new: u64) -> Result<u64> {
        let mut old = [0u8; 8];
        let (c, n) = (compare.to_ne_bytes(), new.to_ne_bytes());
        // SAFETY: the buffers live until completion below.
        let d = unsafe { self.win.compare_and_swap(target, offset as u64, Elem::U64, c.as_ptr(), n.as_ptr(), old.as_mut_ptr()) }?;
        self.complete(d)?;
        Ok(u64::from_ne_bytes(old))
    }

    /// Complete every operation to `target` at the target.
    pub fn flush(&mut self, target: usize) -> Result<()> {
        self.win.flush(target)
    }

    /// Complete every operation at every target.
    pub fn flush_all(&mut self) -> Result<()> {
        self.win.flush_all()
    }

    /// Complete every operation and synchronise with every rank (collective).
    pub fn fence(&mut self) -> Result<()> {
        self.win.flush_all()?;
        self.fab.barrier()?;
        Ok(())
    }

    /// Take `target`'s passive-target lock (exclusive or shared), waiting while it is held in a
    /// conflicting mode (this rank's traffic keeps moving meanwhile).
    pub fn lock(&mut self, target: usize, exclusive: bool) -> Result<()> {
        if self.locks.get(target).is_some_and(|l| l.is_some()) {
            return Err(RmaError::Bad {
                target,
                what: "this rank already holds its lock".into(),
            });
        }
        let mut spins = 0u32;
        while !self.win.try_lock(target, exclusive)? {
            spins += 1;
            self.fab.progress()?;
            if spins > 16 {
                vmf_pal::yield_now();
            }
        }
        self.locks[target] = Some(exclusive);
        Ok(())
    }

    /// Complete the operations to `target` and release its lock.
    pub fn unlock(&mut self, target: usize) -> Result<()> {
        let Some(excl) = self.locks.get(target).copied().flatten() else {
            return Err(RmaError::Bad {
                target,
                what: "this rank holds no lock on it".into(),
            });
        };
        self.win.flush(target)?;
        self.win.unlock(target, excl)?;
        self.locks[target] = None;
        Ok(())
    }
}

impl Drop for Win<'_> {
    fn drop(&mut self) {
        // Collective: everything completes and every rank has stopped using the window before anyone
        // frees its memory.
        let _ = self.win.flush_all();
        let _ = self.fab.barrier();
        if let Some(p) = self.win.take_pool_block() {
            // The node segment lived in this rank's pool partition: nobody maps it any more (barrier).
            self.fab.engine().pool_free(p);
        }
    }
}
