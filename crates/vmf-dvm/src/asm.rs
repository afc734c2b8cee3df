//! The DASS assembler and verifier: text to [`Program`], every error reported with
//! `file:line:column: message`.
//!
//! Syntax (004_*, Figures 4.2 and 4.3): one instruction per line, `mnemonic operand ...`; `;` starts a
//! comment; `:name` defines a label (alone on its line or before an instruction). Operands: `N` is
//! register N, `$N` the immediate N (decimal, `-` allowed, or `0x` hexadecimal; it must fit in 64 bits),
//! `[N]` the register whose number register N holds, and a bare name is a label.
use crate::isa::{Alu, Cond, Dst, Insn, Origin, Program, Src};
use std::collections::HashMap;
use std::fmt;

/// One assembler error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmError {
    pub file: String,
    pub line: u32,
    pub col: u32,
    pub msg: String,
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.msg)
    }
}

/// Every error of a file (at least one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmErrors(pub Vec<AsmError>);

impl fmt::Display for AsmErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for AsmErrors {}

/// Operand kinds an instruction takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// a register: `N` or `[N]`
    D,
    /// a value: `$N`, `N` or `[N]`
    S,
    /// a label
    L,
}

use Kind::{D, L, S};

/// The 40 mnemonics of Appendix A and their operand forms.
fn forms(m: &str) -> Option<&'static [&'static [Kind]]> {
    Some(match m {
        "set" | "and" | "or" | "xor" | "shl" | "shr" | "add" | "sub" | "mul" | "div" => &[&[D, S]],
        "in" | "clk" | "inc" | "dec" | "thid" => &[&[D]],
        "out" | "join" | "lock" | "unlock" | "wait" | "signal" => &[&[S]],
        "lod" | "str" => &[&[S, D, S]],
        "push" | "pop" => &[&[D, S]],
        "cmp" | "barr" => &[&[S, S]],
        "jmp" => &[&[L]],
        "jlt" | "jgt" | "jeq" | "jne" | "jle" | "jge" => &[&[L], &[S, S, L]],
        "cjl" | "cjg" | "cje" => &[&[S, S, L]],
        "for" => &[&[D, S, L]],
        "fork" => &[&[L, D]],
        "hlt" => &[&[]],
        _ => return None,
    })
}

/// The mnemonics, in Appendix A's order.
pub const MNEMONICS: [&str; 40] = [
    "set", "in", "out", "clk", "lod", "pop", "push", "str", "and", "or", "xor", "shl", "shr", "add", "sub",
    "mul", "div", "inc", "dec", "cmp", "jmp", "jlt", "jgt", "jeq", "jne", "jle", "jge", "cjl", "cjg", "cje",
    "for", "hlt", "fork", "join", "thid", "barr", "lock", "unlock", "wait", "signal",
];

fn form_text(f: &[Kind]) -> String {
    if f.is_empty() {
        return "no operands".into();
    }
    f.iter()
        .map(|k| match k {
            D => "register",
            S => "value",
            L => "label",
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Clone, Debug)]
enum Tok {
    Imm(i64),
    Reg(u32),
    Ind(u32),
    Label(String),
}

fn describe(t: &Tok) -> &'static str {
    match t {
        Tok::Imm(_) => "an immediate",
        Tok::Reg(_) => "a register",
        Tok::Ind(_) => "an indirect register",
        Tok::Label(_) => "a label",
    }
}

fn parse_int(s: &str) -> Result<i64, String> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v: u128 = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        if h.is_empty() || !h.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("'{s}' is not a number"));
        }
        if h.len() > 16 {
            return Err(format!("immediate '{s}' out of range (64 bits)"));
        }
        u128::from_str_radix(h, 16).map_err(|_| format!("'{s}' is not a number"))?
    } else {
        if body.is_empty() || !body.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!("'{s}' is not a number"));
        }
        if body.len() > 30 {
            return Err(format!("immediate '{s}' out of range (64 bits)"));
        }
        body.parse::<u128>().map_err(|_| format!("'{s}' is not a number"))?
    };
    if neg {
        if v > 1u128 << 63 {
            return Err(format!("immediate '{s}' out of range (64 bits)"));
        }
        Ok((v as i128).wrapping_neg() as i64)
    } else {
        // Up to 2^64-1: the bit pattern (0xffff_ffff_ffff_ffff is -1).
        if v > u64::MAX as u128 {
            return Err(format!("immediate '{s}' out of range (64 bits)"));
        }
        Ok(v as u64 as i64)
    }
}

fn parse_reg(s: &str, registers: u32) -> Result<u32, String> {
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("malformed operand '{s}'"));
    }
    match s.parse::<u64>() {
        Ok(r) if r < registers as u64 => Ok(r as u32),
        _ => Err(format!("register {s} out of range (registers are 0..{})", registers - 1)),
    }
}

fn is_label(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '.')
}

fn parse_operand(s: &str, registers: u32) -> Result<Tok, String> {
    if let Some(v) = s.strip_prefix('$') {
        return parse_int(v).map(Tok::Imm);
    }
    if let Some(inner) = s.strip_prefix('[') {
        let Some(r) = inner.strip_suffix(']') else {
            return Err(format!("malformed operand '{s}' (missing ']')"));
        };
        return parse_reg(r.trim(), registers).map(Tok::Ind);
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        return parse_reg(s, registers).map(Tok::Reg);
    }
    if is_label(s) {
        return Ok(Tok::Label(s.to_string()));
    }
    Err(format!("malformed operand '{s}'"))
}

/// Split a line into (column, word) pairs, stopping at a comment.
fn words(line: &str) -> Vec<(u32, &str)> {
    let code = match line.find(';') {
        Some(i) => &line[..i],
        None => line,
    };
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in code.char_indices() {
        if c.is_whitespace() || c == ',' {
            if let Some(s) = start.take() {
                out.push(((s + 1) as u32, &code[s..i]));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push(((s + 1) as u32, &code[s..]));
    }
    out
}

struct Pending {
    mnemonic: String,
    ops: Vec<(u32, Tok)>,
    line: u32,
    col: u32,
    text: String,
}

/// Assemble `src` (named `file` in messages) for threads with `registers` registers.
pub fn assemble(file: &str, src: &str, registers: u32) -> Result<Program, AsmErrors> {
    let mut errs = Vec::new();
    let mut labels: HashMap<String, (usize, u32)> = HashMap::new();
    let mut pend: Vec<Pending> = Vec::new();
    let err = |errs: &mut Vec<AsmError>, line: u32, col: u32, msg: String| {
        errs.push(AsmError {
            file: file.to_string(),
            line,
            col,
            msg,
        })
    };
    for (ln, raw) in src.lines().enumerate() {
        let line = (ln + 1) as u32;
        let mut ws = words(raw);
        while let Some(&(col, w)) = ws.first() {
            let Some(name) = w.strip_prefix(':') else { break };
            ws.remove(0);
            if !is_label(name) {
                err(&mut errs, line, col, format!("malformed label '{w}'"));
            } else if let Some(&(_, first)) = labels.get(name) {
                err(&mut errs, line, col, format!("duplicate label '{name}' (first defined at line {first})"));
            } else {
                labels.insert(name.to_string(), (pend.len(), line));
            }
        }
        let Some(&(col, m)) = ws.first() else { continue };
        let Some(fs) = forms(m) else {
            err(&mut errs, line, col, format!("unknown mnemonic '{m}'"));
            continue;
        };
        let given = &ws[1..];
        let Some(form) = fs.iter().find(|f| f.len() == given.len()) else {
            let want = fs.iter().map(|f| form_text(f)).collect::<Vec<_>>().join(", or ");
            let most = fs.iter().map(|f| f.len()).max().unwrap_or(0);
            let c = given.get(most).map_or(col, |w| w.0);
            err(
                &mut errs,
                line,
                c,
                format!("'{m}' takes {want}; {} operand{} given", given.len(), if given.len() == 1 { "" } else { "s" }),
            );
            continue;
        };
        let mut ops = Vec::new();
        let mut ok = true;
        for (i, (&(c, w), &k)) in given.iter().zip(form.iter()).enumerate() {
            let t = match parse_operand(w, registers) {
                Ok(t) => t,
                Err(e) => {
                    err(&mut errs, line, c, e);
                    ok = false;
                    continue;
                }
            };
            let fits = matches!(
                (k, &t),
                (D, Tok::Reg(_) | Tok::Ind(_)) | (S, Tok::Reg(_) | Tok::Ind(_) | Tok::Imm(_)) | (L, Tok::Label(_))
            );
            if !fits {
                let want = match k {
                    D => "a register (N or [N])",
                    S => "a value ($N, N or [N])",
                    L => "a label",
                };
                err(
                    &mut errs,
                    line,
                    c,
                    format!("wrong operand kind: operand {} of '{m}' must be {want}, not {} ('{w}')", i + 1, describe(&t)),
                );
                ok = false;
                continue;
            }
            ops.push((c, t));
        }
        if ok {
            pend.push(Pending {
                mnemonic: m.to_string(),
                ops,
                line,
                col,
                text: ws.iter().map(|w| w.1).collect::<Vec<_>>().join(" "),
            });
        }
    }
    let mut code = Vec::with_capacity(pend.len());
    let mut origin = Vec::with_capacity(pend.len());
    for p in &pend {
        let mut lab = |i: usize| -> u32 {
            let (c, t) = &p.ops[i];
            let Tok::Label(name) = t else { unreachable!("checked kind") };
            match labels.get(name) {
                Some(&(pc, _)) => pc as u32,
                None => {
                    errs.push(AsmError {
                        file: file.to_string(),
                        line: p.line,
                        col: *c,
                        msg: format!("undefined label '{name}'"),
                    });
                    0
                }
            }
        };
        let insn = build(&p.mnemonic, &p.ops, &mut lab);
        code.push(insn);
        origin.push(Origin {
            line: p.line,
            text: p.text.clone(),
        });
        let _ = p.col;
    }
    if errs.is_empty() && code.is_empty() {
        err(&mut errs, 1, 1, "no instructions".into());
    }
    if !errs.is_empty() {
        errs.sort_by_key(|e| (e.line, e.col));
        return Err(AsmErrors(errs));
    }
    Ok(Program {
        file: file.to_string(),
        code,
        origin,
        registers,
    })
}

fn src(t: &Tok) -> Src {
    match *t {
        Tok::Imm(v) => Src::Imm(v),
        Tok::Reg(r) => Src::Reg(r),
        Tok::Ind(r) => Src::Ind(r),
        Tok::Label(_) => unreachable!("checked kind"),
    }
}

fn dst(t: &Tok) -> Dst {
    match *t {
        Tok::Reg(r) => Dst::Reg(r),
        Tok::Ind(r) => Dst::Ind(r),
        _ => unreachable!("checked kind"),
    }
}

fn cond(m: &str) -> Cond {
    match m {
        "jlt" | "cjl" => Cond::Lt,
        "jgt" | "cjg" => Cond::Gt,
        "jeq" | "cje" => Cond::Eq,
        "jne" => Cond::Ne,
        "jle" => Cond::Le,
        _ => Cond::Ge,
    }
}

fn alu(m: &str) -> Alu {
    match m {
        "set" => Alu::Set,
        "add" => Alu::Add,
        "sub" => Alu::Sub,
        "mul" => Alu::Mul,
        "div" => Alu::Div,
        "and" => Alu::And,
        "or" => Alu::Or,
        "xor" => Alu::Xor,
        "shl" => Alu::Shl,
        _ => Alu::Shr,
    }
}

fn build(m: &str, ops: &[(u32, Tok)], lab: &mut impl FnMut(usize) -> u32) -> Insn {
    let t = |i: usize| &ops[i].1;
    match m {
        "set" | "and" | "or" | "xor" | "shl" | "shr" | "add" | "sub" | "mul" | "div" => {
            let op = alu(m);
            match (dst(t(0)), src(t(1))) {
                // div keeps the general form: its divisor is checked there
                (Dst::Reg(d), Src::Reg(s)) if op != Alu::Div => Insn::AluRR(op, d, s),
                (Dst::Reg(d), Src::Imm(v)) if op != Alu::Div || v != 0 => Insn::AluRI(op, d, v),
                (d, s) => Insn::Alu(op, d, s),
            }
        }
        "in" => Insn::In(dst(t(0))),
        "out" => Insn::Out(src(t(0))),
        "clk" => Insn::Clk(dst(t(0))),
        "inc" | "dec" => match (m, dst(t(0))) {
            ("inc", Dst::Reg(r)) => Insn::IncR(r),
            ("dec", Dst::Reg(r)) => Insn::DecR(r),
            ("inc", d) => Insn::Inc(d),
            (_, d) => Insn::Dec(d),
        },
        "thid" => Insn::Thid(dst(t(0))),
        "join" => Insn::Join(src(t(0))),
        "lock" => Insn::Lock(src(t(0))),
        "unlock" => Insn::Unlock(src(t(0))),
        "wait" => Insn::Wait(src(t(0))),
        "signal" => Insn::Signal(src(t(0))),
        "lod" => Insn::Lod {
            addr: src(t(0)),
            dst: dst(t(1)),
            n: src(t(2)),
        },
        "str" => Insn::Str {
            addr: src(t(0)),
            src: dst(t(1)),
            n: src(t(2)),
        },
        "push" => Insn::Push {
            src: dst(t(0)),
            n: src(t(1)),
        },
        "pop" => Insn::Pop {
            dst: dst(t(0)),
            n: src(t(1)),
        },
        "cmp" => Insn::Cmp(src(t(0)), src(t(1))),
        "barr" => Insn::Barr(src(t(0)), src(t(1))),
        "jmp" => Insn::Jmp(lab(0)),
        "jlt" | "jgt" | "jeq" | "jne" | "jle" | "jge" if ops.len() == 1 => Insn::JFlag(cond(m), lab(0)),
        "jlt" | "jgt" | "jeq" | "jne" | "jle" | "jge" => {
            let c = cond(m);
            let l = lab(2);
            match (src(t(0)), src(t(1))) {
                (Src::Reg(a), Src::Reg(b)) => Insn::JCmpRR(c, a, b, l),
                (Src::Reg(a), Src::Imm(b)) => Insn::JCmpRI(c, a, b, l),
                (a, b) => Insn::JCmp(c, a, b, l),
            }
        }
        "cjl" | "cjg" | "cje" => Insn::CJmp(cond(m), src(t(0)), src(t(1)), lab(2)),
        "for" => {
            let l = lab(2);
            match (dst(t(0)), src(t(1))) {
                (Dst::Reg(a), Src::Reg(b)) => Insn::ForRR(a, b, l),
                (Dst::Reg(a), Src::Imm(b)) => Insn::ForRI(a, b, l),
                (a, b) => Insn::For(a, b, l),
            }
        }
        "fork" => Insn::Fork(lab(0), dst(t(1))),
        _ => Insn::Hlt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(src: &str) -> Vec<String> {
        assemble("t.dass", src, 256).unwrap_err().0.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn every_mnemonic_of_appendix_a_assembles() {
        let mut src = String::from(":l\n");
        for m in MNEMONICS {
            let f = forms(m).unwrap()[0];
            let ops: Vec<&str> = f.iter().map(|k| match k { D => "1", S => "$2", L => "l" }).collect();
            src.push_str(&format!("{m} {}\n", ops.join(" ")));
        }
        let p = assemble("t.dass", &src, 8).unwrap();
        assert_eq!(p.code.len(), 40);
    }

    #[test]
    fn thesis_listing_4_2_assembles_with_specialised_forms() {
        let src = "set    0 $0      ; a = 0\nset    1 $0\nset    4 $1000000\nout    0\nclk    2\n:loop\n\n    add    0 1\n    for    1 4 loop\n\nclk    3\nsub    3 2\nout    3\nhlt\n";
        let p = assemble("iter.dass", src, 256).unwrap();
        assert_eq!(p.code[5], Insn::AluRR(Alu::Add, 0, 1));
        assert_eq!(p.code[6], Insn::ForRR(1, 4, 5));
        assert_eq!(p.origin[6].line, 9);
        assert_eq!(p.where_is(6), "iter.dass:9 (for 1 4 loop)");
    }

    #[test]
    fn operand_forms() {
        let p = assemble("t", "add [2] [3]\nset 0 $-5\nset 0 $0xff\nset 1 $18446744073709551615\njlt 1 $3 e\n:e\nhlt", 8).unwrap();
        assert_eq!(p.code[0], Insn::Alu(Alu::Add, Dst::Ind(2), Src::Ind(3)));
        assert_eq!(p.code[1], Insn::AluRI(Alu::Set, 0, -5));
        assert_eq!(p.code[2], Insn::AluRI(Alu::Set, 0, 255));
        assert_eq!(p.code[3], Insn::AluRI(Alu::Set, 1, -1));
        assert_eq!(p.code[4], Insn::JCmpRI(Cond::Lt, 1, 3, 5));
        assert_eq!(cond("jle"), Cond::Le);
        assert_eq!(cond("jne"), Cond::Ne);
        assert_eq!(cond("jge"), Cond::Ge);
        assert_eq!(cond("jgt"), Cond::Gt);
        assert_eq!(cond("cjg"), Cond::Gt);
        assert_eq!(cond("cje"), Cond::Eq);
        assert_eq!(cond("cjl"), Cond::Lt);
        assert_eq!(cond("jeq"), Cond::Eq);
    }

    #[test]
    fn golden_error_messages() {
        assert_eq!(errs("mov 0 $1\nhlt"), ["t.dass:1:1: unknown mnemonic 'mov'"]);
        assert_eq!(
            errs("hlt\nset $1 0"),
            ["t.dass:2:5: wrong operand kind: operand 1 of 'set' must be a register (N or [N]), not an immediate ('$1')"]
        );
        assert_eq!(errs("jmp nowhere"), ["t.dass:1:5: undefined label 'nowhere'"]);
        assert_eq!(errs(":a\n:a\nhlt"), ["t.dass:2:1: duplicate label 'a' (first defined at line 1)"]);
        assert_eq!(
            errs("set 0 $99999999999999999999"),
            ["t.dass:1:7: immediate '99999999999999999999' out of range (64 bits)"]
        );
        assert_eq!(errs("set 0 $-9223372036854775809"), ["t.dass:1:7: immediate '-9223372036854775809' out of range (64 bits)"]);
        assert_eq!(errs("set 256 $1"), ["t.dass:1:5: register 256 out of range (registers are 0..255)"]);
        assert_eq!(errs("add 0"), ["t.dass:1:1: 'add' takes register value; 1 operand given"]);
        assert_eq!(errs("hlt 3"), ["t.dass:1:5: 'hlt' takes no operands; 1 operand given"]);
        assert_eq!(errs("jlt 1 l"), ["t.dass:1:1: 'jlt' takes label, or value value label; 2 operands given"]);
        assert_eq!(errs("jmp 3"), ["t.dass:1:5: wrong operand kind: operand 1 of 'jmp' must be a label, not a register ('3')"]);
        assert_eq!(errs("set 0 [1"), ["t.dass:1:7: malformed operand '[1' (missing ']')"]);
        assert_eq!(errs("; nothing\n"), ["t.dass:1:1: no instructions"]);
        // every error of the file, in order
        assert_eq!(errs("foo\nset 0 $x\nhlt").len(), 2);
        assert_eq!(errs("set 0 $1.5\nhlt"), ["t.dass:1:7: '1.5' is not a number"]);
    }
}
