//! In-process tests of the DASS interpreter ([`crate::vm`]): the semantics of every mnemonic and
//! operand form, memory within and across pages, threads, cross-node mutexes, barriers and signals,
//! and every trap. The nodes run on threads of this process over one page node's memory (a zeroed
//! buffer behind [`Direct`]), in place or on copies; a recording [`Console`] takes the `out` lines and
//! serves scripted `in` lines. Every run has a watchdog, so a hang fails instead of blocking.
use crate::asm;
use crate::backend::Direct;
use crate::isa::Program;
use crate::space::Layout;
use crate::sync;
use crate::vm::{Console, Node, NodeReport, Trap, VmOptions};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const REGS: u32 = 256;
const PAGE: u64 = 4096;
const PAGES: u64 = 16;
const SPACE: u64 = PAGE * PAGES;
/// Node i of a run has ID FIRST_ID + i (not its index, so traps and `out` lines show the ID).
const FIRST_ID: u64 = 7;
const MIN: i64 = i64::MIN;
const MAX: i64 = i64::MAX;

/// Records `out` lines; serves scripted `in` lines.
#[derive(Default)]
struct Rec {
    out: Mutex<Vec<(u64, i64)>>,
    input: Mutex<VecDeque<String>>,
}

impl Console for Rec {
    fn out(&self, node: u64, v: i64) {
        self.out.lock().unwrap().push((node, v));
    }
    fn input(&self) -> Option<String> {
        self.input.lock().unwrap().pop_front()
    }
}

/// One page node's memory: 16 pages of 4096 bytes and the synchronisation table.
struct Space {
    layout: Layout,
    mem: Vec<u64>,
    b: Direct,
}

impl Space {
    fn new() -> Space {
        let layout = Layout::new(PAGE as usize, PAGES, &[(0, 0, PAGES)], sync::TABLE_BYTES);
        let mut mem = vec![0u64; layout.nodes[0].bytes / 8];
        let b = Direct::new(vec![(mem.as_mut_ptr() as *mut u8, mem.len() * 8)]);
        Space { layout, mem, b }
    }
    /// `n` bytes of the shared space at `addr`, from the home frames (after the nodes ended).
    fn bytes(&self, addr: u64, n: usize) -> Vec<u8> {
        // The frames of the one page node are contiguous: page p at frames_off + p * PAGE.
        let off = self.layout.nodes[0].frames_off + addr as usize;
        // SAFETY: the buffer lives as long as self; no node runs any more.
        let all = unsafe { std::slice::from_raw_parts(self.mem.as_ptr() as *const u8, self.mem.len() * 8) };
        all[off..off + n].to_vec()
    }
    fn word(&self, addr: u64) -> i64 {
        i64::from_ne_bytes(self.bytes(addr, 8).try_into().unwrap())
    }
}

#[derive(Clone)]
struct Cfg {
    inplace: bool,
    /// Compile to native code (else interpret every instruction).
    jit: bool,
    stack_words: usize,
    input: Vec<String>,
}

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg {
            inplace: true,
            jit: false,
            stack_words: 64,
            input: Vec::new(),
        }
    }
}

fn copies() -> Cfg {
    Cfg {
        inplace: false,
        ..Cfg::default()
    }
}

/// `cfg` interpreted, then compiled.
fn modes(cfg: Cfg) -> [Cfg; 2] {
    [Cfg { jit: false, ..cfg.clone() }, Cfg { jit: true, ..cfg }]
}

/// In place and on copies, each interpreted and compiled.
fn every_mode() -> Vec<Cfg> {
    modes(Cfg::default()).into_iter().chain(modes(copies())).collect()
}

fn mode(cfg: &Cfg) -> String {
    format!(
        "{}, {}",
        if cfg.jit { "compiled" } else { "interpreted" },
        if cfg.inplace { "in place" } else { "on copies" }
    )
}

struct Outcome {
    results: Vec<Result<NodeReport, Trap>>,
    out: Vec<(u64, i64)>,
    space: Space,
}

impl Outcome {
    /// The values node `id` printed, in order.
    fn values(&self, id: u64) -> Vec<i64> {
        self.out.iter().filter(|(n, _)| *n == id).map(|&(_, v)| v).collect()
    }
    fn ok(&self) {
        for r in &self.results {
            if let Err(t) = r {
                panic!("{t}");
            }
        }
    }
}

fn assemble(src: &str) -> Program {
    asm::assemble("t.dass", src, REGS).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// Run one node per program at once (node i: index i, ID FIRST_ID + i) over one fresh space; fail if
/// they have not all ended within 30 s or one panicked.
fn go(srcs: &[&str], cfg: Cfg) -> Outcome {
    let progs: Vec<Program> = srcs.iter().map(|s| assemble(s)).collect();
    let jit = cfg.jit;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let space = Space::new();
        let console = Rec::default();
        console.input.lock().unwrap().extend(cfg.input.iter().cloned());
        let opts = VmOptions {
            stack_words: cfg.stack_words,
            lease: Duration::from_micros(20),
            inplace: cfg.inplace,
            jit: cfg.jit,
        };
        let results = std::thread::scope(|s| {
            let hs: Vec<_> = progs
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let (space, console, opts) = (&space, &console, opts.clone());
                    s.spawn(move || Node::new(FIRST_ID + i as u64, i as u64, p, &space.b, &space.layout, opts, console).run())
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("a node panicked")).collect::<Vec<_>>()
        });
        let out = console.out.into_inner().unwrap();
        let _ = tx.send(Outcome { results, out, space });
    });
    let o = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(o) => o,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the nodes did not end within 30 s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("a node panicked instead of ending or trapping"),
    };
    for r in o.results.iter().flatten() {
        assert_eq!(r.compiled, jit, "the program did not run as asked (see stderr)");
    }
    o
}

/// Run `src` on one node, interpreted and compiled; both must end without a trap and print the same.
/// Returns what it printed.
fn run_cfg(src: &str, cfg: Cfg) -> Vec<i64> {
    let [a, b] = modes(cfg).map(|c| {
        let o = go(&[src], c.clone());
        if let Err(t) = &o.results[0] {
            panic!("{} ({}):\n{src}", t, mode(&c));
        }
        o.values(FIRST_ID)
    });
    if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
        panic!(
            "compiled code printed {:?} as value {i}, the interpreter {:?} ({} and {} values)",
            b.get(i),
            a.get(i),
            b.len(),
            a.len()
        );
    }
    a
}

fn run(src: &str) -> Vec<i64> {
    run_cfg(src, Cfg::default())
}

/// Run `src` on one node, interpreted and compiled; both must trap the same way.
fn trap_cfg(src: &str, cfg: Cfg) -> Trap {
    let [a, b] = modes(cfg).map(|c| match go(&[src], c.clone()).results.remove(0) {
        Err(t) => t,
        Ok(_) => panic!("no trap ({}):\n{src}", mode(&c)),
    });
    assert_eq!(b, a, "compiled code trapped differently");
    a
}

fn trap(src: &str) -> Trap {
    trap_cfg(src, Cfg::default())
}

/// The trap expected of node FIRST_ID.
fn tr(thread: u64, at: &str, cause: &str) -> Trap {
    Trap {
        node: FIRST_ID,
        thread,
        at: at.into(),
        cause: cause.into(),
    }
}

// ------------------------------------------------------------------------------ registers and ALU

#[test]
fn set_takes_immediates_registers_and_indirect_registers() {
    let src = "\
set 0 $-5               ; immediate (negative)
set 1 $0x10             ; hexadecimal
set 2 $18446744073709551615   ; 2^64-1 is the bit pattern of -1
set 3 1                 ; register
set 4 $0                ; [4] names register 0
set 5 [4]               ; indirect source: register 0
set 6 $9
set [6] $42             ; indirect destination: register 9
out 9
set [6] [4]             ; both indirect: register 9 = register 0
set 7 $9223372036854775807
set 8 $-9223372036854775808
out 0
out 1
out 2
out 3
out 5
out 9
out 7
out 8
out $123
out [6]
hlt
";
    assert_eq!(run(src), [42, -5, 16, -1, 16, -5, -5, MAX, MIN, 123, -5]);
}

/// The interpreter's definition of the two-operand operations (vm.rs, top).
fn reference(op: &str, a: i64, b: i64) -> i64 {
    match op {
        "set" => b,
        "add" => a.wrapping_add(b),
        "sub" => a.wrapping_sub(b),
        "mul" => a.wrapping_mul(b),
        "div" => a.wrapping_div(b),
        "and" => a & b,
        "or" => a | b,
        "xor" => a ^ b,
        "shl" => ((a as u64) << (b as u64 & 63)) as i64,
        "shr" => ((a as u64) >> (b as u64 & 63)) as i64,
        _ => unreachable!(),
    }
}

#[test]
fn every_alu_operation_agrees_in_every_operand_form() {
    // Register-register and register-immediate are specialised by the assembler; indirect operands
    // take the general path. Each form must give the reference result. One program per operation
    // gathers its results in registers 20.. and stores them 60 at a time at 0, 8, ... (read back from
    // the page node's memory). Compiled runs leave out the indirect forms: compiled code hands them
    // to the interpreter (and every such exit makes compiling slower).
    let vals = [0, 1, -1, 2, -2, 3, 7, -7, 63, 64, 65, 100, MAX, MIN, 0x0123_4567_89ab_cdef];
    let ops = ["set", "add", "sub", "mul", "div", "and", "or", "xor", "shl", "shr"];
    for op in ops {
        for cfg in modes(Cfg::default()) {
            let forms: &[&str] = if cfg.jit {
                &["1 2", "1 ${b}"]
            } else {
                &["1 2", "1 ${b}", "[10] [11]", "[10] ${b}", "1 [11]"]
            };
            let mut src = String::from("set 10 $1\nset 11 $2\n"); // [10] = register 1, [11] = register 2
            let mut want = Vec::new();
            for a in vals {
                for b in vals {
                    if op == "div" && b == 0 {
                        continue;
                    }
                    let _ = writeln!(src, "set 2 ${b}");
                    for form in forms {
                        let r = 20 + want.len() % 60;
                        let _ = writeln!(src, "set 1 ${a}\n{op} {}\nset {r} 1", form.replace("{b}", &b.to_string()));
                        want.push((a, b, form, reference(op, a, b)));
                        if want.len() % 60 == 0 {
                            let _ = writeln!(src, "str ${} 20 $60", 8 * (want.len() - 60));
                        }
                    }
                }
            }
            let rest = want.len() % 60;
            let _ = writeln!(src, "str ${} 20 ${rest}\nhlt", 8 * (want.len() - rest));
            let m = mode(&cfg);
            let o = go(&[&src], cfg);
            o.ok();
            for (k, (a, b, form, w)) in want.iter().enumerate() {
                assert_eq!(o.space.word(8 * k as u64), *w, "{op} {form} with a = {a}, b = {b} ({m})");
            }
        }
    }
}

/// `set 1 $a; set 2 $b; OP 1 2; out 1` and the immediate form `OP 1 $b`, for each case.
fn binary(cases: &[(&str, i64, i64)]) -> Vec<i64> {
    let mut src = String::new();
    for (op, a, b) in cases {
        let _ = writeln!(src, "set 1 ${a}\nset 2 ${b}\n{op} 1 2\nout 1\nset 1 ${a}\n{op} 1 ${b}\nout 1");
    }
    src.push_str("hlt\n");
    let got = run(&src);
    // both forms agree; one value per case
    got.chunks(2).map(|p| {
        assert_eq!(p[0], p[1]);
        p[0]
    })
    .collect()
}

#[test]
fn arithmetic_wraps_and_div_truncates_toward_zero() {
    let cases = [
        ("add", MAX, 1),
        ("add", MIN, -1),
        ("sub", MIN, 1),
        ("sub", 0, MIN),
        ("mul", 1 << 32, 1 << 32),
        ("mul", 0x1_0000_0001, 0x1_0000_0001),
        ("mul", MIN, -1),
        ("mul", MAX, 2),
        ("div", 7, 2),
        ("div", -7, 2),
        ("div", 7, -2),
        ("div", -7, -2),
        ("div", 1, 2),
        ("div", -1, 2),
        ("div", MIN, -1),
        ("div", MIN, 2),
        ("div", -9, 3),
    ];
    let want = [
        MIN,
        MAX,
        MAX,
        MIN,
        0,
        0x2_0000_0001,
        MIN,
        -2,
        3,
        -3,
        -3,
        3,
        0,
        0,
        MIN,
        MIN / 2,
        -3,
    ];
    assert_eq!(binary(&cases), want);
    // bitwise
    let cases = [("and", 0b1100, 0b1010), ("or", 0b1100, 0b1010), ("xor", 0b1100, 0b1010), ("xor", -1, 5), ("and", -1, MIN)];
    assert_eq!(binary(&cases), [0b1000, 0b1110, 0b0110, !5, MIN]);
}

#[test]
fn shift_amounts_are_masked_to_0_63_and_shr_is_logical() {
    let cases = [
        ("shl", 1, 0),
        ("shl", 1, 1),
        ("shl", 1, 63),
        ("shl", 1, 64),            // 64 & 63 = 0
        ("shl", 1, 65),            // 1
        ("shl", 1, -1),            // 63
        ("shl", 3, 0x1_0000_0001), // 1
        ("shl", -1, 4),
        ("shr", -1, 60), // logical: 15, not -1
        ("shr", -16, 2),
        ("shr", MIN, 63),
        ("shr", -1, 64), // unchanged
        ("shr", 256, 66),
        ("shr", 5, 0),
    ];
    let want = [1, 2, MIN, 1, 2, MIN, 6, -16, 15, 0x3fff_ffff_ffff_fffc, 1, -1, 64, 5];
    assert_eq!(binary(&cases), want);
}

#[test]
fn inc_and_dec_wrap_in_register_and_indirect_forms() {
    let src = "\
set 1 $9223372036854775807
inc 1
out 1
dec 1
out 1
set 2 $-9223372036854775808
dec 2
out 2
set 3 $5
set 4 $3        ; [4] = register 3
inc [4]
inc [4]
out 3
dec [4]
out 3
set 5 $-1
inc 5
out 5
dec 5
out 5
hlt
";
    assert_eq!(run(src), [MIN, MAX, MAX, 7, 6, 0, -1]);
}

// ------------------------------------------------------------------------------ compares and jumps

const PAIRS: [(i64, i64); 7] = [(-5, 3), (3, -5), (4, 4), (MIN, MAX), (MAX, MIN), (-1, 1), (0, -1)];

/// A mnemonic and what its condition means.
type CondFn = (&'static str, fn(i64, i64) -> bool);

fn conds() -> [CondFn; 6] {
    [
        ("jlt", |a, b| a < b),
        ("jgt", |a, b| a > b),
        ("jeq", |a, b| a == b),
        ("jne", |a, b| a != b),
        ("jle", |a, b| a <= b),
        ("jge", |a, b| a >= b),
    ]
}

/// Code printing 1 if `jump` (its target written LABEL) jumps, else 0.
fn taken(code: &mut String, k: &mut usize, jump: &str) {
    *k += 1;
    let j = jump.replace("LABEL", &format!("y{k}"));
    let _ = writeln!(code, "{j}\nout $0\njmp n{k}\n:y{k}\nout $1\n:n{k}");
}

/// Code printing the flags: -1 (less), 0 (equal), 1 (greater).
fn flags(code: &mut String, k: &mut usize) {
    *k += 1;
    let _ = writeln!(code, "jlt l{k}\njeq e{k}\nout $1\njmp d{k}\n:l{k}\nout $-1\njmp d{k}\n:e{k}\nout $0\n:d{k}");
}

fn sign(a: i64, b: i64) -> i64 {
    a.cmp(&b) as i64
}

#[test]
fn cmp_sets_the_flags_for_the_one_operand_jumps_signed() {
    let (mut src, mut k, mut want) = (String::from("set 8 $1\nset 9 $2\n"), 0, Vec::new());
    for (a, b) in PAIRS {
        let _ = writeln!(src, "set 1 ${a}\nset 2 ${b}");
        for cmp in ["cmp 1 2".to_string(), format!("cmp ${a} ${b}"), "cmp [8] [9]".into(), format!("cmp 1 ${b}")] {
            for (j, holds) in conds() {
                src.push_str(&cmp);
                src.push('\n');
                taken(&mut src, &mut k, &format!("{j} LABEL"));
                want.push(holds(a, b) as i64);
            }
        }
    }
    src.push_str("hlt\n");
    assert_eq!(run(&src), want);
    // signed: -1 < 1 although its bit pattern is the larger
    assert_eq!(run("cmp $-1 $1\njlt y\nout $0\nhlt\n:y\nout $1\nhlt"), [1]);
    // before any cmp the flags say equal
    assert_eq!(run("jeq y\nout $0\nhlt\n:y\nout $1\nhlt"), [1]);
}

#[test]
fn compare_and_jump_forms_jump_without_touching_the_flags() {
    let (mut src, mut k, mut want) = (String::from("set 8 $1\nset 9 $2\n"), 0, Vec::new());
    for (a, b) in PAIRS {
        let _ = writeln!(src, "set 1 ${a}\nset 2 ${b}");
        // flags before: something the compare would not set
        let (before, prior) = if a == b { ("cmp $0 $1", -1) } else { ("cmp $0 $0", 0) };
        for (j, holds) in conds() {
            for ops in ["1 2".to_string(), format!("1 ${b}"), format!("${a} 2"), "[8] [9]".into(), format!("${a} ${b}")] {
                let _ = writeln!(src, "{before}");
                taken(&mut src, &mut k, &format!("{j} {ops} LABEL"));
                flags(&mut src, &mut k);
                want.push(holds(a, b) as i64);
                want.push(prior);
            }
        }
    }
    src.push_str("hlt\n");
    assert_eq!(run(&src), want);
}

#[test]
fn cj_forms_compare_set_the_flags_and_jump() {
    let cj: [CondFn; 3] = [("cjl", |a, b| a < b), ("cjg", |a, b| a > b), ("cje", |a, b| a == b)];
    let (mut src, mut k, mut want) = (String::from("set 8 $1\nset 9 $2\n"), 0, Vec::new());
    for (a, b) in PAIRS {
        let _ = writeln!(src, "set 1 ${a}\nset 2 ${b}");
        let before = if a < b { "cmp $1 $0" } else { "cmp $0 $1" };
        for (j, holds) in cj {
            for ops in ["1 2".to_string(), format!("1 ${b}"), format!("${a} [9]"), "[8] [9]".into()] {
                let _ = writeln!(src, "{before}");
                taken(&mut src, &mut k, &format!("{j} {ops} LABEL"));
                flags(&mut src, &mut k); // set whether or not it jumped
                want.push(holds(a, b) as i64);
                want.push(sign(a, b));
            }
        }
    }
    src.push_str("hlt\n");
    assert_eq!(run(&src), want);
}

#[test]
fn jmp_goes_forward_and_backward() {
    let src = "\
jmp a
out $1          ; skipped
:b
out $3
jmp c
:a
out $2
jmp b
:c out $4       ; a label before an instruction on its line
hlt
";
    assert_eq!(run(src), [2, 3, 4]);
}

#[test]
fn for_increments_then_jumps_while_below_so_the_body_runs_n_times() {
    let src = "\
set 0 $0
set 1 $0
set 2 $5
:a
inc 0
for 1 2 a       ; register bound: 5 times
out 0
out 1
set 0 $0
set 1 $0
:b
inc 0
for 1 $3 b      ; immediate bound: 3 times
out 0
out 1
set 0 $0
set 1 $0
:c
inc 0
for 1 $0 c      ; n = 0: the body has run once before the test
out 0
out 1
set 0 $0
set 1 $-3
:d
inc 0
for 1 $0 d      ; -3 up to 0: 3 times
out 0
out 1
set 0 $0
set 1 $0
set 3 $1        ; [3] = register 1
set 4 $2        ; [4] = register 2 (5)
:e
inc 0
for [3] [4] e   ; general form: 5 times
out 0
out 1
set 0 $0
set 1 $0
:f
add 0 1
for 1 $100000 f ; many backward jumps (safe points every 256)
out 0
out 1
hlt
";
    assert_eq!(run(src), [5, 5, 3, 3, 1, 1, 3, 0, 5, 5, 4_999_950_000, 100_000]);
}

#[test]
fn hlt_ends_the_thread_and_out_names_the_node() {
    for cfg in modes(Cfg::default()) {
        let jit = cfg.jit;
        let o = go(&["set 0 $1\nout 0\nhlt\nout $2\n"], cfg.clone());
        let r = o.results[0].as_ref().unwrap();
        if !jit {
            assert_eq!(r.interpreted, 3);
        }
        assert_eq!(o.out, [(FIRST_ID, 1)]);
        // two nodes: each line names its node
        let o = go(&["out $5\nhlt", "out $6\nhlt"], cfg);
        o.ok();
        let mut out = o.out.clone();
        out.sort();
        assert_eq!(out, [(FIRST_ID, 5), (FIRST_ID + 1, 6)]);
    }
}

#[test]
fn in_reads_one_integer_line_per_instruction() {
    let cfg = Cfg {
        input: vec!["42\n".into(), "  -7  \n".into(), "9223372036854775807".into()],
        ..Cfg::default()
    };
    let src = "in 0\nout 0\nset 5 $3\nin [5]\nout 3\nin 1\nout 1\nhlt";
    assert_eq!(run_cfg(src, cfg), [42, -7, MAX]);
    let cfg = Cfg {
        input: vec!["abc\n".into()],
        ..Cfg::default()
    };
    assert_eq!(trap_cfg("in 0\nhlt", cfg), tr(0, "t.dass:1 (in 0)", "in: 'abc' is not an integer"));
}

#[test]
fn clk_counts_microseconds_since_the_thread_started() {
    let src = "\
clk 1
set 3 $0
:l
for 3 $300000 l
clk 2
set 5 $4
clk [5]         ; register 4
out 1
out 2
out 4
hlt
";
    // (times differ between runs: each mode on its own)
    for cfg in modes(Cfg::default()) {
        let t = Instant::now();
        let o = go(&[src], cfg);
        let wall = t.elapsed().as_micros() as i64;
        o.ok();
        let v = o.values(FIRST_ID);
        assert!(0 <= v[0] && v[0] <= v[1] && v[1] <= v[2], "{v:?}");
        assert!(v[2] <= wall, "{v:?} > {wall} µs");
    }
}

// ------------------------------------------------------------------------------ memory

#[test]
fn lod_and_str_move_one_and_several_words() {
    let src = "\
set 1 $11
set 2 $22
set 3 $33
set 4 $44
str $64 1 $1        ; one word
lod $64 10 $1
out 10
str $128 1 $4       ; four words: 11 22 33 44 at 128..152
lod $128 20 $4
out 20
out 21
out 22
out 23
lod $136 30 $2      ; from the middle: 22 33
out 30
out 31
set 5 $256          ; address in a register
set 6 $3            ; count in a register
str 5 2 6           ; 22 33 44 at 256..272
set 7 $5            ; [7] = register 5 (256)
set 8 $40           ; [8] = register 40
lod [7] [8] 6       ; registers 40..42
out 40
out 41
out 42
set 50 $7
str $512 1 $0       ; no words
lod $512 50 $0      ; no words: register 50 unchanged
out 50
set 9 $1000
str $1004 9 $1      ; unaligned, inside a page
lod $1004 51 $1
out 51
set 12 $2
str $2048 [12] $2   ; indirect source registers: 2, 3
lod $2048 52 $2
out 52
out 53
hlt
";
    for cfg in every_mode() {
        let m = mode(&cfg);
        let o = go(&[src], cfg);
        o.ok();
        assert_eq!(o.values(FIRST_ID), [11, 11, 22, 33, 44, 22, 33, 22, 33, 44, 7, 1000, 22, 33], "{m}");
        // and the words are in the page node's memory (written back at the end on copies)
        let s = &o.space;
        assert_eq!([s.word(64), s.word(128), s.word(136), s.word(144), s.word(152)], [11, 11, 22, 33, 44]);
        assert_eq!([s.word(256), s.word(264), s.word(272)], [22, 33, 44]);
        assert_eq!(s.bytes(1004, 8), 1000i64.to_ne_bytes());
        assert_eq!(s.word(512), 0);
    }
}

#[test]
fn lod_and_str_cross_page_boundaries() {
    let src = "\
set 1 $101
set 2 $102
set 3 $103
str $4088 1 $3      ; 4088 on page 0; 4096, 4104 on page 1
set 10 $-1
lod $4080 10 $5     ; 0 101 102 103 0
out 10
out 11
out 12
out 13
out 14
set 4 $0x1122334455667788
str $8188 4 $1      ; one word split between pages 1 and 2
lod $8188 20 $1
out 20
lod $8184 21 $2     ; the two aligned words around it
out 21
out 22
str $12284 1 $2     ; two words from 4 bytes before page 3: the first split, the second on page 3
lod $12284 23 $2
out 23
out 24
set 255 $0
:fill
set [255] 255       ; register i = i
for 255 $255 fill
str $3072 0 $256    ; 256 words over pages 0 and 1 (3072..5120)
lod $3080 0 $255    ; register i = i + 1
out 0
out 127
out 254
out 255
hlt
";
    let v: i64 = 0x1122_3344_5566_7788;
    let vb = v.to_ne_bytes();
    let lo = i64::from_ne_bytes([0, 0, 0, 0, vb[0], vb[1], vb[2], vb[3]]);
    let hi = i64::from_ne_bytes([vb[4], vb[5], vb[6], vb[7], 0, 0, 0, 0]);
    for cfg in every_mode() {
        let m = mode(&cfg);
        let o = go(&[src], cfg);
        o.ok();
        assert_eq!(o.values(FIRST_ID), [0, 101, 102, 103, 0, v, lo, hi, 101, 102, 1, 128, 255, 255], "{m}");
        let s = &o.space;
        assert_eq!(s.bytes(8188, 8), vb);
        assert_eq!(s.word(12284 + 8), 102);
        for i in 0..256u64 {
            assert_eq!(s.word(3072 + 8 * i), i as i64, "word {i} ({m})");
        }
    }
}

#[test]
fn unwritten_memory_reads_zero_and_the_last_word_is_in_the_space() {
    let src = "\
lod $65528 1 $1
out 1
set 2 $-1
str $65528 2 $1
lod $65528 3 $1
out 3
set 4 $9
lod $40000 4 $2     ; page 9, never written
out 4
out 5
hlt
";
    for cfg in every_mode() {
        let o = go(&[src], cfg);
        o.ok();
        assert_eq!(o.values(FIRST_ID), [0, -1, 0, 0]);
        assert_eq!(o.space.word(SPACE - 8), -1);
    }
}

#[test]
fn memory_in_loops_stays_right_when_pages_change() {
    // Loops keep using the page they used last (compiled code goes through the translation cache
    // inline and falls back when the page changes, is held only for reading, or a word is unaligned).
    let src = "\
set 1 $0
set 2 $0
:l
str $64 1 $1        ; page 0
lod $64 3 $1
add 2 3
set 4 1
set 5 1
str $128 4 $2       ; two words
lod $128 6 $2
add 2 6
add 2 7
push 1 $3
pop 10 $3           ; register 10 = register 1
add 2 10
for 1 $1000 l
out 2
set 1 $0
:pages              ; 16 rounds over all 16 pages: word 8 of page p += p + 1
set 3 $0
:p
set 4 3
shl 4 $12
add 4 $8
lod 4 5 $1
add 5 3
inc 5
str 4 5 $1
for 3 $16 p
for 1 $16 pages
set 3 $0
set 6 $0
:sum
set 4 3
shl 4 $12
add 4 $8
lod 4 5 $1
add 6 5
for 3 $16 sum
out 6
set 1 $0
set 7 $0
:u                  ; unaligned and page-spanning words in a loop
set 4 1
shl 4 $12
add 4 $4092         ; 4 bytes before page p + 1
str 4 1 $1
lod 4 8 $1
add 7 8
for 1 $15 u
out 7
hlt
";
    for cfg in every_mode() {
        let m = mode(&cfg);
        let o = go(&[src], cfg);
        o.ok();
        assert_eq!(o.values(FIRST_ID), [4 * 499_500, 16 * 136, 105], "{m}");
        for p in 0..16u64 {
            assert_eq!(o.space.word(p * PAGE + 8), 16 * (p as i64 + 1), "page {p} ({m})");
        }
    }
}

#[test]
fn push_and_pop_restore_registers_in_order() {
    let src = "\
set 1 $11
set 2 $22
set 3 $33
set 4 $44
push 1 $3
set 1 $0
set 2 $0
set 3 $0
pop 1 $3            ; the same range back
out 1
out 2
out 3
push 1 $3
pop 5 $1            ; the top is the last register pushed: 33
out 5
pop 5 $2            ; then 11 22
out 5
out 6
push 1 $1
push 2 $1
pop 7 $1            ; last in, first out: 22
pop 8 $1            ; 11
out 7
out 8
set 9 $2            ; [9] = register 2
set 10 $3           ; count in a register
push [9] 10         ; registers 2..4
pop 40 $3
out 40
out 41
out 42
push 1 $0           ; nothing
pop 1 $0
out 1
push 0 $64          ; exactly the 64-word stack
pop 0 $64
hlt
";
    assert_eq!(run(src), [11, 22, 33, 33, 11, 22, 22, 11, 22, 33, 44, 11]);
    // the stack is empty again: one more pop underflows
    assert_eq!(
        trap("push 1 $3\npop 1 $3\npop 1 $1\nhlt"),
        tr(0, "t.dass:3 (pop 1 $1)", "stack underflow (pop of 1 words, 0 on the stack)")
    );
}

// ------------------------------------------------------------------------------ threads

#[test]
fn fork_copies_the_registers_and_d_holds_the_child_id_in_both() {
    let src = "\
set 5 $77
set 7 $0
fork child 1
thid 2
join 1
out 2               ; 0: the first thread
out 1               ; 1: the child's ID
out 5               ; 77: the child's set did not reach the parent
out 7               ; 0
lod $0 10 $4        ; what the child saw
out 10
out 11
out 12
out 13
fork child2 3
join 3
out 3               ; 2: the second child's ID
lod $32 14 $2
out 14
out 15
hlt
:child
thid 7
str $0 7 $1         ; its thid: 1
str $8 1 $1         ; its d: 1
str $16 5 $1        ; the copied register: 77
set 5 $99
str $24 5 $1
hlt
:child2
set 6 $8
thid [6]            ; register 8
str $32 8 $1        ; 2
str $40 3 $1        ; its d: 2
hlt
";
    for cfg in [Cfg::default(), copies()] {
        assert_eq!(run_cfg(src, cfg), [0, 1, 77, 0, 1, 1, 77, 99, 2, 2, 2]);
    }
}

#[test]
fn join_waits_until_the_thread_has_halted() {
    let src = "\
set 9 $1
fork c 9            ; register 9 = 1
join 9
lod $0 1 $1
out 1
hlt
:c
set 2 $0
:l
for 2 $200000 l
str $0 2 $1
hlt
";
    for cfg in [Cfg::default(), copies()] {
        assert_eq!(run_cfg(src, cfg), [200_000]);
    }
}

#[test]
fn the_node_ends_when_its_first_thread_halts() {
    // one child spins, one waits for a signal nobody sends: both are stopped
    let src = "\
fork spin 1
fork blocked 1
set 2 $0
:l
for 2 $1000 l
out $1
hlt
:spin
jmp spin
:blocked
wait $9
out $2
hlt
";
    let t = Instant::now();
    assert_eq!(run(src), [1]);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_forked_thread_has_its_own_stack() {
    assert_eq!(
        trap("push 1 $2\nfork c 1\njoin 1\nhlt\n:c\npop 1 $1\nhlt"),
        tr(1, "t.dass:6 (pop 1 $1)", "stack underflow (pop of 1 words, 0 on the stack)")
    );
}

#[test]
fn a_trap_in_a_forked_thread_stops_the_node() {
    assert_eq!(
        trap("fork c 2\njoin 2\nout $1\nhlt\n:c\nset 1 $0\ndiv 1 1\nhlt"),
        tr(1, "t.dass:7 (div 1 1)", "division by zero")
    );
    // a child that starts past the last instruction
    assert_eq!(
        trap("fork e 1\njoin 1\nhlt\n:e"),
        tr(1, "t.dass: past the last instruction", "ran past the last instruction (no hlt)")
    );
}

#[test]
fn a_node_has_at_most_64_threads() {
    assert_eq!(
        trap(":l\nfork c 1\njmp l\n:c\nhlt"),
        tr(0, "t.dass:2 (fork c 1)", "fork: more than 64 threads on a node")
    );
}

// ------------------------------------------------------------------------------ across nodes

#[test]
fn producer_and_consumer_on_two_nodes_with_wait_and_signal() {
    let producer = "\
set 1 $1
set 21 $2
:p
wait $1             ; a free slot
str $0 1 $1
signal 21           ; a full slot (register 21 = 2)
inc 1
jle 1 $200 p
hlt
";
    let consumer = "\
signal $1           ; the slot is free
set 5 $0            ; sum
set 6 $0
set 7 $0            ; expected item
set 8 $0            ; items out of order
set 30 $2
set 31 $30          ; [31] = register 30 = 2
:c
wait [31]
lod $0 2 $1
inc 7
jeq 2 7 ok
inc 8
:ok
add 5 2
signal $1
for 6 $200 c
out 5
out 8
hlt
";
    for cfg in every_mode() {
        let o = go(&[producer, consumer], cfg);
        o.ok();
        assert_eq!(o.values(FIRST_ID), [] as [i64; 0]);
        assert_eq!(o.values(FIRST_ID + 1), [20100, 0]);
    }
}

#[test]
fn a_mutex_protected_counter_over_nodes_and_threads_is_exact() {
    // 3 nodes x 2 threads x 300 increments of the word at 8, each under mutex 1 (named as an
    // immediate, a register and an indirect register on the three nodes)
    let prog = |lock: &str, unlock: &str| {
        format!(
            "\
set 9 $1
set 8 $9
fork w 1
:w
set 2 $0
:l
{lock}
lod $8 3 $1
inc 3
str $8 3 $1
{unlock}
for 2 $300 l
thid 4
jne 4 $0 end
join 1
:end
hlt
"
        )
    };
    let progs = [prog("lock $1", "unlock $1"), prog("lock 9", "unlock 9"), prog("lock [8]", "unlock [8]")];
    let srcs: Vec<&str> = progs.iter().map(|s| s.as_str()).collect();
    for cfg in every_mode() {
        let m = mode(&cfg);
        let o = go(&srcs, cfg);
        o.ok();
        assert_eq!(o.space.word(8), 3 * 2 * 300, "{m}");
    }
}

#[test]
fn a_barrier_across_nodes_separates_the_rounds() {
    // Each round every node writes round+1 to its slot, meets the others at barrier 1, checks that
    // every slot holds round+1 and meets them at barrier 2 before the next round's write.
    let prog = |slot: u64, barr: &str| {
        format!(
            "\
set 1 $0
set 20 $0
set 5 $1
set 6 $3
set 30 $5
set 31 $6
:round
set 2 1
inc 2
str ${slot} 2 $1
{barr}
lod $0 10 $3
jne 10 2 bad
jne 11 2 bad
jne 12 2 bad
jmp ok
:bad
inc 20
:ok
barr $2 $3
for 1 $20 round
out 20
out 1
hlt
"
        )
    };
    let progs = [prog(0, "barr $1 $3"), prog(8, "barr 5 6"), prog(16, "barr [30] [31]")];
    let srcs: Vec<&str> = progs.iter().map(|s| s.as_str()).collect();
    for cfg in every_mode() {
        let o = go(&srcs, cfg);
        o.ok();
        for i in 0..3 {
            assert_eq!(o.values(FIRST_ID + i), [0, 20], "node {}", FIRST_ID + i);
        }
    }
    // a barrier counts threads of any node: two threads of one node and one of another
    let a = "fork c 1\nstr $0 1 $1\nbarr $4 $3\njoin 1\nhlt\n:c\nset 2 $7\nstr $8 2 $1\nbarr $4 $3\nhlt";
    let b = "barr $4 $3\nlod $0 10 $2\nout 10\nout 11\nhlt";
    for cfg in modes(Cfg::default()) {
        let o = go(&[a, b], cfg);
        o.ok();
        assert_eq!(o.values(FIRST_ID + 1), [1, 7]);
    }
}

// ------------------------------------------------------------------------------ traps

#[test]
fn trap_display() {
    let t = tr(3, "t.dass:3 (div 0 1)", "division by zero");
    assert_eq!(t.to_string(), "trap on node 7, thread 3, at t.dass:3 (div 0 1): division by zero");
}

#[test]
fn trap_division_by_zero() {
    assert_eq!(trap("set 0 $1\nset 1 $0\ndiv 0 1\nhlt"), tr(0, "t.dass:3 (div 0 1)", "division by zero"));
    assert_eq!(trap("set 0 $1\ndiv 0 $0   ; immediate zero\nhlt"), tr(0, "t.dass:2 (div 0 $0)", "division by zero"));
    assert_eq!(trap("set 2 $0\nset 3 $1\ndiv [2] [3]\nhlt"), tr(0, "t.dass:3 (div [2] [3])", "division by zero"));
}

#[test]
fn trap_address_outside_the_shared_space() {
    let cause = |a: i64, n: usize| format!("address {a} ({n} bytes) outside the shared space (0..{SPACE})");
    assert_eq!(trap("lod $65536 1 $1\nhlt"), tr(0, "t.dass:1 (lod $65536 1 $1)", &cause(65536, 8)));
    assert_eq!(trap("str $65536 1 $1\nhlt"), tr(0, "t.dass:1 (str $65536 1 $1)", &cause(65536, 8)));
    assert_eq!(trap("lod $65528 1 $2\nhlt"), tr(0, "t.dass:1 (lod $65528 1 $2)", &cause(65528, 16)));
    assert_eq!(trap("str $65532 1 $1\nhlt"), tr(0, "t.dass:1 (str $65532 1 $1)", &cause(65532, 8)));
    assert_eq!(trap("set 5 $-8\nlod 5 1 $1\nhlt"), tr(0, "t.dass:2 (lod 5 1 $1)", &cause(-8, 8)));
    assert_eq!(trap("str $-4 1 $2\nhlt"), tr(0, "t.dass:1 (str $-4 1 $2)", &cause(-4, 16)));
    // copies take the same checks
    assert_eq!(trap_cfg("lod $1000000 1 $1\nhlt", copies()), tr(0, "t.dass:1 (lod $1000000 1 $1)", &cause(1_000_000, 8)));
}

#[test]
fn trap_stack_overflow() {
    let cfg = || Cfg {
        stack_words: 4,
        ..Cfg::default()
    };
    assert_eq!(run_cfg("push 0 $4\nhlt", cfg()), [] as [i64; 0]);
    assert_eq!(trap_cfg("push 0 $3\npush 0 $2\nhlt", cfg()), tr(0, "t.dass:2 (push 0 $2)", "stack overflow (4 words)"));
    assert_eq!(
        trap_cfg(":l\npush 0 $1\njmp l", cfg()),
        tr(0, "t.dass:2 (push 0 $1)", "stack overflow (4 words)")
    );
}

#[test]
fn trap_stack_underflow() {
    assert_eq!(
        trap("push 0 $1\npop 0 $2\nhlt"),
        tr(0, "t.dass:2 (pop 0 $2)", "stack underflow (pop of 2 words, 1 on the stack)")
    );
    assert_eq!(trap("pop 3 $1\nhlt"), tr(0, "t.dass:1 (pop 3 $1)", "stack underflow (pop of 1 words, 0 on the stack)"));
}

#[test]
fn trap_indirect_register_out_of_range() {
    assert_eq!(trap("set 0 $256\nout [0]\nhlt"), tr(0, "t.dass:2 (out [0])", "[0] names register 256, outside 0..255"));
    assert_eq!(trap("set 0 $-1\nset [0] $1\nhlt"), tr(0, "t.dass:2 (set [0] $1)", "[0] names register -1, outside 0..255"));
    assert_eq!(trap("set 3 $300\ninc [3]\nhlt"), tr(0, "t.dass:2 (inc [3])", "[3] names register 300, outside 0..255"));
    assert_eq!(
        trap("set 4 $1000\njlt [4] $0 x\n:x\nhlt"),
        tr(0, "t.dass:2 (jlt [4] $0 x)", "[4] names register 1000, outside 0..255")
    );
    assert_eq!(
        trap("set 4 $-9223372036854775808\nlod $0 [4] $1\nhlt"),
        tr(0, "t.dass:2 (lod $0 [4] $1)", "[4] names register -9223372036854775808, outside 0..255")
    );
}

#[test]
fn trap_register_range_of_push_pop_lod_str() {
    assert_eq!(run("push 250 $6\npop 250 $6\nlod $0 250 $6\nstr $0 250 $6\nhlt"), [] as [i64; 0]);
    let cases = [
        ("push 250 $7", "registers 250..250+7 outside 0..255"),
        ("pop 0 $-1", "registers 0..0+-1 outside 0..255"),
        ("lod $0 255 $2", "registers 255..255+2 outside 0..255"),
        ("str $0 200 $57", "registers 200..200+57 outside 0..255"),
        ("lod $0 0 $257", "registers 0..0+257 outside 0..255"),
        // counts so large that d + n overflows
        ("lod $0 1 $9223372036854775807", "registers 1..1+9223372036854775807 outside 0..255"),
        ("str $0 1 $9223372036854775807", "registers 1..1+9223372036854775807 outside 0..255"),
        ("push 1 $9223372036854775807", "registers 1..1+9223372036854775807 outside 0..255"),
        ("pop 255 $9223372036854775807", "registers 255..255+9223372036854775807 outside 0..255"),
    ];
    for (insn, cause) in cases {
        assert_eq!(trap(&format!("push 0 $8\n{insn}\nhlt")), tr(0, &format!("t.dass:2 ({insn})"), cause));
    }
    // a register count
    assert_eq!(
        trap("set 9 $-2\nlod $0 3 9\nhlt"),
        tr(0, "t.dass:2 (lod $0 3 9)", "registers 3..3+-2 outside 0..255")
    );
}

#[test]
fn trap_join_of_an_unknown_thread() {
    assert_eq!(trap("join $1\nhlt"), tr(0, "t.dass:1 (join $1)", "join of unknown thread 1"));
    assert_eq!(trap("join $0\nhlt"), tr(0, "t.dass:1 (join $0)", "join of unknown thread 0"));
    assert_eq!(trap("set 1 $-1\njoin 1\nhlt"), tr(0, "t.dass:2 (join 1)", "join of unknown thread -1"));
    assert_eq!(trap("fork c 1\njoin $2\nhlt\n:c\nhlt"), tr(0, "t.dass:2 (join $2)", "join of unknown thread 2"));
}

#[test]
fn trap_unlock_of_a_mutex_not_held() {
    assert_eq!(
        trap("unlock $3\nhlt"),
        tr(0, "t.dass:1 (unlock $3)", "unlock of mutex 3, which this thread does not hold")
    );
    assert_eq!(
        trap("lock $3\nunlock $3\nunlock $3\nhlt"),
        tr(0, "t.dass:3 (unlock $3)", "unlock of mutex 3, which this thread does not hold")
    );
    // held by another thread of the node
    assert_eq!(
        trap("lock $4\nfork c 1\njoin 1\nhlt\n:c\nunlock $4\nhlt"),
        tr(1, "t.dass:6 (unlock $4)", "unlock of mutex 4, which this thread does not hold")
    );
    // and locking twice
    assert_eq!(trap("lock $3\nlock $3\nhlt"), tr(0, "t.dass:2 (lock $3)", "mutex 3 is already held by this thread"));
}

#[test]
fn trap_barrier_count_not_positive() {
    assert_eq!(trap("barr $1 $0\nhlt"), tr(0, "t.dass:1 (barr $1 $0)", "barrier 1: count 0 is not positive"));
    assert_eq!(trap("set 3 $-2\nbarr $7 3\nhlt"), tr(0, "t.dass:2 (barr $7 3)", "barrier 7: count -2 is not positive"));
    // a barrier of one passes at once
    assert_eq!(run("barr $1 $1\nbarr $1 $1\nout $1\nhlt"), [1]);
}

#[test]
fn trap_running_past_the_last_instruction() {
    let past = tr(0, "t.dass: past the last instruction", "ran past the last instruction (no hlt)");
    assert_eq!(trap("set 0 $1\nout 0"), past);
    assert_eq!(trap("jmp end\nhlt\n:end"), past);
    for cfg in modes(Cfg::default()) {
        assert_eq!(go(&["out $1"], cfg).out, [(FIRST_ID, 1)]);
    }
}

#[test]
fn trap_in_at_end_of_input() {
    assert_eq!(trap("in 0\nhlt"), tr(0, "t.dass:1 (in 0)", "in: end of input"));
    let cfg = Cfg {
        input: vec!["1\n".into()],
        ..Cfg::default()
    };
    assert_eq!(trap_cfg("in 0\nout 0\nin 0\nhlt", cfg), tr(0, "t.dass:3 (in 0)", "in: end of input"));
}

#[test]
fn trap_deadlock_when_every_thread_waits() {
    let cause = "deadlock: every thread of the application waits";
    for cfg in modes(Cfg::default()) {
        // two nodes, each waiting for a signal nobody sends
        let t = Instant::now();
        let o = go(&["wait $1\nhlt", "set 1 $2\nwait 1\nhlt"], cfg.clone());
        let took = t.elapsed();
        assert_eq!(o.results[0].as_ref().unwrap_err(), &tr(0, "t.dass:1 (wait $1)", cause));
        let mut t8 = tr(0, "t.dass:2 (wait 1)", cause);
        t8.node = FIRST_ID + 1;
        assert_eq!(o.results[1].as_ref().unwrap_err(), &t8);
        assert!(took < Duration::from_secs(2), "{took:?}");
        // one node: the child waits for a mutex its parent holds, the parent joins the child (either
        // may find the deadlock first)
        let t = go(&["lock $1\nfork c 1\njoin 1\nhlt\n:c\nlock $1\nhlt"], cfg).results.remove(0).unwrap_err();
        assert!(
            t == tr(0, "t.dass:3 (join 1)", cause) || t == tr(1, "t.dass:6 (lock $1)", cause),
            "{t}"
        );
    }
}


/// Bulk transfers (4 words and more: inline 16-byte moves up to 128 words, memcpy beyond) of register
/// ranges where some registers live in compiled code's variables (changed in a compiled loop just
/// before) and the others only in the register file: str then lod, push then pop, compiled and
/// interpreted, every word checked through `[N]` reads (which go through the register file).
#[test]
fn bulk_transfers_mix_registers_in_variables_and_in_the_register_file() {
    for n in [4i64, 5, 17, 128, 129, 200] {
        let last = 20 + n - 1;
        let src = format!(
            "\
; registers 20..20+n-1 = 7k+1 (through [N]: the register file)
set 1 $20
:fill
set 2 1
mul 2 $7
inc 2
set [1] 2
inc 1
jle 1 ${last} fill
; a compiled loop changes registers 21 and {last} (they live in variables)
set 3 $0
:bump
add 21 $1000
add {last} $1000
for 3 $3 bump
str $1000 20 ${n}
push 20 ${n}
; clear the range, then read it back from memory
set 1 $20
:clear
set [1] $0
inc 1
jle 1 ${last} clear
lod $1000 20 ${n}
set 1 $20
set 4 $0
:sum1
add 4 [1]
inc 1
jle 1 ${last} sum1
out 4
out 21
out {last}
; and from the stack
set 1 $20
:clear2
set [1] $0
inc 1
jle 1 ${last} clear2
pop 20 ${n}
set 1 $20
set 4 $0
:sum2
add 4 [1]
inc 1
jle 1 ${last} sum2
out 4
out 21
out {last}
hlt
"
        );
        let base: i64 = (20..=last).map(|k| 7 * k + 1).sum();
        let want = base + 6000;
        let (r21, rl) = (7 * 21 + 1 + 3000, 7 * last + 1 + 3000);
        let cfg = Cfg {
            stack_words: 4096,
            ..Cfg::default()
        };
        assert_eq!(run_cfg(&src, cfg), [want, r21, rl, want, r21, rl], "{n} words");
    }
}

/// Compiled code remembers the last address check in straight-line code; it must forget it when the
/// address register changes (by the load itself, or arithmetic), so the store goes where the new
/// value says.
#[test]
fn a_store_after_its_address_register_changed_goes_to_the_new_address() {
    let src = "\
set 1 $16
str $8 1 $1         ; mem[8] = 16
set 5 $8
lod 5 5 $1          ; r5 = mem[8] = 16: the load overwrites its own address register
set 2 $99
str 5 2 $1          ; mem[16] = 99
lod 5 6 $1
add 5 $8            ; r5 = 24
str 5 2 $1          ; mem[24] = 99
lod $8 3 $1
out 3
lod $16 3 $1
out 3
lod $24 3 $1
out 3
out 6
hlt
";
    assert_eq!(run(src), [16, 99, 99, 99]);
}
