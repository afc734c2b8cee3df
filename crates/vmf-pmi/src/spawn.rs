//! Dynamic processes over PMI-1: the multi-line `mcmd=spawn` request by which a rank asks the launcher to
//! start a new job (MPI_Comm_spawn / MPI_Comm_spawn_multiple).
//!
//! The wire format is the one MPICH 4.0's simple PMI client writes (`PMI_Spawn_multiple` in
//! `src/pmi/simple/simple_pmi.c`) and Hydra's server reads (`fn_spawn` in
//! `src/pm/hydra/pm/pmiserv/pmiserv_pmi_v1.c`): one block per command, one `key=value` per line, the value
//! being the rest of the line (so arguments and info values may contain spaces and `=`, not newlines):
//!
//! ```text
//! mcmd=spawn
//! nprocs=<maxprocs>
//! execname=<program>
//! totspawns=<number of commands>
//! spawnssofar=<1-based index of this command>
//! arg1=<first argument>            (argN lines come before argcnt)
//! argcnt=<number of arguments>
//! preput_num=<P>                   (the same preputs in every block)
//! preput_key_0=<key>
//! preput_val_0=<value>
//! info_num=<I>
//! info_key_0=<key>
//! info_val_0=<value>
//! endcmd
//! ```
//!
//! After the last block the client reads one line, `cmd=spawn_result rc=0` (or a nonzero `rc` with a
//! `msg=`). The preputs are put into the new job's key-value space before its processes start; MPICH
//! passes the root's port as `PARENT_ROOT_PORT_NAME`.
use crate::server::{KEYLEN_MAX, VALLEN_MAX};
use crate::wire::{check_token, MAX_LINE};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};

/// Most commands one spawn request may carry (`totspawns`).
pub const SPAWN_MAX_CMDS: usize = 1024;
/// Most arguments of one command (`argcnt`).
pub const SPAWN_MAX_ARGS: usize = 4096;
/// Most info pairs of one command (`info_num`), and most preput pairs (`preput_num`).
pub const SPAWN_MAX_PAIRS: usize = 1024;
/// Most processes one command may ask for (`nprocs`); the launcher applies its own, lower limit.
pub const SPAWN_MAX_PROCS: usize = 1 << 20;
/// Most lines one block may have (longer blocks are read to `endcmd` and refused).
const BLOCK_MAX_LINES: usize = SPAWN_MAX_ARGS + 4 * SPAWN_MAX_PAIRS + 16;
/// Most bytes one block may have.
const BLOCK_MAX_BYTES: usize = 4 << 20;

/// One command of a spawn request: start `maxprocs` copies of `exe` with `args`.
///
/// `info` holds the MPI_Info pairs given for the command; vmfabric's launcher honours `wdir` (working
/// directory), `path` (directories to search for `exe`, separated by `:`) and `host`/`hosts` (where to
/// start the processes), and ignores other keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpawnCmd {
    /// The program (a path, or a name looked up in the `path` info directories and `PATH`).
    pub exe: String,
    /// Its arguments (without the program name).
    pub args: Vec<String>,
    /// Number of processes to start (at least 1).
    pub maxprocs: usize,
    /// Info keys and values.
    pub info: Vec<(String, String)>,
}

/// A string that travels as the rest of a line: anything but line breaks and NUL.
fn check_line_value(what: &str, s: &str) -> Result<(), String> {
    if let Some(c) = s.chars().find(|&c| c == '\n' || c == '\r' || c == '\0') {
        return Err(format!(
            "{what} contains {c:?} (spawn request values may not contain line breaks)"
        ));
    }
    Ok(())
}

/// The bytes of a spawn request for `cmds` and `preput`, as MPICH's `PMI_Spawn_multiple` writes them.
/// Preput keys and values must be valid key-value-space entries (at most `keylen_max` / `vallen_max`
/// bytes, no whitespace or `=`). Returns why not on invalid input.
pub(crate) fn encode_request(
    cmds: &[SpawnCmd],
    preput: &[(String, String)],
    keylen_max: usize,
    vallen_max: usize,
) -> Result<String, String> {
    if cmds.is_empty() {
        return Err("no command was given".into());
    }
    if cmds.len() > SPAWN_MAX_CMDS {
        return Err(format!(
            "{} commands were given and the limit is {SPAWN_MAX_CMDS}",
            cmds.len()
        ));
    }
    if preput.len() > SPAWN_MAX_PAIRS {
        return Err(format!(
            "{} preput pairs were given and the limit is {SPAWN_MAX_PAIRS}",
            preput.len()
        ));
    }
    for (k, v) in preput {
        check_token(k, keylen_max, false).map_err(|why| format!("preput key {k:?}: {why}"))?;
        check_token(v, vallen_max, true).map_err(|why| format!("preput value of {k}: {why}"))?;
    }
    let mut out = String::new();
    let total = cmds.len();
    for (i, c) in cmds.iter().enumerate() {
        let n = i + 1;
        if c.maxprocs == 0 || c.maxprocs > SPAWN_MAX_PROCS {
            return Err(format!(
                "command {n} asks for {} processes (1..={SPAWN_MAX_PROCS})",
                c.maxprocs
            ));
        }
        if c.exe.is_empty() {
            return Err(format!("command {n} has no program"));
        }
        check_line_value(&format!("the program of command {n}"), &c.exe)?;
        if c.args.len() > SPAWN_MAX_ARGS {
            return Err(format!(
                "command {n} has {} arguments and the limit is {SPAWN_MAX_ARGS}",
                c.args.len()
            ));
        }
        if c.info.len() > SPAWN_MAX_PAIRS {
            return Err(format!(
                "command {n} has {} info pairs and the limit is {SPAWN_MAX_PAIRS}",
                c.info.len()
            ));
        }
        let mut lines: Vec<String> = vec![
            "mcmd=spawn".into(),
            format!("nprocs={}", c.maxprocs),
            format!("execname={}", c.exe),
            format!("totspawns={total}"),
            format!("spawnssofar={n}"),
        ];
        for (j, a) in c.args.iter().enumerate() {
            check_line_value(&format!("argument {} of command {n}", j + 1), a)?;
            lines.push(format!("arg{}={a}", j + 1));
        }
        lines.push(format!("argcnt={}", c.args.len()));
        lines.push(format!("preput_num={}", preput.len()));
        for (j, (k, v)) in preput.iter().enumerate() {
            lines.push(format!("preput_key_{j}={k}"));
            lines.push(format!("preput_val_{j}={v}"));
        }
        lines.push(format!("info_num={}", c.info.len()));
        for (j, (k, v)) in c.info.iter().enumerate() {
            if k.is_empty() {
                return Err(format!("info key {j} of command {n} is empty"));
            }
            check_line_value(&format!("info key {k:?} of command {n}"), k)?;
            check_line_value(&format!("info value of {k} in command {n}"), v)?;
            lines.push(format!("info_key_{j}={k}"));
            lines.push(format!("info_val_{j}={v}"));
        }
        lines.push("endcmd".into());
        for l in &lines {
            if l.len() > MAX_LINE {
                return Err(format!(
                    "a line of command {n} is {} bytes long and the limit is {MAX_LINE}",
                    l.len()
                ));
            }
            out.push_str(l);
            out.push('\n');
        }
    }
    Ok(out)
}

/// One received block: its `key=value` lines in order (the `mcmd=` line included), or why it cannot be
/// used; and its `totspawns` / `spawnssofar` counts, read even from a block that is refused, so the rest of
/// the request is still recognised as such.
pub(crate) struct Block {
    fields: Result<Vec<(String, String)>, String>,
    totspawns: Option<usize>,
    spawnssofar: Option<usize>,
}

/// Reads the lines of one `mcmd=` block. Feed every line after the first with [`BlockReader::line`] until
/// it returns `true` (the `endcmd` line was seen), then take the block with [`BlockReader::finish`].
pub(crate) struct BlockReader {
    fields: Vec<(String, String)>,
    lines: usize,
    bytes: usize,
    error: Option<String>,
    totspawns: Option<usize>,
    spawnssofar: Option<usize>,
}

impl BlockReader {
    /// Start a block with its first line (`mcmd=NAME`).
    pub(crate) fn start(first: &str) -> BlockReader {
        let mut b = BlockReader {
            fields: Vec::new(),
            lines: 0,
            bytes: 0,
            error: None,
            totspawns: None,
            spawnssofar: None,
        };
        let first = first.strip_suffix('\n').unwrap_or(first);
        b.add(first.strip_suffix('\r').unwrap_or(first));
        b
    }

    fn add(&mut self, line: &str) {
        self.lines += 1;
        self.bytes += line.len() + 1;
        let kv = line.split_once('=');
        if let Some((k @ ("totspawns" | "spawnssofar"), v)) = kv {
            let v = v.trim().parse().ok();
            if k == "totspawns" {
                self.totspawns = self.totspawns.or(v);
            } else {
                self.spawnssofar = self.spawnssofar.or(v);
            }
        }
        if self.error.is_some() {
            return;
        }
        if self.lines > BLOCK_MAX_LINES || self.bytes > BLOCK_MAX_BYTES {
            self.error = Some(format!(
                "the request is longer than {BLOCK_MAX_LINES} lines or {BLOCK_MAX_BYTES} bytes"
            ));
            self.fields = Vec::new();
            return;
        }
        match kv {
            Some(("", _)) | None => {
                let shown: String = line.chars().take(80).collect();
                self.error = Some(format!("the line {shown:?} is not of the form key=value"));
                self.fields = Vec::new();
            }
            Some((k, v)) => self.fields.push((k.to_owned(), v.to_owned())),
        }
    }

    /// Feed one received line (`Err`: too long or not UTF-8). Returns `true` at `endcmd`.
    pub(crate) fn line(&mut self, line: Result<String, String>) -> bool {
        match line {
            Err(why) => {
                self.lines += 1;
                if self.error.is_none() {
                    self.error = Some(why);
                    self.fields = Vec::new();
                }
                false
            }
            Ok(l) => {
                let l = l.strip_suffix('\n').unwrap_or(&l);
                let l = l.strip_suffix('\r').unwrap_or(l);
                if l == "endcmd" {
                    return true;
                }
                if !l.trim().is_empty() {
                    self.add(l);
                }
                false
            }
        }
    }

    /// The block read.
    pub(crate) fn finish(self) -> Block {
        Block {
            fields: match self.error {
                Some(e) => Err(e),
                None => Ok(self.fields),
            },
            totspawns: self.totspawns,
            spawnssofar: self.spawnssofar,
        }
    }
}

/// Collects the blocks of one spawn request (`totspawns` of them) on one connection.
#[derive(Default)]
pub(crate) struct Collector {
    pending: Option<Pending>,
}

struct Pending {
    total: usize,
    received: usize,
    blocks: Vec<Result<Vec<(String, String)>, String>>,
}

/// A complete, valid spawn request.
pub(crate) type Request = (Vec<SpawnCmd>, Vec<(String, String)>);

fn field<'a>(f: &'a [(String, String)], key: &str) -> Option<&'a str> {
    f.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn number(f: &[(String, String)], key: &str) -> Option<Result<usize, String>> {
    field(f, key).map(|v| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| format!("{key}={v} is not a non-negative integer"))
    })
}

impl Collector {
    /// Drop an unfinished request (the client sent something else before its last block).
    pub(crate) fn abandon(&mut self) -> bool {
        self.pending.take().is_some()
    }

    /// Add one received block. Returns `Some` once the request is complete (or cannot be completed):
    /// the request, or why it is refused. Every complete request gets exactly one answer.
    pub(crate) fn push(&mut self, block: Block) -> Option<Result<Request, String>> {
        let p = match &mut self.pending {
            Some(p) => p,
            None => match block.totspawns {
                Some(total) if total >= 1 => self.pending.insert(Pending {
                    total,
                    received: 0,
                    blocks: Vec::new(),
                }),
                // Without a usable count the end of the request is unknown: answer now.
                _ => {
                    return Some(Err(match block.fields {
                        Err(why) => why,
                        Ok(_) => "the request has no valid totspawns= (a positive integer)".into(),
                    }))
                }
            },
        };
        p.received += 1;
        if p.blocks.len() < SPAWN_MAX_CMDS {
            p.blocks.push(block.fields);
        }
        if p.received < p.total && block.spawnssofar != Some(p.total) {
            return None;
        }
        let p = self.pending.take()?;
        Some(validate(p))
    }
}

fn validate(p: Pending) -> Result<Request, String> {
    if p.total > SPAWN_MAX_CMDS {
        return Err(format!(
            "totspawns={} is more than the limit of {SPAWN_MAX_CMDS} commands",
            p.total
        ));
    }
    if p.received != p.total {
        return Err(format!(
            "the request ended after {} of its totspawns={} commands",
            p.received, p.total
        ));
    }
    let mut cmds = Vec::with_capacity(p.total);
    let mut preput: Vec<(String, String)> = Vec::new();
    let mut procs: usize = 0;
    for (i, b) in p.blocks.into_iter().enumerate() {
        let n = i + 1;
        let f = b.map_err(|why| format!("command {n}: {why}"))?;
        let (cmd, pre) =
            validate_block(&f, n, p.total).map_err(|why| format!("command {n}: {why}"))?;
        procs = procs
            .checked_add(cmd.maxprocs)
            .filter(|&t| t <= SPAWN_MAX_PROCS)
            .ok_or_else(|| format!("more than {SPAWN_MAX_PROCS} processes were asked for"))?;
        for (k, v) in pre {
            match preput.iter().find(|(pk, _)| *pk == k) {
                Some((_, pv)) if *pv != v => {
                    return Err(format!(
                    "command {n}: preput key {k} has a value different from an earlier command's"
                ))
                }
                Some(_) => {}
                None => preput.push((k, v)),
            }
        }
        cmds.push(cmd);
    }
    Ok((cmds, preput))
}

/// Numbered keys `prefix<j>` must be exactly those with `lo <= j < lo + count`.
fn check_numbered(
    f: &[(String, String)],
    prefix: &str,
    lo: usize,
    count: usize,
    count_key: &str,
) -> Result<(), String> {
    for (k, _) in f {
        let Some(rest) = k.strip_prefix(prefix) else {
            continue;
        };
        let Ok(j) = rest.parse::<usize>() else {
            continue;
        };
        if rest.starts_with('+') || j < lo || j >= lo + count {
            return Err(format!("{k}= was given but {count_key}={count}"));
        }
    }
    Ok(())
}

fn validate_block(
    f: &[(String, String)],
    n: usize,
    total: usize,
) -> Result<(SpawnCmd, Vec<(String, String)>), String> {
    let mut seen: HashMap<&str, ()> = HashMap::with_capacity(f.len());
    for (k, _) in f {
        if seen.insert(k.as_str(), ()).is_some() {
            return Err(format!("{k}= is given twice"));
        }
    }
    match field(f, "mcmd") {
        Some("spawn") => {}
        Some(other) => return Err(format!("mcmd={other} is not a spawn request")),
        None => return Err("mcmd= is missing".into()),
    }
    let need = |key: &str| -> Result<usize, String> {
        number(f, key).unwrap_or_else(|| Err(format!("{key}= is missing")))
    };
    let t = need("totspawns")?;
    if t != total {
        return Err(format!(
            "totspawns={t} differs from the first command's {total}"
        ));
    }
    let s = need("spawnssofar")?;
    if s != n {
        return Err(format!("spawnssofar={s} where {n} was expected"));
    }
    let nprocs = need("nprocs")?;
    if nprocs == 0 || nprocs > SPAWN_MAX_PROCS {
        return Err(format!(
            "nprocs={nprocs} is not within 1..={SPAWN_MAX_PROCS}"
        ));
    }
    let exe = field(f, "execname").unwrap_or("");
    if exe.is_empty() {
        return Err("execname= is missing or empty".into());
    }
    let argcnt = need("argcnt")?;
    if argcnt > SPAWN_MAX_ARGS {
        return Err(format!(
            "argcnt={argcnt} is more than the limit of {SPAWN_MAX_ARGS}"
        ));
    }
    check_numbered(f, "arg", 1, argcnt, "argcnt")?;
    let args = (1..=argcnt)
        .map(|j| {
            field(f, &format!("arg{j}"))
                .map(str::to_owned)
                .ok_or_else(|| format!("argcnt={argcnt} but arg{j}= is missing"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pairs = |num_key: &str, key: &str, val: &str| -> Result<Vec<(String, String)>, String> {
        let num = number(f, num_key).unwrap_or(Ok(0))?;
        if num > SPAWN_MAX_PAIRS {
            return Err(format!(
                "{num_key}={num} is more than the limit of {SPAWN_MAX_PAIRS}"
            ));
        }
        check_numbered(f, key, 0, num, num_key)?;
        check_numbered(f, val, 0, num, num_key)?;
        (0..num)
            .map(|j| {
                let k = field(f, &format!("{key}{j}"));
                let v = field(f, &format!("{val}{j}"));
                match (k, v) {
                    (Some(k), Some(v)) => Ok((k.to_owned(), v.to_owned())),
                    _ => Err(format!(
                        "{num_key}={num} but {key}{j}= or {val}{j}= is missing"
                    )),
                }
            })
            .collect()
    };
    let preput = pairs("preput_num", "preput_key_", "preput_val_")?;
    for (k, v) in &preput {
        check_token(k, KEYLEN_MAX, false).map_err(|why| format!("preput key {k:?}: {why}"))?;
        check_token(v, VALLEN_MAX, true).map_err(|why| format!("preput value of {k}: {why}"))?;
    }
    let info = pairs("info_num", "info_key_", "info_val_")?;
    if let Some((_, _)) = info.iter().find(|(k, _)| k.trim().is_empty()) {
        return Err("an info key is empty".into());
    }
    Ok((
        SpawnCmd {
            exe: exe.to_owned(),
            args,
            maxprocs: nprocs,
            info,
        },
        preput,
    ))
}

/// What the launcher answers to a spawn request: `Ok(())` once the processes have started, or why they
/// could not be (sent to the rank as `msg=`).
pub type SpawnResult = Result<(), String>;

/// The launcher's way back to the rank that sent a spawn request ([`PmiEvent::Spawn`]). The rank's
/// connection handler waits until [`send`](Self::send) is called; if every clone of the `SpawnReply` is
/// dropped unanswered, or the job's key-value space is shut down, the rank gets an error instead.
///
/// Clones share one answer: the first `send` counts. Two `SpawnReply`s are equal when they are clones of
/// one another.
///
/// [`PmiEvent::Spawn`]: crate::PmiEvent::Spawn
#[derive(Clone)]
pub struct SpawnReply(Arc<Mutex<Option<mpsc::Sender<SpawnResult>>>>);

impl SpawnReply {
    /// A reply channel: the `SpawnReply` for the launcher and the receiver the connection handler waits on.
    pub fn channel() -> (SpawnReply, mpsc::Receiver<SpawnResult>) {
        let (tx, rx) = mpsc::channel();
        (SpawnReply(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// Answer the request. Returns `false` if it was already answered or the rank's handler has gone.
    pub fn send(&self, result: SpawnResult) -> bool {
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        tx.is_some_and(|tx| tx.send(result).is_ok())
    }

    /// True once [`send`](Self::send) has been called.
    pub fn answered(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }
}

impl std::fmt::Debug for SpawnReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnReply")
            .field("answered", &self.answered())
            .finish()
    }
}

impl PartialEq for SpawnReply {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SpawnReply {}
