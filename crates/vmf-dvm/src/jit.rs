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
//! Everything else (`out`, `in`, `clk`, threads, synchronisation, `hlt`) exits. Every backward jump
//! (a counting `for` every 8th iteration) compares the node's *poll word* with the value it had on
//! entry (one load, no loop-carried state):
//! a thread waiting for a page, a stopping node or the lease ticker changes it, and the code returns
//! [`RESUME`]` | target` so the interpreter runs a safe point (leases, stop) and comes straight back.
use crate::isa::{Alu, Cond, Dst, Insn, Program, Src};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I64, I64X2};
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
    pub flags: i64,
    /// The poll word, and its value when the code was entered.
    pub poll: *const u64,
    pub seen: u64,
}

/// Set in a returned pc: run a safe point, then enter compiled code again at the pc (the code has
/// already executed the jump to it).
pub const RESUME: usize = 1 << 62;

const O_REGS: i32 = 0;
const O_TLB: i32 = 8;
const O_STACK: i32 = 16;
const O_SP: i32 = 24;
const O_CAP: i32 = 32;
const O_FLAGS: i32 = 40;
const O_POLL: i32 = 48;
const O_SEEN: i32 = 56;

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

/// lod/str of at most this many words are compiled (the register file's limit).
const MAX_WORDS: i64 = 1 << 20;
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
            // bulk transfers move registers through the register file in memory: no variables
            Insn::Lod { addr, .. } | Insn::Str { addr, .. } if bulk(insn) => src(addr, &mut r),
            Insn::Push { .. } | Insn::Pop { .. } if bulk(insn) => {}
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

/// Transfers of at least this many registers copy between memories (register file, frame, stack)
/// instead of moving each register's variable.
const BULK: i64 = 4;
/// Above this many words a copy calls memcpy instead of inline loads and stores.
const INLINE_COPY: i64 = 64;

fn bulk(i: &Insn) -> bool {
    matches!(
        *i,
        Insn::Lod { n: Src::Imm(n), .. } | Insn::Str { n: Src::Imm(n), .. } | Insn::Push { n: Src::Imm(n), .. } | Insn::Pop { n: Src::Imm(n), .. }
            if n >= BULK
    )
}

fn target(i: &Insn) -> Option<u32> {
    match *i {
        Insn::Jmp(l) | Insn::JFlag(_, l) | Insn::JCmp(.., l) | Insn::CJmp(.., l) | Insn::JCmpRR(.., l) => Some(l),
        Insn::JCmpRI(.., l) | Insn::For(.., l) | Insn::ForRR(.., l) | Insn::ForRI(.., l) | Insn::Fork(l, _) => Some(l),
        _ => None,
    }
}

/// Where the interpreter may enter compiled code: the start, every jump target (also where code
/// resumes after a safe point), and the instruction after one the code does not compile.
fn entries(p: &Program, ok: &[bool]) -> Vec<bool> {
    let n = p.code.len();
    // room past the end: a label after the last instruction is a jump target l = n
    let mut e = vec![false; n + 2];
    e[0] = true;
    for (i, insn) in p.code.iter().enumerate() {
        if let Some(l) = target(insn) {
            e[l as usize] = true;
        }
        // After an instruction the code does not compile, the next one is an entry. After a fallback
        // (lod/str on another page, stack bounds, a zero divisor: rare) the interpreter goes on until
        // the next jump target instead, so straight-line code stays one block (a str after a lod of
        // the same address reuses its checks).
        if !ok[i] {
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

/// The registers an instruction writes (the compiled forms).
fn writes(i: &Insn) -> std::ops::Range<u32> {
    match *i {
        Insn::AluRR(_, d, _) | Insn::AluRI(_, d, _) | Insn::IncR(d) | Insn::DecR(d) => d..d + 1,
        Insn::Alu(_, Dst::Reg(d), _) | Insn::Inc(Dst::Reg(d)) | Insn::Dec(Dst::Reg(d)) => d..d + 1,
        Insn::ForRR(d, ..) | Insn::ForRI(d, ..) | Insn::For(Dst::Reg(d), ..) => d..d + 1,
        Insn::Lod { dst: Dst::Reg(d), n: Src::Imm(n), .. } | Insn::Pop { dst: Dst::Reg(d), n: Src::Imm(n) } => {
            d..d.saturating_add(n.clamp(0, u32::MAX as i64) as u32)
        }
        _ => 0..0,
    }
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
    // Cranelift's mid-end (opt_level "speed") sinks a loop body's arithmetic below the loop test, which
    // costs a register copy per iteration of the DASS loops measured (Listing 4.2: 1.5-2x slower);
    // DASS code is explicit enough that its other rewrites buy little. VMF_DVM_JIT_OPT overrides.
    let opt = std::env::var("VMF_DVM_JIT_OPT").unwrap_or_else(|_| "none".into());
    set(&mut flags, "opt_level", &opt)?;
    set(&mut flags, "is_pic", "false")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    let isa = cranelift_native::builder()
        .map_err(|e| format!("no native code generator: {e}"))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| format!("cranelift: {e}"))?;
    let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
    // the C library's memcpy (its vector variant for this CPU) for bulk transfers
    jb.symbol("memcpy", libc::memcpy as *const u8);
    let mut module = JITModule::new(jb);
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(I64));
    ctx.func.signature.params.push(AbiParam::new(I64));
    ctx.func.signature.returns.push(AbiParam::new(I64));
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        Gen::emit(&mut b, p, &ok, &entry, &read, &written, page_shift, module.target_config());
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
        if let Some(c) = ctx.compiled_code() {
            if let Some(v) = &c.vcode {
                eprintln!("{}: native code\n{v}", p.file);
            }
            // the bytes too, for a disassembler (objdump -D -b binary -mi386:x86-64 FILE)
            let _ = std::fs::write(format!("/tmp/vmf-dvm-jit-{}.bin", std::process::id()), c.code_buffer());
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

struct FrameMemo {
    /// The address operand (a register or an immediate).
    key: Src,
    n: i64,
    page: Value,
    ptr: Value,
    write_ok: bool,
}

struct Gen {
    vars: std::collections::HashMap<u32, Variable>,
    exit_pc: Variable,
    flags: Variable,
    poll: Value,
    seen: Value,
    sp: Variable,
    stack: Value,
    cap: Value,
    tlb_page: Value,
    /// The cached page when it is held for writing, else u64::MAX (no page number).
    tlb_wpage: Value,
    tlb_frame: Value,
    regs: Value,
    written: BTreeSet<u32>,
    config: cranelift_codegen::isa::TargetFrontendConfig,
    exit: Block,
    blocks: Vec<Option<Block>>,
    page_shift: u32,
    /// The last frame check in this straight-line stretch of code (cleared where control merges): a
    /// `str` to the address a `lod` just checked only adds the write check.
    memo: Option<FrameMemo>,
}

impl Gen {
    #[allow(clippy::too_many_arguments)]
    fn emit(
        b: &mut FunctionBuilder,
        p: &Program,
        ok: &[bool],
        entry_at: &[bool],
        read: &BTreeSet<u32>,
        written: &BTreeSet<u32>,
        page_shift: u32,
        config: cranelift_codegen::isa::TargetFrontendConfig,
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
        let none = b.ins().iconst(I64, -1);
        let tlb_wpage = b.ins().select(tlb_write, tlb_page, none);
        let stack = b.ins().load(I64, mf, ctx, O_STACK);
        let cap = b.ins().load(I64, mf, ctx, O_CAP);
        let mk = |b: &mut FunctionBuilder, off: i32| {
            let v = b.declare_var(I64);
            let x = b.ins().load(I64, mf, ctx, off);
            b.def_var(v, x);
            v
        };
        let sp = mk(b, O_SP);
        let flags = mk(b, O_FLAGS);
        let poll = b.ins().load(I64, mf, ctx, O_POLL);
        let seen = b.ins().load(I64, mf, ctx, O_SEEN);
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
            exit_pc,
            flags,
            poll,
            seen,
            sp,
            stack,
            cap,
            tlb_page,
            tlb_wpage,
            tlb_frame,
            regs,
            written: written.clone(),
            config,
            exit,
            blocks,
            page_shift,
            memo: None,
        };
        for i in 0..=n {
            if let Some(blk) = g.blocks[i] {
                g.memo = None;
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
        for (var, off) in [(g.sp, O_SP), (g.flags, O_FLAGS)] {
            let v = b.use_var(var);
            b.ins().store(mf, v, ctx, off);
        }
        let pc = b.use_var(g.exit_pc);
        b.ins().return_(&[pc]);
    }

    fn leave(&mut self, b: &mut FunctionBuilder, pc: usize) {
        // out of line: the hot path (a loop and its tests) stays contiguous, its back edge the only
        // taken branch
        if let Some(cur) = b.current_block() {
            b.set_cold_block(cur);
        }
        self.leave_at(b, pc);
    }

    /// Return `pc` to the interpreter from the current block, laid out where it is.
    fn leave_at(&mut self, b: &mut FunctionBuilder, pc: usize) {
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

    /// Go to instruction `l` (from `pc`): a backward jump first looks at the poll word.
    fn goto(&mut self, b: &mut FunctionBuilder, l: u32, pc: usize) {
        let target = self.blocks[l as usize].expect("jump targets have blocks");
        if (l as usize) > pc {
            b.ins().jump(target, &[]);
            return;
        }
        // Not `trusted`: another thread writes it (an aligned 8-byte load is atomic on every target
        // Cranelift compiles for here).
        let now = b.ins().load(I64, MemFlags::new().with_aligned().with_notrap(), self.poll, 0);
        // the back edge itself is the conditional branch (taken while nothing changed)
        let same = b.ins().icmp(IntCC::Equal, now, self.seen);
        let out = b.create_block();
        b.ins().brif(same, target, &[], out, &[]);
        b.switch_to_block(out);
        // not cold: laid out right after the test, the back edge becomes one `je` (no extra jump)
        self.leave_at(b, l as usize | RESUME);
    }

    /// Jump to `l` if `c`, else fall through to pc + 1.
    fn branch(&mut self, b: &mut FunctionBuilder, c: Value, l: u32, pc: usize) {
        self.when(b, c, pc);
        self.goto(b, l, pc);
    }

    /// Fall through to pc + 1 unless `c`; continue emitting in the block taken when `c` holds.
    fn when(&mut self, b: &mut FunctionBuilder, c: Value, pc: usize) {
        let taken = b.create_block();
        let next = self.blocks[pc + 1].expect("instructions after a branch have blocks");
        b.ins().brif(c, taken, &[], next, &[]);
        b.switch_to_block(taken);
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
                let zero = b.ins().icmp_imm(IntCC::Equal, s, 0);
                self.guard_zero(b, zero, pc);
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

    /// Fall back to the interpreter at `pc` if `bad` is non-zero; continue in a new block.
    fn guard_zero(&mut self, b: &mut FunctionBuilder, bad: Value, pc: usize) {
        let cont = b.create_block();
        let out = b.create_block();
        b.ins().brif(bad, out, &[], cont, &[]);
        b.switch_to_block(out);
        self.leave(b, pc);
        b.switch_to_block(cont);
    }

    /// The frame address of `n` words at `addr` (aligned, inside the cached page, held for writing if
    /// `write`), or a fallback at `pc`.
    fn frame(&mut self, b: &mut FunctionBuilder, key: Src, addr: Value, n: i64, write: bool, pc: usize) -> Value {
        if let Some(m) = &self.memo {
            if m.key == key && m.n == n {
                let (page, ptr, write_ok) = (m.page, m.ptr, m.write_ok);
                if write && !write_ok {
                    let other = b.ins().icmp(IntCC::NotEqual, page, self.tlb_wpage);
                    self.guard_zero(b, other, pc);
                    if let Some(m) = &mut self.memo {
                        m.write_ok = true;
                    }
                }
                return ptr;
            }
        }
        let want = if write { self.tlb_wpage } else { self.tlb_page };
        let low = b.ins().band_imm(addr, 7);
        self.guard_zero(b, low, pc);
        let page = b.ins().ushr_imm(addr, self.page_shift as i64);
        let other = b.ins().icmp(IntCC::NotEqual, page, want);
        self.guard_zero(b, other, pc);
        if n > 1 {
            // an aligned single word never crosses a page; several may
            let last = b.ins().iadd_imm(addr, 8 * n - 1);
            let last_page = b.ins().ushr_imm(last, self.page_shift as i64);
            let other = b.ins().icmp(IntCC::NotEqual, last_page, want);
            self.guard_zero(b, other, pc);
        }
        let off = b.ins().band_imm(addr, (1i64 << self.page_shift) - 1);
        let ptr = b.ins().iadd(self.tlb_frame, off);
        self.memo = Some(FrameMemo {
            key,
            n,
            page,
            ptr,
            write_ok: write,
        });
        ptr
    }

    /// Store the variables of registers `first..first+n` that compiled code may have changed into the
    /// register file (before a bulk transfer reads it).
    fn spill(&mut self, b: &mut FunctionBuilder, first: u32, n: i64) {
        for r in first..first + n as u32 {
            if self.written.contains(&r) {
                if let Some(&v) = self.vars.get(&r) {
                    let x = b.use_var(v);
                    b.ins().store(MemFlags::trusted(), x, self.regs, (r * 8) as i32);
                }
            }
        }
    }

    /// Reload the variables of registers `first..first+n` from the register file (after a bulk
    /// transfer wrote it).
    fn reload(&mut self, b: &mut FunctionBuilder, first: u32, n: i64) {
        for r in first..first + n as u32 {
            if let Some(&v) = self.vars.get(&r) {
                let x = b.ins().load(I64, MemFlags::trusted(), self.regs, (r * 8) as i32);
                b.def_var(v, x);
            }
        }
    }

    /// Copy `n` words from `src` to `dst` (distinct memories).
    fn copy(&mut self, b: &mut FunctionBuilder, dst: Value, src: Value, n: i64) {
        let mf = MemFlags::trusted();
        if n <= INLINE_COPY {
            // 16-byte moves, then the odd word
            let pairs = (n / 2) as i32;
            for k in 0..pairs {
                let x = b.ins().load(I64X2, mf, src, 16 * k);
                b.ins().store(mf, x, dst, 16 * k);
            }
            if n % 2 == 1 {
                let x = b.ins().load(I64, mf, src, 16 * pairs);
                b.ins().store(mf, x, dst, 16 * pairs);
            }
        } else {
            let size = b.ins().iconst(I64, 8 * n);
            b.call_memcpy(self.config, dst, src, size);
        }
    }

    /// Registers `first..first+n` to memory at `dst` (str, push): registers compiled code keeps in
    /// variables are stored from them, runs of the others copied from the register file (no spill
    /// before the copy: a 16-byte load of a word just stored would stall on store forwarding).
    fn bulk_out(&mut self, b: &mut FunctionBuilder, dst: Value, first: u32, n: i64) {
        if n > INLINE_COPY {
            self.spill(b, first, n);
            let from = self.reg_addr(b, first);
            self.copy(b, dst, from, n);
            return;
        }
        let mf = MemFlags::trusted();
        let mut k = 0u32;
        while (k as i64) < n {
            let r = first + k;
            if let Some(&v) = self.vars.get(&r) {
                let x = b.use_var(v);
                b.ins().store(mf, x, dst, (8 * k) as i32);
                k += 1;
                continue;
            }
            // a run of registers without variables
            let mut end = k;
            while (end as i64) < n && !self.vars.contains_key(&(first + end)) {
                end += 1;
            }
            let from = self.reg_addr(b, r);
            let to = b.ins().iadd_imm(dst, (8 * k) as i64);
            self.copy(b, to, from, (end - k) as i64);
            k = end;
        }
    }

    /// Memory at `src` into registers `first..first+n` (lod, pop): copied into the register file,
    /// and the registers kept in variables loaded from `src` itself.
    fn bulk_in(&mut self, b: &mut FunctionBuilder, src: Value, first: u32, n: i64) {
        let to = self.reg_addr(b, first);
        self.copy(b, to, src, n);
        if n > INLINE_COPY {
            self.reload(b, first, n);
            return;
        }
        for k in 0..n as u32 {
            if let Some(&v) = self.vars.get(&(first + k)) {
                let x = b.ins().load(I64, MemFlags::trusted(), src, (8 * k) as i32);
                b.def_var(v, x);
            }
        }
    }

    fn reg_addr(&mut self, b: &mut FunctionBuilder, r: u32) -> Value {
        b.ins().iadd_imm(self.regs, (r * 8) as i64)
    }

    fn insn(&mut self, b: &mut FunctionBuilder, insn: &Insn, pc: usize) {
        self.insn_body(b, insn, pc);
        // a remembered frame check is about the address register's value: forget it once written
        if let Some(FrameMemo { key: Src::Reg(r), .. }) = self.memo {
            if writes(insn).contains(&r) {
                self.memo = None;
            }
        }
    }

    fn insn_body(&mut self, b: &mut FunctionBuilder, insn: &Insn, pc: usize) {
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
            }
            Insn::ForRI(a, v, l) | Insn::For(Dst::Reg(a), Src::Imm(v), l) => {
                let s = b.ins().iconst(I64, v);
                self.for_(b, a, s, l, pc);
            }
            Insn::JCmpRR(c, x, y, l) => {
                let (x, y) = (self.get(b, x), self.get(b, y));
                let t = b.ins().icmp(cc(c), x, y);
                self.branch(b, t, l, pc);
            }
            Insn::JCmpRI(c, x, v, l) => {
                let x = self.get(b, x);
                let t = b.ins().icmp_imm(cc(c), x, v);
                self.branch(b, t, l, pc);
            }
            Insn::JCmp(c, x, y, l) => {
                let (x, y) = (self.src(b, x), self.src(b, y));
                let t = b.ins().icmp(cc(c), x, y);
                self.branch(b, t, l, pc);
            }
            Insn::CJmp(c, x, y, l) => {
                let (x, y) = (self.src(b, x), self.src(b, y));
                self.set_flags(b, x, y);
                let t = self.flag_holds(b, c);
                self.branch(b, t, l, pc);
            }
            Insn::Cmp(x, y) => {
                let (x, y) = (self.src(b, x), self.src(b, y));
                self.set_flags(b, x, y);
            }
            Insn::JFlag(c, l) => {
                let t = self.flag_holds(b, c);
                self.branch(b, t, l, pc);
            }
            Insn::Jmp(l) => {
                self.goto(b, l, pc);
            }
            Insn::Lod { addr, dst: Dst::Reg(d), n: Src::Imm(n) } if n >= BULK => {
                let a = self.src(b, addr);
                let p = self.frame(b, addr, a, n, false, pc);
                self.bulk_in(b, p, d, n);
            }
            Insn::Str { addr, src: Dst::Reg(s), n: Src::Imm(n) } if n >= BULK => {
                let a = self.src(b, addr);
                let p = self.frame(b, addr, a, n, true, pc);
                self.bulk_out(b, p, s, n);
            }
            Insn::Push { src: Dst::Reg(s), n: Src::Imm(n) } if n >= BULK => {
                let sp = b.use_var(self.sp);
                let end = b.ins().iadd_imm(sp, n);
                let over = b.ins().icmp(IntCC::UnsignedGreaterThan, end, self.cap);
                self.guard_zero(b, over, pc);
                let off = b.ins().ishl_imm(sp, 3);
                let to = b.ins().iadd(self.stack, off);
                self.bulk_out(b, to, s, n);
                b.def_var(self.sp, end);
            }
            Insn::Pop { dst: Dst::Reg(d), n: Src::Imm(n) } if n >= BULK => {
                let sp = b.use_var(self.sp);
                let under = b.ins().icmp_imm(IntCC::UnsignedLessThan, sp, n);
                self.guard_zero(b, under, pc);
                let from_sp = b.ins().iadd_imm(sp, -n);
                let off = b.ins().ishl_imm(from_sp, 3);
                let from = b.ins().iadd(self.stack, off);
                self.bulk_in(b, from, d, n);
                b.def_var(self.sp, from_sp);
            }
            Insn::Lod { addr, dst: Dst::Reg(d), n: Src::Imm(n) } => {
                let a = self.src(b, addr);
                let p = self.frame(b, addr, a, n, false, pc);
                for k in 0..n as u32 {
                    let v = b.ins().load(I64, mf, p, (k * 8) as i32);
                    b.def_var(self.vars[&(d + k)], v);
                }
            }
            Insn::Str { addr, src: Dst::Reg(s), n: Src::Imm(n) } => {
                let a = self.src(b, addr);
                let p = self.frame(b, addr, a, n, true, pc);
                for k in 0..n as u32 {
                    let v = self.get(b, s + k);
                    b.ins().store(mf, v, p, (k * 8) as i32);
                }
            }
            Insn::Push { src: Dst::Reg(s), n: Src::Imm(n) } => {
                let sp = b.use_var(self.sp);
                let end = b.ins().iadd_imm(sp, n);
                let over = b.ins().icmp(IntCC::UnsignedGreaterThan, end, self.cap);
                self.guard_zero(b, over, pc);
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
                let under = b.ins().icmp_imm(IntCC::UnsignedLessThan, sp, n);
                self.guard_zero(b, under, pc);
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
        if l as usize > pc {
            self.branch(b, t, l, pc);
            return;
        }
        // A counting loop looks at the poll word every 8th iteration only (when the counter's low
        // three bits are zero): one test instead of a load and a compare per iteration.
        self.when(b, t, pc);
        let low = b.ins().band_imm(x, 7);
        let target = self.blocks[l as usize].expect("jump targets have blocks");
        let check = b.create_block();
        b.ins().brif(low, target, &[], check, &[]);
        b.switch_to_block(check);
        self.goto(b, l, pc);
    }
}
