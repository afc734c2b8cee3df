//! The rank side: [`PmiClient`].
use crate::error::PmiError;
use crate::spawn::{encode_request, SpawnCmd};
use crate::wire::{check_token, Message, MAX_LINE, V2_LEN_FIELD};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a process has taken its PMI_FD / PMI_PORT connection, so a second `from_env` cannot adopt the
/// same descriptor twice.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Read one line of at most [`MAX_LINE`] bytes. `Ok(None)` at end of stream; `Ok(Some(Err(why)))` for a line
/// that is too long or not UTF-8 (the rest of an over-long line is skipped).
pub(crate) fn read_raw_line<R: BufRead>(
    r: &mut R,
) -> std::io::Result<Option<Result<String, String>>> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64 + 2)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
        let mut sink = Vec::new();
        loop {
            sink.clear();
            let m = r.by_ref().take(1 << 16).read_until(b'\n', &mut sink)?;
            if m == 0 || sink.last() == Some(&b'\n') {
                break;
            }
        }
        return Ok(Some(Err(format!(
            "the line is longer than {MAX_LINE} bytes"
        ))));
    }
    Ok(Some(
        String::from_utf8(buf).map_err(|_| "the line is not UTF-8".to_string()),
    ))
}

/// A rank's connection to its PMI server: our launcher or MPICH's Hydra `pmi_proxy` (PMI-1), or a PMI-2
/// server — Slurm's `srun --mpi=pmi2`, or Hydra again.
///
/// Created by [`PmiClient::from_env`] (the normal way), or from an already connected stream. The handshake
/// is done on creation: PMI-1 `init`, `get_maxes`, `get_appnum`, `get_my_kvsname`; PMI-2 `fullinit`,
/// `job-getid`. The methods are the same for both wire protocols: each sends its protocol's command.
///
/// Keys and values may not contain whitespace, `=` or newlines (the wire format is space-separated
/// `key=value` words); [`put`](Self::put) and [`get`](Self::get) return
/// [`PmiError::InvalidArgument`] for such strings. Encode binary data (e.g. as hex) before putting it.
pub struct PmiClient {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: Box<dyn Write + Send>,
    rank: usize,
    size: usize,
    appnum: i64,
    kvsname: String,
    kvsname_max: usize,
    keylen_max: usize,
    vallen_max: usize,
    spawned: bool,
    finalized: bool,
    /// The PMI-2 wire protocol (length-prefixed `cmd=...;` frames) instead of PMI-1 lines.
    v2: bool,
}

/// PMI-2's limits (MPICH's `PMI2_MAX_KEYLEN` / `PMI2_MAX_VALLEN`, which Slurm's server shares).
const V2_KEYLEN_MAX: usize = 64;
const V2_VALLEN_MAX: usize = 1024;

/// Which wire protocol to speak: `VMF_PMI_VERSION` (1 or 2) when set, else PMI-2 under Slurm's
/// `srun --mpi=pmi2` (it sets `SLURM_MPI_TYPE=pmi2`), PMI-1 otherwise (our launcher, Hydra).
fn wants_v2() -> Result<bool, PmiError> {
    match std::env::var("VMF_PMI_VERSION") {
        Ok(v) => match v.trim() {
            "1" => Ok(false),
            "2" => Ok(true),
            _ => Err(PmiError::Environment {
                op: "initialise PMI".into(),
                why: format!("VMF_PMI_VERSION={v:?}: use 1 or 2"),
            }),
        },
        Err(_) => Ok(std::env::var("SLURM_MPI_TYPE").is_ok_and(|t| t.trim() == "pmi2")),
    }
}

impl std::fmt::Debug for PmiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmiClient")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("appnum", &self.appnum)
            .field("kvsname", &self.kvsname)
            .field("vallen_max", &self.vallen_max)
            .field("spawned", &self.spawned)
            .finish_non_exhaustive()
    }
}

fn env_usize(name: &str) -> Result<Option<usize>, PmiError> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| PmiError::Environment {
                op: "initialise PMI".into(),
                why: format!("{name}={v:?} is not a non-negative integer"),
            }),
    }
}

impl PmiClient {
    /// Connect to the PMI server named by the environment, as MPICH's simple PMI does:
    /// `PMI_FD` (an inherited connected socket) is preferred, else `PMI_PORT` (`host:port`, TCP, followed by
    /// the `initack` exchange when `PMI_ID` is set). Rank and size come from `PMI_RANK` / `PMI_SIZE` when set,
    /// else from the `initack` exchange. Returns `Ok(None)` when neither variable is set (a singleton
    /// process not started by a launcher).
    ///
    /// Only the first successful call in a process adopts the connection; later calls fail.
    ///
    /// [`spawned`](Self::spawned) is read from `PMI_SPAWNED`, as MPICH's simple PMI does.
    pub fn from_env() -> Result<Option<PmiClient>, PmiError> {
        let op = "connect to the PMI server";
        let fd = std::env::var("PMI_FD")
            .ok()
            .filter(|s| !s.trim().is_empty());
        let port = std::env::var("PMI_PORT")
            .ok()
            .filter(|s| !s.trim().is_empty());
        if fd.is_none() && port.is_none() {
            return Ok(None);
        }
        let rank = env_usize("PMI_RANK")?;
        let size = env_usize("PMI_SIZE")?;
        let v2 = wants_v2()?;
        if TAKEN.swap(true, Ordering::AcqRel) {
            return Err(PmiError::Environment {
                op: op.into(),
                why: "this process has already taken its PMI connection (call from_env once)"
                    .into(),
            });
        }
        let res = if let Some(fd) = fd {
            let n: RawFd = fd.trim().parse().ok().filter(|&n| n >= 0).ok_or_else(|| {
                PmiError::Environment {
                    op: op.into(),
                    why: format!("PMI_FD={fd:?} is not a file descriptor number"),
                }
            })?;
            // SAFETY: F_GETFD only inspects the descriptor table.
            let flags = unsafe { libc::fcntl(n, libc::F_GETFD) };
            if flags < 0 {
                TAKEN.store(false, Ordering::Release);
                return Err(PmiError::Environment {
                    op: op.into(),
                    why: format!("PMI_FD={n} is not an open file descriptor in this process"),
                });
            }
            // Keep the connection out of programs this rank starts.
            // SAFETY: plain fcntl on a descriptor we checked is open.
            unsafe { libc::fcntl(n, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
            // SAFETY: the launcher handed this descriptor to us alone (PMI_FD contract); TAKEN ensures we
            // adopt it once.
            let s = unsafe { UnixStream::from_raw_fd(n) };
            if v2 {
                let Some(rank) = rank else {
                    return Err(PmiError::Environment {
                        op: "initialise PMI-2".into(),
                        why: "PMI_FD is set but PMI_RANK is not".into(),
                    });
                };
                Self::from_stream_v2(s, rank)
            } else {
                let (rank, size) = match (rank, size) {
                    (Some(r), Some(s)) => (r, s),
                    _ => {
                        return Err(PmiError::Environment {
                            op: "initialise PMI".into(),
                            why: "PMI_FD is set but PMI_RANK or PMI_SIZE is not".into(),
                        })
                    }
                };
                Self::from_stream(s, rank, size)
            }
        } else {
            let addr = port.unwrap_or_default();
            let id = std::env::var("PMI_ID").ok();
            Self::connect_tcp(&addr, id.as_deref(), rank, size)
        };
        // MPICH's PMI_Init: atoi(getenv("PMI_SPAWNED")) != 0.
        let spawned = std::env::var("PMI_SPAWNED")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .is_some_and(|v| v != 0);
        res.map(|mut c| {
            c.spawned = spawned;
            Some(c)
        })
    }

    /// Handshake over an already connected Unix stream, for a rank whose rank and size are known.
    pub fn from_stream(
        stream: UnixStream,
        rank: usize,
        size: usize,
    ) -> Result<PmiClient, PmiError> {
        let w = stream.try_clone().map_err(|e| PmiError::Io {
            op: "connect to the PMI server".into(),
            source: e,
        })?;
        Self::handshake(Box::new(stream), Box::new(w), None, Some(rank), Some(size))
    }

    /// PMI-2 handshake (`fullinit`, `job-getid`) over an already connected Unix stream, as rank `rank`;
    /// the size comes from the server.
    pub fn from_stream_v2(stream: UnixStream, rank: usize) -> Result<PmiClient, PmiError> {
        let op = "connect to the PMI-2 server";
        let w = stream.try_clone().map_err(|e| PmiError::Io {
            op: op.into(),
            source: e,
        })?;
        let mut c = Self::unconnected(Box::new(stream), Box::new(w));
        // The first exchange is a PMI-1 line that names version 2 (so one server can serve both); every
        // later message is a PMI-2 frame.
        let op = "initialise PMI-2";
        let r = c.call(
            op,
            &Message::new("init")
                .with("pmi_version", 2)
                .with("pmi_subversion", 0),
            "response_to_init",
        )?;
        c.check_rc(op, &r)?;
        if r.get("pmi_version").is_some_and(|v| v != "2") {
            return Err(PmiError::Failed {
                op: op.into(),
                rc: 0,
                msg: format!(
                    "the server speaks PMI version {}, not 2 (set VMF_PMI_VERSION=1)",
                    r.get("pmi_version").unwrap_or("?")
                ),
            });
        }
        c.v2 = true;
        c.keylen_max = V2_KEYLEN_MAX;
        c.vallen_max = V2_VALLEN_MAX;
        c.kvsname_max = V2_VALLEN_MAX;
        // As MPICH's client: the job id the launcher gave (Slurm requires it), the rank, no threads.
        let mut m = Message::new("fullinit");
        if let Some(j) = std::env::var("PMI_JOBID").ok().filter(|j| !j.is_empty()) {
            if j.contains(';') || check_token(&j, V2_VALLEN_MAX, false).is_err() {
                return Err(PmiError::Environment {
                    op: op.into(),
                    why: format!("PMI_JOBID={j:?} cannot travel in a PMI-2 message"),
                });
            }
            m = m.with("pmijobid", j);
        }
        let m = m.with("pmirank", rank).with("threaded", "FALSE");
        let r = c.call(op, &m, "fullinit-response")?;
        c.check_rc(op, &r)?;
        c.rank = Self::num_field(op, &r, "rank")?;
        c.size = Self::num_field(op, &r, "size")?;
        if c.size == 0 || c.rank >= c.size || c.rank != rank {
            return Err(PmiError::Environment {
                op: op.into(),
                why: format!(
                    "the server calls this rank {} of {} (PMI_RANK is {rank})",
                    c.rank, c.size
                ),
            });
        }
        c.appnum = match r.get("appnum") {
            Some(_) => Self::num_field(op, &r, "appnum")?,
            None => 0,
        };
        c.spawned = r.get("spawner-jobid").is_some_and(|j| !j.is_empty());
        let op = "read the job id";
        let r = c.call(op, &Message::new("job-getid"), "job-getid-response")?;
        c.check_rc(op, &r)?;
        c.kvsname = r
            .get("jobid")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| PmiError::Malformed {
                op: op.into(),
                why: "jobid= is missing".into(),
                line: r.to_line(),
            })?
            .to_owned();
        Ok(c)
    }

    fn unconnected(r: Box<dyn Read + Send>, w: Box<dyn Write + Send>) -> PmiClient {
        PmiClient {
            reader: BufReader::new(r),
            writer: w,
            rank: 0,
            size: 0,
            appnum: 0,
            kvsname: String::new(),
            kvsname_max: 256,
            keylen_max: 256,
            vallen_max: 1024,
            spawned: false,
            finalized: false,
            v2: false,
        }
    }

    /// True when the connection speaks PMI-2.
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// Connect with TCP to `addr` (`host:port`, the form of Hydra's `PMI_PORT`). When `pmi_id` is given the
    /// `cmd=initack pmiid=<id>` exchange is done first and supplies rank and size unless given here.
    pub fn connect_tcp(
        addr: &str,
        pmi_id: Option<&str>,
        rank: Option<usize>,
        size: Option<usize>,
    ) -> Result<PmiClient, PmiError> {
        let op = format!("connect to the PMI server at {addr}");
        let s = TcpStream::connect(addr).map_err(|e| PmiError::Io {
            op: op.clone(),
            source: e,
        })?;
        let _ = s.set_nodelay(true);
        let w = s.try_clone().map_err(|e| PmiError::Io { op, source: e })?;
        Self::handshake(Box::new(s), Box::new(w), pmi_id, rank, size)
    }

    fn handshake(
        r: Box<dyn Read + Send>,
        w: Box<dyn Write + Send>,
        pmi_id: Option<&str>,
        mut rank: Option<usize>,
        mut size: Option<usize>,
    ) -> Result<PmiClient, PmiError> {
        let mut c = Self::unconnected(r, w);
        if let Some(id) = pmi_id {
            let op = "initialise PMI (initack)";
            check_token(id, 256, false).map_err(|why| PmiError::InvalidArgument {
                op: op.into(),
                why: format!("PMI_ID {id:?}: {why}"),
            })?;
            let r = c.call(op, &Message::new("initack").with("pmiid", id), "initack")?;
            c.check_rc(op, &r)?;
            for _ in 0..3 {
                let m = c.recv(op)?;
                if m.cmd != "set" {
                    return Err(PmiError::Unexpected {
                        op: op.into(),
                        expected: "set".into(),
                        got: m.cmd,
                    });
                }
                let num = |k: &str| -> Result<Option<usize>, PmiError> {
                    m.get(k)
                        .map(|v| {
                            v.parse().map_err(|_| PmiError::Malformed {
                                op: op.into(),
                                why: format!("{k}={v} is not a number"),
                                line: m.to_line(),
                            })
                        })
                        .transpose()
                };
                if let Some(v) = num("size")? {
                    size = size.or(Some(v));
                }
                if let Some(v) = num("rank")? {
                    rank = rank.or(Some(v));
                }
            }
        }
        let (Some(rank), Some(size)) = (rank, size) else {
            return Err(PmiError::Environment {
                op: "initialise PMI".into(),
                why: "the rank or the size of the job is unknown (set PMI_RANK and PMI_SIZE, or PMI_ID)".into(),
            });
        };
        if size == 0 || rank >= size {
            return Err(PmiError::Environment {
                op: "initialise PMI".into(),
                why: format!("rank {rank} is not within a job of size {size}"),
            });
        }
        c.rank = rank;
        c.size = size;

        let op = "initialise PMI";
        let r = c.call(
            op,
            &Message::new("init")
                .with("pmi_version", 1)
                .with("pmi_subversion", 1),
            "response_to_init",
        )?;
        c.check_rc(op, &r)?;
        if let Some(v) = r.get("pmi_version") {
            if v != "1" {
                return Err(PmiError::Failed {
                    op: op.into(),
                    rc: 0,
                    msg: format!("the server speaks PMI version {v}, not 1"),
                });
            }
        }

        let op = "read the PMI limits";
        let r = c.call(op, &Message::new("get_maxes"), "maxes")?;
        c.check_rc(op, &r)?;
        c.kvsname_max = Self::num_field(op, &r, "kvsname_max")?;
        c.keylen_max = Self::num_field(op, &r, "keylen_max")?;
        c.vallen_max = Self::num_field(op, &r, "vallen_max")?;

        let op = "read the application number";
        let r = c.call(op, &Message::new("get_appnum"), "appnum")?;
        c.check_rc(op, &r)?;
        c.appnum = Self::num_field(op, &r, "appnum")?;

        let op = "read the key-value space name";
        let r = c.call(op, &Message::new("get_my_kvsname"), "my_kvsname")?;
        c.check_rc(op, &r)?;
        c.kvsname = r
            .get("kvsname")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| PmiError::Malformed {
                op: op.into(),
                why: "kvsname= is missing".into(),
                line: r.to_line(),
            })?
            .to_owned();
        Ok(c)
    }

    fn num_field<T: std::str::FromStr>(op: &str, m: &Message, key: &str) -> Result<T, PmiError> {
        let v = m.get(key).ok_or_else(|| PmiError::Malformed {
            op: op.into(),
            why: format!("{key}= is missing"),
            line: m.to_line(),
        })?;
        v.trim().parse().map_err(|_| PmiError::Malformed {
            op: op.into(),
            why: format!("{key}={v} is not a number"),
            line: m.to_line(),
        })
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The application number (the server's `get_appnum` answer, read at the handshake): 0 for a
    /// single-program job, `i` for the processes of command `i` of a spawn request.
    pub fn appnum(&self) -> i64 {
        self.appnum
    }

    /// True when this process was started by a spawn request of another job (`PMI_SPAWNED` set to a
    /// nonzero number; set by [`from_env`](Self::from_env) only). Its parent's preputs, e.g.
    /// `PARENT_ROOT_PORT_NAME`, are in its key-value space from the start (no fence needed).
    pub fn spawned(&self) -> bool {
        self.spawned
    }

    /// Name of the job's key-value space.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// Longest value (bytes) the server accepts.
    pub fn vallen_max(&self) -> usize {
        self.vallen_max
    }

    /// Longest key (bytes) the server accepts.
    pub fn keylen_max(&self) -> usize {
        self.keylen_max
    }

    /// Publish `key=value` in the job's key-value space. Other ranks see it after the next
    /// [`fence`](Self::fence). Neither may contain whitespace, `=` or newlines.
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        let op = format!("put key {key}");
        self.live(&op)?;
        check_token(key, self.keylen_max, false).map_err(|why| PmiError::InvalidArgument {
            op: op.clone(),
            why: format!("the key is invalid: {why}"),
        })?;
        check_token(value, self.vallen_max, true).map_err(|why| PmiError::InvalidArgument {
            op: op.clone(),
            why: format!("the value is invalid: {why}"),
        })?;
        if self.v2 && (key.contains(';') || value.contains(';')) {
            return Err(PmiError::InvalidArgument {
                op,
                why: "a PMI-2 key or value cannot contain ';'".into(),
            });
        }
        let r = if self.v2 {
            let m = Message::new("kvs-put").with("key", key).with("value", value);
            self.call(&op, &m, "kvs-put-response")?
        } else {
            let m = Message::new("put")
                .with("kvsname", &self.kvsname)
                .with("key", key)
                .with("value", value);
            self.call(&op, &m, "put_result")?
        };
        self.check_rc(&op, &r)
    }

    /// Read the value of `key`. A key nobody has put (or not yet fenced) is [`PmiError::KeyNotFound`].
    pub fn get(&mut self, key: &str) -> Result<String, PmiError> {
        let op = format!("get key {key}");
        self.live(&op)?;
        check_token(key, self.keylen_max, false).map_err(|why| PmiError::InvalidArgument {
            op: op.clone(),
            why: format!("the key is invalid: {why}"),
        })?;
        let r = if self.v2 {
            let m = Message::new("kvs-get")
                .with("jobid", &self.kvsname)
                .with("srcid", -1)
                .with("key", key);
            self.call(&op, &m, "kvs-get-response")?
        } else {
            let m = Message::new("get")
                .with("kvsname", &self.kvsname)
                .with("key", key);
            self.call(&op, &m, "get_result")?
        };
        let rc = r.rc().map_err(|why| PmiError::Malformed {
            op: op.clone(),
            why,
            line: r.to_line(),
        })?;
        if rc != 0 || (self.v2 && r.get("found") != Some("TRUE")) {
            return Err(PmiError::KeyNotFound {
                key: key.to_owned(),
                msg: r.get("msg").unwrap_or("no message").to_owned(),
            });
        }
        r.get("value")
            .map(str::to_owned)
            .ok_or_else(|| PmiError::Malformed {
                op,
                why: "value= is missing".into(),
                line: r.to_line(),
            })
    }

    /// The values of keys `<prefix><from>` .. `<prefix><from+count-1>` in one round trip: vmfabric's own
    /// extension, which only our launcher's PMI server speaks (ask Hydra with [`PmiClient::get`]).
    pub fn get_range(
        &mut self,
        prefix: &str,
        from: usize,
        count: usize,
    ) -> Result<Vec<String>, PmiError> {
        let op = format!("get keys {prefix}{from}..{}", from + count);
        self.live(&op)?;
        if self.v2 {
            return Err(PmiError::Failed {
                op,
                rc: -1,
                msg: "a PMI-2 server has no range get (vmfabric's launcher's extension)".into(),
            });
        }
        let m = Message::new("vmf_getrange")
            .with("kvsname", &self.kvsname)
            .with("prefix", prefix)
            .with("from", from)
            .with("count", count);
        let r = self.call(&op, &m, "vmf_getrange_result")?;
        self.check_rc(&op, &r)?;
        let vals: Vec<String> = r
            .get("values")
            .unwrap_or("")
            .split('|')
            .map(str::to_owned)
            .collect();
        if vals.len() != count {
            return Err(PmiError::Malformed {
                op,
                why: format!("{} values for {count} keys", vals.len()),
                line: r.to_line(),
            });
        }
        Ok(vals)
    }

    /// Barrier over all ranks of the job (`barrier_in` / `barrier_out`); also makes every put done before it
    /// visible to every rank.
    pub fn fence(&mut self) -> Result<(), PmiError> {
        let op = "fence";
        self.live(op)?;
        let r = if self.v2 {
            self.call(op, &Message::new("kvs-fence"), "kvs-fence-response")?
        } else {
            self.call(op, &Message::new("barrier_in"), "barrier_out")?
        };
        self.check_rc(op, &r)
    }

    /// The universe size (how many processes the launcher could run).
    pub fn universe_size(&mut self) -> Result<Option<usize>, PmiError> {
        let op = "read the universe size";
        self.live(op)?;
        if self.v2 {
            let m = Message::new("info-getjobattr").with("key", "universeSize");
            let r = self.call(op, &m, "info-getjobattr-response")?;
            self.check_rc(op, &r)?;
            if r.get("found") != Some("TRUE") {
                return Ok(None);
            }
            let n: i64 = Self::num_field(op, &r, "value")?;
            return Ok((n > 0).then_some(n as usize));
        }
        let r = self.call(op, &Message::new("get_universe_size"), "universe_size")?;
        self.check_rc(op, &r)?;
        // Hydra (and vmfabric run without --universe-size) answer -1: not known.
        let n: i64 = Self::num_field(op, &r, "size")?;
        Ok((n > 0).then_some(n as usize))
    }

    /// Ask the launcher to start a new job (MPI_Comm_spawn_multiple): `sum(maxprocs)` processes running
    /// `cmds`, with the `preput` pairs in the new job's key-value space before they start (MPICH passes the
    /// root's port as `PARENT_ROOT_PORT_NAME`). Returns once the launcher has started them.
    ///
    /// Sends the multi-line request MPICH 4.0's simple PMI client sends (one `mcmd=spawn` ... `endcmd`
    /// block per command; see [`SpawnCmd`]), so it works with vmfabric's launcher and with Hydra, and reads
    /// the one `cmd=spawn_result` answer. Arguments, programs and info values may contain spaces and `=`
    /// but no line breaks; preput keys and values follow [`put`](Self::put)'s rules. A nonzero `rc` is
    /// [`PmiError::Failed`] with the server's `msg` (or `errmsg`).
    pub fn spawn(
        &mut self,
        cmds: &[SpawnCmd],
        preput: &[(String, String)],
    ) -> Result<(), PmiError> {
        let total: usize = cmds
            .iter()
            .map(|c| c.maxprocs)
            .fold(0, usize::saturating_add);
        let op = match cmds.first() {
            Some(c) if cmds.len() == 1 => format!("spawn {total} process(es) of {}", c.exe),
            _ => format!("spawn {total} process(es) of {} commands", cmds.len()),
        };
        self.live(&op)?;
        if self.v2 {
            return Err(PmiError::Failed {
                op,
                rc: -1,
                msg: "starting processes through a PMI-2 server (srun --mpi=pmi2) is not supported; \
                      launch with vmfabric run or mpiexec.mpich to use MPI_Comm_spawn"
                    .into(),
            });
        }
        let text =
            encode_request(cmds, preput, self.keylen_max, self.vallen_max).map_err(|why| {
                PmiError::InvalidArgument {
                    op: op.clone(),
                    why,
                }
            })?;
        self.writer
            .write_all(text.as_bytes())
            .and_then(|_| self.writer.flush())
            .map_err(|e| PmiError::Io {
                op: op.clone(),
                source: e,
            })?;
        let r = self.recv(&op)?;
        let rc = r.rc().map_err(|why| PmiError::Malformed {
            op: op.clone(),
            why,
            line: r.to_line(),
        })?;
        let msg = || {
            r.get("msg")
                .or_else(|| r.get("errmsg"))
                .unwrap_or("no message")
                .to_owned()
        };
        if r.cmd != "spawn_result" {
            if rc != 0 {
                return Err(PmiError::Failed { op, rc, msg: msg() });
            }
            return Err(PmiError::Unexpected {
                op,
                expected: "spawn_result".into(),
                got: r.cmd,
            });
        }
        if rc != 0 {
            return Err(PmiError::Failed { op, rc, msg: msg() });
        }
        Ok(())
    }

    /// Ask the launcher to kill the whole job and exit with `code` (`cmd=abort exitcode=N`, as MPICH's
    /// simple PMI sends it). There is no answer; the caller should exit right after. A non-empty `msg` is
    /// printed to this process's stderr first (Hydra's wire format has no message field).
    pub fn abort(&mut self, code: i32, msg: &str) -> Result<(), PmiError> {
        if !msg.is_empty() {
            eprintln!(
                "vmfabric: rank {} aborting with code {code}: {msg}",
                self.rank
            );
        }
        let op = "abort the job";
        if self.v2 {
            // PMI-2's abort carries a message but no exit code (Slurm ends the step with the rank's own).
            let text = if msg.is_empty() { format!("exit code {code}") } else { msg.to_owned() };
            let m = Message::new("abort")
                .with("isworld", "TRUE")
                .with("msg", crate::wire::sanitize_text(&text));
            return self.send(op, &m);
        }
        self.send(op, &Message::new("abort").with("exitcode", code))
    }

    /// Leave PMI (`finalize` / `finalize_ack`). Afterwards every call fails.
    pub fn finalize(&mut self) -> Result<(), PmiError> {
        let op = "finalize PMI";
        self.live(op)?;
        let r = if self.v2 {
            self.call(op, &Message::new("finalize"), "finalize-response")?
        } else {
            self.call(op, &Message::new("finalize"), "finalize_ack")?
        };
        self.check_rc(op, &r)?;
        self.finalized = true;
        Ok(())
    }

    fn live(&self, op: &str) -> Result<(), PmiError> {
        if self.finalized {
            return Err(PmiError::InvalidArgument {
                op: op.into(),
                why: "PMI has been finalized".into(),
            });
        }
        Ok(())
    }

    fn send(&mut self, op: &str, m: &Message) -> Result<(), PmiError> {
        let line = if self.v2 { m.to_v2() } else { m.to_line() };
        self.writer
            .write_all(line.as_bytes())
            .and_then(|_| self.writer.flush())
            .map_err(|e| PmiError::Io {
                op: op.into(),
                source: e,
            })
    }

    fn recv(&mut self, op: &str) -> Result<Message, PmiError> {
        if self.v2 {
            return self.recv_v2(op);
        }
        match read_raw_line(&mut self.reader) {
            Err(e) => Err(PmiError::Io {
                op: op.into(),
                source: e,
            }),
            Ok(None) => Err(PmiError::Eof { op: op.into() }),
            Ok(Some(Err(why))) => Err(PmiError::Malformed {
                op: op.into(),
                why,
                line: String::new(),
            }),
            Ok(Some(Ok(line))) => Message::parse(&line).map_err(|why| PmiError::Malformed {
                op: op.into(),
                why,
                line: line.trim_end().chars().take(200).collect(),
            }),
        }
    }

    /// One PMI-2 frame: the 6-byte length, then that many bytes.
    fn recv_v2(&mut self, op: &str) -> Result<Message, PmiError> {
        let io = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                PmiError::Eof { op: op.into() }
            } else {
                PmiError::Io {
                    op: op.into(),
                    source: e,
                }
            }
        };
        let mut len = [0u8; V2_LEN_FIELD];
        self.reader.read_exact(&mut len).map_err(io)?;
        let field = String::from_utf8_lossy(&len).trim().to_string();
        let n: usize = field
            .parse()
            .ok()
            .filter(|&n| n <= MAX_LINE)
            .ok_or_else(|| PmiError::Malformed {
                op: op.into(),
                why: format!("the frame length {field:?} is not a number up to {MAX_LINE}"),
                line: String::new(),
            })?;
        let mut body = vec![0u8; n];
        self.reader.read_exact(&mut body).map_err(io)?;
        let body = String::from_utf8(body).map_err(|_| PmiError::Malformed {
            op: op.into(),
            why: "the frame is not UTF-8".into(),
            line: String::new(),
        })?;
        Message::parse_v2(&body).map_err(|why| PmiError::Malformed {
            op: op.into(),
            why,
            line: body.chars().take(200).collect(),
        })
    }

    fn call(&mut self, op: &str, m: &Message, expected: &str) -> Result<Message, PmiError> {
        self.send(op, m)?;
        let r = self.recv(op)?;
        if r.cmd != expected {
            // A server that does not know the command may answer with a generic error carrying rc/msg.
            if let Ok(rc) = r.rc() {
                if rc != 0 {
                    return Err(PmiError::Failed {
                        op: op.into(),
                        rc,
                        msg: r.get("msg").or(r.get("errmsg")).unwrap_or("no message").into(),
                    });
                }
            }
            return Err(PmiError::Unexpected {
                op: op.into(),
                expected: expected.into(),
                got: r.cmd,
            });
        }
        Ok(r)
    }

    fn check_rc(&self, op: &str, r: &Message) -> Result<(), PmiError> {
        let rc = r.rc().map_err(|why| PmiError::Malformed {
            op: op.into(),
            why,
            line: r.to_line(),
        })?;
        if rc != 0 {
            return Err(PmiError::Failed {
                op: op.into(),
                rc,
                msg: r.get("msg").or(r.get("errmsg")).unwrap_or("no message").into(),
            });
        }
        Ok(())
    }
}
