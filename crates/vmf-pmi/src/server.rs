//! The launcher side: a job-wide key-value space with a reusable barrier ([`JobKvs`]) and a handler that
//! serves one rank's connection ([`serve_connection`]).
use crate::client::read_raw_line;
use crate::error::PmiError;
use crate::spawn::{BlockReader, Collector, SpawnCmd, SpawnReply};
use crate::wire::{check_token, sanitize, sanitize_text, Message};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Longest key name reported by `get_maxes`.
pub const KVSNAME_MAX: usize = 256;
/// Longest key reported by `get_maxes`.
pub const KEYLEN_MAX: usize = 256;
/// Longest value reported by `get_maxes`.
pub const VALLEN_MAX: usize = 4096;

/// What a connection handler tells the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PmiEvent {
    /// The rank sent `cmd=init`.
    Initialized {
        /// The rank.
        rank: usize,
    },
    /// The rank sent `cmd=finalize`.
    Finalized {
        /// The rank.
        rank: usize,
    },
    /// The rank sent `cmd=abort`: the launcher should kill the job and exit with `code`.
    Abort {
        /// The rank.
        rank: usize,
        /// The requested exit code.
        code: i32,
        /// Optional text the client sent (`message=` or `msg=`; MPICH's clients send none).
        message: Option<String>,
    },
    /// The rank's connection ended after `init` and before `finalize` (the rank died or misbehaved). Sent
    /// only for ranks that initialised PMI; a program that never speaks PMI closing its end is not an event.
    Disconnected {
        /// The rank.
        rank: usize,
    },
    /// The rank asked for a new job (`mcmd=spawn`, MPI_Comm_spawn / MPI_Comm_spawn_multiple): start
    /// `sum(maxprocs)` processes as one new job, with `preput` in its key-value space before they start
    /// (processes of command `i` have application number `i`), then answer through `reply`. The rank's
    /// connection handler waits for the answer and sends it as `cmd=spawn_result rc=0` (or `rc=-1 msg=..`).
    /// The request has been validated (at least one command, every `maxprocs >= 1`, arguments and
    /// key-value pairs complete, preputs valid key-value-space entries).
    Spawn {
        /// The rank.
        rank: usize,
        /// The commands, in order.
        cmds: Vec<SpawnCmd>,
        /// Key-value pairs for the new job's key-value space (MPICH: `PARENT_ROOT_PORT_NAME`).
        preput: Vec<(String, String)>,
        /// Where to answer.
        reply: SpawnReply,
    },
}

/// How often a handler waiting for the launcher's answer to a spawn request checks for shutdown.
const SPAWN_POLL: Duration = Duration::from_millis(100);

struct KvsInner {
    map: HashMap<String, String>,
    arrived: usize,
    generation: u64,
    closed: Vec<bool>,
    failure: Option<String>,
}

/// The key-value space and barrier of one job, shared by the handlers of all its ranks.
///
/// The barrier is reusable for any number of fences (generation counting). It never waits forever for a
/// rank that can no longer arrive: once any rank's connection has closed ([`JobKvs::rank_closed`]) or the
/// job is shut down ([`JobKvs::shutdown`]), every waiting and later barrier fails instead.
pub struct JobKvs {
    kvsname: String,
    size: usize,
    universe: usize,
    appnums: Vec<i64>,
    inner: Mutex<KvsInner>,
    cv: Condvar,
}

/// The name used in the brief for the shared store; the same type as [`JobKvs`].
pub type KvsStore = JobKvs;

impl std::fmt::Debug for JobKvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobKvs")
            .field("kvsname", &self.kvsname)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl JobKvs {
    /// A store for a job of `size` ranks whose key-value space is called `kvsname`. Its universe size is
    /// `size` and every rank's application number 0 until set with [`with_universe_size`] and
    /// [`with_appnums`].
    ///
    /// [`with_universe_size`]: Self::with_universe_size
    /// [`with_appnums`]: Self::with_appnums
    pub fn new(kvsname: &str, size: usize) -> JobKvs {
        JobKvs {
            kvsname: kvsname.to_owned(),
            size,
            universe: size,
            appnums: Vec::new(),
            inner: Mutex::new(KvsInner {
                map: HashMap::new(),
                arrived: 0,
                generation: 0,
                closed: vec![false; size],
                failure: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, KvsInner> {
        // A handler that panicked cannot leave the map inconsistent (single inserts); keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Builder: the universe size `get_universe_size` answers (how many processes the launcher could run;
    /// 0: not known, answered as -1 the way Hydra does without `-usize`).
    pub fn with_universe_size(mut self, universe: usize) -> JobKvs {
        self.universe = universe;
        self
    }

    /// Builder: the application number of each rank (`get_appnum`); ranks beyond the list have 0. The ranks
    /// started for command `i` of a spawn request have application number `i`.
    pub fn with_appnums(mut self, appnums: Vec<i64>) -> JobKvs {
        self.appnums = appnums;
        self
    }

    /// The universe size.
    pub fn universe_size(&self) -> usize {
        self.universe
    }

    /// The application number of `rank`.
    pub fn appnum(&self, rank: usize) -> i64 {
        self.appnums.get(rank).copied().unwrap_or(0)
    }

    /// True once [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.lock().failure.is_some()
    }

    /// The key-value space name.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Store `key=value` (a later put of the same key replaces the value).
    pub fn put(&self, key: &str, value: &str) {
        self.lock().map.insert(key.to_owned(), value.to_owned());
    }

    /// The value of `key`, if put.
    pub fn get(&self, key: &str) -> Option<String> {
        self.lock().map.get(key).cloned()
    }

    /// Enter the barrier as one rank; returns when all `size` ranks have entered, or `Err(why)` when the
    /// barrier can no longer complete (a rank left, or the job is shutting down).
    pub fn barrier(&self) -> Result<(), String> {
        let mut g = self.lock();
        if let Some(why) = Self::broken(&g) {
            return Err(why);
        }
        let gen = g.generation;
        g.arrived += 1;
        if g.arrived >= self.size {
            g.arrived = 0;
            g.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        loop {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
            if g.generation != gen {
                return Ok(());
            }
            if let Some(why) = Self::broken(&g) {
                g.arrived = g.arrived.saturating_sub(1);
                return Err(why);
            }
        }
    }

    fn broken(g: &KvsInner) -> Option<String> {
        if let Some(f) = &g.failure {
            return Some(f.clone());
        }
        g.closed
            .iter()
            .position(|&c| c)
            .map(|r| format!("rank {r} left the job before the fence"))
    }

    /// Record that `rank`'s connection ended: it can never enter a barrier again, so current and future
    /// barriers fail rather than wait forever.
    pub fn rank_closed(&self, rank: usize) {
        let mut g = self.lock();
        if let Some(c) = g.closed.get_mut(rank) {
            *c = true;
        }
        self.cv.notify_all();
    }

    /// Fail every current and future barrier with `why` (used when the launcher stops the job).
    pub fn shutdown(&self, why: &str) {
        let mut g = self.lock();
        if g.failure.is_none() {
            g.failure = Some(why.to_owned());
        }
        self.cv.notify_all();
    }
}

/// Serve one rank's PMI-1 connection until it closes (or the rank aborts). Answers `init` (version 1 only),
/// `get_maxes` ([`KVSNAME_MAX`], [`KEYLEN_MAX`], [`VALLEN_MAX`]), `get_appnum` ([`JobKvs::appnum`]),
/// `get_my_kvsname`, `put`, `get` (`rc=-1 msg=key_not_found` when missing), `barrier_in`,
/// `get_universe_size` ([`JobKvs::universe_size`]), `finalize` and, for PMI_PORT-style clients, `initack`.
/// `abort` is reported as [`PmiEvent::Abort`] and ends the connection. Malformed lines and unknown commands
/// are answered with `rc=-1` and serving continues.
///
/// Spawn requests (the multi-line `mcmd=spawn` ... `endcmd` blocks, see [`SpawnCmd`]) are collected until
/// all `totspawns` blocks have arrived, validated (a bad request gets `cmd=spawn_result rc=-1 msg=..`) and
/// reported as [`PmiEvent::Spawn`]; the handler then waits for the launcher's answer and sends
/// `cmd=spawn_result rc=0` or `rc=-1 msg=..`. If the launcher drops the event unanswered, or the job is
/// shut down while it waits, the rank gets an error answer.
///
/// Always calls [`JobKvs::rank_closed`] before returning, and reports [`PmiEvent::Disconnected`] if the
/// rank initialised but neither finalized nor aborted. Returns `Ok(())` at a clean end of stream (or after
/// abort), `Err` on an I/O error (already reported as `Disconnected` when applicable).
pub fn serve_connection<S, F>(
    stream: S,
    rank: usize,
    kvs: Arc<JobKvs>,
    mut events: F,
) -> Result<(), PmiError>
where
    S: Read + Write,
    F: FnMut(PmiEvent),
{
    let mut st = ConnState {
        initialized: false,
        finalized: false,
        aborted: false,
        spawn: Collector::default(),
    };
    let res = serve_loop(stream, rank, &kvs, &mut events, &mut st);
    kvs.rank_closed(rank);
    if st.initialized && !st.finalized && !st.aborted {
        events(PmiEvent::Disconnected { rank });
    }
    res
}

struct ConnState {
    initialized: bool,
    finalized: bool,
    aborted: bool,
    /// The blocks of a spawn request received so far.
    spawn: Collector,
}

fn serve_loop<S: Read + Write, F: FnMut(PmiEvent)>(
    stream: S,
    rank: usize,
    kvs: &JobKvs,
    events: &mut F,
    st: &mut ConnState,
) -> Result<(), PmiError> {
    let op = format!("serve the PMI connection of rank {rank}");
    let mut r = BufReader::new(stream);
    let io = |e| PmiError::Io {
        op: op.clone(),
        source: e,
    };
    loop {
        let line = match read_raw_line(&mut r).map_err(io)? {
            None => return Ok(()),
            Some(l) => l,
        };
        let replies = if let Some(first) = line.as_ref().ok().filter(|l| l.starts_with("mcmd=")) {
            let name = first.trim_end().trim_start_matches("mcmd=").to_owned();
            let mut block = BlockReader::start(first);
            loop {
                match read_raw_line(&mut r).map_err(io)? {
                    None => return Ok(()), // the rank went away in the middle of its request
                    Some(l) => {
                        if block.line(l) {
                            break;
                        }
                    }
                }
            }
            if name != "spawn" {
                vec![Message::new("error").with("rc", -1).with(
                    "msg",
                    sanitize_text(&format!("unknown multi-line command mcmd={name}")),
                )]
            } else {
                match st.spawn.push(block.finish()) {
                    None => Vec::new(), // more blocks to come
                    Some(Err(why)) => vec![spawn_failed(&why)],
                    Some(Ok((cmds, preput))) => {
                        vec![request_spawn(rank, cmds, preput, kvs, events)]
                    }
                }
            }
        } else {
            let mut v = Vec::new();
            if st.spawn.abandon() {
                // The answer the client's unfinished request is owed, before this command's.
                v.push(spawn_failed(
                    "the spawn request was interrupted by another command before its last block",
                ));
            }
            match line.and_then(|l| Message::parse(&l)) {
                Err(why) => v.push(
                    Message::new("error")
                        .with("rc", -1)
                        .with("msg", sanitize(&format!("malformed_line:_{why}"))),
                ),
                Ok(m) => v.extend(answer(&m, rank, kvs, events, st)),
            }
            v
        };
        if !replies.is_empty() {
            let text: String = replies.iter().map(Message::to_line).collect();
            let w = r.get_mut();
            w.write_all(text.as_bytes())
                .and_then(|_| w.flush())
                .map_err(io)?;
        }
        if st.aborted {
            return Ok(());
        }
    }
}

fn spawn_failed(why: &str) -> Message {
    Message::new("spawn_result")
        .with("rc", -1)
        .with("msg", sanitize_text(why))
}

/// Hand a valid spawn request to the launcher and wait for its answer.
fn request_spawn<F: FnMut(PmiEvent)>(
    rank: usize,
    cmds: Vec<SpawnCmd>,
    preput: Vec<(String, String)>,
    kvs: &JobKvs,
    events: &mut F,
) -> Message {
    let (reply, rx) = SpawnReply::channel();
    events(PmiEvent::Spawn {
        rank,
        cmds,
        preput,
        reply,
    });
    let res = loop {
        match rx.recv_timeout(SPAWN_POLL) {
            Ok(r) => break r,
            Err(RecvTimeoutError::Timeout) => {
                if kvs.is_shut_down() {
                    break Err("the job is ending".into());
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                break Err(
                    "the launcher does not start processes (spawn is not supported here)".into(),
                )
            }
        }
    };
    match res {
        Ok(()) => Message::new("spawn_result").with("rc", 0),
        Err(why) => spawn_failed(&why),
    }
}

fn answer<F: FnMut(PmiEvent)>(
    m: &Message,
    rank: usize,
    kvs: &JobKvs,
    events: &mut F,
    st: &mut ConnState,
) -> Vec<Message> {
    answer_one(m, rank, kvs, events, st).map_or_else(Vec::new, |first| {
        let mut v = vec![first];
        if m.cmd == "initack" {
            // PMI_PORT/PMI_ID-style clients learn size and rank here (the launcher itself uses PMI_FD).
            v.push(Message::new("set").with("size", kvs.size()));
            v.push(Message::new("set").with("rank", rank));
            v.push(Message::new("set").with("debug", 0));
        }
        v
    })
}

fn answer_one<F: FnMut(PmiEvent)>(
    m: &Message,
    rank: usize,
    kvs: &JobKvs,
    events: &mut F,
    st: &mut ConnState,
) -> Option<Message> {
    let fail =
        |cmd: &str, msg: &str| Some(Message::new(cmd).with("rc", -1).with("msg", sanitize(msg)));
    let kvs_ok = |m: &Message| m.get("kvsname").is_none_or(|k| k == kvs.kvsname());
    match m.cmd.as_str() {
        "init" => {
            let v = m.get("pmi_version").unwrap_or("");
            if v != "1" {
                return Some(
                    Message::new("response_to_init")
                        .with("pmi_version", 1)
                        .with("pmi_subversion", 1)
                        .with("rc", -1)
                        .with("msg", sanitize(&format!("unsupported_pmi_version_{v}"))),
                );
            }
            if !st.initialized {
                st.initialized = true;
                events(PmiEvent::Initialized { rank });
            }
            Some(
                Message::new("response_to_init")
                    .with("pmi_version", 1)
                    .with("pmi_subversion", 1)
                    .with("rc", 0),
            )
        }
        "initack" => Some(Message::new("initack").with("rc", 0)),
        "get_maxes" => Some(
            Message::new("maxes")
                .with("rc", 0)
                .with("kvsname_max", KVSNAME_MAX)
                .with("keylen_max", KEYLEN_MAX)
                .with("vallen_max", VALLEN_MAX),
        ),
        "get_appnum" => Some(
            Message::new("appnum")
                .with("rc", 0)
                .with("appnum", kvs.appnum(rank)),
        ),
        "get_my_kvsname" => Some(
            Message::new("my_kvsname")
                .with("rc", 0)
                .with("kvsname", kvs.kvsname()),
        ),
        "get_universe_size" => Some(
            Message::new("universe_size")
                .with("rc", 0)
                // 0: not known, which PMI (as Hydra) says with -1.
                .with("size", match kvs.universe_size() {
                    0 => -1,
                    u => u as i64,
                }),
        ),
        "put" => {
            let (Some(k), Some(v)) = (m.get("key"), m.get("value")) else {
                return fail("put_result", "put needs key= and value=");
            };
            if !kvs_ok(m) {
                return fail("put_result", "unknown_kvsname");
            }
            if let Err(why) =
                check_token(k, KEYLEN_MAX, false).and_then(|_| check_token(v, VALLEN_MAX, true))
            {
                return fail("put_result", &format!("invalid_key_or_value:_{why}"));
            }
            kvs.put(k, v);
            Some(
                Message::new("put_result")
                    .with("rc", 0)
                    .with("msg", "success"),
            )
        }
        "get" => {
            let Some(k) = m.get("key") else {
                return fail("get_result", "get needs key=");
            };
            if !kvs_ok(m) {
                return fail("get_result", "unknown_kvsname");
            }
            match kvs.get(k) {
                Some(v) => Some(
                    Message::new("get_result")
                        .with("rc", 0)
                        .with("msg", "success")
                        .with("value", v),
                ),
                None => fail("get_result", "key_not_found"),
            }
        }
        // vmfabric's extension (our launcher only): the values of `count` keys `<prefix><from>`,
        // `<prefix><from+1>`, ... in one answer, `|`-separated. A job's start-up reads every rank's
        // address card: one `get` each made start-up quadratic in round trips (1024 ranks: 47 s).
        "vmf_getrange" => {
            let (Some(prefix), Some(from), Some(count)) = (
                m.get("prefix"),
                m.get("from").and_then(|v| v.parse::<usize>().ok()),
                m.get("count").and_then(|v| v.parse::<usize>().ok()),
            ) else {
                return fail("vmf_getrange_result", "vmf_getrange needs prefix=, from= and count=");
            };
            if !kvs_ok(m) {
                return fail("vmf_getrange_result", "unknown_kvsname");
            }
            if count > 4096 {
                return fail("vmf_getrange_result", "count_too_large");
            }
            let mut vals = Vec::with_capacity(count);
            let mut len = 0;
            for k in from..from.saturating_add(count) {
                match kvs.get(&format!("{prefix}{k}")) {
                    Some(v) if !v.contains('|') => {
                        len += v.len() + 1;
                        vals.push(v);
                    }
                    Some(_) => return fail("vmf_getrange_result", "value_contains_separator"),
                    None => return fail("vmf_getrange_result", "key_not_found"),
                }
            }
            if len > crate::wire::MAX_LINE - 256 {
                return fail("vmf_getrange_result", "answer_too_long");
            }
            Some(
                Message::new("vmf_getrange_result")
                    .with("rc", 0)
                    .with("values", vals.join("|")),
            )
        }
        "barrier_in" => match kvs.barrier() {
            Ok(()) => Some(Message::new("barrier_out").with("rc", 0)),
            Err(why) => fail("barrier_out", &why),
        },
        "finalize" => {
            st.finalized = true;
            events(PmiEvent::Finalized { rank });
            Some(Message::new("finalize_ack").with("rc", 0))
        }
        "abort" => {
            let code = m
                .get("exitcode")
                .and_then(|c| c.trim().parse::<i32>().ok())
                .unwrap_or(1);
            let message = m.get("message").or_else(|| m.get("msg")).map(str::to_owned);
            st.aborted = true;
            events(PmiEvent::Abort {
                rank,
                code,
                message,
            });
            None
        }
        other => fail("error", &format!("unknown_command_{other}")),
    }
}
