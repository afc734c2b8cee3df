//! DASS, the instruction set (004_*, Appendix A), as the interpreter runs it: operands resolved (labels
//! to instruction indices, register numbers checked against the register count), common operand forms
//! specialised so the dispatch loop does no operand decoding for them.

/// A source operand: `$N` (immediate), `N` (register N) or `[N]` (the register whose number register N
/// holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    Imm(i64),
    Reg(u32),
    Ind(u32),
}

/// A destination operand: `N` or `[N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dst {
    Reg(u32),
    Ind(u32),
}

/// Two-operand arithmetic and bitwise operations (`d = d OP s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alu {
    Set,
    Add,
    Sub,
    Mul,
    Div,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// A jump condition on a comparison of s1 with s2 (signed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    Lt,
    Gt,
    Eq,
    Ne,
    Le,
    Ge,
}

impl Cond {
    /// Whether the condition holds for `ord` (the sign of s1 - s2: -1, 0 or 1).
    #[inline(always)]
    pub fn holds(self, ord: i8) -> bool {
        match self {
            Cond::Lt => ord < 0,
            Cond::Gt => ord > 0,
            Cond::Eq => ord == 0,
            Cond::Ne => ord != 0,
            Cond::Le => ord <= 0,
            Cond::Ge => ord >= 0,
        }
    }
    /// Whether `a COND b` holds.
    #[inline(always)]
    pub fn test(self, a: i64, b: i64) -> bool {
        match self {
            Cond::Lt => a < b,
            Cond::Gt => a > b,
            Cond::Eq => a == b,
            Cond::Ne => a != b,
            Cond::Le => a <= b,
            Cond::Ge => a >= b,
        }
    }
}

/// One instruction. Jump targets are instruction indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insn {
    // register instructions
    In(Dst),
    Out(Src),
    Clk(Dst),
    // memory instructions: lod s d n / str d s n / push s n / pop d n
    Lod { addr: Src, dst: Dst, n: Src },
    Str { addr: Src, src: Dst, n: Src },
    Push { src: Dst, n: Src },
    Pop { dst: Dst, n: Src },
    // arithmetic and bitwise, general form
    Alu(Alu, Dst, Src),
    Inc(Dst),
    Dec(Dst),
    // specialised register forms (the common case: no operand decoding)
    AluRR(Alu, u32, u32),
    AluRI(Alu, u32, i64),
    IncR(u32),
    DecR(u32),
    // control
    Cmp(Src, Src),
    Jmp(u32),
    /// `jlt l` etc.: jump on the flags of the last cmp / cj*.
    JFlag(Cond, u32),
    /// `jlt s1 s2 l` etc.: compare and jump, flags untouched.
    JCmp(Cond, Src, Src, u32),
    /// `cjl s1 s2 l` etc.: compare, set the flags, jump.
    CJmp(Cond, Src, Src, u32),
    JCmpRR(Cond, u32, u32, u32),
    JCmpRI(Cond, u32, i64, u32),
    /// `for s1 s2 l`: s1 += 1; if s1 < s2 jump to l.
    For(Dst, Src, u32),
    ForRR(u32, u32, u32),
    ForRI(u32, i64, u32),
    Hlt,
    // threads and synchronisation
    Fork(u32, Dst),
    Join(Src),
    Thid(Dst),
    Barr(Src, Src),
    Lock(Src),
    Unlock(Src),
    Wait(Src),
    Signal(Src),
}

/// Where an instruction came from (for traps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub line: u32,
    pub text: String,
}

/// An assembled program.
#[derive(Clone, Debug)]
pub struct Program {
    /// File name (as given) the program was assembled from.
    pub file: String,
    pub code: Vec<Insn>,
    pub origin: Vec<Origin>,
    /// Registers every thread has.
    pub registers: u32,
}

impl Program {
    /// `file:line (text)` of instruction `pc`.
    pub fn where_is(&self, pc: usize) -> String {
        match self.origin.get(pc) {
            Some(o) => format!("{}:{} ({})", self.file, o.line, o.text),
            None => format!("{}: past the last instruction", self.file),
        }
    }
}
