//! Derived datatypes: constructors, commit/free/dup, extents and sizes, names, envelope/contents,
//! Get_address, Pack/Unpack(_external), and the staging used by point-to-point and collectives.
//!
//! A derived type is kept *flattened*: the byte blocks `(offset, length)` of one element in typemap order
//! (adjacent blocks merged), with its size, bounds and true bounds. Sending `count` elements packs the
//! blocks of each element (`i * extent + offset`) into a staging buffer; receiving unpacks. A derived type
//! whose one block is `[0, extent)` (e.g. a contiguous type of a basic type) is marked `contig` and moves
//! straight from the user buffer like a predefined type: contiguous data never pays for the machinery.
//! Predefined types never touch the table (their size is in the handle); the pair types with padding
//! (MPI_DOUBLE_INT...) are described on the fly as their two members and move packed, like a derived type.
use crate::*;
use std::ffi::{c_char, c_int, c_void, CStr};

pub(crate) const DT_BASE: u32 = 0xcc00_0000;

pub const MPI_COMBINER_NAMED: c_int = 1;
pub const MPI_COMBINER_DUP: c_int = 2;
pub const MPI_COMBINER_CONTIGUOUS: c_int = 3;
pub const MPI_COMBINER_VECTOR: c_int = 4;
pub const MPI_COMBINER_HVECTOR: c_int = 6;
pub const MPI_COMBINER_INDEXED: c_int = 7;
pub const MPI_COMBINER_HINDEXED: c_int = 9;
pub const MPI_COMBINER_INDEXED_BLOCK: c_int = 10;
pub const MPI_COMBINER_STRUCT: c_int = 12;
pub const MPI_COMBINER_SUBARRAY: c_int = 13;
pub const MPI_COMBINER_DARRAY: c_int = 14;
pub const MPI_COMBINER_F90_REAL: c_int = 15;
pub const MPI_COMBINER_F90_COMPLEX: c_int = 16;
pub const MPI_COMBINER_F90_INTEGER: c_int = 17;
pub const MPI_COMBINER_RESIZED: c_int = 18;
pub const MPI_COMBINER_HINDEXED_BLOCK: c_int = 19;
const MPI_ORDER_C: c_int = 56;
const MPI_ORDER_FORTRAN: c_int = 57;
const MPI_DISTRIBUTE_BLOCK: c_int = 121;
const MPI_DISTRIBUTE_CYCLIC: c_int = 122;
const MPI_DISTRIBUTE_NONE: c_int = 123;
const MPI_DISTRIBUTE_DFLT_DARG: c_int = -49767;

/// `reps` byte blocks of `len` bytes, the first at `off` and each `stride` bytes after the last: a
/// vector of any length is one run. The one-sided layer's type, so a target datatype travels as it is.
pub(crate) use vmf_rma::Run;

/// A datatype, flattened.
#[derive(Clone, Debug)]
pub(crate) struct Dtype {
    /// Byte blocks of one element as runs, in typemap order, relative to the element's start.
    pub blocks: Vec<Run>,
    pub size: usize,
    pub lb: isize,
    pub ub: isize,
    pub true_lb: isize,
    pub true_ub: isize,
    /// Alignment (for the padding of struct types, as MPICH does).
    pub align: usize,
    /// The one basic type all elements share (MPI_DATATYPE_NULL if mixed): reductions and Get_elements.
    pub basic: MPI_Datatype,
    /// Elements of `basic` per element (a pair type counts once: the unit of reductions).
    pub nbasic: usize,
    /// Basic elements per element, as MPI_Get_elements counts them (a pair type counts twice).
    pub nelem: usize,
    /// One block `[0, extent)`: moves as `count * size` bytes from the buffer.
    pub contig: bool,
    /// An element is `nbasic` elements of `basic` back to back from offset 0, each at its extent (a
    /// contiguous type, or an array of padded pair types): a predefined reduction may work on the buffer
    /// as an array of `basic`.
    pub dense: bool,
    pub committed: bool,
    pub name: String,
    pub combiner: c_int,
    pub ints: Vec<c_int>,
    pub aints: Vec<MPI_Aint>,
    /// Large counts (MPI 4.0): the counts and displacements of a type made by a `_c` constructor.
    pub counts: Vec<MPI_Count>,
    pub types: Vec<MPI_Datatype>,
    /// User attributes (MPI_Type_set_attr): (keyval, value).
    pub attrs: Vec<(c_int, *mut c_void)>,
    /// References handed out by MPI_Type_get_contents (each to be released with MPI_Type_free, as in
    /// MPICH, where the returned handle is the same object): the type goes when the last one is freed.
    pub refs: u32,
}

impl Dtype {
    #[inline]
    pub fn extent(&self) -> isize {
        self.ub - self.lb
    }
}

#[inline]
pub(crate) fn is_derived(dt: MPI_Datatype) -> bool {
    (dt as u32) & 0xfc00_0000 == DT_BASE
}

/// Description of a predefined type, built on the fly. A pair type is the C struct `{ value; index; }`
/// MPICH describes: its two members (MPI_DOUBLE_INT: 8 bytes at 0 and 4 at 8, size 12, extent 16), so
/// it packs without the struct's padding.
fn predefined(dt: MPI_Datatype) -> R<Dtype> {
    let ext = type_extent(dt)?;
    let mut b = Build::new();
    let (true_ub, align, nelem) = match pair_members(dt) {
        Some((v, i, ioff)) => {
            let (vs, is) = (type_extent(v)?, type_extent(i)?);
            b.push(0, vs);
            b.push(ioff as isize, is);
            (ioff + is, vs.max(is).min(16), 2)
        }
        None => {
            b.push(0, ext);
            // A complex number aligns as its parts.
            let align = match dt as u32 & 0xff {
                0x1e | 0x22 | 0x28 | 0x2a | 0x40 | 0x41 | 0x34 | 0x35 | 0x42 | 0x36 | 0x2c => {
                    ext / 2
                }
                _ => ext,
            };
            (ext, align.clamp(1, 16), usize::from(ext > 0))
        }
    };
    let size = type_size(dt)?;
    Ok(Dtype {
        contig: size == ext && b.blocks.len() <= 1,
        blocks: b.blocks,
        size,
        lb: 0,
        ub: ext as isize,
        true_lb: 0,
        true_ub: true_ub as isize,
        align,
        basic: dt,
        nbasic: 1,
        nelem,
        dense: true,
        committed: true,
        name: String::new(),
        combiner: MPI_COMBINER_NAMED,
        ints: vec![],
        aints: vec![],
        counts: vec![],
        types: vec![],
        attrs: vec![],
        refs: 0,
    })
}

/// The MPI-1 bound markers (MPI_Type_struct members of size 0 that set the lower and upper bound).
const MPI_LB: MPI_Datatype = 0x4c00_0010;
const MPI_UB: MPI_Datatype = 0x4c00_0011;

/// A pair type whose C struct has padding (all but MPI_FLOAT_INT and the pairs of one type): its size
/// is less than its extent.
#[inline]
fn is_padded_pair(dt: MPI_Datatype) -> bool {
    matches!(dt as u32, 0x8c00_0001..=0x8c00_0004)
}

/// A predefined type whose elements are contiguous bytes (size = extent): (buffer, count, type) moves
/// straight from the buffer. Derived types and the padded pair types go through [`layout`].
#[inline]
pub(crate) fn is_simple(dt: MPI_Datatype) -> bool {
    !is_derived(dt) && !is_padded_pair(dt)
}

/// The description of a type that may need packing: a derived type in place, a predefined one built.
pub(crate) fn desc(st: &State, dt: MPI_Datatype) -> R<std::borrow::Cow<'_, Dtype>> {
    if is_derived(dt) {
        get(st, dt).map(std::borrow::Cow::Borrowed)
    } else {
        predefined(dt).map(std::borrow::Cow::Owned)
    }
}

/// The description of any datatype (cloned: only for constructors and slow paths).
pub(crate) fn info(st: &State, dt: MPI_Datatype) -> R<Dtype> {
    if is_derived(dt) {
        get(st, dt).cloned()
    } else {
        predefined(dt)
    }
}

pub(crate) fn get(st: &State, dt: MPI_Datatype) -> R<&Dtype> {
    let i = (dt as u32 & 0x03ff_ffff) as usize;
    match st.types.get(i) {
        Some(Some(d)) if is_derived(dt) => Ok(d),
        _ => err(MPI_ERR_TYPE, format!("invalid datatype handle {dt:#x}")),
    }
}

/// A pending operation will use derived type `dt` later (a staged receive unpacks with it, a persistent
/// request packs with it at each start): MPI_Type_free must not let its slot be reused until `release`.
/// Mark derived type `dt` committed.
pub(crate) fn commit(st: &mut State, dt: MPI_Datatype) -> R {
    get(st, dt)?;
    let i = (dt as u32 & 0x03ff_ffff) as usize;
    st.types[i].as_mut().unwrap().committed = true;
    Ok(())
}

/// Free type slot `i`. Pending operations that still pack or unpack with the type hold it: then it goes
/// at their end.
fn drop_slot(st: &mut State, i: usize) {
    match st.type_holds.get_mut(i) {
        Some(h) if h.0 > 0 => h.1 = true,
        _ => discard(st, i),
    }
}

/// Remove type `i` and end its holds on the derived types it was built from (see [`create`]).
fn discard(st: &mut State, i: usize) {
    if let Some(d) = st.types.get_mut(i).and_then(|t| t.take()) {
        for t in d.types {
            release(st, t);
        }
    }
}

pub(crate) fn hold(st: &mut State, dt: MPI_Datatype) {
    if is_derived(dt) && get(st, dt).is_ok() {
        let i = (dt as u32 & 0x03ff_ffff) as usize;
        if st.type_holds.len() <= i {
            st.type_holds.resize(i + 1, (0, false));
        }
        st.type_holds[i].0 += 1;
    }
}

/// The end of a `hold`: a type the program already freed goes now.
pub(crate) fn release(st: &mut State, dt: MPI_Datatype) {
    if is_derived(dt) {
        let i = (dt as u32 & 0x03ff_ffff) as usize;
        if let Some(h) = st.type_holds.get_mut(i) {
            h.0 = h.0.saturating_sub(1);
            if h.0 == 0 && h.1 {
                h.1 = false;
                discard(st, i);
            }
        }
    }
}

fn add(st: &mut State, d: Dtype) -> MPI_Datatype {
    let i = put_in_free_slot(&mut st.types, 0, d);
    (DT_BASE | i as u32) as c_int
}

/// Extent (bytes between consecutive elements) and size of any datatype.
pub(crate) fn ext_size(dt: MPI_Datatype) -> R<(isize, usize)> {
    if !is_derived(dt) {
        return Ok((type_extent(dt)? as isize, type_size(dt)?));
    }
    let st = state()?;
    let d = get(st, dt)?;
    Ok((d.extent(), d.size))
}

// ------------------------------------------------------------------------------------------------ building

/// Most runs a flattened datatype may have (32 bytes each: 1 GiB of description).
const MAX_BLOCKS: usize = 1 << 25;

/// Builder of flattened typemaps.
struct Build {
    blocks: Vec<Run>,
    size: usize,
    lb: isize,
    ub: isize,
    tlb: isize,
    tub: isize,
    any: bool,
    align: usize,
    basic: Option<MPI_Datatype>,
    mixed: bool,
    nbasic: usize,
    nelem: usize,
}

impl Build {
    fn new() -> Build {
        Build {
            blocks: Vec::new(),
            size: 0,
            lb: 0,
            ub: 0,
            tlb: 0,
            tub: 0,
            any: false,
            align: 1,
            basic: None,
            mixed: false,
            nbasic: 0,
            nelem: 0,
        }
    }

    /// Widen the bounds by those of `n` consecutive elements of `c` at byte displacement `d` (an error
    /// when they overflow an address).
    fn bound(&mut self, c: &Dtype, d: isize, n: usize) -> R {
        let fit = |v: i128| {
            isize::try_from(v).map_err(|_| MpiErr {
                code: MPI_ERR_ARG,
                msg: format!(
                    "{n} elements of a type of extent {} at displacement {d} overflow an address",
                    c.extent()
                ),
            })
        };
        let (ext, d, n1) = (c.extent() as i128, d as i128, n as i128 - 1);
        let span = ext * n1;
        let (lo, hi, tlo, thi) = if ext >= 0 {
            let lo = d + c.lb as i128;
            (
                lo,
                lo + span + ext,
                d + c.true_lb as i128,
                d + span + c.true_ub as i128,
            )
        } else {
            let (lo, tlo) = (d + c.lb as i128 + span, d + span + c.true_lb as i128);
            (lo, d + c.ub as i128, tlo, d + c.true_ub as i128)
        };
        let (lo, hi, tlo, thi) = (fit(lo)?, fit(hi)?, fit(tlo)?, fit(thi)?);
        if !self.any {
            (self.lb, self.ub, self.tlb, self.tub) = (lo, hi, tlo, thi);
            self.any = true;
        } else {
            self.lb = self.lb.min(lo);
            self.ub = self.ub.max(hi);
            self.tlb = self.tlb.min(tlo);
            self.tub = self.tub.max(thi);
        }
        Ok(())
    }

    /// Count `n` more elements of `c`: size, basic elements, alignment and basic type.
    fn tally(&mut self, c: &Dtype, n: usize) -> R {
        self.size = c
            .size
            .checked_mul(n)
            .and_then(|s| s.checked_add(self.size))
            .filter(|&s| s <= isize::MAX as usize)
            .ok_or_else(|| MpiErr {
                code: MPI_ERR_ARG,
                msg: format!(
                    "the type would hold more than {} bytes ({n} more elements of {} bytes)",
                    isize::MAX,
                    c.size
                ),
            })?;
        self.align = self.align.max(c.align);
        if c.basic == MPI_DATATYPE_NULL {
            self.mixed = true;
        } else {
            match self.basic {
                None => self.basic = Some(c.basic),
                Some(b) if b != c.basic => self.mixed = true,
                _ => {}
            }
        }
        self.nbasic = self.nbasic.saturating_add(c.nbasic.saturating_mul(n));
        self.nelem = self.nelem.saturating_add(c.nelem.saturating_mul(n));
        Ok(())
    }

    /// Whether elements of `c` back to back form one block.
    fn is_run(c: &Dtype) -> bool {
        c.contig && c.size as isize == c.extent()
    }

    fn check_blocks(&self, more: usize) -> R {
        if more > MAX_BLOCKS.saturating_sub(self.blocks.len()) {
            return err(
                MPI_ERR_NO_MEM,
                format!("the type would have more than {MAX_BLOCKS} irregular blocks; vmfabric keeps datatypes flattened"),
            );
        }
        Ok(())
    }

    /// Place `n` consecutive elements of `c` at byte displacement `d`. A type whose bounds or size
    /// overflow an address is an error, and so is one that would need more than [`MAX_BLOCKS`] runs (a
    /// type is kept flattened; a contiguous or strided series of equal blocks is one run).
    fn place(&mut self, c: &Dtype, d: isize, n: usize) -> R {
        if n == 0 {
            return Ok(());
        }
        self.bound(c, d, n)?;
        self.tally(c, n)?;
        match c.blocks[..] {
            // n elements form one block.
            _ if Self::is_run(c) => self.push(d + c.lb, c.size * n),
            // One block per element (a padded pair type, a resized block): n of them are one run.
            [b] if b.reps == 1 => self.push_run(Run {
                off: d + b.off,
                len: b.len,
                reps: n,
                stride: c.extent(),
            }),
            _ => self.place_each(c, d, n)?,
        }
        self.check_blocks(0)
    }

    /// Place the blocks of `n` consecutive elements of `c` at byte displacement `d` one element after
    /// the other.
    fn place_each(&mut self, c: &Dtype, d: isize, n: usize) -> R {
        self.check_blocks(c.blocks.len().saturating_mul(n))?;
        let ext = c.extent();
        for k in 0..n as isize {
            for b in &c.blocks {
                self.push_run(Run {
                    off: d + k * ext + b.off,
                    ..*b
                });
            }
        }
        Ok(())
    }

    /// Place `reps` blocks of `n` elements of `c`, block `i` at byte displacement `i * step`: one run
    /// when elements of `c` form one block, whatever `reps` is (a vector of a predefined type).
    fn place_strided(&mut self, c: &Dtype, n: usize, reps: usize, step: isize) -> R {
        let last = (reps as isize)
            .checked_sub(1)
            .and_then(|r| r.checked_mul(step));
        let Some(last) = last else {
            return err(
                MPI_ERR_ARG,
                format!("{reps} blocks {step} bytes apart overflow an address"),
            );
        };
        if !Self::is_run(c) || reps < 2 || n == 0 {
            for i in 0..reps as isize {
                self.place(c, i * step, n)?;
            }
            return Ok(());
        }
        // The bounds of blocks at i * step are those of the first and the last block.
        self.bound(c, 0, n)?;
        self.bound(c, last, n)?;
        let Some(total) = n.checked_mul(reps) else {
            return err(
                MPI_ERR_ARG,
                format!("{reps} blocks of {n} elements overflow a count"),
            );
        };
        self.tally(c, total)?;
        self.push_run(Run {
            off: c.lb,
            len: c.size * n,
            reps,
            stride: step,
        });
        self.check_blocks(0)
    }

    /// Append a block of `l` bytes at `o`: it extends the last block when it follows it, or the last run
    /// when it continues its progression.
    #[inline]
    fn push(&mut self, o: isize, l: usize) {
        self.push_run(Run {
            off: o,
            len: l,
            reps: 1,
            stride: 0,
        });
    }

    fn push_run(&mut self, mut r: Run) {
        if r.len == 0 || r.reps == 0 {
            return;
        }
        if r.reps > 1 && r.stride == r.len as isize {
            // Blocks back to back: one block.
            (r.len, r.reps, r.stride) = (r.len * r.reps, 1, 0);
        }
        if let Some(last) = self.blocks.last_mut() {
            // Only compared: wrapping keeps an absurd run from panicking in debug builds.
            let next = last
                .off
                .wrapping_add((last.reps as isize).wrapping_mul(last.stride));
            if r.reps == 1 && last.reps == 1 && last.off + last.len as isize == r.off {
                last.len += r.len;
                return;
            }
            if r.len == last.len {
                let fits = |stride: isize| r.reps == 1 || r.stride == stride;
                if last.reps == 1 && fits(r.off - last.off) {
                    last.stride = r.off - last.off;
                    last.reps += r.reps;
                    return;
                }
                if last.reps > 1 && r.off == next && fits(last.stride) {
                    last.reps += r.reps;
                    return;
                }
            }
        }
        self.blocks.push(Run {
            stride: if r.reps == 1 { 0 } else { r.stride },
            ..r
        });
    }

    fn finish(self, combiner: c_int, c: Contents, types: Vec<MPI_Datatype>) -> Dtype {
        let mut d = Dtype {
            contig: false,
            blocks: self.blocks,
            size: self.size,
            lb: self.lb,
            ub: self.ub,
            true_lb: self.tlb,
            true_ub: self.tub,
            align: self.align,
            basic: if self.mixed {
                MPI_DATATYPE_NULL
            } else {
                self.basic.unwrap_or(MPI_DATATYPE_NULL)
            },
            nbasic: self.nbasic,
            nelem: self.nelem,
            dense: false,
            committed: false,
            name: String::new(),
            combiner,
            ints: c.ints,
            aints: c.aints,
            counts: c.counts,
            types,
            attrs: vec![],
            refs: 0,
        };
        if combiner == MPI_COMBINER_STRUCT && d.any_extent_pad() {
            let e = d.extent();
            let a = d.align as isize;
            if e % a != 0 {
                d.ub += a - e.rem_euclid(a);
            }
        }
        d.set_contig();
        d
    }
}

impl Dtype {
    /// Elements in block `i` of a struct type (from its contents: integers, or large counts).
    fn struct_blocklength(&self, i: usize) -> usize {
        let c = if self.counts.is_empty() {
            self.ints.get(1 + i).map(|&v| v as i64)
        } else {
            self.counts.get(1 + i).copied()
        };
        c.unwrap_or(0).max(0) as usize
    }
    fn any_extent_pad(&self) -> bool {
        self.align > 1
    }
    /// Work out `contig` and `dense` from the blocks and bounds.
    fn set_contig(&mut self) {
        self.contig = self.lb == 0
            && self.extent() == self.size as isize
            && (self.size == 0
                || (self.blocks.len() == 1 && self.blocks[0].off == 0 && self.blocks[0].reps == 1));
        self.dense = if is_padded_pair(self.basic) {
            self.is_pair_array()
        } else {
            self.contig
        };
    }

    /// Whether the type is laid out as an array of `nbasic` elements of its (padded pair) basic type
    /// from offset 0: the blocks and bounds of a contiguous type of them.
    fn is_pair_array(&self) -> bool {
        let Ok(p) = predefined(self.basic) else {
            return false;
        };
        let whole = (self.nbasic as isize).checked_mul(p.extent());
        if self.lb != 0 || whole != Some(self.extent()) {
            return false;
        }
        let mut b = Build::new();
        b.place(&p, 0, self.nbasic).is_ok() && b.blocks == self.blocks
    }
}

fn nonneg(n: c_int, what: &str) -> R<usize> {
    if n < 0 {
        err(MPI_ERR_COUNT, format!("{what} {n} is negative"))
    } else {
        Ok(n as usize)
    }
}

/// hindexed: blocks of `lens[i]` elements of `old` at byte displacements `disps[i]`.
fn hindexed(old: &Dtype, blocks: impl Iterator<Item = (usize, isize)>) -> R<Build> {
    let mut b = Build::new();
    for (l, d) in blocks {
        b.place(old, d, l)?;
    }
    Ok(b)
}

unsafe fn out_type(newtype: *mut MPI_Datatype) -> R<()> {
    if newtype.is_null() {
        return err(MPI_ERR_ARG, "newtype is NULL");
    }
    Ok(())
}

/// Offsets of the elements of a subarray, in memory order.
fn subarray_offsets(
    sizes: &[usize],
    subs: &[usize],
    starts: &[usize],
    order: c_int,
    ext: isize,
) -> R<Vec<isize>> {
    let n = sizes.len();
    for i in 0..n {
        if subs[i] == 0 || sizes[i] == 0 || starts[i] + subs[i] > sizes[i] {
            return err(
                MPI_ERR_ARG,
                format!(
                    "subarray dimension {i}: size {} subsize {} start {}",
                    sizes[i], subs[i], starts[i]
                ),
            );
        }
    }
    let lists: Vec<Vec<usize>> = (0..n)
        .map(|i| (starts[i]..starts[i] + subs[i]).collect())
        .collect();
    Ok(grid_offsets(sizes, &lists, order, ext))
}

/// Offsets of the cartesian product of per-dimension index lists in an array of `sizes` (order C or Fortran).
fn grid_offsets(sizes: &[usize], lists: &[Vec<usize>], order: c_int, ext: isize) -> Vec<isize> {
    let n = sizes.len();
    // Dimension order from slowest to fastest.
    let dims: Vec<usize> = if order == MPI_ORDER_C {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    };
    let mut stride = vec![0isize; n];
    let mut s = ext;
    for &d in dims.iter().rev() {
        stride[d] = s;
        s *= sizes[d] as isize;
    }
    let mut out = vec![0isize];
    for &d in &dims {
        let mut next = Vec::with_capacity(out.len() * lists[d].len());
        for &o in &out {
            for &i in &lists[d] {
                next.push(o + i as isize * stride[d]);
            }
        }
        out = next;
    }
    if lists.iter().any(|l| l.is_empty()) {
        out.clear();
    }
    out
}

fn from_offsets(
    old: &Dtype,
    offs: &[isize],
    extent: isize,
    combiner: c_int,
    c: Contents,
    types: Vec<MPI_Datatype>,
) -> R<Dtype> {
    let mut b = Build::new();
    for &o in offs {
        b.place(old, o, 1)?;
    }
    let mut d = b.finish(combiner, c, types);
    d.lb = 0;
    d.ub = extent;
    d.set_contig();
    Ok(d)
}

// ------------------------------------------------------------------------------------------------ pack/unpack

/// Copy `count` elements of `d` from `buf` into the packed stream `out` (count * size bytes).
pub(crate) unsafe fn pack(d: &Dtype, buf: *const u8, count: usize, out: *mut u8) {
    let ext = d.extent();
    let mut o = 0usize;
    for k in 0..count as isize {
        let base = buf.offset(k * ext);
        for b in &d.blocks {
            let mut p = base.offset(b.off);
            for _ in 0..b.reps {
                std::ptr::copy_nonoverlapping(p, out.add(o), b.len);
                o += b.len;
                p = p.wrapping_offset(b.stride);
            }
        }
    }
}

/// Copy up to `nbytes` of the packed stream `inp` into `count` elements of `d` at `buf`.
pub(crate) unsafe fn unpack(d: &Dtype, inp: *const u8, nbytes: usize, buf: *mut u8, count: usize) {
    let ext = d.extent();
    let mut o = 0usize;
    'outer: for k in 0..count as isize {
        let base = buf.offset(k * ext);
        for b in &d.blocks {
            let mut p = base.offset(b.off);
            for _ in 0..b.reps {
                if o >= nbytes {
                    break 'outer;
                }
                let l = b.len.min(nbytes - o);
                std::ptr::copy_nonoverlapping(inp.add(o), p, l);
                o += l;
                p = p.wrapping_offset(b.stride);
            }
        }
    }
}

/// How a (buffer, count, datatype) moves.
pub(crate) enum Lay {
    /// Straight from/to the buffer: this many bytes.
    Contig(usize),
    /// Through a staging buffer of `bytes` (packed).
    Packed { bytes: usize },
}

/// Layout of (buf, count, dt), with the argument checks of `msg_bytes`.
#[inline]
pub(crate) fn layout(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> R<Lay> {
    if is_simple(dt) {
        return msg_bytes(buf, count, dt).map(Lay::Contig);
    }
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    if !is_derived(dt) {
        // A padded pair type: its members without the padding.
        return msg_bytes(buf, count, dt).map(|bytes| Lay::Packed { bytes });
    }
    let st = state()?;
    let d = get(st, dt)?;
    if !d.committed {
        return err(MPI_ERR_TYPE, "datatype is not committed");
    }
    let bytes = d.size * count as usize;
    if d.contig {
        Ok(Lay::Contig(bytes))
    } else {
        Ok(Lay::Packed { bytes })
    }
}

/// Staging of a derived-datatype transfer kept with its request.
pub(crate) struct Xfer {
    pub tmp: Vec<u8>,
    /// Receive: where to unpack (buffer, count, datatype).
    pub unpack: Option<(*mut u8, usize, MPI_Datatype)>,
}

/// Pack `count` elements of `dt` at `buf` into a new vector.
pub(crate) unsafe fn pack_vec(
    buf: *const u8,
    count: usize,
    dt: MPI_Datatype,
    bytes: usize,
) -> R<Vec<u8>> {
    let st = state()?;
    let d = desc(st, dt)?;
    let mut v = vec![0u8; bytes];
    pack(&d, buf, count, v.as_mut_ptr());
    Ok(v)
}

/// Unpack the first `nbytes` of `tmp` into (buf, count, dt).
pub(crate) unsafe fn unpack_from(
    tmp: &[u8],
    nbytes: usize,
    buf: *mut u8,
    count: usize,
    dt: MPI_Datatype,
) -> R {
    let st = state()?;
    let d = desc(st, dt)?;
    unpack(&d, tmp.as_ptr(), nbytes.min(tmp.len()), buf, count);
    Ok(())
}

/// Copy (sbuf, scount, stype) into (rbuf, rcount, rtype) locally (type signatures assumed to match).
pub(crate) unsafe fn local_copy(
    sbuf: *const u8,
    scount: usize,
    stype: MPI_Datatype,
    rbuf: *mut u8,
    rcount: usize,
    rtype: MPI_Datatype,
) -> R {
    let sl = layout(sbuf as *const c_void, scount as c_int, stype)?;
    let rl = layout(rbuf as *const c_void, rcount as c_int, rtype)?;
    match (sl, rl) {
        (Lay::Contig(a), Lay::Contig(b)) => {
            if a > b {
                return err(MPI_ERR_TRUNCATE, format!("{a} bytes into a buffer of {b}"));
            }
            if a > 0 && !std::ptr::eq(sbuf, rbuf) {
                std::ptr::copy(sbuf, rbuf, a);
            }
        }
        (Lay::Contig(a), Lay::Packed { bytes }) => {
            if a > bytes {
                return err(
                    MPI_ERR_TRUNCATE,
                    format!("{a} bytes into a buffer of {bytes}"),
                );
            }
            let v = std::slice::from_raw_parts(sbuf, a).to_vec();
            unpack_from(&v, a, rbuf, rcount, rtype)?;
        }
        (Lay::Packed { bytes }, rl) => {
            let v = pack_vec(sbuf, scount, stype, bytes)?;
            match rl {
                Lay::Contig(b) => {
                    if bytes > b {
                        return err(
                            MPI_ERR_TRUNCATE,
                            format!("{bytes} bytes into a buffer of {b}"),
                        );
                    }
                    std::ptr::copy_nonoverlapping(v.as_ptr(), rbuf, bytes);
                }
                Lay::Packed { bytes: b } => {
                    if bytes > b {
                        return err(
                            MPI_ERR_TRUNCATE,
                            format!("{bytes} bytes into a buffer of {b}"),
                        );
                    }
                    unpack_from(&v, bytes, rbuf, rcount, rtype)?;
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------ darray

fn darray_indices(
    gsize: usize,
    distrib: c_int,
    darg: c_int,
    psize: usize,
    coord: usize,
) -> R<Vec<usize>> {
    Ok(match distrib {
        MPI_DISTRIBUTE_NONE => (0..gsize).collect(),
        MPI_DISTRIBUTE_BLOCK => {
            let b = if darg == MPI_DISTRIBUTE_DFLT_DARG {
                gsize.div_ceil(psize)
            } else {
                darg as usize
            };
            if b * psize < gsize {
                return err(MPI_ERR_ARG, "darray block size too small");
            }
            let lo = (coord * b).min(gsize);
            let hi = ((coord + 1) * b).min(gsize);
            (lo..hi).collect()
        }
        MPI_DISTRIBUTE_CYCLIC => {
            let b = if darg == MPI_DISTRIBUTE_DFLT_DARG {
                1
            } else {
                darg as usize
            };
            (0..gsize).filter(|i| (i / b) % psize == coord).collect()
        }
        _ => return err(MPI_ERR_ARG, format!("invalid distribution {distrib}")),
    })
}

// ------------------------------------------------------------------------------------------------ entry points

fn create(newtype: *mut MPI_Datatype, mut d: Dtype) -> R {
    let st = state()?;
    d.refs = 0; // a new object, even when built from a clone of another
    // The derived types it is built from stay valid while it lives, even if the program frees them:
    // MPI_Type_get_contents returns their handles (MPICH too keeps them).
    let from = d.types.clone();
    from.iter().for_each(|&t| hold(st, t));
    let h = add(st, d);
    // SAFETY: checked non-NULL by the caller (out_type).
    unsafe { *newtype = h };
    Ok(())
}

fn check_old(st: &State, t: MPI_Datatype) -> R<Dtype> {
    info(st, t)
}

unsafe fn name_of(s: *const c_char) -> String {
    if s.is_null() {
        String::new()
    } else {
        CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// Name of a predefined datatype (for Type_get_name).
fn predefined_name(dt: MPI_Datatype) -> &'static str {
    match dt as u32 {
        0x4c000101 => "MPI_CHAR",
        0x4c000118 => "MPI_SIGNED_CHAR",
        0x4c000102 => "MPI_UNSIGNED_CHAR",
        0x4c00010d => "MPI_BYTE",
        0x4c00040e => "MPI_WCHAR",
        0x4c000203 => "MPI_SHORT",
        0x4c000204 => "MPI_UNSIGNED_SHORT",
        0x4c000405 => "MPI_INT",
        0x4c000406 => "MPI_UNSIGNED",
        0x4c000807 => "MPI_LONG",
        0x4c000808 => "MPI_UNSIGNED_LONG",
        0x4c00040a => "MPI_FLOAT",
        0x4c00080b => "MPI_DOUBLE",
        0x4c00100c => "MPI_LONG_DOUBLE",
        0x4c000809 => "MPI_LONG_LONG_INT",
        0x4c000819 => "MPI_UNSIGNED_LONG_LONG",
        0x4c00010f => "MPI_PACKED",
        0x8c000000 => "MPI_FLOAT_INT",
        0x8c000001 => "MPI_DOUBLE_INT",
        0x8c000002 => "MPI_LONG_INT",
        0x8c000003 => "MPI_SHORT_INT",
        0x4c000816 => "MPI_2INT",
        0x8c000004 => "MPI_LONG_DOUBLE_INT",
        0x4c000137 => "MPI_INT8_T",
        0x4c000238 => "MPI_INT16_T",
        0x4c000439 => "MPI_INT32_T",
        0x4c00083a => "MPI_INT64_T",
        0x4c00013b => "MPI_UINT8_T",
        0x4c00023c => "MPI_UINT16_T",
        0x4c00043d => "MPI_UINT32_T",
        0x4c00083e => "MPI_UINT64_T",
        0x4c00013f => "MPI_C_BOOL",
        0x4c000843 => "MPI_AINT",
        0x4c000844 => "MPI_OFFSET",
        0x4c000845 => "MPI_COUNT",
        0x4c00041b => "MPI_INTEGER",
        0x4c00041c => "MPI_REAL",
        0x4c00081f => "MPI_DOUBLE_PRECISION",
        0x4c00081e => "MPI_COMPLEX",
        0x4c001022 => "MPI_DOUBLE_COMPLEX",
        0x4c00041d => "MPI_LOGICAL",
        0x4c00011a => "MPI_CHARACTER",
        // MPI_C_COMPLEX is MPI_C_FLOAT_COMPLEX; MPICH reports the shorter name.
        0x4c000840 => "MPI_C_COMPLEX",
        0x4c001041 => "MPI_C_DOUBLE_COMPLEX",
        0x4c002042 => "MPI_C_LONG_DOUBLE_COMPLEX",
        0x4c000010 => "MPI_LB",
        0x4c000011 => "MPI_UB",
        0x4c000820 => "MPI_2INTEGER",
        0x4c000821 => "MPI_2REAL",
        0x4c001023 => "MPI_2DOUBLE_PRECISION",
        0x4c000427 => "MPI_REAL4",
        0x4c000829 => "MPI_REAL8",
        0x4c00102b => "MPI_REAL16",
        0x4c000828 => "MPI_COMPLEX8",
        0x4c00102a => "MPI_COMPLEX16",
        0x4c00202c => "MPI_COMPLEX32",
        0x4c00012d => "MPI_INTEGER1",
        0x4c00022f => "MPI_INTEGER2",
        0x4c000430 => "MPI_INTEGER4",
        0x4c000831 => "MPI_INTEGER8",
        0x4c000246 => "MPIX_C_FLOAT16",
        0x4c000133 => "MPI_CXX_BOOL",
        0x4c000834 => "MPI_CXX_FLOAT_COMPLEX",
        0x4c001035 => "MPI_CXX_DOUBLE_COMPLEX",
        0x4c002036 => "MPI_CXX_LONG_DOUBLE_COMPLEX",
        _ => "",
    }
}

/// (integers, addresses, large counts, datatypes, combiner) of MPI_Type_get_envelope(_c).
pub(crate) fn envelope(datatype: MPI_Datatype) -> R<(usize, usize, usize, usize, c_int)> {
    let d = info(state()?, datatype)?;
    Ok((
        d.ints.len(),
        d.aints.len(),
        d.counts.len(),
        d.types.len(),
        d.combiner,
    ))
}

/// The MPI-3 decoding calls cannot report large counts.
fn no_large_counts(n: usize) -> R {
    if n > 0 {
        return err(MPI_ERR_TYPE, format!("the datatype was made by a large-count (_c) constructor and has {n} large counts: decode it with MPI_Type_get_envelope_c/MPI_Type_get_contents_c"));
    }
    Ok(())
}

/// MPI_Type_get_contents(_c): `max` holds the capacities of the integer, address, large-count and
/// datatype arrays. A derived member type is handed out as a new reference the program frees.
pub(crate) unsafe fn contents(
    datatype: MPI_Datatype,
    max: [usize; 4],
    ints: *mut c_int,
    aints: *mut MPI_Aint,
    counts: *mut MPI_Count,
    types: *mut MPI_Datatype,
) -> R {
    let st = state()?;
    let d = info(st, datatype)?;
    if d.combiner == MPI_COMBINER_NAMED {
        return err(
            MPI_ERR_TYPE,
            "MPI_Type_get_contents of a predefined datatype",
        );
    }
    let have = [d.ints.len(), d.aints.len(), d.counts.len(), d.types.len()];
    if max.iter().zip(&have).any(|(m, h)| m < h) {
        return err(MPI_ERR_ARG, format!("arrays too small: {have:?} entries (integers, addresses, large counts, datatypes) needed, room for {max:?}"));
    }
    unsafe fn put<T: Copy>(v: &[T], p: *mut T) -> R {
        if !v.is_empty() && p.is_null() {
            return err(MPI_ERR_ARG, "array argument is NULL");
        }
        std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len());
        Ok(())
    }
    put(&d.ints, ints)?;
    put(&d.aints, aints)?;
    put(&d.counts, counts)?;
    put(&d.types, types)?;
    for v in &d.types {
        if is_derived(*v) {
            if let Some(Some(t)) = st.types.get_mut((*v as u32 & 0x03ff_ffff) as usize) {
                t.refs += 1;
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------ constructors

/// The counts a type constructor takes: `c_int` from the MPI-3 calls, `MPI_Count` from the large-count
/// (`_c`) calls of MPI 4.0. Both build the same type; a type made by a `_c` call records its counts and
/// displacements as *large counts* (what MPI_Type_get_contents_c returns in `array_of_large_counts`).
pub(crate) trait Cnt: Copy + std::fmt::Display + Into<i64> {
    const LARGE: bool;
}
impl Cnt for c_int {
    const LARGE: bool = false;
}
impl Cnt for MPI_Count {
    const LARGE: bool = true;
}

/// What MPI_Type_get_contents reports for a constructed type.
#[derive(Default)]
pub(crate) struct Contents {
    ints: Vec<c_int>,
    aints: Vec<MPI_Aint>,
    counts: Vec<MPI_Count>,
}

impl Contents {
    /// A count argument: an integer, or a large count from a `_c` call.
    fn count<T: Cnt>(&mut self, v: T) {
        if T::LARGE {
            self.counts.push(v.into());
        } else {
            self.ints.push(v.into() as c_int);
        }
    }
    /// A byte displacement: an address, or a large count from a `_c` call.
    fn addr<T: Cnt>(&mut self, v: MPI_Aint) {
        if T::LARGE {
            self.counts.push(v as MPI_Count);
        } else {
            self.aints.push(v);
        }
    }
}

/// A non-negative count argument as usize.
fn count_arg<T: Cnt>(n: T, what: &str) -> R<usize> {
    usize::try_from(n.into()).map_err(|_| MpiErr {
        code: MPI_ERR_COUNT,
        msg: format!("{what} {n} is negative"),
    })
}

/// The `n` entries of an array argument (`n` from a count argument, already checked).
unsafe fn arr_n<T: Copy>(p: *const T, n: usize) -> R<Vec<T>> {
    if n > 0 && p.is_null() {
        return err(MPI_ERR_ARG, "array argument is NULL");
    }
    Ok((0..n).map(|i| *p.add(i)).collect())
}

/// `n * ext` bytes, or MPI_ERR_ARG saying that `what` overflows an address (rather than a wrapped one).
fn bytes_of(n: Option<isize>, ext: isize, what: impl FnOnce() -> String) -> R<isize> {
    n.and_then(|n| n.checked_mul(ext)).ok_or_else(|| MpiErr {
        code: MPI_ERR_ARG,
        msg: format!("{} overflows an address", what()),
    })
}

/// Byte displacement of `d` elements of extent `ext`.
fn scaled<T: Cnt>(d: T, ext: isize) -> R<isize> {
    bytes_of(isize::try_from(d.into()).ok(), ext, || {
        format!("displacement of {d} elements of extent {ext}")
    })
}

pub(crate) unsafe fn type_contiguous<T: Cnt>(
    count: T,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    let (old, n) = count_args(count, oldtype, newtype)?;
    let mut b = Build::new();
    b.place(&old, 0, n)?;
    let mut c = Contents::default();
    c.count(count);
    create(newtype, b.finish(MPI_COMBINER_CONTIGUOUS, c, vec![oldtype]))
}

/// What the (count, blocklength, oldtype) constructors check first: [`count_args`] and the block length.
unsafe fn block_args<T: Cnt>(
    count: T,
    blocklength: T,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R<(Dtype, usize, usize)> {
    let (old, n) = count_args(count, oldtype, newtype)?;
    Ok((old, n, count_arg(blocklength, "blocklength")?))
}

/// What every constructor over one old type checks first: the output pointer, the old type and the count.
unsafe fn count_args<T: Cnt>(
    count: T,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R<(Dtype, usize)> {
    out_type(newtype)?;
    Ok((check_old(state()?, oldtype)?, count_arg(count, "count")?))
}

/// vector (`stride` in elements) and hvector (`hstride` in bytes).
pub(crate) unsafe fn type_vector<T: Cnt>(
    count: T,
    blocklength: T,
    stride: Result<T, MPI_Aint>,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    let (old, n, bl) = block_args(count, blocklength, oldtype, newtype)?;
    let step = match stride {
        Ok(s) => scaled(s, old.extent())?,
        Err(h) => h,
    };
    let mut b = Build::new();
    b.place_strided(&old, bl, n, step)?;
    let mut c = Contents::default();
    c.count(count);
    c.count(blocklength);
    let combiner = match stride {
        Ok(s) => {
            c.count(s);
            MPI_COMBINER_VECTOR
        }
        Err(h) => {
            c.addr::<T>(h);
            MPI_COMBINER_HVECTOR
        }
    };
    create(newtype, b.finish(combiner, c, vec![oldtype]))
}

/// The displacements of an indexed constructor: in elements of the old type (`Ok`) or in bytes (`Err`).
pub(crate) enum Disps<T> {
    Elems(*const T),
    Bytes(*const MPI_Aint),
}

impl<T: Cnt> Disps<T> {
    /// The `n` displacements in bytes, recorded in `c` as the constructor's contents.
    unsafe fn read(&self, n: usize, ext: isize, c: &mut Contents) -> R<Vec<isize>> {
        match *self {
            Disps::Elems(p) => arr_n(p, n)?
                .into_iter()
                .map(|d| {
                    c.count(d);
                    scaled(d, ext)
                })
                .collect(),
            Disps::Bytes(p) => Ok(arr_n(p, n)?
                .into_iter()
                .inspect(|&d| c.addr::<T>(d))
                .collect()),
        }
    }
    fn combiner(&self, elems: c_int, bytes: c_int) -> c_int {
        match self {
            Disps::Elems(_) => elems,
            Disps::Bytes(_) => bytes,
        }
    }
}

/// indexed and hindexed (one length per block).
pub(crate) unsafe fn type_indexed<T: Cnt>(
    count: T,
    blocklengths: *const T,
    disps: Disps<T>,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    let (old, n) = count_args(count, oldtype, newtype)?;
    let bl = arr_n(blocklengths, n)?;
    let lens: Vec<usize> = bl
        .iter()
        .map(|&l| count_arg(l, "blocklength"))
        .collect::<R<_>>()?;
    let mut c = Contents::default();
    c.count(count);
    bl.iter().for_each(|&l| c.count(l));
    let ds = disps.read(n, old.extent(), &mut c)?;
    let b = hindexed(&old, lens.into_iter().zip(ds))?;
    let combiner = disps.combiner(MPI_COMBINER_INDEXED, MPI_COMBINER_HINDEXED);
    create(newtype, b.finish(combiner, c, vec![oldtype]))
}

/// indexed_block and hindexed_block (one length for all blocks).
pub(crate) unsafe fn type_indexed_block<T: Cnt>(
    count: T,
    blocklength: T,
    disps: Disps<T>,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    let (old, n, bl) = block_args(count, blocklength, oldtype, newtype)?;
    let mut c = Contents::default();
    c.count(count);
    c.count(blocklength);
    let ds = disps.read(n, old.extent(), &mut c)?;
    let b = hindexed(&old, ds.iter().map(|&d| (bl, d)))?;
    let combiner = disps.combiner(MPI_COMBINER_INDEXED_BLOCK, MPI_COMBINER_HINDEXED_BLOCK);
    create(newtype, b.finish(combiner, c, vec![oldtype]))
}

pub(crate) unsafe fn type_struct<T: Cnt>(
    count: T,
    blocklengths: *const T,
    disps: *const MPI_Aint,
    types: *const MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    out_type(newtype)?;
    let st = state()?;
    let n = count_arg(count, "count")?;
    let (bl, ds, ts) = (arr_n(blocklengths, n)?, arr_n(disps, n)?, arr_n(types, n)?);
    let lens = bl
        .iter()
        .map(|&l| count_arg(l, "blocklength"))
        .collect::<R<Vec<usize>>>()?;
    let mut c = Contents::default();
    c.count(count);
    bl.iter().for_each(|&l| c.count(l));
    ds.iter().for_each(|&d| c.addr::<T>(d));
    let d = struct_of(&lens, &ds, &ts, |t| check_old(st, t), c)?;
    create(newtype, d)
}

/// A struct of blocks of `lens[i]` elements of `types[i]` at byte displacements `disps[i]` (`old`
/// describes a member type). The MPI-1 markers MPI_LB and MPI_UB set the bounds of the struct of the
/// other members, as MPICH does it: the last of each kind wins, whatever its block length, and a bound
/// without a marker is the other members' (with the struct's padding). They are no data: the true
/// bounds leave them out.
fn struct_of(
    lens: &[usize],
    disps: &[MPI_Aint],
    types: &[MPI_Datatype],
    old: impl Fn(MPI_Datatype) -> R<Dtype>,
    c: Contents,
) -> R<Dtype> {
    let mut b = Build::new();
    let (mut lb, mut ub) = (None, None);
    for ((&len, &d), &t) in lens.iter().zip(disps).zip(types) {
        match t {
            MPI_LB => lb = Some(d),
            MPI_UB => ub = Some(d),
            t => b.place(&old(t)?, d, len)?,
        }
    }
    let mut d = b.finish(MPI_COMBINER_STRUCT, c, types.to_vec());
    if lb.is_some() || ub.is_some() {
        d.lb = lb.unwrap_or(d.lb);
        d.ub = ub.unwrap_or(d.ub);
        d.set_contig();
    }
    Ok(d)
}

pub(crate) unsafe fn type_resized<T: Cnt>(
    oldtype: MPI_Datatype,
    lb: MPI_Aint,
    extent: MPI_Aint,
    newtype: *mut MPI_Datatype,
) -> R {
    out_type(newtype)?;
    let mut d = check_old(state()?, oldtype)?;
    let Some(ub) = lb.checked_add(extent) else {
        return err(
            MPI_ERR_ARG,
            format!("lb {lb} + extent {extent} overflows an address"),
        );
    };
    let mut c = Contents::default();
    c.addr::<T>(lb);
    c.addr::<T>(extent);
    d.attrs.clear();
    (d.lb, d.ub) = (lb, ub);
    d.combiner = MPI_COMBINER_RESIZED;
    (d.ints, d.aints, d.counts) = (c.ints, c.aints, c.counts);
    d.types = vec![oldtype];
    d.committed = false;
    d.name.clear();
    d.set_contig();
    create(newtype, d)
}

/// What the subarray and darray constructors check first: the output pointer, the old type and the
/// storage order.
unsafe fn grid_args(order: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> R<Dtype> {
    out_type(newtype)?;
    let old = check_old(state()?, oldtype)?;
    if order != MPI_ORDER_C && order != MPI_ORDER_FORTRAN {
        return err(MPI_ERR_ARG, format!("invalid order {order}"));
    }
    Ok(old)
}

/// The product of `dims` elements of extent `ext`, in bytes.
fn grid_extent(dims: &[usize], ext: isize) -> R<isize> {
    let n = dims
        .iter()
        .try_fold(1isize, |a, &d| a.checked_mul(isize::try_from(d).ok()?));
    bytes_of(n, ext, || format!("an array of {dims:?} elements"))
}

pub(crate) unsafe fn type_subarray<T: Cnt>(
    ndims: c_int,
    sizes: *const T,
    subsizes: *const T,
    starts: *const T,
    order: c_int,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    let old = grid_args(order, oldtype, newtype)?;
    if ndims <= 0 {
        return err(MPI_ERR_ARG, "ndims must be positive");
    }
    let nd = ndims as usize;
    let mut c = Contents::default();
    c.ints.push(ndims);
    let mut dims = |p: *const T| -> R<Vec<usize>> {
        let v = arr_n(p, nd)?;
        v.iter().for_each(|&x| c.count(x));
        v.into_iter()
            .map(|x| count_arg(x, "subarray argument"))
            .collect()
    };
    let (szu, subu, sttu) = (dims(sizes)?, dims(subsizes)?, dims(starts)?);
    c.ints.push(order);
    let offs = subarray_offsets(&szu, &subu, &sttu, order, old.extent())?;
    let extent = grid_extent(&szu, old.extent())?;
    create(
        newtype,
        from_offsets(&old, &offs, extent, MPI_COMBINER_SUBARRAY, c, vec![oldtype])?,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn type_darray<T: Cnt>(
    size: c_int,
    rank: c_int,
    ndims: c_int,
    gsizes: *const T,
    distribs: *const c_int,
    dargs: *const c_int,
    psizes: *const c_int,
    order: c_int,
    oldtype: MPI_Datatype,
    newtype: *mut MPI_Datatype,
) -> R {
    let old = grid_args(order, oldtype, newtype)?;
    if ndims <= 0 || size <= 0 || rank < 0 || rank >= size {
        return err(MPI_ERR_ARG, "invalid darray size/rank/ndims");
    }
    let nd = ndims as usize;
    let gs = arr_n(gsizes, nd)?;
    let (dis, da, ps) = (arr_n(distribs, nd)?, arr_n(dargs, nd)?, arr_n(psizes, nd)?);
    if ps.iter().map(|&p| p.max(0) as i64).product::<i64>() != size as i64 {
        return err(MPI_ERR_ARG, "product of psizes is not size");
    }
    let gsu = gs
        .iter()
        .map(|&g| count_arg(g, "gsize"))
        .collect::<R<Vec<usize>>>()?;
    // Process grid coordinates: row-major (C order) regardless of `order`.
    let mut coords = vec![0usize; nd];
    let mut rem = rank as usize;
    for i in (0..nd).rev() {
        coords[i] = rem % ps[i] as usize;
        rem /= ps[i] as usize;
    }
    let mut lists = Vec::new();
    for i in 0..nd {
        lists.push(darray_indices(
            gsu[i],
            dis[i],
            da[i],
            ps[i] as usize,
            coords[i],
        )?);
    }
    let offs = grid_offsets(&gsu, &lists, order, old.extent());
    let extent = grid_extent(&gsu, old.extent())?;
    let mut c = Contents::default();
    c.ints.extend([size, rank, ndims]);
    gs.iter().for_each(|&g| c.count(g));
    c.ints.extend(dis.iter().chain(&da).chain(&ps));
    c.ints.push(order);
    create(
        newtype,
        from_offsets(&old, &offs, extent, MPI_COMBINER_DARRAY, c, vec![oldtype])?,
    )
}

mpi_api! {
    fn MPI_Type_contiguous / PMPI_Type_contiguous(count: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_contiguous", type_contiguous(count, oldtype, newtype))
    }
    fn MPI_Type_vector / PMPI_Type_vector(count: c_int, blocklength: c_int, stride: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_vector", type_vector(count, blocklength, Ok(stride), oldtype, newtype))
    }
    fn MPI_Type_create_hvector / PMPI_Type_create_hvector(count: c_int, blocklength: c_int, stride: MPI_Aint, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_hvector", type_vector(count, blocklength, Err(stride), oldtype, newtype))
    }
    fn MPI_Type_indexed / PMPI_Type_indexed(count: c_int, array_of_blocklengths: *const c_int, array_of_displacements: *const c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_indexed", type_indexed(count, array_of_blocklengths, Disps::Elems(array_of_displacements), oldtype, newtype))
    }
    fn MPI_Type_create_hindexed / PMPI_Type_create_hindexed(count: c_int, array_of_blocklengths: *const c_int, array_of_displacements: *const MPI_Aint, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_hindexed", type_indexed(count, array_of_blocklengths, Disps::Bytes(array_of_displacements), oldtype, newtype))
    }
    fn MPI_Type_create_indexed_block / PMPI_Type_create_indexed_block(count: c_int, blocklength: c_int, array_of_displacements: *const c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_indexed_block", type_indexed_block(count, blocklength, Disps::Elems(array_of_displacements), oldtype, newtype))
    }
    fn MPI_Type_create_hindexed_block / PMPI_Type_create_hindexed_block(count: c_int, blocklength: c_int, array_of_displacements: *const MPI_Aint, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_hindexed_block", type_indexed_block(count, blocklength, Disps::Bytes(array_of_displacements), oldtype, newtype))
    }
    fn MPI_Type_create_struct / PMPI_Type_create_struct(count: c_int, array_of_blocklengths: *const c_int, array_of_displacements: *const MPI_Aint, array_of_types: *const MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_struct", type_struct(count, array_of_blocklengths, array_of_displacements, array_of_types, newtype))
    }
    fn MPI_Type_create_resized / PMPI_Type_create_resized(oldtype: MPI_Datatype, lb: MPI_Aint, extent: MPI_Aint, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_resized", type_resized::<c_int>(oldtype, lb, extent, newtype))
    }
    fn MPI_Type_create_subarray / PMPI_Type_create_subarray(ndims: c_int, array_of_sizes: *const c_int, array_of_subsizes: *const c_int, array_of_starts: *const c_int, order: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_subarray", type_subarray(ndims, array_of_sizes, array_of_subsizes, array_of_starts, order, oldtype, newtype))
    }
    fn MPI_Type_create_darray / PMPI_Type_create_darray(size: c_int, rank: c_int, ndims: c_int, array_of_gsizes: *const c_int, array_of_distribs: *const c_int, array_of_dargs: *const c_int, array_of_psizes: *const c_int, order: c_int, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_darray", type_darray(size, rank, ndims, array_of_gsizes, array_of_distribs, array_of_dargs, array_of_psizes, order, oldtype, newtype))
    }
    fn MPI_Type_dup / PMPI_Type_dup(oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        let r = (|| -> R {
            out_type(newtype)?;
            *newtype = MPI_DATATYPE_NULL; // what the program sees if a copy callback fails
            let st = state()?;
            let mut d = check_old(st, oldtype)?;
            if !is_derived(oldtype) {
                d.attrs = st.predef_attrs.get(&oldtype).cloned().unwrap_or_default();
            }
            d.attrs = crate::comm::copy_obj_attrs(st, oldtype, &d.attrs)?;
            d.combiner = MPI_COMBINER_DUP;
            d.ints = vec![];
            d.aints = vec![];
            d.counts = vec![];
            d.types = vec![oldtype];
            d.committed = true;
            d.name.clear();
            create(newtype, d)
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_dup", r)
    }
    fn MPI_Type_commit / PMPI_Type_commit(datatype: *mut MPI_Datatype) -> c_int {
        let r = (|| -> R {
            if datatype.is_null() {
                return err(MPI_ERR_ARG, "datatype is NULL");
            }
            let st = state()?;
            if !is_derived(*datatype) {
                type_extent(*datatype)?;
                return Ok(());
            }
            commit(st, *datatype)
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_commit", r)
    }
    fn MPI_Type_free / PMPI_Type_free(datatype: *mut MPI_Datatype) -> c_int {
        let r = (|| -> R {
            if datatype.is_null() {
                return err(MPI_ERR_ARG, "datatype is NULL");
            }
            let st = state()?;
            if !is_derived(*datatype) {
                return err(MPI_ERR_TYPE, "cannot free a predefined datatype");
            }
            let i = (*datatype as u32 & 0x03ff_ffff) as usize;
            let d = get(st, *datatype)?;
            if matches!(d.combiner, MPI_COMBINER_F90_REAL | MPI_COMBINER_F90_COMPLEX | MPI_COMBINER_F90_INTEGER) {
                return err(MPI_ERR_TYPE, "cannot free a type made by MPI_Type_create_f90_*");
            }
            if d.refs > 0 {
                st.types[i].as_mut().unwrap().refs -= 1;
                *datatype = MPI_DATATYPE_NULL;
                return Ok(());
            }
            let attrs = d.attrs.clone();
            for (k, v) in attrs.iter().rev() {
                crate::comm::delete_obj_attr(st, *datatype, *k, *v)?;
            }
            // Types are flattened at construction: freeing never affects how types built from this one
            // work; those hold it (for MPI_Type_get_contents) until they go.
            drop_slot(st, i);
            // The stand-ins of large counts of this type (bigcount::wide) go with it: its handle may
            // name another type later.
            let dt = *datatype;
            let stand_ins: Vec<MPI_Datatype> = st.big_types.iter().filter(|(k, _)| k.0 == dt).map(|(_, &h)| h).collect();
            st.big_types.retain(|k, _| k.0 != dt);
            for h in stand_ins {
                drop_slot(st, (h as u32 & 0x03ff_ffff) as usize);
            }
            *datatype = MPI_DATATYPE_NULL;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_free", r)
    }
    fn MPI_Type_get_extent / PMPI_Type_get_extent(datatype: MPI_Datatype, lb: *mut MPI_Aint, extent: *mut MPI_Aint) -> c_int {
        let r = extents(datatype).and_then(|(l, e, _, _)| out_pair(lb, extent, l, e));
        fin(MPI_COMM_WORLD, "MPI_Type_get_extent", r)
    }
    fn MPI_Type_get_extent_x / PMPI_Type_get_extent_x(datatype: MPI_Datatype, lb: *mut MPI_Count, extent: *mut MPI_Count) -> c_int {
        let r = extents(datatype).and_then(|(l, e, _, _)| out_pair(lb, extent, l as MPI_Count, e as MPI_Count));
        fin(MPI_COMM_WORLD, "MPI_Type_get_extent_x", r)
    }
    fn MPI_Type_get_true_extent / PMPI_Type_get_true_extent(datatype: MPI_Datatype, true_lb: *mut MPI_Aint, true_extent: *mut MPI_Aint) -> c_int {
        let r = extents(datatype).and_then(|(_, _, l, e)| out_pair(true_lb, true_extent, l, e));
        fin(MPI_COMM_WORLD, "MPI_Type_get_true_extent", r)
    }
    fn MPI_Type_get_true_extent_x / PMPI_Type_get_true_extent_x(datatype: MPI_Datatype, true_lb: *mut MPI_Count, true_extent: *mut MPI_Count) -> c_int {
        let r = extents(datatype).and_then(|(_, _, l, e)| out_pair(true_lb, true_extent, l as MPI_Count, e as MPI_Count));
        fin(MPI_COMM_WORLD, "MPI_Type_get_true_extent_x", r)
    }
    fn MPI_Type_size / PMPI_Type_size(datatype: MPI_Datatype, size: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (_, s) = ext_size(datatype)?;
            if size.is_null() {
                return err(MPI_ERR_ARG, "size is NULL");
            }
            *size = s.try_into().unwrap_or(MPI_UNDEFINED);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_size", r)
    }
    fn MPI_Type_size_x / PMPI_Type_size_x(datatype: MPI_Datatype, size: *mut MPI_Count) -> c_int {
        let r = (|| -> R {
            let (_, s) = ext_size(datatype)?;
            if size.is_null() {
                return err(MPI_ERR_ARG, "size is NULL");
            }
            *size = s as MPI_Count;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_size_x", r)
    }
    fn MPI_Type_set_name / PMPI_Type_set_name(datatype: MPI_Datatype, type_name: *const c_char) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if type_name.is_null() {
                return err(MPI_ERR_ARG, "type_name is NULL");
            }
            let n = name_of(type_name);
            if !is_derived(datatype) {
                type_extent(datatype)?;
                st.predef_names.insert(datatype, n);
                return Ok(());
            }
            get(st, datatype)?;
            st.types[(datatype as u32 & 0x03ff_ffff) as usize].as_mut().unwrap().name = n;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_set_name", r)
    }
    fn MPI_Type_get_name / PMPI_Type_get_name(datatype: MPI_Datatype, type_name: *mut c_char, resultlen: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let n = if is_derived(datatype) {
                get(st, datatype)?.name.clone()
            } else {
                type_extent(datatype)?;
                st.predef_names.get(&datatype).cloned().unwrap_or_else(|| predefined_name(datatype).to_string())
            };
            put_str(&n, type_name, resultlen, 128);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_get_name", r)
    }
    fn MPI_Type_get_envelope / PMPI_Type_get_envelope(datatype: MPI_Datatype, num_integers: *mut c_int, num_addresses: *mut c_int, num_datatypes: *mut c_int, combiner: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (ni, na, nc, nd, c) = envelope(datatype)?;
            if num_integers.is_null() || num_addresses.is_null() || num_datatypes.is_null() || combiner.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            no_large_counts(nc)?;
            (*num_integers, *num_addresses, *num_datatypes) = (ni as c_int, na as c_int, nd as c_int);
            *combiner = c;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_get_envelope", r)
    }
    fn MPI_Type_get_contents / PMPI_Type_get_contents(datatype: MPI_Datatype, max_integers: c_int, max_addresses: c_int, max_datatypes: c_int, array_of_integers: *mut c_int, array_of_addresses: *mut MPI_Aint, array_of_datatypes: *mut MPI_Datatype) -> c_int {
        let m = |v: c_int| usize::try_from(v).unwrap_or(0);
        let r = (|| -> R {
            no_large_counts(envelope(datatype)?.2)?;
            contents(datatype, [m(max_integers), m(max_addresses), 0, m(max_datatypes)], array_of_integers, array_of_addresses, std::ptr::null_mut(), array_of_datatypes)
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_get_contents", r)
    }
    fn MPI_Get_address / PMPI_Get_address(location: *const c_void, address: *mut MPI_Aint) -> c_int {
        if address.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Get_address", MpiErr { code: MPI_ERR_ARG, msg: "address is NULL".into() });
        }
        *address = location as MPI_Aint;
        MPI_SUCCESS
    }
    fn MPI_Aint_add / PMPI_Aint_add(base: MPI_Aint, disp: MPI_Aint) -> MPI_Aint {
        base.wrapping_add(disp)
    }
    fn MPI_Aint_diff / PMPI_Aint_diff(addr1: MPI_Aint, addr2: MPI_Aint) -> MPI_Aint {
        addr1.wrapping_sub(addr2)
    }
    fn MPI_Pack_size / PMPI_Pack_size(incount: c_int, datatype: MPI_Datatype, _comm: MPI_Comm, size: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (_, s) = ext_size(datatype)?;
            if size.is_null() {
                return err(MPI_ERR_ARG, "size is NULL");
            }
            *size = (s * nonneg(incount, "incount")?) as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Pack_size", r)
    }
    fn MPI_Pack / PMPI_Pack(inbuf: *const c_void, incount: c_int, datatype: MPI_Datatype, outbuf: *mut c_void, outsize: c_int, position: *mut c_int, comm: MPI_Comm) -> c_int {
        let r = (|| -> R {
            if position.is_null() {
                return err(MPI_ERR_ARG, "position is NULL");
            }
            let st = state()?;
            let d = info(st, datatype)?;
            let n = nonneg(incount, "incount")?;
            let bytes = d.size * n;
            let pos = *position as usize;
            if pos + bytes > outsize.max(0) as usize {
                return err(MPI_ERR_TRUNCATE, format!("{bytes} bytes do not fit at position {pos} of {outsize}"));
            }
            pack(&d, inbuf as *const u8, n, (outbuf as *mut u8).add(pos));
            *position = (pos + bytes) as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Pack", r)
    }
    fn MPI_Unpack / PMPI_Unpack(inbuf: *const c_void, insize: c_int, position: *mut c_int, outbuf: *mut c_void, outcount: c_int, datatype: MPI_Datatype, comm: MPI_Comm) -> c_int {
        let r = (|| -> R {
            if position.is_null() {
                return err(MPI_ERR_ARG, "position is NULL");
            }
            let st = state()?;
            let d = info(st, datatype)?;
            let n = nonneg(outcount, "outcount")?;
            let bytes = d.size * n;
            let pos = *position as usize;
            if pos + bytes > insize.max(0) as usize {
                return err(MPI_ERR_TRUNCATE, format!("{bytes} bytes wanted at position {pos} of {insize}"));
            }
            unpack(&d, (inbuf as *const u8).add(pos), bytes, outbuf as *mut u8, n);
            *position = (pos + bytes) as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Unpack", r)
    }
    fn MPI_Pack_external_size / PMPI_Pack_external_size(datarep: *const c_char, incount: c_int, datatype: MPI_Datatype, size: *mut MPI_Aint) -> c_int {
        let r = (|| -> R {
            check_datarep(datarep)?;
            let st = state()?;
            let d = desc(st, datatype)?;
            let s = external_size(&members(st, &d)?, &d)?;
            if size.is_null() {
                return err(MPI_ERR_ARG, "size is NULL");
            }
            *size = (s * nonneg(incount, "incount")?) as MPI_Aint;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Pack_external_size", r)
    }
    fn MPI_Pack_external / PMPI_Pack_external(datarep: *const c_char, inbuf: *const c_void, incount: c_int, datatype: MPI_Datatype, outbuf: *mut c_void, outsize: MPI_Aint, position: *mut MPI_Aint) -> c_int {
        let r = (|| -> R {
            check_datarep(datarep)?;
            if position.is_null() {
                return err(MPI_ERR_ARG, "position is NULL");
            }
            let st = state()?;
            let d = desc(st, datatype)?;
            let n = nonneg(incount, "incount")?;
            let m = members(st, &d)?;
            let bytes = external_size(&m, &d)? * n;
            let pos = *position as usize;
            if pos + bytes > outsize.max(0) as usize {
                return err(MPI_ERR_TRUNCATE, "output buffer too small");
            }
            let mut v = vec![0u8; d.size * n];
            pack(&d, inbuf as *const u8, n, v.as_mut_ptr());
            convert_external(&m, n, v.as_ptr(), (outbuf as *mut u8).add(pos), true)?;
            *position = (pos + bytes) as MPI_Aint;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Pack_external", r)
    }
    fn MPI_Unpack_external / PMPI_Unpack_external(datarep: *const c_char, inbuf: *const c_void, insize: MPI_Aint, position: *mut MPI_Aint, outbuf: *mut c_void, outcount: c_int, datatype: MPI_Datatype) -> c_int {
        let r = (|| -> R {
            check_datarep(datarep)?;
            if position.is_null() {
                return err(MPI_ERR_ARG, "position is NULL");
            }
            let st = state()?;
            let d = desc(st, datatype)?;
            let n = nonneg(outcount, "outcount")?;
            let m = members(st, &d)?;
            let bytes = external_size(&m, &d)? * n;
            let pos = *position as usize;
            if pos + bytes > insize.max(0) as usize {
                return err(MPI_ERR_TRUNCATE, "input buffer too small");
            }
            let mut v = vec![0u8; d.size * n];
            convert_external(&m, n, (inbuf as *const u8).add(pos), v.as_mut_ptr(), false)?;
            unpack(&d, v.as_ptr(), v.len(), outbuf as *mut u8, n);
            *position = (pos + bytes) as MPI_Aint;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Unpack_external", r)
    }
}

/// Lower bound, extent, true lower bound and true extent of any datatype (read in place: no copy of its
/// description).
fn extents(dt: MPI_Datatype) -> R<(isize, isize, isize, isize)> {
    let st = state()?;
    if is_simple(dt) {
        let s = type_extent(dt)? as isize;
        Ok((0, s, 0, s))
    } else {
        let d = desc(st, dt)?;
        Ok((d.lb, d.extent(), d.true_lb, d.true_ub - d.true_lb))
    }
}

/// Store two results through caller pointers, refusing NULL.
unsafe fn out_pair<T>(a: *mut T, b: *mut T, x: T, y: T) -> R {
    if a.is_null() || b.is_null() {
        return err(MPI_ERR_ARG, "NULL argument");
    }
    *a = x;
    *b = y;
    Ok(())
}

/// The only data representation the standard requires (and MPICH offers): "external32".
unsafe fn check_datarep(datarep: *const c_char) -> R {
    if datarep.is_null() {
        return err(MPI_ERR_ARG, "datarep is NULL");
    }
    let d = std::ffi::CStr::from_ptr(datarep).to_string_lossy();
    if d != "external32" {
        return err(
            MPI_ERR_ARG,
            format!("data representation \"{d}\" is not supported (only \"external32\")"),
        );
    }
    Ok(())
}

/// The basic members of one element of a datatype in typemap order: `pattern` repeated `reps` times,
/// each entry a predefined type that is not a pair (a pair is its two members) and how many of it.
/// Types of size 0 (the MPI-1 markers) are left out.
struct Members {
    pattern: Vec<(MPI_Datatype, usize)>,
    reps: usize,
}

/// Append `n` elements of basic type `t` to a member list, merging with an equal last entry.
fn push_member(out: &mut Vec<(MPI_Datatype, usize)>, t: MPI_Datatype, n: usize) {
    match out.last_mut() {
        _ if n == 0 => {}
        Some(l) if l.0 == t => l.1 += n,
        _ => out.push((t, n)),
    }
}

/// The members of one element of `d` (a type mixing basic types reads its constructor's member types).
fn members(st: &State, d: &Dtype) -> R<Members> {
    if let Some(m) = basic_members(d)? {
        return Ok(m);
    }
    // Members of different types: from the constructor, a struct's member types block by block; any
    // other constructor repeats its one old type as many times as its size holds.
    let mut pattern = Vec::new();
    let mut add = |t: MPI_Datatype, n: usize| -> R {
        if n == 0 {
            return Ok(());
        }
        let m = members(st, &*desc(st, t)?)?;
        match m.pattern[..] {
            [(b, c)] => push_member(&mut pattern, b, c * m.reps * n),
            _ => {
                for _ in 0..m.reps * n {
                    m.pattern
                        .iter()
                        .for_each(|&(b, c)| push_member(&mut pattern, b, c));
                }
            }
        }
        Ok(())
    };
    if d.combiner == MPI_COMBINER_STRUCT {
        for (i, &t) in d.types.iter().enumerate() {
            add(t, d.struct_blocklength(i))?;
        }
    } else {
        let Some(&t) = d.types.first() else {
            return err(MPI_ERR_TYPE, "datatype without a member type");
        };
        let (_, ts) = ext_size(t)?;
        add(t, d.size.checked_div(ts).unwrap_or(0))?;
    }
    Ok(Members { pattern, reps: 1 })
}

/// The members of a type of one basic type (None for a type mixing basic types).
fn basic_members(d: &Dtype) -> R<Option<Members>> {
    if d.basic == MPI_DATATYPE_NULL {
        return Ok(None);
    }
    let mut pattern = Vec::new();
    let reps = match pair_members(d.basic) {
        Some((v, i, _)) => {
            push_member(&mut pattern, v, 1);
            push_member(&mut pattern, i, 1);
            d.nbasic
        }
        None if type_extent(d.basic)? > 0 => {
            pattern.push((d.basic, d.nbasic));
            1
        }
        None => 1,
    };
    Ok(Some(Members { pattern, reps }))
}

impl Members {
    /// Visit `count` elements' members in order; stops at the first error.
    fn each(&self, count: usize, mut f: impl FnMut(MPI_Datatype, usize) -> R) -> R {
        for _ in 0..count.saturating_mul(self.reps) {
            for &(t, n) in &self.pattern {
                f(t, n)?;
            }
        }
        Ok(())
    }
}

/// How a basic type is converted to external32 (big-endian, with the sizes of the MPI standard's table,
/// as MPICH has them).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Conv {
    /// The same size: bytes reversed.
    Swap,
    /// An integer of another size (C long and unsigned long are 4 bytes in external32, wchar_t 2):
    /// truncated when packed, sign- or zero-extended when unpacked, as MPICH converts them.
    Int { signed: bool },
    /// An x87 extended `long double` (16 bytes in memory) as an IEEE quadruple.
    X87,
}

/// The external32 conversion of one basic type: (conversion, native bytes, external bytes) of each of
/// its `units` parts (the two halves of a complex number; one part otherwise).
fn ext32(t: MPI_Datatype) -> R<(Conv, usize, usize, usize)> {
    let native = type_extent(t)?;
    Ok(match t as u32 {
        0x4c00_0807 => (Conv::Int { signed: true }, 8, 4, 1), // MPI_LONG
        0x4c00_0808 => (Conv::Int { signed: false }, 8, 4, 1), // MPI_UNSIGNED_LONG
        0x4c00_040e => (Conv::Int { signed: false }, 4, 2, 1), // MPI_WCHAR
        0x4c00_100c => (Conv::X87, 16, 16, 1),                // MPI_LONG_DOUBLE
        // MPI_C_LONG_DOUBLE_COMPLEX, MPI_CXX_LONG_DOUBLE_COMPLEX
        0x4c00_2042 | 0x4c00_2036 => (Conv::X87, 16, 16, 2),
        u if matches!(
            u & 0xff,
            0x1e | 0x22 | 0x28 | 0x2a | 0x2c | 0x40 | 0x41 | 0x34 | 0x35
        ) =>
        {
            (Conv::Swap, native / 2, native / 2, 2)
        }
        _ => (Conv::Swap, native, native, 1),
    })
}

/// Bytes of one element of `d` in external32, checking that its members `m` describe its size.
fn external_size(m: &Members, d: &Dtype) -> R<usize> {
    let (mut native, mut ext) = (0usize, 0usize);
    for &(t, n) in &m.pattern {
        let (_, ns, es, units) = ext32(t)?;
        native += n * units * ns;
        ext += n * units * es;
    }
    if native.checked_mul(m.reps) != Some(d.size) {
        return err(MPI_ERR_TYPE, format!(
            "external32: the datatype's members describe {} bytes, not {} (was a member type freed?)",
            native.saturating_mul(m.reps), d.size
        ));
    }
    Ok(ext * m.reps)
}

/// Bytes of one element of `dt` in external32 (MPI-IO's "external32" file views use it too).
pub(crate) fn external32_size(dt: MPI_Datatype) -> R<usize> {
    let st = state()?;
    let d = desc(st, dt)?;
    external_size(&members(st, &d)?, &d)
}

/// Convert `count` elements of `dt` between the packed native stream and external32 (`to_ext`: native at
/// `src` to external32 at `dst`; else the reverse).
pub(crate) unsafe fn external32_convert(
    dt: MPI_Datatype,
    count: usize,
    src: *const u8,
    dst: *mut u8,
    to_ext: bool,
) -> R {
    let st = state()?;
    let d = desc(st, dt)?;
    convert_external(&members(st, &d)?, count, src, dst, to_ext)
}

/// The predefined types one element of `dt` is made of, in typemap order, with how many of each (a pair
/// type counts as its two members).
pub(crate) fn member_types(dt: MPI_Datatype) -> R<Vec<(MPI_Datatype, usize)>> {
    let st = state()?;
    let d = desc(st, dt)?;
    let m = members(st, &d)?;
    let mut v = Vec::new();
    m.each(1, |t, n| {
        push_member(&mut v, t, n);
        Ok(())
    })?;
    Ok(v)
}

/// Convert `count` elements of members `m` from the packed native stream at `src` to external32 at `dst`
/// (`pack`), or from external32 at `src` to the packed native stream at `dst`.
unsafe fn convert_external(
    m: &Members,
    count: usize,
    src: *const u8,
    dst: *mut u8,
    pack: bool,
) -> R {
    let (mut p, mut q) = (src, dst);
    m.each(count, |t, n| {
        let (conv, ns, es, units) = ext32(t)?;
        let (from, to) = if pack { (ns, es) } else { (es, ns) };
        for _ in 0..n * units {
            let a = std::slice::from_raw_parts(p, from);
            let b = std::slice::from_raw_parts_mut(q, to);
            match conv {
                Conv::Swap => b.iter_mut().zip(a.iter().rev()).for_each(|(y, x)| *y = *x),
                // Memory is little-endian: packing keeps the low bytes.
                Conv::Int { .. } if pack => b
                    .iter_mut()
                    .zip(a[..es].iter().rev())
                    .for_each(|(y, x)| *y = *x),
                Conv::Int { signed } => {
                    b.fill(if signed && a[0] & 0x80 != 0 { 0xff } else { 0 });
                    b[..es]
                        .iter_mut()
                        .zip(a.iter().rev())
                        .for_each(|(y, x)| *y = *x);
                }
                Conv::X87 if pack => b.copy_from_slice(&vmf_rma::ldouble::to_quad(a)),
                Conv::X87 => b.copy_from_slice(&vmf_rma::ldouble::from_quad(a)),
            }
            (p, q) = (p.add(from), q.add(to));
        }
        Ok(())
    })
}

/// Basic elements in `bytes` of packed data of `dt` (MPI_Get_elements), or None if not a whole number.
/// A pair type counts two elements, and a partial pair its value alone.
pub(crate) fn elements_of(dt: MPI_Datatype, bytes: i64) -> R<Option<i64>> {
    let st = state()?;
    let d = desc(st, dt)?;
    if d.size == 0 {
        return Ok(Some(0));
    }
    let rest = bytes % d.size as i64;
    let m = if rest == 0 {
        Members {
            pattern: vec![],
            reps: 0,
        }
    } else {
        members(st, &d)?
    };
    count_elements(&d, &m, bytes)
}

/// Basic elements in `bytes` of packed data of `d` with members `m` (read only for a partial element).
fn count_elements(d: &Dtype, m: &Members, bytes: i64) -> R<Option<i64>> {
    let (whole, rest) = (bytes / d.size as i64, bytes % d.size as i64);
    let mut n = whole * d.nelem as i64;
    // The rest of a partial element: its basic members in typemap order, as far as they are whole.
    let mut left = rest as usize;
    'walk: for _ in 0..m.reps {
        for &(t, c) in &m.pattern {
            if left == 0 {
                break 'walk;
            }
            let size = type_extent(t)?;
            let k = (left / size).min(c);
            n += k as i64;
            left -= k * size;
            if k < c {
                break 'walk;
            }
        }
    }
    Ok((left == 0).then_some(n))
}

unsafe fn type_attr_slot(st: &mut State, dt: MPI_Datatype) -> R<&mut Vec<(c_int, *mut c_void)>> {
    if !is_derived(dt) {
        type_extent(dt)?;
        return Ok(st.predef_attrs.entry(dt).or_default());
    }
    get(st, dt)?;
    Ok(&mut st.types[(dt as u32 & 0x03ff_ffff) as usize]
        .as_mut()
        .unwrap()
        .attrs)
}

/// Size-specific Fortran types (MPICH's handles).
const INTEGER1: MPI_Datatype = 0x4c00_012d;
const INTEGER2: MPI_Datatype = 0x4c00_022f;
const INTEGER4: MPI_Datatype = 0x4c00_0430;
const INTEGER8: MPI_Datatype = 0x4c00_0831;
const REAL4: MPI_Datatype = 0x4c00_0427;
const REAL8: MPI_Datatype = 0x4c00_0829;
const REAL16: MPI_Datatype = 0x4c00_102b;
const COMPLEX8: MPI_Datatype = 0x4c00_0828;
const COMPLEX16: MPI_Datatype = 0x4c00_102a;
const COMPLEX32: MPI_Datatype = 0x4c00_202c;

/// The predefined type of a Fortran REAL (or, `complex`, COMPLEX) kind with `p` decimal digits and
/// decimal exponent range `r` (MPI_UNDEFINED: any), as `selected_real_kind` picks it with gfortran:
/// IEEE single, double, then quadruple precision.
fn f90_real(p: c_int, r: c_int, complex: bool) -> R<MPI_Datatype> {
    let want = |lim: c_int, x: c_int| x == MPI_UNDEFINED || (0..=lim).contains(&x);
    if p == MPI_UNDEFINED && r == MPI_UNDEFINED {
        return err(MPI_ERR_ARG, "p and r are both MPI_UNDEFINED");
    }
    let kinds = [
        (6, 37, REAL4, COMPLEX8),
        (15, 307, REAL8, COMPLEX16),
        (33, 4931, REAL16, COMPLEX32),
    ];
    match kinds
        .iter()
        .find(|&&(pp, rr, _, _)| want(pp, p) && want(rr, r))
    {
        Some(&(_, _, re, cx)) => Ok(if complex { cx } else { re }),
        None => err(
            MPI_ERR_ARG,
            format!(
                "no Fortran {} kind with precision {p} and range {r}",
                if complex { "COMPLEX" } else { "REAL" }
            ),
        ),
    }
}

/// The type MPI_Type_create_f90_* returns for `(combiner, p, r)`: the predefined `base` described as made
/// by that combiner (what MPI_Type_get_envelope/contents report), one handle per parameter set, as in
/// MPICH; the program must not free it.
fn f90_type(combiner: c_int, p: c_int, r: c_int, base: MPI_Datatype) -> R<MPI_Datatype> {
    let st = state()?;
    if let Some(&h) = st.f90_types.get(&(combiner, p, r)) {
        return Ok(h);
    }
    let mut d = predefined(base)?;
    d.combiner = combiner;
    d.ints = if combiner == MPI_COMBINER_F90_INTEGER {
        vec![r]
    } else {
        vec![p, r]
    };
    let h = add(st, d);
    st.f90_types.insert((combiner, p, r), h);
    Ok(h)
}

mpi_api! {
    fn MPI_Type_match_size / PMPI_Type_match_size(typeclass: c_int, size: c_int, datatype: *mut MPI_Datatype) -> c_int {
        let r = (|| -> R {
            if datatype.is_null() {
                return err(MPI_ERR_ARG, "datatype is NULL");
            }
            // The size-specific Fortran types: what MPI_Sizeof followed by this call is for.
            let cands: &[MPI_Datatype] = match typeclass {
                1 => &[REAL4, REAL8, REAL16],
                2 => &[INTEGER1, INTEGER2, INTEGER4, INTEGER8],
                3 => &[COMPLEX8, COMPLEX16, COMPLEX32],
                _ => return err(MPI_ERR_ARG, format!("typeclass {typeclass} is not MPI_TYPECLASS_REAL, _INTEGER or _COMPLEX")),
            };
            match cands.iter().find(|&&t| type_extent(t).ok() == usize::try_from(size).ok()) {
                Some(&t) => *datatype = t,
                None => return err(MPI_ERR_ARG, format!("no predefined type of typeclass {typeclass} has {size} bytes")),
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_match_size", r)
    }
    fn MPI_Type_create_f90_integer / PMPI_Type_create_f90_integer(r: c_int, newtype: *mut MPI_Datatype) -> c_int {
        let res = (|| -> R {
            if newtype.is_null() {
                return err(MPI_ERR_ARG, "newtype is NULL");
            }
            // selected_int_kind(r): the smallest integer holding every value below 10^r.
            let base = match r {
                0..=2 => INTEGER1,
                3..=4 => INTEGER2,
                5..=9 => INTEGER4,
                10..=18 => INTEGER8,
                _ => return err(MPI_ERR_ARG, format!("no Fortran INTEGER kind with range {r}")),
            };
            *newtype = f90_type(MPI_COMBINER_F90_INTEGER, 0, r, base)?;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_create_f90_integer", res)
    }
    fn MPI_Type_create_f90_real / PMPI_Type_create_f90_real(p: c_int, r: c_int, newtype: *mut MPI_Datatype) -> c_int {
        let res = (|| -> R {
            if newtype.is_null() {
                return err(MPI_ERR_ARG, "newtype is NULL");
            }
            *newtype = f90_type(MPI_COMBINER_F90_REAL, p, r, f90_real(p, r, false)?)?;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_create_f90_real", res)
    }
    fn MPI_Type_create_f90_complex / PMPI_Type_create_f90_complex(p: c_int, r: c_int, newtype: *mut MPI_Datatype) -> c_int {
        let res = (|| -> R {
            if newtype.is_null() {
                return err(MPI_ERR_ARG, "newtype is NULL");
            }
            *newtype = f90_type(MPI_COMBINER_F90_COMPLEX, p, r, f90_real(p, r, true)?)?;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_create_f90_complex", res)
    }
    fn MPI_Type_create_keyval / PMPI_Type_create_keyval(type_copy_attr_fn: Option<crate::comm::CopyFn>, type_delete_attr_fn: Option<crate::comm::DeleteFn>, type_keyval: *mut c_int, extra_state: *mut c_void) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Type_create_keyval", crate::comm::keyval_create(type_copy_attr_fn, type_delete_attr_fn, type_keyval, extra_state))
    }
    fn MPI_Type_free_keyval / PMPI_Type_free_keyval(type_keyval: *mut c_int) -> c_int {
        crate::comm::PMPI_Comm_free_keyval(type_keyval)
    }
    fn MPI_Type_set_attr / PMPI_Type_set_attr(datatype: MPI_Datatype, type_keyval: c_int, attribute_val: *mut c_void) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            crate::comm::user_key(st, type_keyval)?;
            let old = type_attr_slot(st, datatype)?.iter().find(|a| a.0 == type_keyval).map(|a| a.1);
            if let Some(v) = old {
                crate::comm::delete_obj_attr(st, datatype, type_keyval, v)?;
            }
            let a = type_attr_slot(st, datatype)?;
            match a.iter_mut().find(|x| x.0 == type_keyval) {
                Some(x) => x.1 = attribute_val,
                None => a.push((type_keyval, attribute_val)),
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_set_attr", r)
    }
    fn MPI_Type_get_attr / PMPI_Type_get_attr(datatype: MPI_Datatype, type_keyval: c_int, attribute_val: *mut c_void, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            crate::comm::user_key(st, type_keyval)?;
            if attribute_val.is_null() || flag.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            match type_attr_slot(st, datatype)?.iter().find(|a| a.0 == type_keyval) {
                Some(a) => {
                    *(attribute_val as *mut *mut c_void) = a.1;
                    *flag = 1;
                }
                None => *flag = 0,
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_get_attr", r)
    }
    fn MPI_Type_delete_attr / PMPI_Type_delete_attr(datatype: MPI_Datatype, type_keyval: c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            crate::comm::user_key(st, type_keyval)?;
            let Some(pos) = type_attr_slot(st, datatype)?.iter().position(|a| a.0 == type_keyval) else {
                return err(MPI_ERR_KEYVAL, "attribute not set on this datatype");
            };
            let v = type_attr_slot(st, datatype)?[pos].1;
            crate::comm::delete_obj_attr(st, datatype, type_keyval, v)?;
            type_attr_slot(st, datatype)?.remove(pos);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Type_delete_attr", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int() -> Dtype {
        predefined(0x4c000405).unwrap() // MPI_INT
    }

    fn packed(d: &Dtype, src: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; d.size];
        // SAFETY: every block of `d` lies inside `src` (checked by the callers' layouts).
        unsafe { pack(d, src.as_ptr(), 1, out.as_mut_ptr()) };
        out
    }

    #[test]
    fn strided_blocks_are_one_run_and_back_to_back_blocks_one_block() {
        let mut b = Build::new();
        b.place_strided(&int(), 2, 1_000_000_000, 12).unwrap();
        let d = b.finish(0, Contents::default(), vec![]);
        assert_eq!(
            d.blocks,
            vec![Run {
                off: 0,
                len: 8,
                reps: 1_000_000_000,
                stride: 12
            }]
        );
        assert_eq!(
            (d.size, d.lb, d.ub),
            (8_000_000_000, 0, 12 * 999_999_999 + 8)
        );
        let mut b = Build::new();
        b.place_strided(&int(), 3, 5, 12).unwrap();
        let d = b.finish(0, Contents::default(), vec![]);
        assert!(d.contig && d.blocks.len() == 1 && d.size == 60);
        // Single blocks pushed one by one join a run, and a block that breaks the progression starts
        // a new one.
        let mut b = Build::new();
        for o in [0, 16, 32, 48, 100] {
            b.push(o, 4);
        }
        assert_eq!(
            b.blocks,
            vec![
                Run {
                    off: 0,
                    len: 4,
                    reps: 4,
                    stride: 16
                },
                Run {
                    off: 100,
                    len: 4,
                    reps: 1,
                    stride: 0
                }
            ]
        );
    }

    #[test]
    fn runs_pack_in_typemap_order_with_negative_strides_and_nesting() {
        let src: Vec<u8> = (0..64).collect();
        // Three 2-byte blocks going backwards from byte 40.
        let mut b = Build::new();
        b.push_run(Run {
            off: 40,
            len: 2,
            reps: 3,
            stride: -10,
        });
        let mut d = b.finish(0, Contents::default(), vec![]);
        d.size = 6; // push_run places blocks only; the bytes are counted by place/tally
        assert_eq!(packed(&d, &src), vec![40, 41, 30, 31, 20, 21]);
        // A vector of that vector: two elements 4 bytes apart, each its own run.
        let mut inner = d.clone();
        (inner.lb, inner.ub) = (0, 4);
        let mut b = Build::new();
        b.place(&inner, 0, 2).unwrap();
        let d = b.finish(0, Contents::default(), vec![]);
        assert_eq!(
            packed(&d, &src),
            vec![40, 41, 30, 31, 20, 21, 44, 45, 34, 35, 24, 25]
        );
    }

    #[test]
    fn oversized_types_are_errors_not_wraparound() {
        let mut b = Build::new();
        let e = b
            .place_strided(&int(), 1, usize::MAX / 2, 1 << 40)
            .unwrap_err();
        assert_eq!(e.code, MPI_ERR_ARG);
        let mut b = Build::new();
        assert_eq!(
            b.place(&int(), 0, usize::MAX / 2).unwrap_err().code,
            MPI_ERR_ARG
        );
    }

    const BYTE: MPI_Datatype = 0x4c00_010d;
    const LONG: MPI_Datatype = 0x4c00_0807;
    const ULONG: MPI_Datatype = 0x4c00_0808;
    const WCHAR: MPI_Datatype = 0x4c00_040e;
    const LONG_DOUBLE: MPI_Datatype = 0x4c00_100c;
    const FLOAT_INT: MPI_Datatype = 0x8c00_0000u32 as c_int;
    const DOUBLE_INT: MPI_Datatype = 0x8c00_0001u32 as c_int;
    const LONG_INT: MPI_Datatype = 0x8c00_0002u32 as c_int;
    const SHORT_INT: MPI_Datatype = 0x8c00_0003u32 as c_int;
    const LONG_DOUBLE_INT: MPI_Datatype = 0x8c00_0004u32 as c_int;

    fn pd(dt: MPI_Datatype) -> Dtype {
        predefined(dt).unwrap()
    }

    fn block(off: isize, len: usize, reps: usize, stride: isize) -> Run {
        Run {
            off,
            len,
            reps,
            stride,
        }
    }

    /// `n` consecutive elements of `c` as a contiguous type.
    fn contiguous(c: &Dtype, n: usize) -> Dtype {
        let mut b = Build::new();
        b.place(c, 0, n).unwrap();
        b.finish(MPI_COMBINER_CONTIGUOUS, Contents::default(), vec![])
    }

    fn pack_n(d: &Dtype, src: &[u8], n: usize) -> Vec<u8> {
        let mut out = vec![0u8; d.size * n];
        // SAFETY: the callers' buffers hold n extents of `d`.
        unsafe { pack(d, src.as_ptr(), n, out.as_mut_ptr()) };
        out
    }

    #[test]
    fn pair_types_are_their_two_members_in_the_extent_of_the_c_struct() {
        // (type, size, extent, true extent, alignment), as MPICH reports them on x86-64.
        for (t, size, ext, true_ext, align) in [
            (FLOAT_INT, 8, 8, 8, 4),
            (DOUBLE_INT, 12, 16, 12, 8),
            (LONG_INT, 12, 16, 12, 8),
            (SHORT_INT, 6, 8, 8, 4),
            (LONG_DOUBLE_INT, 20, 32, 20, 16),
            (MPI_2INT, 8, 8, 8, 4),
        ] {
            let d = pd(t);
            assert_eq!(
                (d.size, d.extent(), d.true_ub - d.true_lb),
                (size, ext, true_ext)
            );
            assert_eq!((d.align, d.nelem, d.nbasic), (align, 2, 1));
            assert_eq!(d.contig, size as isize == ext, "{t:#x}");
            assert_eq!(is_simple(t), size as isize == ext, "{t:#x}");
            assert_eq!(ext_size(t).unwrap(), (ext, size));
        }
        // The value at 0, the int at its aligned offset: the padding is not data.
        assert_eq!(pd(DOUBLE_INT).blocks, vec![block(0, 12, 1, 0)]);
        assert_eq!(
            pd(SHORT_INT).blocks,
            vec![block(0, 2, 1, 0), block(4, 4, 1, 0)]
        );
        let src: Vec<u8> = (0..32).collect();
        assert_eq!(
            pack_n(&pd(SHORT_INT), &src, 2),
            vec![0, 1, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15]
        );
        let mut want: Vec<u8> = (0..12).collect();
        want.extend(16..28);
        assert_eq!(pack_n(&pd(DOUBLE_INT), &src, 2), want);
        // An array of them is one run, and still an array of the pair type for reductions.
        let c = contiguous(&pd(DOUBLE_INT), 1000);
        assert_eq!(c.blocks, vec![block(0, 12, 1000, 16)]);
        assert_eq!(
            (c.size, c.extent(), c.nbasic, c.nelem),
            (12_000, 16_000, 1000, 2000)
        );
        assert!(!c.contig && c.dense && c.basic == DOUBLE_INT);
        assert!(contiguous(&pd(SHORT_INT), 3).dense);
        // Every other pair is not (a reduction packs it).
        let mut b = Build::new();
        b.place_strided(&pd(DOUBLE_INT), 1, 2, 32).unwrap();
        let v = b.finish(MPI_COMBINER_VECTOR, Contents::default(), vec![]);
        assert_eq!(v.blocks, vec![block(0, 12, 2, 32)]);
        assert!(!v.dense && v.size == 24);
        // A struct {double; int} is the same as MPI_DOUBLE_INT (pairtype_size_extent).
        let s = struct_of(
            &[1, 1],
            &[0, 8],
            &[0x4c00_080b, 0x4c00_0405],
            predefined,
            Contents::default(),
        )
        .unwrap();
        assert_eq!(
            (s.size, s.extent(), s.blocks.clone()),
            (12, 16, pd(DOUBLE_INT).blocks)
        );
    }

    #[test]
    fn get_elements_counts_both_members_of_a_pair() {
        let count =
            |d: &Dtype, bytes| count_elements(d, &basic_members(d).unwrap().unwrap(), bytes);
        let d = pd(DOUBLE_INT);
        // get_elements_pairtype: 24 bytes received as MPI_DOUBLE_INT are 4 elements.
        assert_eq!(count(&d, 24).unwrap(), Some(4));
        // A partial pair counts its value; a partial value nothing whole.
        assert_eq!(count(&d, 20).unwrap(), Some(3));
        assert_eq!(count(&d, 30).unwrap(), None);
        let c = contiguous(&d, 2);
        assert_eq!(count(&c, 24 + 12 + 8).unwrap(), Some(4 + 3));
        assert_eq!(count(&pd(SHORT_INT), 8).unwrap(), Some(3));
        assert_eq!(count(&pd(0x4c00_0405), 12).unwrap(), Some(3));
    }

    /// Pack `n` elements of predefined `t` from `native` to external32 and back.
    fn external(t: MPI_Datatype, native: &[u8], n: usize) -> (usize, Vec<u8>, Vec<u8>) {
        let d = pd(t);
        let m = basic_members(&d).unwrap().unwrap();
        let size = external_size(&m, &d).unwrap();
        let packed = pack_n(&d, native, n);
        let mut ext = vec![0u8; size * n];
        let mut back = vec![0u8; d.size * n];
        // SAFETY: the buffers hold n elements of each representation.
        unsafe {
            convert_external(&m, n, packed.as_ptr(), ext.as_mut_ptr(), true).unwrap();
            convert_external(&m, n, ext.as_ptr(), back.as_mut_ptr(), false).unwrap();
        }
        (size, ext, back)
    }

    fn bytes_of_longs(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn external32_has_the_sizes_of_the_standard_table() {
        // pack_external: C long is 4 bytes in external32, big-endian.
        let (size, ext, back) = external(LONG, &bytes_of_longs(&[1, -2]), 2);
        assert_eq!(size, 4);
        assert_eq!(ext, vec![0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(back, bytes_of_longs(&[1, -2]));
        // A value that does not fit keeps its low 32 bits (MPICH converts as C does), and comes back
        // sign-extended; an unsigned long zero-extended.
        let (_, ext, back) = external(LONG, &bytes_of_longs(&[0x1_0000_0005, 0xffff_ffff]), 2);
        assert_eq!(ext, vec![0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(back, bytes_of_longs(&[5, -1]));
        let (size, ext, back) = external(ULONG, &bytes_of_longs(&[0xffff_ffff]), 1);
        assert_eq!((size, ext), (4, vec![0xff; 4]));
        assert_eq!(back, bytes_of_longs(&[0xffff_ffff]));
        let (size, ext, _) = external(WCHAR, &0x41u32.to_le_bytes(), 1);
        assert_eq!((size, ext), (2, vec![0, 0x41]));
        // Sizes of the pair types: their members' (MPI_LONG_INT: 4 + 4).
        for (t, want) in [
            (FLOAT_INT, 8),
            (DOUBLE_INT, 12),
            (LONG_INT, 8),
            (SHORT_INT, 6),
            (LONG_DOUBLE_INT, 20),
            (BYTE, 1),
            (0x4c00_0840, 8), // MPI_C_FLOAT_COMPLEX
        ] {
            let d = pd(t);
            let m = basic_members(&d).unwrap().unwrap();
            assert_eq!(external_size(&m, &d).unwrap(), want, "{t:#x}");
        }
        // A pair: each member big-endian, no padding.
        let mut li = vec![0u8; 16];
        li[..8].copy_from_slice(&(-3i64).to_le_bytes());
        li[8..12].copy_from_slice(&7i32.to_le_bytes());
        let (_, ext, back) = external(LONG_INT, &li, 1);
        assert_eq!(ext, vec![0xff, 0xff, 0xff, 0xfd, 0, 0, 0, 7]);
        assert_eq!(back, [&li[..12]].concat());
    }

    #[test]
    fn external32_long_double_is_an_ieee_quadruple() {
        // 1.0 and 2.0 as x87 extended values, in 16 bytes (pack_external's expected bytes).
        let x87 = |m: u64, se: u16| {
            let mut v = m.to_le_bytes().to_vec();
            v.extend(se.to_le_bytes());
            v.extend([0u8; 6]);
            v
        };
        let native = [x87(1 << 63, 0x3fff), x87(1 << 63, 0x4000)].concat();
        let (size, ext, back) = external(LONG_DOUBLE, &native, 2);
        let mut want = vec![0u8; 32];
        (want[0], want[1], want[16]) = (0x3f, 0xff, 0x40);
        assert_eq!((size, ext), (16, want));
        assert_eq!(back, native);
        // Exact both ways for any finite value, negative, denormal, infinite.
        for v in [
            x87(0xaaaa_aaaa_aaaa_aaab, 0x3ffd), // 1/3
            x87(0xc90f_daa2_2168_c235, 0xc000), // -pi
            x87(0x0000_0000_0000_0001, 0),      // the smallest denormal
            x87(1 << 63, 0x7fff),               // infinity
            x87(0, 0),
        ] {
            assert_eq!(
                vmf_rma::ldouble::from_quad(&vmf_rma::ldouble::to_quad(&v)),
                v[..]
            );
        }
        // A quadruple rounds to the nearest x87 value, ties to even.
        let mut q = vmf_rma::ldouble::to_quad(&x87(1 << 63, 0x3fff));
        q[15] = 1; // 1 + 2^-112
        assert_eq!(vmf_rma::ldouble::from_quad(&q), x87(1 << 63, 0x3fff)[..]);
        // Bit 48 of the quadruple is half an ulp of the x87 mantissa (byte 9, big-endian).
        let half = |m: u64, more: bool| {
            let mut q = vmf_rma::ldouble::to_quad(&x87(m, 0x3fff));
            q[9] |= 1;
            q[10] |= if more { 0x80 } else { 0 };
            vmf_rma::ldouble::from_quad(&q)
        };
        assert_eq!(half((1 << 63) | 1, false), x87((1 << 63) | 2, 0x3fff)[..]);
        assert_eq!(half((1 << 63) | 2, false), x87((1 << 63) | 2, 0x3fff)[..]);
        assert_eq!(half((1 << 63) | 2, true), x87((1 << 63) | 3, 0x3fff)[..]);
        // Rounding up the largest mantissa carries into the exponent.
        assert_eq!(half(u64::MAX, false), x87(1 << 63, 0x4000)[..]);
    }

    /// A struct of (type, blocklength, displacement) members of predefined types.
    fn strukt(m: &[(MPI_Datatype, usize, isize)]) -> Dtype {
        let lens: Vec<usize> = m.iter().map(|x| x.1).collect();
        let disps: Vec<isize> = m.iter().map(|x| x.2).collect();
        let types: Vec<MPI_Datatype> = m.iter().map(|x| x.0).collect();
        struct_of(&lens, &disps, &types, predefined, Contents::default()).unwrap()
    }

    /// (lb, extent, true lb, true extent, size)
    fn bounds(d: &Dtype) -> (isize, isize, isize, isize, usize) {
        (d.lb, d.extent(), d.true_lb, d.true_ub - d.true_lb, d.size)
    }

    #[test]
    fn mpi1_markers_set_the_bounds_of_a_struct_and_are_no_data() {
        // lbub_oldapi: { (LB,-3), 4*(BYTE,0), (UB,6) }
        let t = strukt(&[(MPI_LB, 1, -3), (BYTE, 4, 0), (MPI_UB, 1, 6)]);
        assert_eq!(bounds(&t), (-3, 9, 0, 4, 4));
        assert_eq!(t.blocks, vec![block(0, 4, 1, 0)]);
        assert!(!t.contig);
        let c = contiguous(&t, 3);
        assert_eq!(bounds(&c), (-3, 27, 0, 22, 12));
        assert_eq!(
            pack_n(&c, &(0..40).collect::<Vec<u8>>(), 1),
            [0, 1, 2, 3, 9, 10, 11, 12, 18, 19, 20, 21]
        );
        // Markers the other way round: a negative extent.
        let n = strukt(&[(MPI_LB, 1, 6), (BYTE, 4, 0), (MPI_UB, 1, -3)]);
        assert_eq!(bounds(&n), (6, -9, 0, 4, 4));
        assert_eq!(bounds(&contiguous(&n, 3)), (-12, 9, -18, 22, 12));
        // struct_no_real_types: only a marker.
        assert_eq!(bounds(&strukt(&[(MPI_LB, 1, 10)])), (10, -10, 0, 0, 0));
        // The last marker of a kind wins; the other bound stays the members' (with the padding).
        let t = strukt(&[
            (MPI_UB, 1, 100),
            (0x4c00_0405, 1, 0),
            (0x4c00_080b, 1, 8),
            (MPI_UB, 0, 40),
        ]);
        assert_eq!(bounds(&t), (0, 40, 0, 16, 12));
        let t = strukt(&[(MPI_LB, 1, -8), (0x4c00_080b, 1, 0), (0x4c00_0405, 1, 8)]);
        assert_eq!(bounds(&t), (-8, 24, 0, 12, 12));
    }
}
