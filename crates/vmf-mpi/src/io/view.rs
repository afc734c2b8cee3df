//! File views (MPI 4.0 §14.3): which bytes of the file a rank sees, and in which data representation.
//!
//! A view is a displacement, an elementary type and a filetype tiled from the displacement on. The
//! program's data form a *stream* (the bytes its accesses move, in order); [`View::pieces`] maps a range
//! of the stream onto the file's byte ranges. The filetype is flattened once, at `MPI_File_set_view`, into
//! runs (offset, block length, repetitions, stride) with the stream bytes that precede each run, so
//! mapping a position is a binary search plus arithmetic, whatever the size of the type.
use crate::datatype::{self, desc};
use crate::*;
use std::ffi::{c_int, c_void};

/// One run of the flattened filetype: `reps` blocks of `len` bytes, `stride` apart, from `off` (relative
/// to the start of a tile); `cum` stream bytes of the tile come before it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Seg {
    pub off: i64,
    pub len: usize,
    pub reps: usize,
    pub stride: i64,
    pub cum: usize,
}

/// How data is represented in the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rep {
    /// "native" and "internal": the bytes of memory.
    Native,
    /// "external32": big-endian, the standard's sizes.
    External32,
    /// A representation registered with MPI_Register_datarep (index into `State::datareps`).
    User(usize),
}

/// A data representation registered with MPI_Register_datarep(_c).
pub(crate) struct Datarep {
    pub name: String,
    pub read: Option<ConvFn>,
    pub write: Option<ConvFn>,
    pub extent: Option<ExtentFn>,
    pub extra: *mut c_void,
}

/// A conversion function of either flavour (the `_c` one takes an MPI_Count).
#[derive(Clone, Copy)]
pub(crate) enum ConvFn {
    Int(DatarepConv),
    Big(DatarepConvC),
}

pub(crate) type DatarepConv =
    unsafe extern "C" fn(*mut c_void, MPI_Datatype, c_int, *mut c_void, i64, *mut c_void) -> c_int;
pub(crate) type DatarepConvC = unsafe extern "C" fn(
    *mut c_void,
    MPI_Datatype,
    MPI_Count,
    *mut c_void,
    i64,
    *mut c_void,
) -> c_int;
pub(crate) type ExtentFn = unsafe extern "C" fn(MPI_Datatype, *mut MPI_Aint, *mut c_void) -> c_int;

/// A file view.
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub disp: i64,
    /// The etype and filetype as the view keeps them (derived ones are the view's own duplicates).
    pub etype: MPI_Datatype,
    pub filetype: MPI_Datatype,
    pub datarep: String,
    pub rep: Rep,
    /// Bytes of one etype and of one filetype (data bytes, not extent), and the filetype's extent.
    pub esize: usize,
    pub ftsize: usize,
    pub ftext: i64,
    pub segs: Vec<Seg>,
}

impl View {
    /// The default view: displacement 0, etype and filetype MPI_BYTE, "native".
    pub fn bytes() -> View {
        View {
            disp: 0,
            etype: MPI_BYTE,
            filetype: MPI_BYTE,
            datarep: "native".into(),
            rep: Rep::Native,
            esize: 1,
            ftsize: 1,
            ftext: 1,
            segs: vec![Seg {
                off: 0,
                len: 1,
                reps: 1,
                stride: 1,
                cum: 0,
            }],
        }
    }

    /// A view of (disp, etype, filetype, rep); the types are checked (overlaps only refused on a `writable`
    /// file) and flattened (not duplicated).
    pub fn new(
        disp: i64,
        etype: MPI_Datatype,
        filetype: MPI_Datatype,
        datarep: &str,
        rep: Rep,
        writable: bool,
    ) -> R<View> {
        let st = state()?;
        let e = desc(st, etype)?;
        let f = desc(st, filetype)?;
        for (t, d, what) in [(etype, &e, "etype"), (filetype, &f, "filetype")] {
            if datatype::is_derived(t) && !d.committed {
                return err(MPI_ERR_TYPE, format!("the {what} is not committed"));
            }
        }
        for (d, what) in [(&e, "etype"), (&f, "filetype")] {
            if !monotone(&d.blocks, writable) {
                return err(MPI_ERR_IO, format!(
                    "the {what}'s displacements must be non-negative, non-decreasing and (on a writable file) not overlap"
                ));
            }
        }
        if e.size == 0 {
            return err(MPI_ERR_TYPE, "the etype has size 0");
        }
        if f.size % e.size != 0 {
            return err(
                MPI_ERR_TYPE,
                format!(
                    "the filetype ({} bytes) is not made of whole etypes ({} bytes)",
                    f.size, e.size
                ),
            );
        }
        if disp < 0 {
            return err(MPI_ERR_ARG, format!("displacement {disp} is negative"));
        }
        let mut segs: Vec<Seg> = Vec::new();
        let mut cum = 0usize;
        for b in &f.blocks {
            if b.len == 0 || b.reps == 0 {
                continue;
            }
            let (len, reps, stride) = if b.reps > 1 && b.stride == b.len as isize {
                (b.len * b.reps, 1, (b.len * b.reps) as i64)
            } else {
                (b.len, b.reps, b.stride as i64)
            };
            match segs.last_mut() {
                // A single block right after a single block: one block.
                Some(l) if l.reps == 1 && reps == 1 && l.off + l.len as i64 == b.off as i64 => {
                    l.len += len;
                    l.stride = l.len as i64;
                }
                _ => segs.push(Seg {
                    off: b.off as i64,
                    len,
                    reps,
                    stride,
                    cum,
                }),
            }
            cum += len * reps;
        }
        Ok(View {
            disp,
            etype,
            filetype,
            datarep: datarep.into(),
            rep,
            esize: e.size,
            ftsize: f.size,
            ftext: f.extent() as i64,
            segs,
        })
    }

    /// Whether the stream is one contiguous run of the file (the filetype tiles without gaps).
    pub fn contiguous(&self) -> bool {
        matches!(&self.segs[..], [s] if s.off == 0 && s.reps == 1 && s.len as i64 == self.ftext)
    }

    /// The file byte ranges (offset, length) holding stream bytes [start, start + len), in stream order,
    /// adjacent ranges merged.
    pub fn pieces(&self, start: u64, len: usize) -> R<Vec<(i64, usize)>> {
        let mut out: Vec<(i64, usize)> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let mut push = |off: i64, n: usize| match out.last_mut() {
            Some(l) if l.0 + l.1 as i64 == off => l.1 += n,
            _ => out.push((off, n)),
        };
        if self.contiguous() {
            push(self.disp + start as i64, len);
            return Ok(out);
        }
        if self.ftsize == 0 {
            return err(MPI_ERR_IO, "the file view's filetype holds no data");
        }
        let ft = self.ftsize as u64;
        let mut tile = (start / ft) as i64;
        let within = (start % ft) as usize;
        let mut s = self.segs.partition_point(|g| g.cum <= within) - 1;
        let mut inner = within - self.segs[s].cum;
        let mut left = len;
        while left > 0 {
            let g = self.segs[s];
            let base = self.disp + tile * self.ftext + g.off;
            let mut r = inner / g.len;
            let mut boff = inner % g.len;
            while r < g.reps && left > 0 {
                let n = (g.len - boff).min(left);
                push(base + r as i64 * g.stride + boff as i64, n);
                left -= n;
                boff = 0;
                r += 1;
            }
            inner = 0;
            s += 1;
            if s == self.segs.len() {
                s = 0;
                tile += 1;
            }
        }
        Ok(out)
    }

    /// Stream bytes that lie before file offset `end` (how much of the view a file of that size holds).
    pub fn stream_before(&self, end: i64) -> u64 {
        if end <= self.disp || self.ftsize == 0 {
            return 0;
        }
        let rel = end - self.disp;
        let (tiles, rem) = if self.ftext > 0 {
            (rel / self.ftext, rel % self.ftext)
        } else {
            (0, rel)
        };
        let mut n = tiles as u64 * self.ftsize as u64;
        for g in &self.segs {
            for r in 0..g.reps as i64 {
                let o = g.off + r * g.stride;
                if o >= rem {
                    break;
                }
                n += (g.len as i64).min(rem - o) as u64;
            }
        }
        n
    }

    /// Stream bytes of `count` elements of memory type `dt` in this view's representation.
    pub fn stream_len(&self, count: usize, dt: MPI_Datatype) -> R<usize> {
        let one = match self.rep {
            Rep::Native => datatype::ext_size(dt)?.1,
            Rep::External32 => datatype::external32_size(dt)?,
            Rep::User(i) => user_size(i, dt)?,
        };
        one.checked_mul(count).ok_or_else(|| MpiErr {
            code: MPI_ERR_COUNT,
            msg: "count too large".into(),
        })
    }
}

/// Whether blocks in typemap order start at or after 0, each at or after the previous one, and (when the
/// file can be written: `disjoint`) after the previous one ends (MPI 4.0 §14.3; overlaps are fine for
/// reading, as in ROMIO).
fn monotone(blocks: &[datatype::Run], disjoint: bool) -> bool {
    let (mut start, mut end) = (0isize, 0isize);
    for b in blocks.iter().filter(|b| b.len > 0 && b.reps > 0) {
        let bad_stride = b.reps > 1 && (b.stride < 0 || (disjoint && b.stride < b.len as isize));
        if b.off < start || (disjoint && b.off < end) || bad_stride {
            return false;
        }
        start = b.off + b.stride * (b.reps as isize - 1);
        end = start + b.len as isize;
    }
    true
}

/// Bytes one element of `dt` takes in user representation `i` (its extent function, member by member).
fn user_size(i: usize, dt: MPI_Datatype) -> R<usize> {
    let st = state()?;
    let (f, extra) = match st.datareps.get(i) {
        Some(d) => (d.extent, d.extra),
        None => return err(MPI_ERR_UNSUPPORTED_DATAREP, "unknown data representation"),
    };
    let mut total = 0usize;
    for (t, n) in datatype::member_types(dt)? {
        let e = match f {
            Some(f) => {
                let mut e: MPI_Aint = 0;
                // SAFETY: the program's extent function, called as MPI_Register_datarep documents.
                let rc = unsafe { f(t, &mut e, extra) };
                if rc != MPI_SUCCESS {
                    return err(rc, "the data representation's extent function failed");
                }
                usize::try_from(e).map_err(|_| MpiErr {
                    code: MPI_ERR_CONVERSION,
                    msg: format!("negative file extent {e}"),
                })?
            }
            None => datatype::ext_size(t)?.1,
        };
        total += e * n;
    }
    Ok(total)
}

pub(crate) const MPI_BYTE: MPI_Datatype = 0x4c00_010d;
pub(crate) const MPI_ERR_IO: c_int = 32;
pub(crate) const MPI_ERR_CONVERSION: c_int = 23;
pub(crate) const MPI_ERR_UNSUPPORTED_DATAREP: c_int = 43;

#[cfg(test)]
mod tests {
    use super::*;

    fn view(disp: i64, ftext: i64, segs: &[(i64, usize, usize, i64)]) -> View {
        let mut cum = 0;
        let segs: Vec<Seg> = segs
            .iter()
            .map(|&(off, len, reps, stride)| {
                let s = Seg {
                    off,
                    len,
                    reps,
                    stride,
                    cum,
                };
                cum += len * reps;
                s
            })
            .collect();
        View {
            disp,
            etype: MPI_BYTE,
            filetype: MPI_BYTE,
            datarep: "native".into(),
            rep: Rep::Native,
            esize: 1,
            ftsize: cum,
            ftext,
            segs,
        }
    }

    #[test]
    fn contiguous_view_maps_to_one_piece_at_the_displacement() {
        let v = View::bytes();
        assert!(v.contiguous());
        assert_eq!(v.pieces(10, 5).unwrap(), vec![(10, 5)]);
        let mut d = View::bytes();
        d.disp = 100;
        assert_eq!(d.pieces(0, 3).unwrap(), vec![(100, 3)]);
    }

    #[test]
    fn strided_view_maps_across_blocks_and_tiles() {
        // A vector of 2 blocks of 4 bytes, stride 16, extent 32: bytes 0..4 and 16..20 of each tile.
        let v = view(8, 32, &[(0, 4, 2, 16)]);
        assert!(!v.contiguous());
        assert_eq!(v.pieces(0, 8).unwrap(), vec![(8, 4), (24, 4)]);
        // Starting inside the second block and running into the next tile.
        assert_eq!(v.pieces(6, 5).unwrap(), vec![(26, 2), (40, 3)]);
        assert_eq!(v.stream_before(8), 0);
        assert_eq!(v.stream_before(10), 2);
        assert_eq!(v.stream_before(40), 8);
        assert_eq!(v.stream_before(42), 10);
    }

    #[test]
    fn adjacent_blocks_are_merged_and_multi_run_types_keep_order() {
        // Two runs: 2 bytes at 0, 3 bytes at 10; extent 20.
        let v = view(0, 20, &[(0, 2, 1, 2), (10, 3, 1, 3)]);
        assert_eq!(v.pieces(1, 6).unwrap(), vec![(1, 1), (10, 3), (20, 2)]);
        assert_eq!(v.pieces(5, 1).unwrap(), vec![(20, 1)]);
        // Tiles with a gap between them stay apart; a tile ending where the next begins merges.
        let w = view(0, 4, &[(2, 2, 1, 2)]);
        assert_eq!(w.pieces(0, 4).unwrap(), vec![(2, 2), (6, 2)]);
        assert_eq!(
            view(0, 2, &[(0, 2, 1, 2)]).pieces(1, 4).unwrap(),
            vec![(1, 4)]
        );
    }
}
