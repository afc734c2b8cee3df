//! Reductions on C `long double` (x86-64: the x87 80-bit extended format, stored in 16 bytes): MPI_SUM,
//! MPI_PROD, MPI_MAX, MPI_MIN on MPI_LONG_DOUBLE, MINLOC/MAXLOC on MPI_LONG_DOUBLE_INT, and SUM/PROD on
//! MPI_C_LONG_DOUBLE_COMPLEX (= MPI_CXX_LONG_DOUBLE_COMPLEX).
//!
//! Rust has no 80-bit float, so the arithmetic is a few x87 instructions in inline assembly: load both
//! operands (`fld tbyte`), one `fadd`/`fmul`/`fcomi`, store (`fstp tbyte`). The x87 control word is the
//! process default (64-bit mantissa, round to nearest), the precision C's `long double` uses, so results
//! are bit-identical to what the program would compute itself. Only the 10 value bytes are written; the
//! 6 padding bytes of the destination are left as they are.
use std::arch::asm;

/// One x87 extended value (10 significant bytes of a 16-byte `long double`).
type F80 = [u8; 10];

#[inline]
unsafe fn ld(p: *const u8) -> F80 {
    let mut v = [0u8; 10];
    std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), 10);
    v
}

#[inline]
unsafe fn st(p: *mut u8, v: &F80) {
    std::ptr::copy_nonoverlapping(v.as_ptr(), p, 10);
}

/// `x + y` in extended precision.
fn add(x: &F80, y: &F80) -> F80 {
    let mut out = [0u8; 10];
    // SAFETY: reads 10 bytes at x and y, writes 10 at out; every x87 register is declared clobbered, so
    // the x87 stack is empty on entry and left empty (two loads, one popping add, one popping store).
    unsafe {
        asm!(
            "fld tbyte ptr [{x}]",
            "fld tbyte ptr [{y}]",
            "faddp st(1), st",
            "fstp tbyte ptr [{o}]",
            x = in(reg) x.as_ptr(), y = in(reg) y.as_ptr(), o = in(reg) out.as_mut_ptr(),
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            options(nostack),
        );
    }
    out
}

/// `x * y` in extended precision.
fn mul(x: &F80, y: &F80) -> F80 {
    let mut out = [0u8; 10];
    // SAFETY: as in `add`.
    unsafe {
        asm!(
            "fld tbyte ptr [{x}]",
            "fld tbyte ptr [{y}]",
            "fmulp st(1), st",
            "fstp tbyte ptr [{o}]",
            x = in(reg) x.as_ptr(), y = in(reg) y.as_ptr(), o = in(reg) out.as_mut_ptr(),
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            options(nostack),
        );
    }
    out
}

/// `-x` (sign flip, exact).
fn neg(x: &F80) -> F80 {
    let mut v = *x;
    v[9] ^= 0x80;
    v
}

/// `x > y` (false when either is a NaN, as in C).
fn gt(x: &F80, y: &F80) -> bool {
    let r: u8;
    // SAFETY: as in `add`: two loads, fcomip pops one, fstp st(0) pops the other.
    unsafe {
        asm!(
            "fld tbyte ptr [{y}]",
            "fld tbyte ptr [{x}]",
            "fcomip st, st(1)",
            "fstp st(0)",
            "seta {r}",
            x = in(reg) x.as_ptr(), y = in(reg) y.as_ptr(), r = out(reg_byte) r,
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            options(nostack),
        );
    }
    r != 0
}

/// What to do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Minimum value and its index.
    MinLoc,
    /// Maximum value and its index.
    MaxLoc,
    /// Logical and/or/xor on values (MPICH accepts them on floating types): the result is 1.0 or 0.0.
    Land,
    /// Logical or.
    Lor,
    /// Logical exclusive or.
    Lxor,
}

/// `x != 0` (either sign of zero is false; NaN is true, as in C).
fn nonzero(x: &F80) -> bool {
    x[..9].iter().any(|&b| b != 0) || x[9] & 0x7f != 0
}

/// 1.0 or 0.0.
fn truth(t: bool) -> F80 {
    if t {
        [0, 0, 0, 0, 0, 0, 0, 0x80, 0xff, 0x3f]
    } else {
        [0; 10]
    }
}

/// `b[i] = a[i] op b[i]` over `n` `long double`s (16-byte elements).
///
/// # Safety
/// `a` must be readable and `b` readable and writable for `16 * n` bytes.
pub unsafe fn real(op: LOp, a: *const u8, b: *mut u8, n: usize) {
    for k in 0..n {
        let (pa, pb) = (a.add(16 * k), b.add(16 * k));
        let (x, y) = (ld(pa), ld(pb));
        match op {
            LOp::Sum => st(pb, &add(&x, &y)),
            LOp::Prod => st(pb, &mul(&x, &y)),
            LOp::Max if gt(&x, &y) => st(pb, &x),
            LOp::Min if gt(&y, &x) => st(pb, &x),
            LOp::Land => st(pb, &truth(nonzero(&x) && nonzero(&y))),
            LOp::Lor => st(pb, &truth(nonzero(&x) || nonzero(&y))),
            LOp::Lxor => st(pb, &truth(nonzero(&x) != nonzero(&y))),
            _ => {}
        }
    }
}

/// SUM/PROD over `n` `long double _Complex` (32-byte elements: real part, imaginary part).
///
/// # Safety
/// `a` must be readable and `b` readable and writable for `32 * n` bytes.
pub unsafe fn complex(op: LOp, a: *const u8, b: *mut u8, n: usize) {
    for k in 0..n {
        let (pa, pb) = (a.add(32 * k), b.add(32 * k));
        let (ar, ai, br, bi) = (ld(pa), ld(pa.add(16)), ld(pb), ld(pb.add(16)));
        let (r, i) = match op {
            LOp::Sum => (add(&ar, &br), add(&ai, &bi)),
            LOp::Prod => (
                add(&mul(&ar, &br), &neg(&mul(&ai, &bi))),
                add(&mul(&ar, &bi), &mul(&ai, &br)),
            ),
            _ => continue,
        };
        st(pb, &r);
        st(pb.add(16), &i);
    }
}

/// MINLOC/MAXLOC over `n` `struct { long double v; int i; }` pairs `stride` bytes apart (32 in memory,
/// 20 packed), the index at byte 16; ties keep the lower index.
///
/// # Safety
/// `a` must be readable and `b` readable and writable for `stride * n` bytes.
pub unsafe fn loc(op: LOp, a: *const u8, b: *mut u8, n: usize, stride: usize) {
    for k in 0..n {
        let (pa, pb) = (a.add(stride * k), b.add(stride * k));
        let (va, vb) = (ld(pa), ld(pb));
        let ia = (pa.add(16) as *const i32).read_unaligned();
        let ib = (pb.add(16) as *const i32).read_unaligned();
        let better = if op == LOp::MinLoc {
            gt(&vb, &va)
        } else {
            gt(&va, &vb)
        };
        let equal = !gt(&va, &vb) && !gt(&vb, &va);
        if better || (equal && ia < ib) {
            st(pb, &va);
            (pb.add(16) as *mut i32).write_unaligned(ia);
        }
    }
}

/// A `long double` (16 bytes in memory, the first 10 an x87 extended value) as external32 has it: an
/// IEEE quadruple, big-endian. Exact: the quadruple's 112-bit fraction holds the 63 bits below the x87
/// explicit integer bit, with the same exponent range (a denormal keeps the scale of its exponent 1).
pub fn to_quad(x: &[u8]) -> [u8; 16] {
    let m = u64::from_le_bytes(x[..8].try_into().unwrap()) as u128;
    let se = u16::from_le_bytes([x[8], x[9]]) as u128;
    let (sign, exp) = (se >> 15, se & 0x7fff);
    let q = if exp == 0 {
        // A (pseudo-)denormal: the same scale; an integer bit carries into exponent 1.
        (sign << 127) | (m << 49)
    } else {
        (sign << 127) | (exp << 112) | ((m & !(1 << 63)) << 49)
    };
    q.to_be_bytes()
}

/// The inverse of [`to_quad`]: an external32 quadruple (big-endian) as a 16-byte `long double`, the
/// fraction rounded to 63 bits (to nearest, ties to even); the 6 padding bytes are zero.
pub fn from_quad(x: &[u8]) -> [u8; 16] {
    let q = u128::from_be_bytes(x[..16].try_into().unwrap());
    let (sign, mut exp) = ((q >> 127) as u16, ((q >> 112) & 0x7fff) as u16);
    let frac = q & ((1u128 << 112) - 1);
    let m: u64 = if exp == 0x7fff {
        // Infinity or NaN (a NaN whose payload is all in the dropped bits stays a quiet NaN).
        let m = (1u64 << 63) | (frac >> 49) as u64;
        if frac != 0 && m == 1 << 63 {
            m | 1 << 62
        } else {
            m
        }
    } else {
        let sig = if exp == 0 { frac } else { frac | 1 << 112 };
        let (mut m, rest) = (sig >> 49, sig & ((1 << 49) - 1));
        if rest > 1 << 48 || (rest == 1 << 48 && m & 1 == 1) {
            m += 1;
        }
        if m == 1 << 64 {
            // Rounded up to the next power of two (infinity past the largest exponent).
            m = 1 << 63;
            exp += 1;
        } else if exp == 0 && m == 1 << 63 {
            // A denormal rounded up to the smallest normal.
            exp = 1;
        }
        m as u64
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&m.to_le_bytes());
    out[8..10].copy_from_slice(&((sign << 15) | exp).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exact small integer as an x87 extended value.
    fn int(v: u64) -> F80 {
        let mut o = [0u8; 10];
        if v == 0 {
            return o;
        }
        let lz = v.leading_zeros();
        let m = v << lz;
        o[..8].copy_from_slice(&m.to_le_bytes());
        let e = 16383 + 63 - lz as u16;
        o[8..].copy_from_slice(&e.to_le_bytes());
        o
    }

    #[test]
    fn arithmetic_and_compare_are_exact() {
        assert_eq!(add(&int(2), &int(3)), int(5));
        assert_eq!(mul(&int(6), &int(7)), int(42));
        assert!(gt(&int(4), &int(3)) && !gt(&int(3), &int(4)) && !gt(&int(3), &int(3)));
        assert_eq!(add(&int(5), &neg(&int(3))), int(2));
        // 1 + 2^-63 is representable in 64 bits of mantissa (not in f64)
        let mut tiny = int(1);
        tiny[8..].copy_from_slice(&(16383u16 - 63).to_le_bytes());
        let s = add(&int(1), &tiny);
        assert_eq!(
            u64::from_le_bytes(s[..8].try_into().unwrap()),
            (1u64 << 63) | 1
        );
    }
}
