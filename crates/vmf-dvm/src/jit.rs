//! A just-in-time compiler for DASS (the thesis's future work, §5.1), with Cranelift.
//!
//! The whole program becomes one native function `f(ctx, pc) -> pc`: it starts at `pc` (a switch over
//! every instruction) and runs until an instruction it does not compile, or a *fallback*, and returns
//! that instruction's index for the interpreter to execute. DASS registers the program names directly
//! become Cranelift variables, so the register allocator keeps the hot ones in machine registers: they
//! are loaded from the thread's register file on entry and the ones the code writes are stored back on
//! exit. Compiled:
//! - arithmetic and bitwise instructions, inc/dec, cmp, every jump, `for` (register and immediate
//!   operands; `[N]` forms go to the interpreter);
//! - `lod`/`str` of 1..=64 words at a register or immediate address: inline, through the thread's
//!   translation cache (the page it used last); an address on another page, unaligned or spanning
//!   pages falls back to the interpreter, which takes the page and refreshes the cache;
//! - `push`/`pop` of an immediate number of registers (fallback on stack overflow/underflow, where the
//!   interpreter traps);
//! - `div` (fallback on a zero divisor; `x / -1` wraps as in the interpreter).
//!
//! Everything else (`out`, `in`, `clk`, threads, synchronisation, `hlt`) exits. Backward jumps count
//! down the safe-point budget and exit when it runs out, so leases, stops and deadlock checks happen
//! as in the interpreter.
use crate::isa::{Alu, Cond, Dst, Insn, Program, Src};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{AbiParam, Block, InstBuilder, MemFlags, Value};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Switch, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use std::collections::BTreeSet;

/// What compiled code reads and writes besides registers (`#[repr(C)]`, offsets below).
#[repr(C)]
pub struct JitCtx {
    pub regs: *mut i64,
    pub tlb: *const crate::space::Tlb,
    pub stack: *mut i64,
    pub sp: u64,
    pub cap: u64,
    pub budget: i64,
    pub flags: i64,
}

const O_REGS: i32 = 0;
const O_TLB: i32 = 8;
const O_STACK: i32 = 16;
const O_SP: i32 = 24;
const O_CAP: i32 = 32;
const O_BUDGET: i32 = 40;
const O_FLAGS: i32 = 48;

type Entry = unsafe extern "C" fn(*mut JitCtx, u64) -> u64;

/// A compiled program.
pub struct Compiled {
    _module: JITModule,
    f: Entry,
    /// Where compiled code may be entered (an entry elsewhere returns at once).
    pub entry: Vec<bool>,
}

// SAFETY: the module only owns finished, immutable code; calling it touches nothing but the ctx.
unsafe impl Send for Compiled {}
unsafe impl Sync for Compiled {}

impl Compiled {
    /// Run from `pc`; returns the instruction the interpreter executes next.
    ///
    /// # Safety
    /// `ctx` must describe this thread's live register file (the program's register count), stack
    /// (`cap` words, `sp` ≤ `cap`) and translation cache.
    #[inline]
    pub unsafe fn run(&self, ctx: &mut JitCtx, pc: usize) -> usize {
        (self.f)(ctx, pc as u64) as usize
    }
}

fn reg_src(s: Src) -> bool {
    !matches!(s, Src::Ind(_))
}

const MAX_WORDS: i64 = 64;
const MAX_PUSH: i64 = 256;

/// Whether instruction `i` is compiled.
fn compilable(i: &Insn, regs: u32) -> bool {
    let range_ok = |d: u32, n: i64, max: i64| (0..=max).contains(&n) && d as i64 + n <= regs as i64;
    match *i {
        Insn::AluRR(..) | Insn::AluRI(..) | Insn::IncR(_) | Insn::DecR(_) => true,
        Insn::ForRR(..) | Insn::ForRI(..) | Insn::JCmpRR(..) | Insn::JCmpRI(..) | Insn::Jmp(_) | Insn::JFlag(..) => true,
        Insn::Alu(_, Dst::Reg(_), s) => reg_src(s),
        Insn::Inc(Dst::Reg(_)) | Insn::Dec(Dst::Reg(_)) => true,
        Insn::For(Dst::Reg(_), s, _) => reg_src(s),
        Insn::Cmp(a, b) | Insn::JCmp(_, a, b, _) | Insn::CJmp(_, a, b, _) => reg_src(a) && reg_src(b),
        Insn::Lod { addr, dst: Dst::Reg(d), n: Src::Imm(n) } => reg_src(addr) && n >= 1 && range_ok(d, n, MAX_WORDS),
        Insn::Str { addr, src: Dst::Reg(s), n: Src::Imm(n) } => reg_src(addr) && n >= 1 && range_ok(s, n, MAX_WORDS),
        Insn::Push { src: Dst::Reg(s), n: Src::Imm(n) } => range_ok(s, n, MAX_PUSH),
        Insn::Pop { dst: Dst::Reg(d), n: Src::Imm(n) } => range_ok(d, n, MAX_PUSH),
        _ => false,
    }
}

/// Registers compiled code reads or writes (read set, written set).
fn registers(p: &Program, ok: &[bool]) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let (mut r, mut w) = (BTreeSet::new(), BTreeSet::new());
    let src = |s: Src, r: &mut BTreeSet<u32>| {
        if let Src::Reg(x) = s {
            r.insert(x);
        }
    };
    for (i, insn) in p.code.iter().enumerate() {
        if !ok[i] {
            continue;
        }
        match *insn {
            Insn::AluRR(_, d, s) => {
                r.extend([d, s]);
                w.insert(d);
            }
            Insn::AluRI(_, d, _) | Insn::IncR(d) | Insn::DecR(d) | Insn::Inc(Dst::Reg(d)) | Insn::Dec(Dst::Reg(d)) => {
                r.insert(d);
                w.insert(d);
            }
            Insn::Alu(_, Dst::Reg(d), s) | Insn::For(Dst::Reg(d), s, _) => {
                r.insert(d);
                w.insert(d);
                src(s, &mut r);
            }
            Insn::ForRR(a, b, _) => {
                r.extend([a, b]);
                w.insert(a);
            }
            Insn::ForRI(a, _, _) => {
                r.insert(a);
                w.insert(a);
            }
            Insn::JCmpRR(_, a, b, _) => r.extend([a, b]),
            Insn::JCmpRI(_, a, _, _) => {
                r.insert(a);
            }
            Insn::Cmp(a, b) | Insn::JCmp(_, a, b, _) | Insn::CJmp(_, a, b, _) => {
                src(a, &mut r);
                src(b, &mut r);
            }
            Insn::Lod { addr, dst: Dst::Reg(d), n: Src::Imm(n) } => {
                src(addr, &mut r);
                // a fallback leaves them as they were: they are read too
                r.extend(d..d + n as u32);
                w.extend(d..d + n as u32);
            }
            Insn::Str { addr, src: Dst::Reg(s), n: Src::Imm(n) } => {
                src(addr, &mut r);
                r.extend(s..s + n as u32);
            }
            Insn::Push { src: Dst::Reg(s), n: Src::Imm(n) } => {
                r.extend(s..s + n as u32);
            }
            Insn::Pop { dst: Dst::Reg(d), n: Src::Imm(n) } => {
                r.extend(d..d + n as u32);
                w.extend(d..d + n as u32);
            }
            _ => {}
        }
    }
    (r, w)
}

fn target(i: &Insn) -> Option<u32> {
    match *i {
        Insn::Jmp(l) | Insn::JFlag(_, l) | Insn::JCmp(.., l) | Insn::CJmp(.., l) | Insn::JCmpRR(.., l) => Some(l),
        Insn::JCmpRI(.., l) | Insn::For(.., l) | Insn::ForRR(.., l) | Insn::ForRI(.., l) | Insn::Fork(l, _) => Some(l),
        _ => None,
    }
}

/// Whether compiled code may hand instruction `i` to the interpreter although it compiles it.
fn may_fall_back(i: &Insn) -> bool {
    matches!(
        i,
        Insn::Lod { .. } | Insn::Str { .. } | Insn::Push { .. } | Insn::Pop { .. } | Insn::AluRR(Alu::Div, ..) | Insn::AluRI(Alu::Div, ..) | Insn::Alu(Alu::Div, ..)
    )
}

/// Where the interpreter may enter compiled code: the start, every jump target, and the instruction
/// after any the code returns (one it does not compile, a fallback, a jump target where the budget ran
/// out).
fn entries(p: &Program, ok: &[bool]) -> Vec<bool> {
    let n = p.code.len();
    let mut e = vec![false; n + 1];
    e[0] = true;
    for (i, insn) in p.code.iter().enumerate() {
        if let Some(l) = target(insn) {
            e[l as usize] = true;
            e[l as usize + 1] = true;
        }
        if !ok[i] || may_fall_back(insn) {
            e[i + 1] = true;
        }
    }
    e.truncate(n);
    e
}

/// Whether instruction `i` ends its block (a jump, or an exit).
fn terminates(i: &Insn, ok: bool) -> bool {
    !ok || (target(i).is_some() && !matches!(i, Insn::Fork(..)))
}

fn cc(c: Cond) -> IntCC {
    match c {
        Cond::Lt => IntCC::SignedLessThan,
        Cond::Gt => IntCC::SignedGreaterThan,
        Cond::Eq => IntCC::Equal,
        Cond::Ne => IntCC::NotEqual,
        Cond::Le => IntCC::SignedLessThanOrEqual,
        Cond::Ge => IntCC::SignedGreaterThanOrEqual,
    }
}

/// Compile `p` for pages of 2^`page_shift` bytes. None when the host has no Cranelift backend.
pub fn compile(p: &Program, page_shift: u32) -> Result<Compiled, String> {
    let ok: Vec<bool> = p.code.iter().map(|i| compilable(i, p.registers)).collect();
    let (read, written) = registers(p, &ok);
    let entry = entries(p, &ok);
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| f.set(k, v).map_err(|e| format!("cranelift {k}: {e}"));
    set(&mut flags, "opt_level", "speed")?;
    set(&mut flags, "is_pic", "false")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    let isa = cranelift_native::builder()
        .map_err(|e| format!("no native code generator: {e}"))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| format!("cranelift: {e}"))?;
    let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(I64));
    ctx.func.signature.params.push(AbiParam::new(I64));
    ctx.func.signature.returns.push(AbiParam::new(I64));
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        Gen::emit(&mut b, p, &ok, &entry, &read, &written, page_shift);
        b.seal_all_blocks();
        b.finalize();
    }
    let id = module
        .declare_function("dass", Linkage::Export, &ctx.func.signature)
        .map_err(|e| format!("cranelift: {e}"))?;
    let dump = std::env::var_os("VMF_DVM_JIT_DUMP").is_some();
    ctx.set_disasm(dump);
    module.define_function(id, &mut ctx).map_err(|e| format!("cranelift: {e:?}"))?;
    if dump {
        if let Some(v) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
            eprintln!("{}: native code\n{v}", p.file);
        }
    }
    module.clear_context(&mut ctx);
    module.finalize_definitions().map_err(|e| format!("cranelift: {e}"))?;
    let code = module.get_finalized_function(id);
    // SAFETY: the function was declared with this signature (two i64 parameters, one i64 result).
    let f: Entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
    Ok(Compiled {
        _module: module,
        f,
        entry,
    })
}

struct Gen {
    vars: std::collections::HashMap<u32, Variable>,
    ctx: Value,
    exit_pc: Variable,
    budget: Variable,
    flags: Variable,
    sp: Variable,
    stack: Value,
    cap: Value,
    tlb_page: Value,
    tlb_frame: Value,
    tlb_write: Value,
    exit: Block,
    blocks: Vec<Option<Block>>,
    page_shift: u32,
}

impl Gen {
    fn emit(
        b: &mut FunctionBuilder,
        p: &Program,
        ok: &[bool],
        entry_at: &[bool],
        read: &BTreeSet<u32>,
        written: &BTreeSet<u32>,
        page_shift: u32,
    ) {
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let ctx = b.block_params(entry)[0];
        let pc = b.block_params(entry)[1];
        let mf = MemFlags::trusted();
        let regs = b.ins().load(I64, mf, ctx, O_REGS);
        let mut vars = std::collections::HashMap::new();
        for &r in read.iter().chain(written.iter()) {
            if vars.contains_key(&r) {
                continue;
            }
            let v = b.declare_var(I64);
            let x = b.ins().load(I64, mf, regs, (r as i32) * 8);
            b.def_var(v, x);
            vars.insert(r, v);
        }
        let tlb = b.ins().load(I64, mf, ctx, O_TLB);
        let tlb_page = b.ins().load(I64, mf, tlb, 0);
        let tlb_frame = b.ins().load(I64, mf, tlb, 8);
        let tlb_write = b.ins().load(I64, mf, tlb, 16);
        let stack = b.ins().load(I64, mf, ctx, O_STACK);
        let cap = b.ins().load(I64, mf, ctx, O_CAP);
        let mk = |b: &mut FunctionBuilder, off: i32| {
            let v = b.declare_var(I64);
            let x = b.ins().load(I64, mf, ctx, off);
            b.def_var(v, x);
            v
        };
        let sp = mk(b, O_SP);
        let budget = mk(b, O_BUDGET);
        let flags = mk(b, O_FLAGS);
        let exit_pc = b.declare_var(I64);
        b.def_var(exit_pc, pc);
        let exit = b.create_block();
        let n = p.code.len();
        // a block where control can arrive other than from the instruction before
        let own = |i: usize| i == n || entry_at[i] || (i > 0 && terminates(&p.code[i - 1], ok[i - 1]));
        let blocks: Vec<Option<Block>> = (0..=n).map(|i| own(i).then(|| b.create_block())).collect();
        let mut sw = Switch::new();
        for (i, blk) in blocks.iter().enumerate().take(n) {
            if ok[i] && entry_at[i] {
                sw.set_entry(i as u128, blk.expect("entries have blocks"));
            }
        }
        sw.emit(b, pc, exit);
        let mut g = Gen {
            vars,
            ctx,
            exit_pc,
            budget,
            flags,
            sp,
            stack,
            cap,
            tlb_page,
            tlb_frame,
            tlb_write,
            exit,
            blocks,
            page_shift,
        };
        for i in 0..=n {
            if let Some(blk) = g.blocks[i] {
                if i > 0 && !terminates(&p.code[i - 1], ok[i - 1]) {
                    b.ins().jump(blk, &[]);
                }
                b.switch_to_block(blk);
            }
            if i == n {
                // past the last instruction: the interpreter traps there
                g.leave(b, n);
            } else if ok[i] {
                g.insn(b, &p.code[i], i);
            } else {
                g.leave(b, i);
            }
        }
        // the exit: store what compiled code may have changed
        b.switch_to_block(exit);
        let regs = b.ins().load(I64, mf, ctx, O_REGS);
        for &r in written {
            let v = b.use_var(g.vars[&r]);
            b.ins().store(mf, v, regs, (r as i32) * 8);
        }
        for (var, off) in [(g.sp, O_SP), (g.budget, O_BUDGET), (g.flags, O_FLAGS)] {
            let v = b.use_var(var);
            b.ins().store(mf, v, ctx, off);
        }
        let pc = b.use_var(g.exit_pc);
        b.ins().return_(&[pc]);
        let _ = g.ctx;
    }

    fn leave(&mut self, b: &mut FunctionBuilder, pc: usize) {
        let v = b.ins().iconst(I64, pc as i64);
        b.def_var(self.exit_pc, v);
        b.ins().jump(self.exit, &[]);
    }

    fn get(&self, b: &mut FunctionBuilder, r: u32) -> Value {
        b.use_var(self.vars[&r])
    }

    fn src(&self, b: &mut FunctionBuilder, s: Src) -> Value {
        match s {
            Src::Imm(v) => b.ins().iconst(I64, v),
            Src::Reg(r) => self.get(b, r),
            Src::Ind(_) => unreachable!("not compiled"),
        }
    }

    /// Go to instruction `l` (from `pc`): a backward jump counts down the budget.
    fn goto(&mut self, b: &mut FunctionBuilder, l: u32, pc: usize) {
        let target = self.blocks[l as usize].expect("jump targets have blocks");
        if (l as usize) > pc {
            b.ins().jump(target, &[]);
            return;
        }
        let left = b.use_var(self.budget);
        let left = b.ins().iadd_imm(left, -1);
        b.def_var(self.budget, left);
        let out = b.create_block();
        b.ins().brif(left, target, &[], out, &[]);
        b.switch_to_block(out);
        self.leave(b, l as usize);
    }

    /// Jump to `l` if `c`, else fall through to pc + 1.
    fn branch(&mut self, b: &mut FunctionBuilder, c: Value, l: u32, pc: usize) {
        let taken = b.create_block();
        let next = self.blocks[pc + 1].expect("instructions after a branch have blocks");
        b.ins().brif(c, taken, &[], next, &[]);
        b.switch_to_block(taken);
        self.goto(b, l, pc);
    }

    /// Fall back to the interpreter at `pc` unless `good`; continue in a new block.
    fn guard(&mut self, b: &mut FunctionBuilder, good: Value, pc: usize) {
        let cont = b.create_block();
        let bad = b.create_block();
        b.ins().brif(good, cont, &[], bad, &[]);
        b.switch_to_block(bad);
        self.leave(b, pc);
        b.switch_to_block(cont);
    }

    fn alu(&mut self, b: &mut FunctionBuilder, op: Alu, d: u32, s: Value, pc: usize) {
        let a = self.get(b, d);
        let r = match op {
            Alu::Set => s,
            Alu::Add => b.ins().iadd(a, s),
            Alu::Sub => b.ins().isub(a, s),
            Alu::Mul => b.ins().imul(a, s),
            Alu::And => b.ins().band(a, s),
            Alu::Or => b.ins().bor(a, s),
            Alu::Xor => b.ins().bxor(a, s),
            // Cranelift shifts by the amount modulo 64, as DASS defines
            Alu::Shl => b.ins().ishl(a, s),
            Alu::Shr => b.ins().ushr(a, s),
            Alu::Div => {
                let nz = b.ins().icmp_imm(IntCC::NotEqual, s, 0);
                self.guard(b, nz, pc);
                // x / -1 wraps (idiv would fault on i64::MIN / -1)
                let m1 = b.ins().icmp_imm(IntCC::Equal, s, -1);
                let neg = b.ins().ineg(a);
                let one = b.ins().iconst(I64, 1);
                let safe = b.ins().select(m1, one, s);
                let q = b.ins().sdiv(a, safe);
                b.ins().select(m1, neg, q)
            }
        };
        b.def_var(self.vars[&d], r);
    }

    fn set_flags(&mut self, b: &mut FunctionBuilder, x: Value, y: Value) {
        let lt = b.ins().icmp(IntCC::SignedLessThan, x, y);
        let gt = b.ins().icmp(IntCC::SignedGreaterThan, x, y);
        let lt = b.ins().uextend(I64, lt);
        let gt = b.ins().uextend(I64, gt);
        let f = b.ins().isub(gt, lt);
        b.def_var(self.flags, f);
    }

    fn flag_holds(&mut self, b: &mut FunctionBuilder, c: Cond) -> Value {
        let f = b.use_var(self.flags);
        b.ins().icmp_imm(cc(c), f, 0)
    }

    /// The frame address of `n` words at `addr`, or a fallback at `pc`.
    fn frame(&mut self, b: &mut FunctionBuilder, addr: Value, n: i64, write: bool, pc: usize) -> Value {
        let low = b.ins().band_imm(addr, 7);
        let aligned = b.ins().icmp_imm(IntCC::Equal, low, 0);
        let page = b.ins().ushr_imm(addr, self.page_shift as i64);
        let last = b.ins().iadd_imm(addr, 8 * n - 1);
        let last_page = b.ins().ushr_imm(last, self.page_shift as i64);
        let same = b.ins().icmp(IntCC::Equal, page, self.tlb_page);
        let same_last = b.ins().icmp(IntCC::Equal, last_page, self.tlb_page);
        let mut good = b.ins().band(aligned, same);
        good = b.ins().band(good, same_last);
        if write {
            let w = b.ins().icmp_imm(IntCC::NotEqual, self.tlb_write, 0);
            good = b.ins().band(good, w);
        }
        self.guard(b, good, pc);
        let off = b.ins().band_imm(addr, (1i64 << self.page_shift) - 1);
        b.ins().iadd(self.tlb_frame, off)
    }

    fn insn(&mut self, b: &mut FunctionBuilder, insn: &Insn, pc: usize) {
        let mf = MemFlags::trusted();
        match *insn {
            Insn::AluRR(op, d, s) => {
                let s = self.get(b, s);
                self.alu(b, op, d, s, pc);
            }
            Insn::AluRI(op, d, v) => {
                let s = b.ins().iconst(I64, v);
                self.alu(b, op, d, s, pc);
            }
            Insn::Alu(op, Dst::Reg(d), s) => {
                let s = self.src(b, s);
                self.alu(b, op, d, s, pc);
            }
            Insn::IncR(d) | Insn::Inc(Dst::Reg(d)) => {
                let a = self.get(b, d);
                let r = b.ins().iadd_imm(a, 1);
                b.def_var(self.vars[&d], r);
            }
            Insn::DecR(d) | Insn::Dec(Dst::Reg(d)) => {
                let a = self.get(b, d);
                let r = b.ins().iadd_imm(a, -1);
                b.def_var(self.vars[&d], r);
            }
            Insn::ForRR(a, s, l) | Insn::For(Dst::Reg(a), Src::Reg(s), l) => {
                let s = self.get(b, s);
                self.for_(b, a, s, l, pc);
                return;
            }
            Insn::ForRI(a, v, l) | Insn::For(Dst::Reg(a), Src::Imm(v), l) => {
                let s = b.ins().iconst(I64, v);
                self.for_(b, a, s, l, pc);
                return;
            }
            Insn::JCmpRR(c, x, y, l) => {
                let (x, y) = (self.get(b, x), self.get(b, y));
                let t = b.ins().icmp(cc(c), x, y);
                self.branch(b, t, l, pc);
                return;
            }
            Insn::JCmpRI(c, x, v, l) => {
                let x = self.get(b, x);
                let t = b.ins().icmp_imm(cc(c), x, v);
                self.branch(b, t, l, pc);
                return;
            }
            Insn::JCmp(c, x, y, l) => {
                let (x, y) = (self.src(b, x), self.src(b, y));
                let t = b.ins().icmp(cc(c), x, y);
                self.branch(b, t, l, pc);
                return;
            }
            Insn::CJmp(c, x, y, l) => {
                let (x, y) = (self.src(b, x), self.src(b, y));
                self.set_flags(b, x, y);
                let t = self.flag_holds(b, c);
                self.branch(b, t, l, pc);
                return;
            }
            Insn::Cmp(x, y) => {
                let (x, y) = (self.src(b, x), self.src(b, y));
                self.set_flags(b, x, y);
            }
            Insn::JFlag(c, l) => {
                let t = self.flag_holds(b, c);
                self.branch(b, t, l, pc);
                return;
            }
            Insn::Jmp(l) => {
                self.goto(b, l, pc);
                return;
            }
            Insn::Lod { addr, dst: Dst::Reg(d), n: Src::Imm(n) } => {
                let a = self.src(b, addr);
                let p = self.frame(b, a, n, false, pc);
                for k in 0..n as u32 {
                    let v = b.ins().load(I64, mf, p, (k * 8) as i32);
                    b.def_var(self.vars[&(d + k)], v);
                }
            }
            Insn::Str { addr, src: Dst::Reg(s), n: Src::Imm(n) } => {
                let a = self.src(b, addr);
                let p = self.frame(b, a, n, true, pc);
                for k in 0..n as u32 {
                    let v = self.get(b, s + k);
                    b.ins().store(mf, v, p, (k * 8) as i32);
                }
            }
            Insn::Push { src: Dst::Reg(s), n: Src::Imm(n) } => {
                let sp = b.use_var(self.sp);
                let end = b.ins().iadd_imm(sp, n);
                let fits = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, end, self.cap);
                self.guard(b, fits, pc);
                let off = b.ins().ishl_imm(sp, 3);
                let base = b.ins().iadd(self.stack, off);
                for k in 0..n as u32 {
                    let v = self.get(b, s + k);
                    b.ins().store(mf, v, base, (k * 8) as i32);
                }
                b.def_var(self.sp, end);
            }
            Insn::Pop { dst: Dst::Reg(d), n: Src::Imm(n) } => {
                let sp = b.use_var(self.sp);
                let enough = b.ins().icmp_imm(IntCC::UnsignedGreaterThanOrEqual, sp, n);
                self.guard(b, enough, pc);
                let from = b.ins().iadd_imm(sp, -n);
                let off = b.ins().ishl_imm(from, 3);
                let base = b.ins().iadd(self.stack, off);
                for k in 0..n as u32 {
                    let v = b.ins().load(I64, mf, base, (k * 8) as i32);
                    b.def_var(self.vars[&(d + k)], v);
                }
                b.def_var(self.sp, from);
            }
            _ => unreachable!("not compiled: {insn:?}"),
        }
    }

    fn for_(&mut self, b: &mut FunctionBuilder, a: u32, bound: Value, l: u32, pc: usize) {
        let x = self.get(b, a);
        let x = b.ins().iadd_imm(x, 1);
        b.def_var(self.vars[&a], x);
        let t = b.ins().icmp(IntCC::SignedLessThan, x, bound);
        self.branch(b, t, l, pc);
    }
}
