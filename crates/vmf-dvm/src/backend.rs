//! How a node reaches the page nodes' memory: one-sided operations on word offsets of a page node's
//! window. [`Direct`] when every node of the application maps every page node's memory (co-resident:
//! processes, containers, VMs sharing a region): CPU atomics, loads and stores, and pages used in place.
//! [`Remote`] otherwise: `vmf-rma` window operations (load/store or single copy where mapped, the target's
//! agent over TCP elsewhere), every read-modify-write under the target's accumulate lock so mapped and
//! remote origins stay atomic with respect to each other.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A failed one-sided operation (a dead or unreachable page node).
pub type BResult<T> = Result<T, String>;

/// One-sided access to page node `t`'s window at byte offset `off` (8-byte aligned for words).
pub trait Backend: Send + Sync {
    fn load(&self, t: usize, off: usize) -> BResult<u64>;
    fn store(&self, t: usize, off: usize, v: u64) -> BResult<()>;
    /// Compare-and-swap; returns the previous value.
    fn cas(&self, t: usize, off: usize, old: u64, new: u64) -> BResult<u64>;
    fn fetch_add(&self, t: usize, off: usize, v: u64) -> BResult<u64>;
    /// Copy `out.len()` bytes from the window.
    fn read(&self, t: usize, off: usize, out: &mut [u8]) -> BResult<()>;
    /// Copy `data` into the window; complete at the target on return.
    fn write(&self, t: usize, off: usize, data: &[u8]) -> BResult<()>;
    /// The window's memory at `off`, when this node may use it in place.
    fn frame(&self, t: usize, off: usize) -> Option<*mut u8>;
}

/// Page nodes' windows mapped in this process.
pub struct Direct {
    bases: Vec<(*mut u8, usize)>,
}

// SAFETY: the pointers are to shared mappings that outlive the backend; all access is atomic or
// confined by the page protocol.
unsafe impl Send for Direct {}
unsafe impl Sync for Direct {}

impl Direct {
    /// `bases[t]`: page node t's window (null, 0 for ranks without one).
    pub fn new(bases: Vec<(*mut u8, usize)>) -> Direct {
        Direct { bases }
    }
    #[inline]
    fn at(&self, t: usize, off: usize, len: usize) -> BResult<*mut u8> {
        match self.bases.get(t) {
            Some(&(b, n)) if !b.is_null() && off.checked_add(len).is_some_and(|e| e <= n) => Ok(unsafe { b.add(off) }),
            _ => Err(format!("offset {off}+{len} outside the window of rank {t}")),
        }
    }
    #[inline]
    fn word(&self, t: usize, off: usize) -> BResult<&AtomicU64> {
        let p = self.at(t, off, 8)?;
        if !(p as usize).is_multiple_of(8) {
            return Err(format!("unaligned word at {off} of rank {t}"));
        }
        // SAFETY: in bounds, aligned, in a live shared mapping.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }
}

impl Backend for Direct {
    #[inline]
    fn load(&self, t: usize, off: usize) -> BResult<u64> {
        Ok(self.word(t, off)?.load(Ordering::Acquire))
    }
    #[inline]
    fn store(&self, t: usize, off: usize, v: u64) -> BResult<()> {
        self.word(t, off)?.store(v, Ordering::Release);
        Ok(())
    }
    #[inline]
    fn cas(&self, t: usize, off: usize, old: u64, new: u64) -> BResult<u64> {
        Ok(match self.word(t, off)?.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(v) | Err(v) => v,
        })
    }
    #[inline]
    fn fetch_add(&self, t: usize, off: usize, v: u64) -> BResult<u64> {
        Ok(self.word(t, off)?.fetch_add(v, Ordering::AcqRel))
    }
    fn read(&self, t: usize, off: usize, out: &mut [u8]) -> BResult<()> {
        let p = self.at(t, off, out.len())?;
        // SAFETY: in bounds; the page protocol gives this thread the page.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
    fn write(&self, t: usize, off: usize, data: &[u8]) -> BResult<()> {
        let p = self.at(t, off, data.len())?;
        // SAFETY: as for read.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }
    #[inline]
    fn frame(&self, t: usize, off: usize) -> Option<*mut u8> {
        self.at(t, off, 1).ok()
    }
}

/// Page nodes reached through a `vmf-rma` window (any route).
pub struct Remote<'f> {
    win: Mutex<vmf_rma::Win<'f>>,
}


// SAFETY: all access to the window is serialised by the mutex.
unsafe impl Send for Remote<'_> {}
unsafe impl Sync for Remote<'_> {}

impl<'f> Remote<'f> {
    pub fn new(win: vmf_rma::Win<'f>) -> Remote<'f> {
        Remote { win: Mutex::new(win) }
    }
    /// The window back.
    pub fn into_inner(self) -> vmf_rma::Win<'f> {
        self.win.into_inner().unwrap_or_else(|p| p.into_inner())
    }
    fn with<T>(&self, f: impl FnOnce(&mut vmf_rma::Win<'f>) -> vmf_rma::Result<T>) -> BResult<T> {
        let mut w = self.win.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut w).map_err(|e| e.to_string())
    }
}

impl Backend for Remote<'_> {
    fn load(&self, t: usize, off: usize) -> BResult<u64> {
        // An atomic read: fetch-and-add of zero, under the same lock as every other update.
        self.with(|w| w.fetch_add_u64(t, off, 0))
    }
    fn store(&self, t: usize, off: usize, v: u64) -> BResult<()> {
        self.with(|w| w.swap_u64(t, off, v).map(|_| ()))
    }
    fn cas(&self, t: usize, off: usize, old: u64, new: u64) -> BResult<u64> {
        self.with(|w| w.compare_swap_u64(t, off, old, new))
    }
    fn fetch_add(&self, t: usize, off: usize, v: u64) -> BResult<u64> {
        self.with(|w| w.fetch_add_u64(t, off, v))
    }
    fn read(&self, t: usize, off: usize, out: &mut [u8]) -> BResult<()> {
        self.with(|w| w.get(t, off, out))
    }
    fn write(&self, t: usize, off: usize, data: &[u8]) -> BResult<()> {
        self.with(|w| {
            w.put(t, off, data)?;
            w.flush(t)
        })
    }
    fn frame(&self, _t: usize, _off: usize) -> Option<*mut u8> {
        None
    }
}
