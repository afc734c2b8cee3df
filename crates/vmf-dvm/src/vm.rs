//! The DASS interpreter and its threads.
//!
//! Semantics (where Appendix A is vague, this is the definition; docs/dvm.md repeats it):
//! - Registers are 64-bit two's-complement integers; arithmetic wraps; `div` truncates towards zero
//!   (a zero divisor traps); `shl`/`shr` shift by the low bits of s (0..63), `shr` is logical;
//!   comparisons are signed.
//! - `cmp s1 s2` sets the flags (less, equal, greater); `jlt l` … `jge l` (one operand) jump on them;
//!   `jlt s1 s2 l` … compare and jump without touching the flags; `cjl`/`cjg`/`cje s1 s2 l` compare,
//!   set the flags and jump.
//! - `for s1 s2 l`: s1 += 1, then jump to l if s1 < s2 (so a loop `:l body; for i n l` starting at
//!   i = 0 runs its body n times, as Listing 4.4's 10 MB count needs).
//! - `lod a d n` loads the n words at byte address a (a, a+8, …) into registers d…d+n-1; `str a s n`
//!   stores registers s…s+n-1 there; `push s n` pushes registers s…s+n-1 on the thread's own stack,
//!   `pop d n` pops n words into d…d+n-1 so that a push and a pop of the same range restore it.
//! - `clk d`: microseconds since the thread started. `out s`: one line `ID: VALUE` on the console.
//!   `in d`: reads one integer line from the node's standard input (end of input traps).
//! - `fork l d`: a new thread of this node starts at l with a copy of the registers; d holds the new
//!   thread's ID in both (IDs count from 1; the first thread is 0). `join s` waits for thread s of
//!   this node to halt. `thid d`: this thread's ID. `hlt` ends the thread; the node ends when its first
//!   thread halts (its other threads are stopped).
//! - `lock`, `unlock`, `barr s n`, `wait`, `signal`: see [`crate::sync`]; `wait`/`signal` is a counting
//!   signal (a signal is never lost). Before any instruction that can block (`lock`, `wait`, `barr`,
//!   `join`, `in`) a thread gives up the pages it holds, so a blocked thread never holds a page.
use crate::backend::Backend;
use crate::isa::{Alu, Dst, Insn, Program, Src};
use crate::space::{Fault, Layout, Pager, PagerStats};
use crate::sync::{SyncError, SyncTable};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Scope;
use std::time::{Duration, Instant};

/// Threads per node (thread IDs 0..MAX_THREADS).
pub const MAX_THREADS: u64 = 64;

/// Run-time options of a node.
#[derive(Clone, Debug)]
pub struct VmOptions {
    /// Words of each thread's stack.
    pub stack_words: usize,
    pub lease: Duration,
    /// Work on mapped home frames in place (else always on copies).
    pub inplace: bool,
    /// Compile the program to native code (else interpret every instruction).
    pub jit: bool,
}

/// A run-time error that stops the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trap {
    pub node: u64,
    pub thread: u64,
    /// `file:line (instruction)`.
    pub at: String,
    pub cause: String,
}

impl std::fmt::Display for Trap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trap on node {}, thread {}, at {}: {}", self.node, self.thread, self.at, self.cause)
    }
}

/// Where `out` lines go (stdout in a job; a buffer in tests).
pub trait Console: Send + Sync {
    fn out(&self, node: u64, v: i64);
    fn input(&self) -> Option<String>;
}

/// The lines `in` instructions read.
pub enum Input {
    /// All of them, known at the start (`--input FILE`).
    Lines(Vec<String>),
    /// A file that `vmfabric dvm run` appends to as its standard input (a terminal or a pipe) delivers
    /// lines, and marks finished by creating `FILE.end`: an `in` waits for its line to arrive, so a
    /// program can answer each line before the next is typed.
    Stream(StreamInput),
}

impl Input {
    /// Line `i` (0-based), or None when the input ended before it.
    pub fn line(&self, i: usize) -> Option<String> {
        match self {
            Input::Lines(l) => l.get(i).cloned(),
            Input::Stream(s) => s.line(i),
        }
    }
}

/// See [`Input::Stream`].
pub struct StreamInput {
    path: std::path::PathBuf,
    /// Complete lines read so far, the bytes of an unfinished one, and the file offset read up to.
    seen: Mutex<(Vec<String>, Vec<u8>, u64)>,
}

impl StreamInput {
    pub fn new(path: std::path::PathBuf) -> Self {
        StreamInput { path, seen: Mutex::new((Vec::new(), Vec::new(), 0)) }
    }

    /// The marker `vmfabric dvm run` creates once it has written the last line.
    pub fn end_marker(path: &std::path::Path) -> std::path::PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".end");
        p.into()
    }

    /// Read what the file gained since the last look into `seen`; with `last`, an unfinished final
    /// line counts as a line (the input ended without a newline).
    fn refill(&self, seen: &mut (Vec<String>, Vec<u8>, u64), last: bool) {
        use std::io::{Read, Seek, SeekFrom};
        if let Ok(mut f) = std::fs::File::open(&self.path) {
            let mut buf = Vec::new();
            if f.seek(SeekFrom::Start(seen.2)).is_ok() && f.read_to_end(&mut buf).is_ok() {
                seen.2 += buf.len() as u64;
                seen.1.extend_from_slice(&buf);
            }
        }
        while let Some(nl) = seen.1.iter().position(|&c| c == b'\n') {
            let rest = seen.1.split_off(nl + 1);
            let line = std::mem::replace(&mut seen.1, rest);
            seen.0.push(String::from_utf8_lossy(&line[..nl]).into_owned());
        }
        if last && !seen.1.is_empty() {
            let line = std::mem::take(&mut seen.1);
            seen.0.push(String::from_utf8_lossy(&line).into_owned());
        }
    }

    fn line(&self, i: usize) -> Option<String> {
        let end = Self::end_marker(&self.path);
        loop {
            {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                self.refill(&mut seen, false);
                if let Some(l) = seen.0.get(i) {
                    return Some(l.clone());
                }
                // The marker is made after the last write: once it is there, one more read sees all.
                if end.exists() {
                    self.refill(&mut seen, true);
                    return seen.0.get(i).cloned();
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A job's console: `out` lines on standard output; `in` takes the next line of the application's
/// input (`vmfabric dvm run --input FILE`, or what is piped or typed to it), in the order the nodes ask.
pub struct JobConsole<'a> {
    pub input: Input,
    pub sync: SyncTable<'a>,
}

impl Console for JobConsole<'_> {
    fn out(&self, node: u64, v: i64) {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{node}: {v}");
        let _ = o.flush();
    }
    fn input(&self) -> Option<String> {
        let i = self.sync.next_input().ok()?;
        self.input.line(i as usize)
    }
}

struct ThreadEntry {
    done: AtomicBool,
}

/// What the threads of one compute node share.
pub struct Node<'a> {
    /// The node's ID (nodes.txt).
    pub id: u64,
    /// The node's index among the compute nodes (owner ids are derived from it).
    pub index: u64,
    pub prog: &'a Program,
    pub b: &'a dyn Backend,
    pub layout: &'a Layout,
    pub sync: SyncTable<'a>,
    pub opts: VmOptions,
    pub console: &'a dyn Console,
    stop: AtomicBool,
    /// The poll word compiled loops watch: the application's (shared) where mapped, else this
    /// node's own, which a ticker changes every lease.
    poll: Option<&'a AtomicU64>,
    poll_local: AtomicU64,
    threads: Mutex<Vec<Arc<ThreadEntry>>>,
    trap: Mutex<Option<Trap>>,
    instructions: AtomicU64,
    stats: Mutex<PagerStats>,
    /// The first thread was already counted as running (before the job's start barrier, so a node
    /// that starts late cannot look like a deadlock to one that blocks early).
    pub main_counted: bool,
    jit: Option<crate::jit::Compiled>,
}

/// What a node did.
#[derive(Clone, Debug, Default)]
pub struct NodeReport {
    /// Instructions the interpreter executed (compiled code runs the others).
    pub interpreted: u64,
    /// Whether the program ran compiled.
    pub compiled: bool,
    pub pages: PagerStats,
}

impl<'a> Node<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        index: u64,
        prog: &'a Program,
        b: &'a dyn Backend,
        layout: &'a Layout,
        opts: VmOptions,
        console: &'a dyn Console,
    ) -> Node<'a> {
        let (t, off) = layout.sync_home();
        let jit = if opts.jit {
            match crate::jit::compile(prog, layout.page_shift) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("dvm: node {id}: interpreting {} ({e})", prog.file);
                    None
                }
            }
        } else {
            None
        };
        let sync = SyncTable::new(b, t, off);
        Node {
            id,
            index,
            prog,
            b,
            layout,
            poll: sync.poll_word(),
            poll_local: AtomicU64::new(0),
            sync,
            opts,
            console,
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            trap: Mutex::new(None),
            instructions: AtomicU64::new(0),
            stats: Mutex::new(PagerStats::default()),
            main_counted: false,
            jit,
        }
    }

    /// The word compiled loops watch.
    pub fn poll_word(&self) -> &AtomicU64 {
        self.poll.unwrap_or(&self.poll_local)
    }

    /// The node stops: every thread leaves at its next safe point.
    fn stop_all(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.poll_word().fetch_add(1, Ordering::AcqRel);
    }

    fn owner_id(&self, tid: u64) -> u64 {
        1 + self.index * MAX_THREADS + tid
    }

    /// Run the program from its first instruction until the first thread halts; the first trap of any
    /// thread is the result.
    pub fn run(&self) -> Result<NodeReport, Trap> {
        if !self.main_counted {
            self.sync.thread_started().map_err(|e| self.backend_trap(0, 0, e))?;
        }
        self.threads.lock().unwrap().push(Arc::new(ThreadEntry { done: AtomicBool::new(false) }));
        let regs = vec![0i64; self.prog.registers as usize].into_boxed_slice();
        std::thread::scope(|s| {
            if self.poll.is_none() && self.jit.is_some() {
                // no shared poll word: compiled loops stop at a safe point every lease
                let every = self.opts.lease.max(Duration::from_micros(20));
                s.spawn(move || {
                    while !self.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(every);
                        self.poll_local.fetch_add(1, Ordering::AcqRel);
                    }
                });
            }
            let r = self.thread(s, 0, regs, 0);
            self.stop_all();
            if let Err(t) = r {
                self.record(t);
            }
        });
        if let Some(t) = self.trap.lock().unwrap().take() {
            return Err(t);
        }
        Ok(NodeReport {
            interpreted: self.instructions.load(Ordering::Relaxed),
            compiled: self.jit.is_some(),
            pages: std::mem::take(&mut *self.stats.lock().unwrap()),
        })
    }

    fn record(&self, t: Trap) {
        let mut g = self.trap.lock().unwrap();
        if g.is_none() {
            *g = Some(t);
        }
        drop(g);
        self.stop_all();
    }

    fn backend_trap(&self, tid: u64, pc: usize, e: String) -> Trap {
        Trap {
            node: self.id,
            thread: tid,
            at: self.prog.where_is(pc),
            cause: format!("a page node could not be reached: {e}"),
        }
    }

    fn thread<'s>(&'s self, scope: &'s Scope<'s, '_>, tid: u64, regs: Box<[i64]>, pc: usize) -> Result<(), Trap> {
        let me = self.owner_id(tid);
        let mut t = Thread {
            node: self,
            scope,
            tid,
            regs,
            stack: vec![0i64; self.opts.stack_words].into_boxed_slice(),
            sp: 0,
            flags: 0,
            start: Instant::now(),
            pager: Pager::new(self.b, self.layout, me, self.opts.lease, self.opts.inplace, &self.stop).with_poke(self.poll),
            me,
            executed: 0,
        };
        let r = t.run(pc);
        let released = t.pager.release_all();
        self.stats.lock().unwrap().add(&t.pager.stats);
        self.instructions.fetch_add(t.executed, Ordering::Relaxed);
        if let Some(e) = self.threads.lock().unwrap().get(tid as usize) {
            e.done.store(true, Ordering::Release);
        }
        let ended = self.sync.thread_ended();
        match r {
            Ok(()) | Err(Stop::Stopped) => {}
            Err(Stop::Trap(pc, cause)) => {
                return Err(Trap {
                    node: self.id,
                    thread: tid,
                    at: self.prog.where_is(pc),
                    cause,
                })
            }
        }
        released.and(ended).map_err(|e| self.backend_trap(tid, 0, e))
    }
}

enum Stop {
    /// (pc, cause)
    Trap(usize, String),
    /// The node is stopping.
    Stopped,
}

struct Thread<'s, 'a, 'e> {
    node: &'s Node<'a>,
    scope: &'s Scope<'s, 'e>,
    tid: u64,
    regs: Box<[i64]>,
    /// The thread's stack (zeroed pages are only touched as it grows) and its depth.
    stack: Box<[i64]>,
    sp: usize,
    flags: i8,
    start: Instant,
    pager: Pager<'s>,
    me: u64,
    executed: u64,
}

/// Instructions (backward jumps and memory accesses) between safe points.
const BUDGET: u32 = 256;

impl<'s, 'a: 's, 'e> Thread<'s, 'a, 'e> {
    #[inline(always)]
    fn reg(&self, r: u32) -> i64 {
        // SAFETY: register numbers were checked against the register count by the assembler.
        unsafe { *self.regs.get_unchecked(r as usize) }
    }
    #[inline(always)]
    fn reg_mut(&mut self, r: u32) -> &mut i64 {
        // SAFETY: as in `reg`.
        unsafe { self.regs.get_unchecked_mut(r as usize) }
    }
    #[inline(always)]
    fn ind(&self, r: u32, pc: usize) -> Result<u32, Stop> {
        let v = self.reg(r);
        if v < 0 || v >= self.regs.len() as i64 {
            return Err(Stop::Trap(pc, format!("[{r}] names register {v}, outside 0..{}", self.regs.len() - 1)));
        }
        Ok(v as u32)
    }
    #[inline(always)]
    fn src(&self, s: Src, pc: usize) -> Result<i64, Stop> {
        Ok(match s {
            Src::Imm(v) => v,
            Src::Reg(r) => self.reg(r),
            Src::Ind(r) => self.reg(self.ind(r, pc)?),
        })
    }
    #[inline(always)]
    fn dst(&self, d: Dst, pc: usize) -> Result<u32, Stop> {
        match d {
            Dst::Reg(r) => Ok(r),
            Dst::Ind(r) => self.ind(r, pc),
        }
    }
    /// Registers d..d+n-1 as a range (checked).
    fn range(&self, d: u32, n: i64, pc: usize) -> Result<std::ops::Range<usize>, Stop> {
        // (n compared with the room left, not d + n with the length: d + n overflows for huge n)
        if n < 0 || n > self.regs.len() as i64 - d as i64 {
            return Err(Stop::Trap(pc, format!("registers {d}..{d}+{n} outside 0..{}", self.regs.len() - 1)));
        }
        Ok(d as usize..d as usize + n as usize)
    }

    fn fault(&self, pc: usize, f: Fault) -> Stop {
        match f {
            Fault::Range(a, n) => Stop::Trap(
                pc,
                format!(
                    "address {} ({n} bytes) outside the shared space (0..{})",
                    a as i64,
                    self.node.layout.space_bytes()
                ),
            ),
            Fault::Backend(e) => Stop::Trap(pc, format!("a page node could not be reached: {e}")),
            Fault::Stopped => Stop::Stopped,
        }
    }

    fn sync_err(&self, pc: usize, e: SyncError) -> Stop {
        match e {
            SyncError::Backend(e) => Stop::Trap(pc, format!("a page node could not be reached: {e}")),
            SyncError::Deadlock => Stop::Trap(pc, "deadlock: every thread of the application waits".into()),
            SyncError::Stopped => Stop::Stopped,
            SyncError::Misuse(m) => Stop::Trap(pc, m),
        }
    }

    /// A safe point: leases, and whether the node stops.
    #[cold]
    fn safe_point(&mut self, pc: usize) -> Result<(), Stop> {
        if self.node.stop.load(Ordering::Relaxed) {
            return Err(Stop::Stopped);
        }
        self.pager.tick().map_err(|e| self.fault(pc, Fault::Backend(e)))
    }

    /// Give up pages before a blocking instruction.
    fn before_block(&mut self, pc: usize) -> Result<(), Stop> {
        self.pager.release_all().map_err(|e| self.fault(pc, Fault::Backend(e)))
    }

    fn alu(&self, op: Alu, a: i64, b: i64, pc: usize) -> Result<i64, Stop> {
        Ok(match op {
            Alu::Set => b,
            Alu::Add => a.wrapping_add(b),
            Alu::Sub => a.wrapping_sub(b),
            Alu::Mul => a.wrapping_mul(b),
            Alu::Div => {
                if b == 0 {
                    return Err(Stop::Trap(pc, "division by zero".into()));
                }
                a.wrapping_div(b)
            }
            Alu::And => a & b,
            Alu::Or => a | b,
            Alu::Xor => a ^ b,
            Alu::Shl => a.wrapping_shl(b as u32 & 63),
            Alu::Shr => ((a as u64).wrapping_shr(b as u32 & 63)) as i64,
        })
    }

    fn run(&mut self, mut pc: usize) -> Result<(), Stop> {
        let code: &[Insn] = &self.node.prog.code;
        let jit = self.node.jit.as_ref();
        let mut budget = BUDGET;
        let mut executed: u64 = 0;
        macro_rules! jump {
            ($l:expr) => {{
                let l = $l as usize;
                if l <= pc {
                    budget -= 1;
                    if budget == 0 {
                        budget = BUDGET;
                        self.safe_point(pc)?;
                    }
                }
                pc = l;
                continue;
            }};
        }
        let r = loop {
            if let Some(j) = jit {
                if j.entry.get(pc).copied().unwrap_or(false) {
                    let poll = self.node.poll_word();
                    let mut ctx = crate::jit::JitCtx {
                        regs: self.regs.as_mut_ptr(),
                        tlb: self.pager.tlb(),
                        stack: self.stack.as_mut_ptr(),
                        sp: self.sp as u64,
                        cap: self.stack.len() as u64,
                        flags: self.flags as i64,
                        poll: poll.as_ptr(),
                        seen: poll.load(Ordering::Acquire),
                    };
                    // A stop that came before `seen` was read changes the poll word no more: a
                    // compiled loop would never notice it (stop_all sets `stop` before it changes the
                    // word, so a `seen` that includes the change also sees `stop`).
                    if self.node.stop.load(Ordering::Acquire) {
                        break Err(Stop::Stopped);
                    }
                    // SAFETY: the context describes this thread's registers (the program's count),
                    // stack and translation cache, all live for the call; the poll word lives as
                    // long as the node.
                    let next = unsafe { j.run(&mut ctx, pc) };
                    self.sp = ctx.sp as usize;
                    self.flags = ctx.flags as i8;
                    if next & crate::jit::RESUME != 0 {
                        pc = next & !crate::jit::RESUME;
                        self.safe_point(pc)?;
                        continue;
                    }
                    pc = next;
                }
            }
            // one instruction: where compiled code stopped, or one it does not run
            let Some(&insn) = code.get(pc) else {
                break Err(Stop::Trap(pc, "ran past the last instruction (no hlt)".into()));
            };
            executed += 1;
            match insn {
                Insn::AluRR(op, d, s) => {
                    let (a, b) = (self.reg(d), self.reg(s));
                    *self.reg_mut(d) = match op {
                        Alu::Add => a.wrapping_add(b),
                        Alu::Set => b,
                        Alu::Sub => a.wrapping_sub(b),
                        _ => self.alu(op, a, b, pc)?,
                    };
                }
                Insn::AluRI(op, d, v) => {
                    let a = self.reg(d);
                    *self.reg_mut(d) = match op {
                        Alu::Set => v,
                        Alu::Add => a.wrapping_add(v),
                        _ => self.alu(op, a, v, pc)?,
                    };
                }
                Insn::ForRR(a, b, l) => {
                    let v = self.reg(a).wrapping_add(1);
                    *self.reg_mut(a) = v;
                    if v < self.reg(b) {
                        jump!(l);
                    }
                }
                Insn::ForRI(a, b, l) => {
                    let v = self.reg(a).wrapping_add(1);
                    *self.reg_mut(a) = v;
                    if v < b {
                        jump!(l);
                    }
                }
                Insn::JCmpRR(c, a, b, l) => {
                    if c.test(self.reg(a), self.reg(b)) {
                        jump!(l);
                    }
                }
                Insn::JCmpRI(c, a, b, l) => {
                    if c.test(self.reg(a), b) {
                        jump!(l);
                    }
                }
                Insn::IncR(r) => *self.reg_mut(r) = self.reg(r).wrapping_add(1),
                Insn::DecR(r) => *self.reg_mut(r) = self.reg(r).wrapping_sub(1),
                Insn::Jmp(l) => jump!(l),
                Insn::Alu(op, d, s) => {
                    let s = self.src(s, pc)?;
                    let d = self.dst(d, pc)?;
                    *self.reg_mut(d) = self.alu(op, self.reg(d), s, pc)?;
                }
                Insn::Inc(d) => {
                    let d = self.dst(d, pc)?;
                    *self.reg_mut(d) = self.reg(d).wrapping_add(1);
                }
                Insn::Dec(d) => {
                    let d = self.dst(d, pc)?;
                    *self.reg_mut(d) = self.reg(d).wrapping_sub(1);
                }
                Insn::For(a, b, l) => {
                    let a = self.dst(a, pc)?;
                    let b = self.src(b, pc)?;
                    let v = self.reg(a).wrapping_add(1);
                    *self.reg_mut(a) = v;
                    if v < b {
                        jump!(l);
                    }
                }
                Insn::Cmp(a, b) => {
                    self.flags = self.src(a, pc)?.cmp(&self.src(b, pc)?) as i8;
                }
                Insn::JFlag(c, l) => {
                    if c.holds(self.flags) {
                        jump!(l);
                    }
                }
                Insn::JCmp(c, a, b, l) => {
                    if c.test(self.src(a, pc)?, self.src(b, pc)?) {
                        jump!(l);
                    }
                }
                Insn::CJmp(c, a, b, l) => {
                    self.flags = self.src(a, pc)?.cmp(&self.src(b, pc)?) as i8;
                    if c.holds(self.flags) {
                        jump!(l);
                    }
                }
                Insn::Lod { addr, dst, n } => {
                    let a = self.src(addr, pc)?;
                    let d = self.dst(dst, pc)?;
                    let n = self.src(n, pc)?;
                    let rg = self.range(d, n, pc)?;
                    if n == 1 && a >= 0 && a & 7 == 0 {
                        // one aligned word: the translation cache's fast path
                        let p = self.pager.at(a as u64, false).map_err(|f| self.fault(pc, f))?;
                        // SAFETY: an aligned word inside a held page.
                        *self.reg_mut(d) = unsafe { std::ptr::read_volatile(p as *const i64) };
                    } else {
                        let (regs, pager) = (&mut self.regs, &mut self.pager);
                        if let Err(f) = pager.read_words(a as u64, &mut regs[rg]) {
                            break Err(self.fault(pc, f));
                        }
                    }
                    budget -= 1;
                    if budget == 0 {
                        budget = BUDGET;
                        self.safe_point(pc)?;
                    }
                }
                Insn::Str { addr, src, n } => {
                    let a = self.src(addr, pc)?;
                    let s = self.dst(src, pc)?;
                    let n = self.src(n, pc)?;
                    let rg = self.range(s, n, pc)?;
                    if n == 1 && a >= 0 && a & 7 == 0 {
                        let p = self.pager.at(a as u64, true).map_err(|f| self.fault(pc, f))?;
                        // SAFETY: as for lod.
                        unsafe { std::ptr::write_volatile(p as *mut i64, self.reg(s)) };
                    } else {
                        let (regs, pager) = (&self.regs, &mut self.pager);
                        if let Err(f) = pager.write_words(a as u64, &regs[rg]) {
                            break Err(self.fault(pc, f));
                        }
                    }
                    budget -= 1;
                    if budget == 0 {
                        budget = BUDGET;
                        self.safe_point(pc)?;
                    }
                }
                Insn::Push { src, n } => {
                    let s = self.dst(src, pc)?;
                    let n = self.src(n, pc)?;
                    let rg = self.range(s, n, pc)?;
                    if self.sp + rg.len() > self.stack.len() {
                        break Err(Stop::Trap(pc, format!("stack overflow ({} words)", self.stack.len())));
                    }
                    let to = self.sp..self.sp + rg.len();
                    self.stack[to].copy_from_slice(&self.regs[rg]);
                    self.sp += n as usize;
                }
                Insn::Pop { dst, n } => {
                    let d = self.dst(dst, pc)?;
                    let n = self.src(n, pc)?;
                    let rg = self.range(d, n, pc)?;
                    if rg.len() > self.sp {
                        break Err(Stop::Trap(
                            pc,
                            format!("stack underflow (pop of {} words, {} on the stack)", rg.len(), self.sp),
                        ));
                    }
                    let from = self.sp - rg.len();
                    self.regs[rg].copy_from_slice(&self.stack[from..self.sp]);
                    self.sp = from;
                }
                Insn::Out(s) => {
                    let v = self.src(s, pc)?;
                    self.node.console.out(self.node.id, v);
                }
                Insn::Clk(d) => {
                    let d = self.dst(d, pc)?;
                    *self.reg_mut(d) = self.start.elapsed().as_micros() as i64;
                }
                Insn::In(d) => {
                    let d = self.dst(d, pc)?;
                    self.before_block(pc)?;
                    let Some(line) = self.node.console.input() else {
                        break Err(Stop::Trap(pc, "in: end of input".into()));
                    };
                    match line.trim().parse::<i64>() {
                        Ok(v) => *self.reg_mut(d) = v,
                        Err(_) => break Err(Stop::Trap(pc, format!("in: '{}' is not an integer", line.trim()))),
                    }
                }
                Insn::Hlt => break Ok(()),
                Insn::Thid(d) => {
                    let d = self.dst(d, pc)?;
                    *self.reg_mut(d) = self.tid as i64;
                }
                Insn::Fork(l, d) => {
                    let d = self.dst(d, pc)?;
                    let node = self.node;
                    let tid = {
                        let mut th = node.threads.lock().unwrap();
                        if th.len() as u64 >= MAX_THREADS {
                            break Err(Stop::Trap(pc, format!("fork: more than {MAX_THREADS} threads on a node")));
                        }
                        th.push(Arc::new(ThreadEntry { done: AtomicBool::new(false) }));
                        th.len() as u64 - 1
                    };
                    *self.reg_mut(d) = tid as i64;
                    let regs = self.regs.clone();
                    if let Err(e) = node.sync.thread_started() {
                        break Err(self.fault(pc, Fault::Backend(e)));
                    }
                    let scope = self.scope;
                    scope.spawn(move || {
                        if let Err(t) = node.thread(scope, tid, regs, l as usize) {
                            node.record(t);
                        }
                    });
                }
                Insn::Join(s) => {
                    let id = self.src(s, pc)?;
                    let entry = {
                        let th = self.node.threads.lock().unwrap();
                        if id < 0 || id as usize >= th.len() || id as u64 == self.tid {
                            break Err(Stop::Trap(pc, format!("join of unknown thread {id}")));
                        }
                        th[id as usize].clone()
                    };
                    self.before_block(pc)?;
                    let stop = &self.node.stop;
                    if let Err(e) = self.node.sync.block(stop, || Ok(entry.done.load(Ordering::Acquire))) {
                        break Err(self.sync_err(pc, e));
                    }
                }
                Insn::Barr(k, n) => {
                    let (k, n) = (self.src(k, pc)?, self.src(n, pc)?);
                    self.before_block(pc)?;
                    if let Err(e) = self.node.sync.barrier(k, n, &self.node.stop) {
                        break Err(self.sync_err(pc, e));
                    }
                }
                Insn::Lock(k) => {
                    let k = self.src(k, pc)?;
                    self.before_block(pc)?;
                    if let Err(e) = self.node.sync.lock(k, self.me, &self.node.stop) {
                        break Err(self.sync_err(pc, e));
                    }
                }
                Insn::Unlock(k) => {
                    let k = self.src(k, pc)?;
                    // release consistency: what was written under the mutex is visible to the next holder
                    self.before_block(pc)?;
                    if let Err(e) = self.node.sync.unlock(k, self.me) {
                        break Err(self.sync_err(pc, e));
                    }
                }
                Insn::Wait(k) => {
                    let k = self.src(k, pc)?;
                    self.before_block(pc)?;
                    if let Err(e) = self.node.sync.wait(k, &self.node.stop) {
                        break Err(self.sync_err(pc, e));
                    }
                }
                Insn::Signal(k) => {
                    let k = self.src(k, pc)?;
                    self.before_block(pc)?;
                    if let Err(e) = self.node.sync.signal(k) {
                        break Err(self.sync_err(pc, e));
                    }
                }
            }
            pc += 1;
        };
        self.executed += executed;
        r
    }
}
