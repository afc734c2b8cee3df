//! Reduction operations: the predefined ops on every type the standard allows them on (and MPI_SUM etc.
//! on MPI_CHAR/MPI_BYTE, as MPICH accepts), MINLOC/MAXLOC on the pair types, and user-defined ops
//! (MPI_Op_create/free, commutative or not), plus MPI_Reduce_local and MPI_Op_commutative.
use crate::*;
use std::ffi::{c_int, c_void};
use vmf_rma::reduce::{Elem, ROp};

pub type MPI_Op = c_int;
pub type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype);
/// MPI 4.0's large-count form (`MPI_Op_create_c`): the length is an `MPI_Count`.
pub type UserFnC =
    unsafe extern "C" fn(*mut c_void, *mut c_void, *mut MPI_Count, *mut MPI_Datatype);

/// A user function, in either form.
#[derive(Clone, Copy)]
pub(crate) enum UserCall {
    Int(UserFn),
    Big(UserFnC),
}

pub const MPI_OP_NULL: MPI_Op = 0x1800_0000;
pub const MPI_MAX: MPI_Op = 0x5800_0001;
pub const MPI_MIN: MPI_Op = 0x5800_0002;
pub const MPI_SUM: MPI_Op = 0x5800_0003;
pub const MPI_PROD: MPI_Op = 0x5800_0004;
pub const MPI_LAND: MPI_Op = 0x5800_0005;
pub const MPI_BAND: MPI_Op = 0x5800_0006;
pub const MPI_LOR: MPI_Op = 0x5800_0007;
pub const MPI_BOR: MPI_Op = 0x5800_0008;
pub const MPI_LXOR: MPI_Op = 0x5800_0009;
pub const MPI_BXOR: MPI_Op = 0x5800_000a;
pub const MPI_MINLOC: MPI_Op = 0x5800_000b;
pub const MPI_MAXLOC: MPI_Op = 0x5800_000c;
pub const MPI_REPLACE: MPI_Op = 0x5800_000d;
pub const MPI_NO_OP: MPI_Op = 0x5800_000e;
const OP_BASE: u32 = 0x9800_0000;

/// A user-defined operation.
#[derive(Clone, Copy)]
pub(crate) struct UserOp {
    pub f: UserCall,
    pub commute: bool,
}

/// A resolved reduction: what to apply to runs of `elem`-byte elements.
#[derive(Clone, Copy)]
pub(crate) struct Red {
    pub op: MPI_Op,
    /// The datatype passed to the user function / the basic type for predefined ops.
    pub dt: MPI_Datatype,
    /// Bytes of one element: the extent, or for packed pair types (`coll::red_packed`) the size.
    pub elem: usize,
    pub user: Option<UserCall>,
    pub commute: bool,
}

/// Resolve (op, datatype) for a reduction of `count` elements; returns the reduction and the element
/// count in its units (a contiguous derived type of one basic type reduces as that basic type).
pub(crate) fn resolve(st: &State, op: MPI_Op, dt: MPI_Datatype, count: usize) -> R<(Red, usize)> {
    let u = op as u32;
    if u & 0xfc00_0000 == OP_BASE {
        let o = st
            .ops
            .get((u & 0x03ff_ffff) as usize)
            .copied()
            .flatten()
            .ok_or_else(|| MpiErr {
                code: MPI_ERR_OP,
                msg: format!("invalid op {op:#x}"),
            })?;
        if crate::bigcount::is_wide(st, dt) {
            return err(
                MPI_ERR_COUNT,
                "user-defined reductions of more than INT_MAX elements are not supported (the function would be handed a stand-in datatype)",
            );
        }
        let (ext, _) = if datatype::is_derived(dt) {
            let d = datatype::get(st, dt)?;
            (d.extent() as usize, d.size)
        } else {
            let s = type_extent(dt)?;
            (s, s)
        };
        return Ok((
            Red {
                op,
                dt,
                elem: ext,
                user: Some(o.f),
                commute: o.commute,
            },
            count,
        ));
    }
    if !(MPI_MAX..=MPI_NO_OP).contains(&op) {
        return err(MPI_ERR_OP, format!("invalid op {op:#x}"));
    }
    let (basic, n) = if datatype::is_derived(dt) {
        let d = datatype::get(st, dt)?;
        if d.basic == MPI_DATATYPE_NULL || !d.dense || d.nbasic == 0 {
            return err(MPI_ERR_OP, "predefined reduction on a derived datatype that is not a contiguous run of one basic type");
        }
        (d.basic, count * d.nbasic)
    } else {
        (dt, count)
    };
    let elem = type_extent(basic)?;
    if kind(basic).is_none() || !allowed(op, kind(basic).unwrap()) {
        return err(
            MPI_ERR_OP,
            format!("op {op:#x} is not defined on datatype {basic:#x}"),
        );
    }
    Ok((
        Red {
            op,
            dt: basic,
            elem,
            user: None,
            commute: true,
        },
        n,
    ))
}

/// The element kind of a predefined datatype for reductions (the kernels live in `vmf_rma::reduce`, which
/// one-sided accumulates share).
pub(crate) fn kind(dt: MPI_Datatype) -> Option<Elem> {
    let u = dt as u32;
    if u & 0xffff_fff8 == 0x8c00_0000 {
        return match u & 7 {
            0 => Some(Elem::PFI),
            1 => Some(Elem::PDI),
            2 => Some(Elem::PLI),
            3 => Some(Elem::PSI),
            4 => Some(Elem::Pldi),
            _ => None,
        };
    }
    if u & 0xffff_0000 != 0x4c00_0000 {
        return None;
    }
    Some(match u & 0xff {
        0x01 | 0x18 | 0x37 | 0x2d => Elem::I8,
        0x03 | 0x38 | 0x2f => Elem::I16,
        0x05 | 0x39 | 0x1b | 0x30 | 0x0e | 0x1d => Elem::I32,
        0x07 | 0x09 | 0x3a | 0x31 | 0x43 | 0x44 | 0x45 => Elem::I64,
        0x02 | 0x3b | 0x0d | 0x1a | 0x3f | 0x33 | 0x0f => Elem::U8,
        0x04 | 0x3c => Elem::U16,
        0x06 | 0x3d => Elem::U32,
        0x08 | 0x19 | 0x3e => Elem::U64,
        0x0a | 0x1c | 0x27 => Elem::F32,
        0x0b | 0x1f | 0x29 => Elem::F64,
        0x1e | 0x28 | 0x40 | 0x34 => Elem::C32,
        0x22 | 0x2a | 0x41 | 0x35 => Elem::C64,
        0x16 | 0x20 => Elem::P2I,
        0x21 => Elem::P2F,
        0x23 => Elem::P2D,
        0x0c => Elem::F80,
        0x42 | 0x36 => Elem::C80,
        _ => return None,
    })
}

/// The predefined operation of handle `op`.
#[inline]
pub(crate) fn rop(op: MPI_Op) -> Option<ROp> {
    Some(match op {
        MPI_MAX => ROp::Max,
        MPI_MIN => ROp::Min,
        MPI_SUM => ROp::Sum,
        MPI_PROD => ROp::Prod,
        MPI_LAND => ROp::Land,
        MPI_BAND => ROp::Band,
        MPI_LOR => ROp::Lor,
        MPI_BOR => ROp::Bor,
        MPI_LXOR => ROp::Lxor,
        MPI_BXOR => ROp::Bxor,
        MPI_MINLOC => ROp::MinLoc,
        MPI_MAXLOC => ROp::MaxLoc,
        MPI_REPLACE => ROp::Replace,
        MPI_NO_OP => ROp::NoOp,
        _ => return None,
    })
}

fn allowed(op: MPI_Op, k: Elem) -> bool {
    rop(op).is_some_and(|o| vmf_rma::reduce::allowed(o, k))
}

/// `b = a op b` over `n` elements (a is the left operand: the lower ranks' contribution).
pub(crate) unsafe fn apply(r: &Red, a: *const u8, b: *mut u8, n: usize) {
    if n == 0 {
        return;
    }
    if let Some(f) = r.user {
        let mut dt = r.dt;
        match f {
            UserCall::Int(f) => {
                // Element counts never exceed INT_MAX (a larger count is MPI_ERR_COUNT at the call).
                let mut len = n as c_int;
                f(a as *mut c_void, b as *mut c_void, &mut len, &mut dt);
            }
            UserCall::Big(f) => {
                let mut len = n as MPI_Count;
                f(a as *mut c_void, b as *mut c_void, &mut len, &mut dt);
            }
        }
        return;
    }
    let (Some(o), Some(k)) = (rop(r.op), kind(r.dt)) else {
        return; // checked by resolve
    };
    // Pairs are laid out as in memory (`elem` is the extent) or packed (`elem` is the size).
    vmf_rma::reduce::apply(o, k, a, b, n, r.elem);
}

/// MPI_Op_create(_c): a user-defined operation.
unsafe fn create(f: Option<UserCall>, commute: c_int, op: *mut MPI_Op) -> R {
    let st = state()?;
    let f = f.ok_or_else(|| MpiErr {
        code: MPI_ERR_ARG,
        msg: "user function is NULL".into(),
    })?;
    if op.is_null() {
        return err(MPI_ERR_ARG, "op is NULL");
    }
    let i = put_in_free_slot(
        &mut st.ops,
        0,
        UserOp {
            f,
            commute: commute != 0,
        },
    );
    *op = (OP_BASE | i as u32) as c_int;
    Ok(())
}

mpi_api! {
    fn MPI_Op_create / PMPI_Op_create(user_fn: Option<UserFn>, commute: c_int, op: *mut MPI_Op) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Op_create", create(user_fn.map(UserCall::Int), commute, op))
    }
    fn MPI_Op_create_c / PMPI_Op_create_c(user_fn: Option<UserFnC>, commute: c_int, op: *mut MPI_Op) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Op_create_c", create(user_fn.map(UserCall::Big), commute, op))
    }
    fn MPI_Op_free / PMPI_Op_free(op: *mut MPI_Op) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if op.is_null() {
                return err(MPI_ERR_ARG, "op is NULL");
            }
            let u = *op as u32;
            let i = (u & 0x03ff_ffff) as usize;
            if u & 0xfc00_0000 != OP_BASE || st.ops.get(i).is_none_or(|o| o.is_none()) {
                return err(MPI_ERR_OP, "MPI_Op_free of a predefined or invalid op");
            }
            st.ops[i] = None;
            *op = MPI_OP_NULL;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Op_free", r)
    }
    fn MPI_Op_commutative / PMPI_Op_commutative(op: MPI_Op, commute: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if commute.is_null() {
                return err(MPI_ERR_ARG, "commute is NULL");
            }
            let u = op as u32;
            *commute = if u & 0xfc00_0000 == OP_BASE {
                st.ops.get((u & 0x03ff_ffff) as usize).copied().flatten().ok_or_else(|| MpiErr { code: MPI_ERR_OP, msg: "invalid op".into() })?.commute as c_int
            } else if (MPI_MAX..=MPI_NO_OP).contains(&op) {
                1
            } else {
                return err(MPI_ERR_OP, format!("invalid op {op:#x}"));
            };
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Op_commutative", r)
    }
    fn MPI_Reduce_local / PMPI_Reduce_local(inbuf: *const c_void, inoutbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if count < 0 {
                return err(MPI_ERR_COUNT, "count is negative");
            }
            let (red, n) = resolve(st, op, datatype, count as usize)?;
            apply(&red, inbuf as *const u8, inoutbuf as *mut u8, n);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Reduce_local", r)
    }
}
