//! How large messages move between co-resident ranks, chosen by measurement on this host.
//!
//! Three ways exist to move a message above the eager limit (see docs/transports/shm.md):
//! - **pipelined**: the sender copies chunks into the pair's ring while the receiver copies the previous
//!   ones out (two copies, overlapped on two cores, all in cache);
//! - **read**: the receiver copies the whole message out of the sender's memory with one
//!   `process_vm_readv` (one copy, pages pinned by the kernel, on the receiver's core only);
//! - **write**: the sender copies it into the receiver's buffer with one `process_vm_writev` after a CTS
//!   that names the buffer (one copy on the sender's core, one handshake more).
//!
//! Which is fastest depends on the CPU (cache sizes, the cost of pinning pages, how fast one core copies)
//! and on the kernel, so no constant is right everywhere: on one machine the single copy was 1.6x faster
//! at 1 MiB, on another (the same model a few days later) 2x slower. [`measure`] times each candidate with
//! ping-pongs between two threads over a private region, the real engine and protocol code included, and
//! derives a [`LargePath`]: the eager limit, the pipeline's chunk size and the protocol per size.
//! `vmfabric info --calibrate` runs it and caches the result per host ([`cache_path`]); `vmfabric run`
//! does the same before a job when no valid cache is there (about 0.2-0.5 s); every rank reads the cache
//! at start-up ([`load`]). A cache made by another vmfabric version, kernel, CPU model or CPU count is
//! ignored. Explicit `VMF_SHM_EAGER_LIMIT`, `VMF_SHM_CHUNK` or `VMF_SHM_CMA_MIN` settings win over it.
use crate::config::Config;
use crate::engine::{Engine, SendMode};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmf_transport::shm::region::{Region, RegionSizing, RegionSource};
use vmf_transport::shm::ShmTransport;

/// A way to move a rendezvous message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Chunks through the pair's ring.
    Pipelined,
    /// Receiver-side single copy (`process_vm_readv`).
    Read,
    /// Sender-side single copy (`process_vm_writev`).
    Write,
    /// Both at once: the receiver reads the first half while the sender writes the second (two cores
    /// copy; [`split_point`]).
    Split,
}

/// Where a split copy of `want` bytes divides: the receiver reads `[0, h)`, the sender writes `[h, want)`.
/// Both sides compute it from the length the CTS carries. Page-aligned (from 32 KiB) so neither half
/// shares a page.
pub fn split_point(want: usize) -> usize {
    // The receiver starts first (the sender waits for the CTS): it takes 4 KiB more than half.
    let h = want / 2 + 4096;
    if want >= 32 << 10 {
        h & !4095
    } else {
        want / 2
    }
}

impl Strategy {
    /// Name used in the cache file and in `vmfabric info`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Pipelined => "pipelined",
            Strategy::Read => "read",
            Strategy::Write => "write",
            Strategy::Split => "split",
        }
    }
    fn parse(s: &str) -> Option<Strategy> {
        Some(match s {
            "pipelined" => Strategy::Pipelined,
            "read" => Strategy::Read,
            "write" => Strategy::Write,
            "split" => Strategy::Split,
            _ => return None,
        })
    }
}

/// The large-message choices of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargePath {
    /// Largest message copied through the ring in one packet.
    pub eager_limit: usize,
    /// Chunk size of the pipelined copy.
    pub chunk: usize,
    /// `(smallest size, strategy)`, ascending: a rendezvous message of `len` bytes uses the strategy of
    /// the last step whose size is at most `len` (pipelined below the first step).
    pub steps: Vec<(usize, Strategy)>,
}

impl Default for LargePath {
    /// What an uncalibrated host uses: 64 KiB eager limit and chunks, pipelined at every size.
    fn default() -> Self {
        LargePath {
            eager_limit: 64 << 10,
            chunk: 64 << 10,
            steps: Vec::new(),
        }
    }
}

impl LargePath {
    /// The strategy for a rendezvous message of `len` bytes.
    #[inline]
    pub fn pick(&self, len: usize) -> Strategy {
        let mut s = Strategy::Pipelined;
        for &(min, st) in &self.steps {
            if len >= min {
                s = st;
            } else {
                break;
            }
        }
        s
    }

    /// One line for `vmfabric info`: `eager <= 32768 B, chunk 16384 B; pipelined from 32769 B, read from 1048577 B`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "eager <= {} B, chunk {} B; pipelined from {} B",
            self.eager_limit,
            self.chunk,
            self.eager_limit + 1
        );
        for &(min, st) in &self.steps {
            if min > self.eager_limit {
                s += &format!(", {} from {min} B", st.name());
            } else {
                s = format!("eager <= {} B; {} from {} B", self.eager_limit, st.name(), self.eager_limit + 1);
            }
        }
        s
    }
}

/// One measured point: the median ping-pong half round trip of `strategy` at `size`.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Message size in bytes.
    pub size: usize,
    /// `eager`, `pipelined-<chunk>`, `read` or `write`.
    pub method: String,
    /// Median half round trip in microseconds.
    pub us: f64,
}

/// A calibration: the derived choices, the curves they come from and what machine they belong to.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// See [`fingerprint`].
    pub fingerprint: String,
    /// The choices.
    pub path: LargePath,
    /// Every measured point.
    pub points: Vec<Point>,
    /// Wall time the measurement took, in milliseconds.
    pub took_ms: u64,
}

/// Sizes measured (bytes).
pub const SIZES: &[usize] = &[
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
];
/// Pipeline chunk sizes tried.
pub const CHUNKS: &[usize] = &[16 << 10, 64 << 10];
/// Largest size at which the eager protocol is tried.
const EAGER_MAX_TRY: usize = 128 << 10;

/// Version of the rules in [`derive`]: a cache derived under other rules is measured again.
const DERIVE_VERSION: u32 = 2;

/// What a cache must match to be used: library version, packet format, the rules that derived it,
/// kernel release, CPU model and CPU count.
pub fn fingerprint() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    format!(
        "vmfabric {} proto {} rules {}; kernel {}; cpu {}; cpus {}",
        env!("CARGO_PKG_VERSION"),
        vmf_transport::proto::PROTO_VERSION,
        DERIVE_VERSION,
        kernel.trim(),
        model,
        vmf_pal::available_cpus()
    )
}

/// The cache file for `setting` (`VMF_CALIBRATION`): `off` → none; `auto` →
/// `$XDG_CACHE_HOME/vmfabric/calibration-<host>.json` (else `~/.cache/...`, else
/// `/tmp/vmfabric-<uid>/...`; `<host>`: `VMF_MACHINE_NAME`, which the launcher gives ranks on emulated
/// hosts, else the host name); anything else is the path itself.
pub fn cache_path(setting: &str) -> Option<PathBuf> {
    match setting {
        "off" | "0" | "" => None,
        "auto" => {
            // A rank on an emulated host has that host's name; the launcher passes the machine's.
            let host = std::env::var("VMF_MACHINE_NAME")
                .ok()
                .filter(|h| !h.trim().is_empty() && !h.contains('/'))
                .or_else(|| Some(vmf_pal::hostid::hostname()).filter(|h| !h.trim().is_empty()))
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|| "localhost".into());
            let dir = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .filter(|v| !v.is_empty())
                        .map(|h| PathBuf::from(h).join(".cache"))
                })
                .map(|d| d.join("vmfabric"))
                // SAFETY: getuid has no preconditions.
                .unwrap_or_else(|| PathBuf::from(format!("/tmp/vmfabric-{}", unsafe { libc::getuid() })));
            Some(dir.join(format!("calibration-{host}.json")))
        }
        p => Some(PathBuf::from(p)),
    }
}

/// The calibration cached at `path`, if it is there, well formed and made on this machine as it is now.
pub fn load(path: &Path) -> Option<Calibration> {
    let text = std::fs::read_to_string(path).ok()?;
    let c = from_json(&text)?;
    (c.fingerprint == fingerprint()).then_some(c)
}

/// Write `c` to `path` (atomically: a temporary file renamed over it).
pub fn save(path: &Path, c: &Calibration) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, to_json(c))?;
    std::fs::rename(&tmp, path)
}

/// The cached calibration for `cfg`, measuring and caching it first if there is none. `None`: calibration
/// is off, or it could not be measured (the reason is returned for a warning).
pub fn ensure(cfg: &Config) -> Result<Option<Calibration>, String> {
    let Some(path) = cache_path(&cfg.calibration) else {
        return Ok(None);
    };
    if let Some(c) = load(&path) {
        return Ok(Some(c));
    }
    // One calibration at a time per cache file: jobs started together wait for the first one's result
    // instead of measuring side by side (which would also disturb each other's figures).
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.with_extension("lock"))
        .map_err(|e| format!("cannot open the lock beside {}: {e}", path.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    if let Some(c) = load(&path) {
        return Ok(Some(c));
    }
    let c = measure(cfg)?;
    save(&path, &c).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Some(c))
}

/// JSON form of a calibration (the cache file format).
pub fn to_json(c: &Calibration) -> String {
    let steps: Vec<String> = c
        .path
        .steps
        .iter()
        .map(|(m, s)| format!("{{\"from\": {m}, \"strategy\": \"{}\"}}", s.name()))
        .collect();
    let points: Vec<String> = c
        .points
        .iter()
        .map(|p| format!("{{\"size\": {}, \"method\": \"{}\", \"latency_us\": {:.3}}}", p.size, p.method, p.us))
        .collect();
    format!(
        "{{\n  \"fingerprint\": {},\n  \"eager_limit\": {},\n  \"chunk\": {},\n  \"steps\": [{}],\n  \"took_ms\": {},\n  \"points\": [\n    {}\n  ]\n}}\n",
        json_str(&c.fingerprint),
        c.path.eager_limit,
        c.path.chunk,
        steps.join(", "),
        c.took_ms,
        points.join(",\n    ")
    )
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o += "\\\"",
            '\\' => o += "\\\\",
            c if (c as u32) < 0x20 => o += &format!("\\u{:04x}", c as u32),
            c => o.push(c),
        }
    }
    o + "\""
}

/// Parse the cache file format; `None` if anything is missing or out of range (the file is then ignored).
pub fn from_json(text: &str) -> Option<Calibration> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let size = |x: &serde_json::Value| -> Option<usize> {
        let n = x.as_u64()?;
        (n <= 1 << 30).then_some(n as usize)
    };
    let eager_limit = size(v.get("eager_limit")?)?;
    let chunk = size(v.get("chunk")?)?;
    if chunk < 4096 {
        return None;
    }
    let mut steps = Vec::new();
    for s in v.get("steps")?.as_array()? {
        let from = size(s.get("from")?)?;
        let st = Strategy::parse(s.get("strategy")?.as_str()?)?;
        if steps.last().is_some_and(|&(m, _)| m >= from) {
            return None;
        }
        steps.push((from, st));
    }
    let mut points = Vec::new();
    for p in v.get("points")?.as_array()? {
        points.push(Point {
            size: size(p.get("size")?)?,
            method: p.get("method")?.as_str()?.to_owned(),
            us: p.get("latency_us")?.as_f64()?,
        });
    }
    Some(Calibration {
        fingerprint: v.get("fingerprint")?.as_str()?.to_owned(),
        path: LargePath {
            eager_limit,
            chunk,
            steps,
        },
        points,
        took_ms: v.get("took_ms")?.as_u64()?,
    })
}

/// A candidate way to move a message of some size.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Method {
    Eager,
    Pipelined(usize),
    Single(Strategy),
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::Eager => "eager".into(),
            Method::Pipelined(c) => format!("pipelined-{c}"),
            Method::Single(s) => s.name().into(),
        }
    }
    /// The path that forces this method for a message of `size` bytes.
    fn path(self, size: usize) -> LargePath {
        match self {
            Method::Eager => LargePath {
                eager_limit: size,
                chunk: 64 << 10,
                steps: Vec::new(),
            },
            Method::Pipelined(c) => LargePath {
                eager_limit: 0,
                chunk: c,
                steps: Vec::new(),
            },
            Method::Single(s) => LargePath {
                eager_limit: 0,
                chunk: 64 << 10,
                steps: vec![(0, s)],
            },
        }
    }
}

/// Time every candidate at every size in [`SIZES`] and derive the choices. Runs two threads (the
/// machine should have two idle cores) over a private region in `cfg.region_dir`; takes well under a
/// second on an idle machine.
pub fn measure(cfg: &Config) -> Result<Calibration, String> {
    let t0 = Instant::now();
    let cma = cfg.shm_cma && vmf_pal::cma::allow_any_ptracer().is_ok() && cma_works();
    let mut plan: Vec<(usize, Method)> = Vec::new();
    for &s in SIZES {
        if s <= EAGER_MAX_TRY {
            plan.push((s, Method::Eager));
        }
        for &c in CHUNKS {
            if c <= s || c == CHUNKS[0] {
                plan.push((s, Method::Pipelined(c)));
            }
        }
        if cma {
            plan.push((s, Method::Single(Strategy::Read)));
            plan.push((s, Method::Single(Strategy::Write)));
            plan.push((s, Method::Single(Strategy::Split)));
        }
    }
    let times = run_pair(cfg, &plan)?;
    let points: Vec<Point> = plan
        .iter()
        .zip(&times)
        .map(|(&(size, m), &us)| Point {
            size,
            method: m.name(),
            us,
        })
        .collect();
    let path = derive(&plan, &times, cma);
    Ok(Calibration {
        fingerprint: fingerprint(),
        path,
        points,
        took_ms: t0.elapsed().as_millis() as u64,
    })
}

/// Whether `process_vm_readv` on ourselves works (it may be forbidden in containers).
fn cma_works() -> bool {
    let src = [7u8; 64];
    let mut dst = [0u8; 64];
    vmf_pal::cma::read_from(std::process::id() as i32, src.as_ptr() as u64, &mut dst).is_ok()
        && dst == src
}

/// A rendezvous method lowers the eager limit only where it takes at most this share of eager's time.
/// The calibration's two threads share one address space, which flatters the rendezvous at small sizes:
/// on 2026-12-06 the 16 KiB pipeline measured 0.94x eager between the threads, while MPI ping-pongs
/// between two processes took 1.3-1.6x eager's time with it (16 KiB: 1.96-6.61 us against 1.37-4.77,
/// `mpi_pingpong` with the calibrated path and with `VMF_SHM_EAGER_LIMIT=16384`, 3 alternating runs).
/// Eager is also the protocol that completes without the receiver's progress, so a tie goes to it.
const RNDV_OVER_EAGER_MAX: f64 = 0.8;

/// The choices implied by the measured medians `times` of `plan`.
fn derive(plan: &[(usize, Method)], times: &[f64], cma: bool) -> LargePath {
    let best_at = |size: usize, ok: &dyn Fn(Method) -> bool| -> Option<(Method, f64)> {
        plan.iter()
            .zip(times)
            .filter(|((s, m), _)| *s == size && ok(*m))
            .map(|((_, m), &t)| (*m, t))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    // The eager limit: the largest size up to which no rendezvous method beats eager clearly (by
    // RNDV_OVER_EAGER_MAX) at any size.
    let mut eager_limit = SIZES[0] / 2;
    for &s in SIZES {
        let eager = best_at(s, &|m| m == Method::Eager);
        let rndv = best_at(s, &|m| m != Method::Eager);
        match (eager, rndv) {
            (Some((_, e)), Some((_, r))) if r > e * RNDV_OVER_EAGER_MAX => eager_limit = s,
            (Some(_), None) => eager_limit = s,
            _ => break,
        }
    }
    // The chunk: the one with the smallest total time relative to the best chunk, over rendezvous sizes.
    let rndv: Vec<usize> = SIZES.iter().copied().filter(|&s| s > eager_limit).collect();
    let mut chunk = CHUNKS[CHUNKS.len() - 1];
    let mut best_score = f64::INFINITY;
    for &c in CHUNKS {
        let mut score = 0.0;
        for &s in &rndv {
            let t = best_at(s, &|m| m == Method::Pipelined(c));
            let b = best_at(s, &|m| matches!(m, Method::Pipelined(_)));
            if let (Some((_, t)), Some((_, b))) = (t, b) {
                score += t / b;
            } else {
                score += 1.0; // this chunk was not tried at s (bigger than the message): same as one chunk
            }
        }
        if score < best_score {
            best_score = score;
            chunk = c;
        }
    }
    // The strategy per size, among the pipeline with that chunk and the single copies.
    let mut steps: Vec<(usize, Strategy)> = Vec::new();
    let mut prev = eager_limit;
    let mut current = Strategy::Pipelined;
    for &s in &rndv {
        // The pipeline with the chosen chunk; where that chunk was not tried (larger than the message) the
        // best pipeline measured at this size stands for it.
        let pipe = best_at(s, &|m| m == Method::Pipelined(chunk))
            .or_else(|| best_at(s, &|m| matches!(m, Method::Pipelined(_))));
        let single = if cma {
            best_at(s, &|m| matches!(m, Method::Single(_)))
        } else {
            None
        };
        let st = match (pipe, single) {
            (Some((_, p)), Some((Method::Single(st), t))) if t < p => st,
            _ => Strategy::Pipelined,
        };
        if st != current {
            // The change applies from just above the previous measured size.
            steps.push((prev + 1, st));
            current = st;
        }
        prev = s;
    }
    LargePath {
        eager_limit,
        chunk,
        steps,
    }
}

/// Run the ping-pongs of `plan` between two engines in two threads; the median half round trip of each.
fn run_pair(cfg: &Config, plan: &[(usize, Method)]) -> Result<Vec<f64>, String> {
    let base = if cfg.region_dir.is_empty() {
        "/dev/shm".to_owned()
    } else {
        cfg.region_dir.clone()
    };
    let dir = PathBuf::from(base).join(format!("vmf-calibrate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let mut ecfg = cfg.clone();
    ecfg.wait = crate::config::WaitPolicy::Spin;
    ecfg.shm_eager_limit = None;
    ecfg.shm_chunk = None;
    ecfg.shm_cma_min = None;
    ecfg.shm_cma = true;
    let region = Arc::new(
        Region::open(
            &RegionSource::Dir(dir.clone()),
            "calibrate",
            RegionSizing {
                max_local: 2,
                heap: 4 << 20,
                pool_per_slot: 0,
            },
            None,
            Duration::from_secs(2),
        )
        .map_err(|e| format!("cannot make a region in {}: {e}", dir.display()))?,
    );
    let ring = cfg.shm_ring_size.min(1 << 20);
    let slots = [
        region.attach(0).map_err(|e| e.to_string())?,
        region.attach(1).map_err(|e| e.to_string())?,
    ];
    let max_size = plan.iter().map(|p| p.0).max().unwrap_or(0);
    let plan = Arc::new(plan.to_vec());
    let spawn = |me: usize| {
        let (region, cfg, plan) = (region.clone(), ecfg.clone(), plan.clone());
        std::thread::Builder::new()
            .name(format!("vmf-calibrate-{me}"))
            .spawn(move || -> Result<Vec<f64>, String> {
                let mut t = ShmTransport::new(region, me, slots[me], 2, ring);
                t.add_peer(1 - me, slots[1 - me]).map_err(|e| e.to_string())?;
                let mut e = Engine::new(me, 2, cfg, Some(t), None);
                let mut sbuf = vec![me as u8 + 1; max_size];
                let mut rbuf = vec![0u8; max_size];
                let mut out = Vec::with_capacity(plan.len());
                for (i, &(size, m)) in plan.iter().enumerate() {
                    e.set_large_path(&m.path(size));
                    // Stamp the message so that a wrong copy is noticed.
                    sbuf[0] = i as u8;
                    sbuf[size - 1] = i as u8 ^ 0x5a;
                    let reps = (64usize << 20).div_ceil(size).clamp(12, 400);
                    let mut samples = Vec::with_capacity(reps);
                    for rep in 0..reps + 3 {
                        let t0 = Instant::now();
                        if me == 0 {
                            send(&mut e, &sbuf[..size], 1)?;
                            recv(&mut e, &mut rbuf[..size], 1)?;
                        } else {
                            recv(&mut e, &mut rbuf[..size], 0)?;
                            send(&mut e, &sbuf[..size], 0)?;
                        }
                        if rbuf[0] != i as u8 || rbuf[size - 1] != i as u8 ^ 0x5a {
                            return Err(format!("{} at {size} B delivered wrong data", m.name()));
                        }
                        if rep >= 3 {
                            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                        }
                    }
                    samples.sort_by(f64::total_cmp);
                    out.push(samples[samples.len() / 2]);
                }
                e.flush().map_err(|e| e.to_string())?;
                Ok(out)
            })
            .map_err(|e| format!("cannot start a thread: {e}"))
    };
    let a = spawn(0)?;
    let b = spawn(1)?;
    let ra = a.join().map_err(|_| "calibration thread panicked".to_string())?;
    let rb = b.join().map_err(|_| "calibration thread panicked".to_string())?;
    rb?;
    ra
}

fn send(e: &mut Engine, buf: &[u8], to: i64) -> Result<(), String> {
    // SAFETY: buf outlives the request, which completes before we return.
    let id = unsafe { e.isend(buf.as_ptr(), buf.len(), to, 1, 0, SendMode::Standard) }
        .map_err(|e| e.to_string())?;
    e.wait_until(crate::error::Op::Send, |e| e.is_done(id))
        .map_err(|e| e.to_string())?;
    e.take(id).map(|_| ()).map_err(|e| e.to_string())
}

fn recv(e: &mut Engine, buf: &mut [u8], from: i64) -> Result<(), String> {
    // SAFETY: buf outlives the request, which completes before we return.
    let id = unsafe { e.irecv(buf.as_mut_ptr(), buf.len(), from, 1, 0) }.map_err(|e| e.to_string())?;
    e.wait_until(crate::error::Op::Recv, |e| e.is_done(id))
        .map_err(|e| e.to_string())?;
    e.take(id).map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_follows_the_steps() {
        let p = LargePath {
            eager_limit: 32 << 10,
            chunk: 16 << 10,
            steps: vec![(100_001, Strategy::Read), (2_000_001, Strategy::Write)],
        };
        assert_eq!(p.pick(40_000), Strategy::Pipelined);
        assert_eq!(p.pick(100_001), Strategy::Read);
        assert_eq!(p.pick(2_000_000), Strategy::Read);
        assert_eq!(p.pick(5_000_000), Strategy::Write);
        assert_eq!(LargePath::default().pick(1 << 30), Strategy::Pipelined);
    }

    #[test]
    fn eager_stays_until_a_rendezvous_is_clearly_faster() {
        // The 16 KiB pipeline 6 % faster than eager at 16 and 32 KiB (what two threads measured on
        // 2026-12-06), 21 % faster at 64 KiB: eager up to 32 KiB.
        let (mut plan, mut times) = (Vec::new(), Vec::new());
        for &s in SIZES {
            let k = s as f64 / 1024.0;
            if s <= EAGER_MAX_TRY {
                plan.push((s, Method::Eager));
                times.push(k * 0.1);
            }
            plan.push((s, Method::Pipelined(16 << 10)));
            times.push(if s <= 32 << 10 { k * 0.094 } else { k * 0.079 });
        }
        let p = derive(&plan, &times, false);
        assert_eq!(p.eager_limit, 32 << 10);
        // A pipeline 25 % faster from the smallest size: the eager limit drops below it.
        let times: Vec<f64> = plan
            .iter()
            .map(|&(s, m)| s as f64 / 1024.0 * if m == Method::Eager { 0.1 } else { 0.075 })
            .collect();
        assert_eq!(derive(&plan, &times, false).eager_limit, SIZES[0] / 2);
    }

    #[test]
    fn derive_takes_the_fastest_method_per_size() {
        // Eager wins up to 32K, the 16K pipeline up to 256K, then the single-copy read.
        let mut plan = Vec::new();
        let mut times = Vec::new();
        for &s in SIZES {
            let k = s as f64 / 1024.0;
            if s <= EAGER_MAX_TRY {
                plan.push((s, Method::Eager));
                times.push(if s <= 32 << 10 { k * 0.01 } else { k * 0.1 });
            }
            plan.push((s, Method::Pipelined(16 << 10)));
            times.push(k * 0.05);
            plan.push((s, Method::Pipelined(64 << 10)));
            times.push(k * 0.06);
            plan.push((s, Method::Single(Strategy::Read)));
            times.push(if s > 256 << 10 { k * 0.04 } else { k * 0.2 });
            plan.push((s, Method::Single(Strategy::Write)));
            times.push(k * 0.3);
        }
        let p = derive(&plan, &times, true);
        assert_eq!(p.eager_limit, 32 << 10);
        assert_eq!(p.chunk, 16 << 10);
        assert_eq!(p.steps, vec![((256 << 10) + 1, Strategy::Read)]);
        // Without CMA the single copies are never chosen.
        assert!(derive(&plan, &times, false).steps.is_empty());
        // The 64 KiB chunk wins at large sizes, so at 32 KiB (where it was not tried) the best pipeline
        // measured there stands for it, and a faster single copy is still chosen there.
        let (mut plan, mut times) = (Vec::new(), Vec::new());
        for &s in SIZES {
            let k = s as f64 / 1024.0;
            if s <= EAGER_MAX_TRY {
                plan.push((s, Method::Eager));
                times.push(if s <= 16 << 10 { k * 0.01 } else { k * 1.0 });
            }
            plan.push((s, Method::Pipelined(16 << 10)));
            times.push(k * 0.06);
            if s >= 64 << 10 {
                plan.push((s, Method::Pipelined(64 << 10)));
                times.push(k * 0.05);
            }
            plan.push((s, Method::Single(Strategy::Read)));
            times.push(if s == 32 << 10 { k * 0.02 } else { k * 0.2 });
        }
        let p = derive(&plan, &times, true);
        assert_eq!((p.eager_limit, p.chunk), (16 << 10, 64 << 10));
        assert_eq!(p.steps, vec![((16 << 10) + 1, Strategy::Read), ((32 << 10) + 1, Strategy::Pipelined)]);
    }

    #[test]
    fn cache_round_trips_and_rejects_bad_files() {
        let c = Calibration {
            fingerprint: fingerprint(),
            path: LargePath {
                eager_limit: 32768,
                chunk: 16384,
                steps: vec![(1_048_577, Strategy::Read)],
            },
            points: vec![Point {
                size: 65536,
                method: "pipelined-16384".into(),
                us: 3.25,
            }],
            took_ms: 321,
        };
        let back = from_json(&to_json(&c)).unwrap();
        assert_eq!(back.path, c.path);
        assert_eq!(back.points[0].method, "pipelined-16384");
        assert!(from_json("{}").is_none());
        assert!(from_json(&to_json(&c).replace("\"read\"", "\"teleport\"")).is_none());
        assert!(from_json(&to_json(&c).replace("\"chunk\": 16384", "\"chunk\": 12")).is_none());
        let d = std::env::temp_dir().join(format!("vmf-cal-test-{}", std::process::id()));
        let f = d.join("c.json");
        save(&f, &c).unwrap();
        assert_eq!(load(&f).unwrap().path, c.path);
        // A cache from another machine (fingerprint) is ignored.
        std::fs::write(&f, to_json(&Calibration { fingerprint: "elsewhere".into(), ..c })).unwrap();
        assert!(load(&f).is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn measure_times_every_method_and_the_result_moves_data_correctly() {
        let cfg = Config::from_lookup(|_| None).unwrap();
        let c = measure(&cfg).unwrap();
        assert!(c.points.len() >= SIZES.len() * 2, "{:?}", c.points);
        assert!(c.points.iter().all(|p| p.us > 0.0 && p.us.is_finite()));
        assert!(c.path.eager_limit >= SIZES[0] / 2 && c.path.eager_limit <= EAGER_MAX_TRY);
        assert!(CHUNKS.contains(&c.path.chunk));
    }
}
