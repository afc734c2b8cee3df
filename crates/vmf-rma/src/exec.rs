//! Executing one-sided operations on a member's window memory, wherever the executing thread stands:
//! an origin that maps the target's memory (plain loads and stores), an origin that reaches it by single
//! copy (`process_vm_readv`/`writev`), or the target's own agent serving a request that came over TCP. All
//! three run this code, so an operation computes the same result by every path.
//!
//! Atomicity: every read-modify-write (accumulate, get-accumulate, fetch-and-op, compare-and-swap) runs
//! under the member's accumulate lock in its control block, from every origin, the target itself and its
//! agent included, so any two of them on any element are atomic with respect to each other, whatever the
//! element's type, size or alignment, and whether the memory is shared or reached by single copy. Under
//! the lock the operation is a plain (vectorised) loop over its elements: a 2 MiB accumulate of bytes is
//! one pass, not two million atomic instructions, and an 8-byte fetch-and-op costs one uncontended
//! lock word more than a bare CPU atomic.
use crate::ctl::Ctl;
use crate::layout::Layout;
use crate::attach::{AttachList, AttachTable};
use crate::reduce::{self, Elem, ROp};

/// Outcome of an operation at the target (also the status code of agent responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The layout reaches outside the window (or outside attached memory of a dynamic window).
    Range = 1,
    /// The passive-target lock is held in a conflicting mode (try again).
    Busy = 2,
    /// A malformed request (bad layout, element, operation or lengths).
    Bad = 3,
    /// No such window at the target.
    NoWin = 4,
    /// A single-copy transfer failed (the target's mapping refused it).
    Io = 5,
}

impl Status {
    /// The status with code `v` (unknown codes are [`Status::Bad`]).
    pub fn from_u32(v: u32) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::Range,
            2 => Status::Busy,
            4 => Status::NoWin,
            5 => Status::Io,
            _ => Status::Bad,
        }
    }
}

/// Where a member's memory is, as the executing thread reaches it.
#[derive(Clone, Debug)]
pub enum Mem {
    /// Mapped in this process: `size` bytes at `base`.
    Direct {
        /// Start of the member's window memory here.
        base: *mut u8,
        /// Its size.
        size: u64,
    },
    /// In process `pid` at address `base`, reached by single copy.
    Cma {
        /// Process holding the memory.
        pid: i32,
        /// Address of the window there.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// In process `pid` at address `base` (`size` bytes), whose whole pages `[lo, hi)` (offsets in the
    /// window) the member shared in place and this process maps at `here + lo`: operations inside them
    /// are loads and stores, the others (the partial pages at the edges) single copies.
    Split {
        /// Where window offset 0 would be here (only `[lo, hi)` is mapped: `here + lo` onwards).
        here: *mut u8,
        /// First byte mapped here.
        lo: u64,
        /// One past the last byte mapped here.
        hi: u64,
        /// Process holding the memory.
        pid: i32,
        /// Address of the window there.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// A dynamic window of this process: displacements are addresses, checked against the owner's list.
    DynDirect(AttachList),
    /// A dynamic window of process `pid`: displacements are addresses there, checked against the
    /// attach table the member publishes.
    DynCma {
        /// Process holding the memory.
        pid: i32,
        /// The member's published attach table, mapped here.
        table: AttachTable,
    },
}

// SAFETY: `Direct` names memory that outlives the window object holding it (the window unmaps it only
// when it is dropped); nothing here is thread-affine.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

/// A member's memory and control block, as the executing thread reaches them.
#[derive(Clone, Debug)]
pub struct Target {
    /// The memory.
    pub mem: Mem,
    /// The control block, when mapped here.
    pub ctl: Option<*const Ctl>,
}

// SAFETY: as for `Mem`: the control block outlives the window object holding this.
unsafe impl Send for Target {}
// SAFETY: as above.
unsafe impl Sync for Target {}

/// A resolved address: a pointer here, or an address in process `pid`.
enum At {
    Here(*mut u8),
    There(i32, u64),
}

impl Target {
    fn ctl(&self) -> Option<&Ctl> {
        // SAFETY: the control block outlives the window (see the type's docs).
        self.ctl.map(|c| unsafe { &*c })
    }

    /// True if read-modify-write operations can run here (the member's accumulate lock is mapped);
    /// else they go to the member's agent.
    pub fn can_rmw(&self) -> bool {
        self.ctl.is_some()
    }

    /// Check that `layout` at byte displacement `disp` lies in the member's memory and resolve it.
    fn resolve(&self, disp: u64, layout: &Layout) -> Result<Option<At>, Status> {
        let Some((lo, hi)) = layout.span() else {
            return Ok(None);
        };
        let (a, b) = (disp as i128 + lo, disp as i128 + hi);
        match &self.mem {
            Mem::Direct { base, size } => {
                if a < 0 || b > *size as i128 {
                    return Err(Status::Range);
                }
                Ok(Some(At::Here(base.wrapping_add(disp as usize))))
            }
            Mem::Cma { pid, base, size } => {
                if a < 0 || b > *size as i128 {
                    return Err(Status::Range);
                }
                Ok(Some(At::There(*pid, base.wrapping_add(disp))))
            }
            Mem::Split {
                here,
                lo,
                hi,
                pid,
                base,
                size,
            } => {
                if a < 0 || b > *size as i128 {
                    return Err(Status::Range);
                }
                if a >= *lo as i128 && b <= *hi as i128 {
                    Ok(Some(At::Here(here.wrapping_add(disp as usize))))
                } else {
                    Ok(Some(At::There(*pid, base.wrapping_add(disp))))
                }
            }
            Mem::DynDirect(list) => {
                if a < 0 || b > u64::MAX as i128 {
                    return Err(Status::Range);
                }
                if !list.contains(a as u64, (b - a) as u64) {
                    return Err(Status::Range);
                }
                Ok(Some(At::Here(disp as usize as *mut u8)))
            }
            Mem::DynCma { pid, table } => {
                if a < 0 || b > u64::MAX as i128 {
                    return Err(Status::Range);
                }
                match table.contains(a as u64, (b - a) as u64) {
                    Some(true) => Ok(Some(At::There(*pid, disp))),
                    _ => Err(Status::Range),
                }
            }
        }
    }

    /// Remote pieces (address, length) of `layout` at `addr` in another process.
    fn pieces(addr: u64, layout: &Layout) -> Vec<(u64, usize)> {
        let mut v = Vec::new();
        layout.for_each_block(|o, n| v.push((addr.wrapping_add(o as i64 as u64), n)));
        v
    }

    /// Write the packed `data` (`layout.bytes()` bytes) into the layout at `disp`.
    ///
    /// # Safety
    /// `data` must be readable for `layout.bytes()` bytes.
    pub unsafe fn put(&self, disp: u64, layout: &Layout, data: *const u8) -> Status {
        match self.resolve(disp, layout) {
            Err(s) => s,
            Ok(None) => Status::Ok,
            Ok(Some(At::Here(p))) => {
                let mut o = 0usize;
                layout.for_each_block(|off, n| {
                    vmf_bb::copier::copy(p.offset(off), data.add(o), n);
                    o += n;
                });
                Status::Ok
            }
            Ok(Some(At::There(pid, a))) => {
                let pcs = Self::pieces(a, layout);
                // SAFETY: `data` holds `layout.bytes()`, the pieces' total (caller's contract).
                match unsafe { vmf_pal::cma::scatter(pid, data as *mut u8, &pcs, true) } {
                    Ok(()) => Status::Ok,
                    Err(_) => Status::Io,
                }
            }
        }
    }

    /// Read the layout at `disp` into the packed buffer `out`.
    ///
    /// # Safety
    /// `out` must be writable for `layout.bytes()` bytes.
    pub unsafe fn get(&self, disp: u64, layout: &Layout, out: *mut u8) -> Status {
        match self.resolve(disp, layout) {
            Err(s) => s,
            Ok(None) => Status::Ok,
            Ok(Some(At::Here(p))) => {
                let mut o = 0usize;
                layout.for_each_block(|off, n| {
                    vmf_bb::copier::copy(out.add(o), p.offset(off), n);
                    o += n;
                });
                Status::Ok
            }
            Ok(Some(At::There(pid, a))) => {
                let pcs = Self::pieces(a, layout);
                // SAFETY: `out` is writable for `layout.bytes()`, the pieces' total (caller's contract).
                match unsafe { vmf_pal::cma::scatter(pid, out, &pcs, false) } {
                    Ok(()) => Status::Ok,
                    Err(_) => Status::Io,
                }
            }
        }
    }

    /// Accumulate the packed operand `data` into the layout at `disp` with `op` on elements of kind
    /// `elem`; with `result`, the old contents are returned there (packed) first (get-accumulate,
    /// fetch-and-op). Blocks must hold whole elements (the packed operand has `layout.bytes() /
    /// elem.packed_size()` elements).
    ///
    /// # Safety
    /// `data` readable and `result` (if any) writable for `layout.bytes()` bytes. [`Target::can_rmw`]
    /// must hold.
    pub unsafe fn acc(
        &self,
        disp: u64,
        layout: &Layout,
        elem: Elem,
        op: ROp,
        data: *const u8,
        result: Option<*mut u8>,
    ) -> Status {
        if !reduce::allowed(op, elem) {
            return Status::Bad;
        }
        let s = elem.packed_size();
        if layout.bytes() % s != 0 {
            return Status::Bad;
        }
        let at = match self.resolve(disp, layout) {
            Err(st) => return st,
            Ok(None) => return Status::Ok,
            Ok(Some(a)) => a,
        };
        let Some(ctl) = self.ctl() else {
            return Status::Bad;
        };
        ctl.acc_lock();
        let st = self.acc_locked(&at, disp, layout, elem, op, data, result);
        ctl.acc_unlock();
        st
    }

    /// [`Target::acc`] with the accumulate lock held.
    #[allow(clippy::too_many_arguments)]
    unsafe fn acc_locked(
        &self,
        at: &At,
        disp: u64,
        layout: &Layout,
        elem: Elem,
        op: ROp,
        data: *const u8,
        result: Option<*mut u8>,
    ) -> Status {
        let s = elem.packed_size();
        if let At::Here(p) = at {
            // In place when every block holds whole elements (always, but for pair types split by a
            // datatype across blocks).
            let mut whole = true;
            layout.for_each_block(|_, n| whole &= n % s == 0);
            if whole {
                let mut o = 0usize;
                layout.for_each_block(|off, n| {
                    let q = p.offset(off);
                    if let Some(r) = result {
                        std::ptr::copy_nonoverlapping(q, r.add(o), n);
                    }
                    reduce::apply(op, elem, data.add(o), q, n / s, s);
                    o += n;
                });
                return Status::Ok;
            }
        }
        // Gather, reduce, scatter (single copy, or elements split across blocks).
        let bytes = layout.bytes();
        let mut tmp = vec![0u8; bytes];
        let mut st = self.get(disp, layout, tmp.as_mut_ptr());
        if st == Status::Ok {
            if let Some(r) = result {
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), r, bytes);
            }
            if op != ROp::NoOp {
                reduce::apply(op, elem, data, tmp.as_mut_ptr(), bytes / s, s);
                st = self.put(disp, layout, tmp.as_ptr());
            }
        }
        st
    }

    /// Compare-and-swap one element at `disp`: if it equals `compare`, store `new`; the old value goes
    /// to `result`.
    ///
    /// # Safety
    /// `compare`, `new` readable and `result` writable for one element. [`Target::can_rmw`] must hold.
    pub unsafe fn cas(
        &self,
        disp: u64,
        elem: Elem,
        compare: *const u8,
        new: *const u8,
        result: *mut u8,
    ) -> Status {
        let s = elem.packed_size();
        let run = crate::layout::contig_run(s);
        let layout = Layout::contig(&run);
        match self.resolve(disp, &layout) {
            Err(st) => return st,
            Ok(None) => return Status::Ok,
            Ok(Some(_)) => {}
        }
        let Some(ctl) = self.ctl() else {
            return Status::Bad;
        };
        let mut cur = [0u8; 32];
        ctl.acc_lock();
        let mut st = self.get(disp, &layout, cur.as_mut_ptr());
        if st == Status::Ok {
            std::ptr::copy_nonoverlapping(cur.as_ptr(), result, s);
            if std::slice::from_raw_parts(compare, s) == &cur[..s] {
                st = self.put(disp, &layout, new);
            }
        }
        ctl.acc_unlock();
        st
    }

    /// Try once to take the member's passive-target lock.
    pub fn try_lock(&self, excl: bool) -> Status {
        match self.ctl() {
            Some(c) if c.try_lock(excl) => Status::Ok,
            Some(_) => Status::Busy,
            None => Status::Bad,
        }
    }

    /// Release the member's passive-target lock.
    pub fn unlock(&self, excl: bool) -> Status {
        match self.ctl() {
            Some(c) => {
                c.unlock(excl);
                Status::Ok
            }
            None => Status::Bad,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::HeapCtl;
    use crate::layout::{contig_run, Run};

    fn target(buf: &mut [u8], ctl: &HeapCtl) -> Target {
        Target {
            mem: Mem::Direct {
                base: buf.as_mut_ptr(),
                size: buf.len() as u64,
            },
            ctl: Some(ctl.ptr() as *const Ctl),
        }
    }

    #[test]
    fn put_get_through_a_strided_layout_and_range_checks_work() {
        let mut win = vec![0u8; 64];
        let c = HeapCtl::new();
        let t = target(&mut win, &c);
        let runs = [Run {
            off: 0,
            len: 2,
            reps: 3,
            stride: 4,
        }];
        let l = Layout {
            runs: &runs,
            count: 2,
            extent: 16,
        };
        let data: Vec<u8> = (1..=12).collect();
        assert_eq!(unsafe { t.put(8, &l, data.as_ptr()) }, Status::Ok);
        assert_eq!(&win[8..18], &[1, 2, 0, 0, 3, 4, 0, 0, 5, 6]);
        assert_eq!(&win[24..34], &[7, 8, 0, 0, 9, 10, 0, 0, 11, 12]);
        let mut back = vec![0u8; 12];
        let t = target(&mut win, &c);
        assert_eq!(unsafe { t.get(8, &l, back.as_mut_ptr()) }, Status::Ok);
        assert_eq!(back, data);
        // 8 + 16 + 10 = 34 <= 64, but at 40 the second element ends at 66.
        assert_eq!(unsafe { t.put(40, &l, data.as_ptr()) }, Status::Range);
        let r = contig_run(1);
        assert_eq!(unsafe { t.get(64, &Layout::contig(&r), back.as_mut_ptr()) }, Status::Range);
    }

    #[test]
    fn accumulate_fetch_and_cas_work() {
        let mut win = vec![0u8; 64];
        let c = HeapCtl::new();
        let t = target(&mut win, &c);
        let r = contig_run(16);
        let l = Layout::contig(&r);
        let opnd: Vec<u8> = [5i64, -2].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut old = vec![0u8; 16];
        for _ in 0..3 {
            assert_eq!(
                unsafe { t.acc(8, &l, Elem::I64, ROp::Sum, opnd.as_ptr(), Some(old.as_mut_ptr())) },
                Status::Ok
            );
        }
        assert_eq!(i64::from_ne_bytes(old[..8].try_into().unwrap()), 10);
        assert_eq!(i64::from_ne_bytes(win[8..16].try_into().unwrap()), 15);
        assert_eq!(i64::from_ne_bytes(win[16..24].try_into().unwrap()), -6);
        // Unaligned doubles work alike.
        let t = target(&mut win, &c);
        let r8 = contig_run(8);
        let one = Layout::contig(&r8);
        let x = 2.5f64.to_ne_bytes();
        unsafe {
            t.acc(35, &one, Elem::F64, ROp::Sum, x.as_ptr(), None);
            t.acc(35, &one, Elem::F64, ROp::Sum, x.as_ptr(), None);
        }
        assert_eq!(f64::from_ne_bytes(win[35..43].try_into().unwrap()), 5.0);
        let t = target(&mut win, &c);
        let mut res = [0u8; 8];
        let (cmp, new) = (15i64.to_ne_bytes(), 99i64.to_ne_bytes());
        assert_eq!(
            unsafe { t.cas(8, Elem::I64, cmp.as_ptr(), new.as_ptr(), res.as_mut_ptr()) },
            Status::Ok
        );
        assert_eq!(i64::from_ne_bytes(res), 15);
        assert_eq!(i64::from_ne_bytes(win[8..16].try_into().unwrap()), 99);
        let t = target(&mut win, &c);
        assert_eq!(unsafe { t.acc(60, &l, Elem::I64, ROp::Sum, opnd.as_ptr(), None) }, Status::Range);
        assert_eq!(unsafe { t.acc(0, &l, Elem::F64, ROp::Band, opnd.as_ptr(), None) }, Status::Bad);
        assert_eq!(unsafe { Ctl::at(c.ptr()) }.acc.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn concurrent_accumulates_from_threads_are_exact() {
        let mut win = vec![0u8; 64];
        let c = HeapCtl::new();
        let t = target(&mut win, &c);
        std::thread::scope(|s| {
            for k in 0..4 {
                let t = t.clone();
                s.spawn(move || {
                    let r = contig_run(8);
                    let l = Layout::contig(&r);
                    for _ in 0..5000 {
                        let one = 1u64.to_ne_bytes();
                        let mut old = [0u8; 8];
                        // SAFETY: one element each.
                        unsafe {
                            if k % 2 == 0 {
                                t.acc(0, &l, Elem::U64, ROp::Sum, one.as_ptr(), Some(old.as_mut_ptr()));
                            } else {
                                // A compare-and-swap increment on the same word.
                                let mut cur = [0u8; 8];
                                t.acc(0, &l, Elem::U64, ROp::NoOp, one.as_ptr(), Some(cur.as_mut_ptr()));
                                loop {
                                    let nw = (u64::from_ne_bytes(cur) + 1).to_ne_bytes();
                                    t.cas(0, Elem::U64, cur.as_ptr(), nw.as_ptr(), old.as_mut_ptr());
                                    if old == cur {
                                        break;
                                    }
                                    cur = old;
                                }
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(u64::from_ne_bytes(win[..8].try_into().unwrap()), 20_000);
    }

    #[test]
    fn dynamic_windows_check_attached_ranges_works() {
        let mut mem = vec![0u8; 32];
        let a = mem.as_mut_ptr() as u64;
        let list = AttachList::new();
        list.attach(a, 16).unwrap();
        let c = HeapCtl::new();
        let t = Target {
            mem: Mem::DynDirect(list.clone()),
            ctl: Some(c.ptr() as *const Ctl),
        };
        let r = contig_run(8);
        let l = Layout::contig(&r);
        let v = 7u64.to_ne_bytes();
        assert_eq!(unsafe { t.put(a + 8, &l, v.as_ptr()) }, Status::Ok);
        assert_eq!(mem[8], 7);
        assert_eq!(unsafe { t.put(a + 9, &l, v.as_ptr()) }, Status::Range);
        list.detach(a).unwrap();
        assert_eq!(unsafe { t.put(a, &l, v.as_ptr()) }, Status::Range);
    }
}
