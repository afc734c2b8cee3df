//! Memory for windows and for `MPI_Alloc_mem` that co-resident peers can map: memfd-backed blocks
//! registered by address, so that a window created over such memory (`MPI_Win_create` on memory from
//! `MPI_Alloc_mem`) is reached by peers with plain loads and stores instead of single copies.
use std::collections::BTreeMap;
use std::sync::Mutex;
use vmf_pal::shmem::SharedMem;

static BLOCKS: Mutex<BTreeMap<usize, SharedMem>> = Mutex::new(BTreeMap::new());

/// A new zeroed block of at least `len` bytes that peers of this kernel can map, or `None` if the
/// kernel refuses (no memfd).
pub fn alloc_shared(len: usize) -> Option<*mut u8> {
    let m = SharedMem::create("vmf-alloc", len).ok()?;
    let p = m.as_ptr();
    BLOCKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, m);
    Some(p)
}

/// Free a block of [`alloc_shared`]; false if `p` is not one.
pub fn free_shared(p: *mut u8) -> bool {
    BLOCKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize))
        .is_some()
}

/// If `[p, p + len)` lies inside a block of [`alloc_shared`]: its descriptor, the block's length and
/// the offset of `p` in it.
pub fn lookup(p: *const u8, len: usize) -> Option<(i32, usize, usize)> {
    let g = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    let (&start, m) = g.range(..=p as usize).next_back()?;
    let off = p as usize - start;
    (off.checked_add(len)? <= m.len()).then(|| (m.raw_fd(), m.len(), off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_by_any_inner_range_works() {
        let p = alloc_shared(10_000).unwrap();
        let (fd, len, off) = lookup(unsafe { p.add(100) }, 50).unwrap();
        assert!(fd >= 0 && len >= 10_000 && off == 100);
        assert!(lookup(p, len + 1).is_none());
        assert!(lookup(std::ptr::null(), 1).is_none());
        assert!(free_shared(p));
        assert!(!free_shared(p));
        assert!(lookup(p, 1).is_none());
    }
}
