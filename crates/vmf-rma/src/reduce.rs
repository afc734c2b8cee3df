//! Reduction kernels on typed elements: the predefined MPI operations (sum, product, min/max, logical and
//! bitwise operations, MINLOC/MAXLOC, replace, no-op) on every basic element kind, over arrays
//! ([`apply`]).
//!
//! The MPI library maps its datatype and operation handles to [`Elem`] and [`ROp`] and runs its
//! collectives' reductions here; one-sided accumulates run the same kernels wherever they execute (at the
//! origin on mapped memory, in the target's agent, or on a copy read by single copy), so every path of an
//! operation computes the same bits.
use crate::ldouble::{self as ld, LOp};

/// The kind of a basic element.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum Elem {
    /// Signed integers.
    I8 = 1,
    /// 16-bit signed.
    I16,
    /// 32-bit signed.
    I32,
    /// 64-bit signed.
    I64,
    /// Unsigned integers (and bytes, characters, logicals).
    U8,
    /// 16-bit unsigned.
    U16,
    /// 32-bit unsigned.
    U32,
    /// 64-bit unsigned.
    U64,
    /// IEEE single.
    F32,
    /// IEEE double.
    F64,
    /// Complex of two singles.
    C32,
    /// Complex of two doubles.
    C64,
    /// (float, int) pair (MPI_FLOAT_INT).
    PFI,
    /// (double, int) pair.
    PDI,
    /// (long, int) pair.
    PLI,
    /// (short, int) pair.
    PSI,
    /// (int, int) pair (MPI_2INT, MPI_2INTEGER).
    P2I,
    /// (real, real) pair (MPI_2REAL).
    P2F,
    /// (double, double) pair (MPI_2DOUBLE_PRECISION).
    P2D,
    /// x87 extended `long double` (16 bytes).
    F80,
    /// Complex of two `long double`s (32 bytes).
    C80,
    /// (long double, int) pair.
    Pldi,
}

impl Elem {
    /// Every kind, in wire order.
    pub const ALL: [Elem; 22] = [
        Elem::I8,
        Elem::I16,
        Elem::I32,
        Elem::I64,
        Elem::U8,
        Elem::U16,
        Elem::U32,
        Elem::U64,
        Elem::F32,
        Elem::F64,
        Elem::C32,
        Elem::C64,
        Elem::PFI,
        Elem::PDI,
        Elem::PLI,
        Elem::PSI,
        Elem::P2I,
        Elem::P2F,
        Elem::P2D,
        Elem::F80,
        Elem::C80,
        Elem::Pldi,
    ];

    /// The kind with wire code `v`.
    pub fn from_u8(v: u8) -> Option<Elem> {
        Elem::ALL.get((v as usize).wrapping_sub(1)).copied()
    }

    /// Bytes of one element as packed data holds it (pairs without padding: MPI_DOUBLE_INT is 12).
    pub fn packed_size(self) -> usize {
        use Elem::*;
        match self {
            I8 | U8 => 1,
            I16 | U16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 | C32 | PFI | P2I | P2F => 8,
            C64 | F80 | P2D => 16,
            PDI | PLI => 12,
            PSI => 6,
            C80 => 32,
            Pldi => 20,
        }
    }

    fn is_int(self) -> bool {
        use Elem::*;
        matches!(self, I8 | I16 | I32 | I64 | U8 | U16 | U32 | U64)
    }

    fn is_pair(self) -> bool {
        use Elem::*;
        matches!(self, PFI | PDI | PLI | PSI | P2I | P2F | P2D | Pldi)
    }
}

/// A predefined reduction operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum ROp {
    /// Maximum.
    Max = 1,
    /// Minimum.
    Min,
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Logical and.
    Land,
    /// Bitwise and.
    Band,
    /// Logical or.
    Lor,
    /// Bitwise or.
    Bor,
    /// Logical exclusive or.
    Lxor,
    /// Bitwise exclusive or.
    Bxor,
    /// Minimum value and its index (pairs).
    MinLoc,
    /// Maximum value and its index (pairs).
    MaxLoc,
    /// The operand replaces the target.
    Replace,
    /// The target stays (an atomic read for the fetching operations).
    NoOp,
}

impl ROp {
    /// Every operation, in wire order.
    pub const ALL: [ROp; 14] = [
        ROp::Max,
        ROp::Min,
        ROp::Sum,
        ROp::Prod,
        ROp::Land,
        ROp::Band,
        ROp::Lor,
        ROp::Bor,
        ROp::Lxor,
        ROp::Bxor,
        ROp::MinLoc,
        ROp::MaxLoc,
        ROp::Replace,
        ROp::NoOp,
    ];

    /// The operation with wire code `v`.
    pub fn from_u8(v: u8) -> Option<ROp> {
        ROp::ALL.get((v as usize).wrapping_sub(1)).copied()
    }
}

/// True if `op` is defined on `e` (MPI's table; logical operations on floating types as MPICH allows).
pub fn allowed(op: ROp, e: Elem) -> bool {
    use Elem::*;
    let int = e.is_int();
    let float = matches!(e, F32 | F64 | F80);
    let cplx = matches!(e, C32 | C64 | C80);
    match op {
        ROp::Max | ROp::Min => int || float,
        ROp::Sum | ROp::Prod => int || float || cplx,
        ROp::Land | ROp::Lor | ROp::Lxor => int || float,
        ROp::Band | ROp::Bor | ROp::Bxor => int,
        ROp::MinLoc | ROp::MaxLoc => e.is_pair(),
        ROp::Replace | ROp::NoOp => true,
    }
}

/// Apply elementwise `b[i] = f(a[i], b[i])` over `n` elements of type `T`.
#[inline(always)]
unsafe fn zip<T: Copy>(a: *const u8, b: *mut u8, n: usize, f: impl Fn(T, T) -> T) {
    let (a, b) = (a as *const T, b as *mut T);
    let al = std::mem::align_of::<T>();
    if (a as usize) % al == 0 && (b as usize) % al == 0 {
        let a = std::slice::from_raw_parts(a, n);
        let b = std::slice::from_raw_parts_mut(b, n);
        for (x, y) in a.iter().zip(b.iter_mut()) {
            *y = f(*x, *y);
        }
    } else {
        for i in 0..n {
            let x = a.add(i).read_unaligned();
            let y = b.add(i).read_unaligned();
            b.add(i).write_unaligned(f(x, y));
        }
    }
}

macro_rules! int_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $n:expr) => {
        match $op {
            ROp::Sum => zip::<$t>($a, $b, $n, |x, y| x.wrapping_add(y)),
            ROp::Prod => zip::<$t>($a, $b, $n, |x, y| x.wrapping_mul(y)),
            ROp::Max => zip::<$t>($a, $b, $n, |x, y| if x > y { x } else { y }),
            ROp::Min => zip::<$t>($a, $b, $n, |x, y| if x < y { x } else { y }),
            ROp::Land => zip::<$t>($a, $b, $n, |x, y| ((x != 0) && (y != 0)) as $t),
            ROp::Lor => zip::<$t>($a, $b, $n, |x, y| ((x != 0) || (y != 0)) as $t),
            ROp::Lxor => zip::<$t>($a, $b, $n, |x, y| ((x != 0) != (y != 0)) as $t),
            ROp::Band => zip::<$t>($a, $b, $n, |x, y| x & y),
            ROp::Bor => zip::<$t>($a, $b, $n, |x, y| x | y),
            ROp::Bxor => zip::<$t>($a, $b, $n, |x, y| x ^ y),
            _ => {}
        }
    };
}

macro_rules! float_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $n:expr) => {
        match $op {
            ROp::Sum => zip::<$t>($a, $b, $n, |x, y| x + y),
            ROp::Prod => zip::<$t>($a, $b, $n, |x, y| x * y),
            ROp::Max => zip::<$t>($a, $b, $n, |x, y| if x > y { x } else { y }),
            ROp::Min => zip::<$t>($a, $b, $n, |x, y| if x < y { x } else { y }),
            // Logical ops on floating values, as MPICH allows: any nonzero value is true.
            ROp::Land => zip::<$t>($a, $b, $n, |x, y| ((x != 0.0) && (y != 0.0)) as u8 as $t),
            ROp::Lor => zip::<$t>($a, $b, $n, |x, y| ((x != 0.0) || (y != 0.0)) as u8 as $t),
            ROp::Lxor => zip::<$t>($a, $b, $n, |x, y| ((x != 0.0) != (y != 0.0)) as u8 as $t),
            _ => {}
        }
    };
}

macro_rules! cplx_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $n:expr) => {
        match $op {
            ROp::Sum => zip::<$t>($a, $b, 2 * $n, |x, y| x + y),
            ROp::Prod => zip::<[$t; 2]>($a, $b, $n, |x, y| {
                [x[0] * y[0] - x[1] * y[1], x[0] * y[1] + x[1] * y[0]]
            }),
            _ => {}
        }
    };
}

/// MINLOC/MAXLOC on (value, index) pairs laid out as a C struct of `size` bytes with the index at `ioff`.
unsafe fn loc<V: Copy + PartialOrd, I: Copy + Ord>(
    op: ROp,
    a: *const u8,
    b: *mut u8,
    n: usize,
    size: usize,
    ioff: usize,
) {
    for k in 0..n {
        let pa = a.add(k * size);
        let pb = b.add(k * size);
        let (va, ia) = (
            (pa as *const V).read_unaligned(),
            (pa.add(ioff) as *const I).read_unaligned(),
        );
        let (vb, ib) = (
            (pb as *const V).read_unaligned(),
            (pb.add(ioff) as *const I).read_unaligned(),
        );
        let take_a = if op == ROp::MinLoc {
            va < vb || (va == vb && ia < ib)
        } else {
            va > vb || (va == vb && ia < ib)
        };
        if take_a {
            (pb as *mut V).write_unaligned(va);
            (pb.add(ioff) as *mut I).write_unaligned(ia);
        }
    }
}

/// MINLOC/MAXLOC on Fortran pairs of one float type (the index is a float too).
unsafe fn locf<V: Copy + PartialOrd>(op: ROp, a: *const u8, b: *mut u8, n: usize) {
    let s = std::mem::size_of::<V>();
    for k in 0..n {
        let pa = a.add(2 * k * s) as *const V;
        let pb = b.add(2 * k * s) as *mut V;
        let (va, ia, vb, ib) = (
            pa.read_unaligned(),
            pa.add(1).read_unaligned(),
            pb.read_unaligned(),
            pb.add(1).read_unaligned(),
        );
        let take_a = if op == ROp::MinLoc {
            va < vb || (va == vb && ia < ib)
        } else {
            va > vb || (va == vb && ia < ib)
        };
        if take_a {
            pb.write_unaligned(va);
            pb.add(1).write_unaligned(ia);
        }
    }
}

/// `b[i] = a[i] op b[i]` over `n` elements of kind `e` (`a` is the left operand). `stride` is the
/// distance between elements for the pair kinds with padding (their extent in memory, or their packed
/// size in packed data); other kinds are dense.
///
/// # Safety
/// `a` and `b` must be valid for `n` elements (`b` for writes); `op` must be [`allowed`] on `e`.
pub unsafe fn apply(op: ROp, e: Elem, a: *const u8, b: *mut u8, n: usize, stride: usize) {
    if n == 0 {
        return;
    }
    match op {
        ROp::Replace => {
            std::ptr::copy(a, b, n * stride);
            return;
        }
        ROp::NoOp => return,
        _ => {}
    }
    match e {
        Elem::I8 => int_op!(i8, op, a, b, n),
        Elem::I16 => int_op!(i16, op, a, b, n),
        Elem::I32 => int_op!(i32, op, a, b, n),
        Elem::I64 => int_op!(i64, op, a, b, n),
        Elem::U8 => int_op!(u8, op, a, b, n),
        Elem::U16 => int_op!(u16, op, a, b, n),
        Elem::U32 => int_op!(u32, op, a, b, n),
        Elem::U64 => int_op!(u64, op, a, b, n),
        Elem::F32 => float_op!(f32, op, a, b, n),
        Elem::F64 => float_op!(f64, op, a, b, n),
        Elem::C32 => cplx_op!(f32, op, a, b, n),
        Elem::C64 => cplx_op!(f64, op, a, b, n),
        // Pairs as in memory (`stride` is the extent) or packed (`stride` is the size: no padding).
        Elem::PFI => loc::<f32, i32>(op, a, b, n, 8, 4),
        Elem::PDI => loc::<f64, i32>(op, a, b, n, stride, 8),
        Elem::PLI => loc::<i64, i32>(op, a, b, n, stride, 8),
        Elem::PSI => loc::<i16, i32>(op, a, b, n, stride, stride - 4),
        Elem::P2I => loc::<i32, i32>(op, a, b, n, 8, 4),
        Elem::P2F => locf::<f32>(op, a, b, n),
        Elem::P2D => locf::<f64>(op, a, b, n),
        Elem::F80 | Elem::C80 | Elem::Pldi => {
            let o = match op {
                ROp::Sum => LOp::Sum,
                ROp::Prod => LOp::Prod,
                ROp::Max => LOp::Max,
                ROp::Min => LOp::Min,
                ROp::MinLoc => LOp::MinLoc,
                ROp::MaxLoc => LOp::MaxLoc,
                ROp::Land => LOp::Land,
                ROp::Lor => LOp::Lor,
                _ => LOp::Lxor,
            };
            match e {
                Elem::F80 => ld::real(o, a, b, n),
                Elem::C80 => ld::complex(o, a, b, n),
                _ => ld::loc(o, a, b, n, stride),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain old data.
        unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)).to_vec()
        }
    }

    #[test]
    fn wire_codes_round_trip() {
        for e in Elem::ALL {
            assert_eq!(Elem::from_u8(e as u8), Some(e));
        }
        for o in ROp::ALL {
            assert_eq!(ROp::from_u8(o as u8), Some(o));
        }
        assert_eq!(Elem::from_u8(0), None);
        assert_eq!(ROp::from_u8(200), None);
    }

    #[test]
    fn plain_kernels_compute_the_standard_results() {
        let a = bytes(&[1i32, -5, 7]);
        let mut b = bytes(&[10i32, 3, -2]);
        unsafe { apply(ROp::Sum, Elem::I32, a.as_ptr(), b.as_mut_ptr(), 3, 4) };
        assert_eq!(b, bytes(&[11i32, -2, 5]));
        unsafe { apply(ROp::Max, Elem::I32, a.as_ptr(), b.as_mut_ptr(), 3, 4) };
        assert_eq!(b, bytes(&[11i32, -2, 7]));
        let a = bytes(&[1.5f64, 2.0]);
        let mut b = bytes(&[2.0f64, 0.25]);
        unsafe { apply(ROp::Prod, Elem::F64, a.as_ptr(), b.as_mut_ptr(), 2, 8) };
        assert_eq!(b, bytes(&[3.0f64, 0.5]));
        // (double, int) pairs packed in 12 bytes: MINLOC keeps the lower value, ties the lower index.
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (v, i) in [(1.0f64, 3i32), (5.0, 1)] {
            a.extend_from_slice(&v.to_ne_bytes());
            a.extend_from_slice(&i.to_ne_bytes());
        }
        for (v, i) in [(1.0f64, 2i32), (4.0, 9)] {
            b.extend_from_slice(&v.to_ne_bytes());
            b.extend_from_slice(&i.to_ne_bytes());
        }
        unsafe { apply(ROp::MinLoc, Elem::PDI, a.as_ptr(), b.as_mut_ptr(), 2, 12) };
        assert_eq!(&b[8..12], &2i32.to_ne_bytes());
        assert_eq!(&b[12..20], &4.0f64.to_ne_bytes());
        assert!(allowed(ROp::MinLoc, Elem::PDI) && !allowed(ROp::MinLoc, Elem::F64));
        assert!(!allowed(ROp::Band, Elem::F32) && allowed(ROp::Lor, Elem::F32));
    }
}
