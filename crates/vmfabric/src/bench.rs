//! `vmfabric bench`: OSU-style point-to-point benchmarks over the native API.
//!
//! Ranks are paired (0,1), (2,3), …; every pair runs the benchmark at the same time (like OSU's multi-pair
//! tests) and rank 0 reports its pair. `latency` is half the round trip of a blocking ping-pong; `bw` sends a
//! window of nonblocking messages one way and waits for a short acknowledgement; `bibw` does the same in both
//! directions at once.
use clap::{Args, ValueEnum};
use std::time::Instant;
use vmf_core::{Error, Fabric, SendMode, Source, TagSel};

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum, Debug)]
pub enum Kind {
    /// Ping-pong half round trip.
    Latency,
    /// Unidirectional windowed bandwidth.
    Bw,
    /// Bidirectional windowed bandwidth.
    Bibw,
    /// Latency and bandwidth in one table (what `make demo` runs).
    Demo,
    /// Waiting under oversubscription: ring or all-to-all patterns (see `--pattern`).
    Overcommit,
    /// Live migration under load (inside `vmfabric run --hosts H`).
    Migrate,
    /// One-sided writes (put + flush latency, windowed bandwidth).
    Put,
    /// One-sided reads (get + flush latency, windowed bandwidth).
    Get,
    /// One-sided 8-byte atomics: fetch-and-add, compare-and-swap, swap.
    Atomic,
    /// Increment counters under no/medium/high contention: spin lock vs minitransactions (002_*).
    Mtx,
    /// Barriers per second for each barrier kind (spin, block, adaptive).
    Barrier,
    /// Wake-up of a rank asleep in a blocking receive (futex between processes, the ivshmem doorbell
    /// between VMs): round trip after `--gap-ms` of sleep, sleeps per wait, CPU used while waiting.
    Wakeup,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Which benchmark.
    kind: Kind,
    /// Options of `overcommit`.
    #[command(flatten)]
    over: crate::overcommit::OvercommitArgs,
    /// migrate: how many migrations.
    #[arg(long, default_value_t = 20)]
    migrations: usize,
    /// migrate: the traffic during the migrations.
    #[arg(long, value_enum, default_value = "all-to-all")]
    traffic: crate::migrate_bench::Traffic,
    /// Message sizes in bytes, comma separated (K/M suffixes allowed).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<String>>,
    /// Iterations for small messages (scaled down for large ones).
    #[arg(long, default_value_t = 10000)]
    iters: usize,
    /// Messages in flight per window (bw, bibw).
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Write results as JSON to this file (rank 0).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// wakeup: milliseconds the receiver waits (asleep) before each message.
    #[arg(long, default_value_t = 20)]
    gap_ms: u64,
    /// put/get/atomic: the target computes without calling the library while it is measured (a truly
    /// passive target) instead of waiting in a barrier.
    #[arg(long)]
    target_busy: bool,
}

const DEFAULT_SIZES: &[usize] = &[8, 64, 512, 4096, 16384, 65536, 262144, 1048576, 4194304];
const TAG: i32 = 100;

pub(crate) fn iters_for(size: usize, iters: usize) -> usize {
    (iters.saturating_mul(8192) / size.max(8192)).clamp(20.min(iters), iters.max(1))
}

struct Row {
    size: usize,
    latency_us: Option<f64>,
    mb_per_s: f64,
}

fn fail(f: &Fabric, e: Error) -> i32 {
    eprintln!("vmfabric bench: rank {}: {e}", f.rank());
    1
}

pub fn run(a: BenchArgs) -> i32 {
    if a.kind == Kind::Overcommit {
        return crate::overcommit::run(a.over, a.json);
    }
    if a.kind == Kind::Migrate {
        return crate::migrate_bench::run(a.migrations, a.traffic, a.json);
    }
    if a.kind == Kind::Mtx {
        return crate::mtx_bench::run_mtx(a.iters, a.json);
    }
    if a.kind == Kind::Wakeup {
        return crate::wakeup_bench::run(a.iters.min(1000), a.gap_ms, a.json);
    }
    if a.kind == Kind::Barrier {
        return crate::mtx_bench::run_barrier(a.iters, a.json);
    }
    let sizes: Vec<usize> = match &a.sizes {
        None => DEFAULT_SIZES.to_vec(),
        Some(v) => {
            let mut out = Vec::new();
            for s in v {
                match vmf_core::config::parse_size(s) {
                    Some(x) if x <= 1 << 30 => out.push(x as usize),
                    _ => {
                        eprintln!(
                            "vmfabric bench: invalid size {s:?} in --sizes (use e.g. 8,64K,1M)"
                        );
                        return 2;
                    }
                }
            }
            out
        }
    };
    if a.window == 0 || a.iters == 0 {
        eprintln!("vmfabric bench: --iters and --window must be at least 1");
        return 2;
    }
    if let Some(k) = match a.kind {
        Kind::Put => Some(crate::rma_bench::Rma::Put),
        Kind::Get => Some(crate::rma_bench::Rma::Get),
        Kind::Atomic => Some(crate::rma_bench::Rma::Atomic),
        _ => None,
    } {
        let o = crate::rma_bench::Opts {
            sizes,
            iters: a.iters,
            window: a.window,
            json: a.json,
            target_busy: a.target_busy,
        };
        return crate::rma_bench::run(k, o);
    }
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmfabric bench: {e}");
            return 1;
        }
    };
    if f.size() < 2 || f.size() % 2 != 0 {
        eprintln!(
            "vmfabric bench: needs an even number of ranks (got {}); run it as `vmfabric run -n 2 vmfabric bench ...`",
            f.size()
        );
        return 2;
    }
    let maxsz = sizes.iter().copied().max().unwrap_or(0);
    let mut sbuf = vec![0u8; maxsz.max(1)];
    let mut rbuf = vec![0u8; maxsz.max(1)];
    for (i, b) in sbuf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let kinds: Vec<Kind> = if a.kind == Kind::Demo {
        vec![Kind::Latency, Kind::Bw]
    } else {
        vec![a.kind]
    };
    let mut tables = Vec::new();
    for k in kinds {
        let mut rows = Vec::new();
        for &size in &sizes {
            let it = iters_for(size, a.iters);
            let r = match k {
                Kind::Latency => latency(&f, &sbuf[..size], &mut rbuf[..size], it),
                Kind::Bw => bandwidth(&f, &sbuf[..size], &mut rbuf[..size], it, a.window, false),
                Kind::Bibw => bandwidth(&f, &sbuf[..size], &mut rbuf[..size], it, a.window, true),
                _ => unreachable!(),
            };
            match r {
                Ok(row) => rows.push(row),
                Err(e) => return fail(&f, e),
            }
        }
        tables.push((k, rows));
    }
    let transport = transport_name(&f);
    if f.rank() == 0 {
        print_tables(&f, &tables, &transport);
        if let Some(path) = &a.json {
            let (k, rows) = &tables[0];
            let name = match k {
                Kind::Latency => "latency",
                Kind::Bw => "bw",
                Kind::Bibw => "bibw",
                _ => "demo",
            };
            let results: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    let mut m = serde_json::Map::new();
                    m.insert("size".into(), r.size.into());
                    if let Some(l) = r.latency_us {
                        m.insert("latency_us".into(), l.into());
                    }
                    m.insert("mb_per_s".into(), r.mb_per_s.into());
                    serde_json::Value::Object(m)
                })
                .collect();
            let rndv = if f.cma_enabled() { "cma" } else { "pipelined" };
            let doc = serde_json::json!({"benchmark": name, "transport": transport, "ranks": f.size(),
                "eager_limit": f.eager_limit(), "rendezvous": rndv, "results": results});
            if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n")
            {
                eprintln!(
                    "vmfabric bench: unable to write {} since {e}",
                    path.display()
                );
                return 1;
            }
        }
    }
    match f.finalize() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vmfabric bench: {e}");
            1
        }
    }
}

fn transport_name(f: &Fabric) -> String {
    let peer = f.rank() ^ 1;
    format!("vmfabric-{}", f.channel(peer).name())
}

fn print_tables(f: &Fabric, tables: &[(Kind, Vec<Row>)], transport: &str) {
    println!(
        "# vmfabric {} — {} ranks, transport {transport}, eager limit {} B, rendezvous {}, pairs (0,1){}",
        env!("CARGO_PKG_VERSION"),
        f.size(),
        f.eager_limit(),
        if f.cma_enabled() { "single-copy (CMA)" } else { "pipelined" },
        if f.size() > 2 { ", (2,3), … concurrently" } else { "" }
    );
    for (k, rows) in tables {
        match k {
            Kind::Latency => {
                println!("{:>10}  {:>14}  {:>12}", "size(B)", "latency(us)", "MB/s");
                for r in rows {
                    println!(
                        "{:>10}  {:>14.3}  {:>12.1}",
                        r.size,
                        r.latency_us.unwrap_or(0.0),
                        r.mb_per_s
                    );
                }
            }
            _ => {
                let what = if *k == Kind::Bibw {
                    "bi-bandwidth(MB/s)"
                } else {
                    "bandwidth(MB/s)"
                };
                println!("{:>10}  {:>20}", "size(B)", what);
                for r in rows {
                    println!("{:>10}  {:>20.1}", r.size, r.mb_per_s);
                }
            }
        }
    }
}

fn latency(f: &Fabric, s: &[u8], r: &mut [u8], iters: usize) -> Result<Row, Error> {
    let peer = f.rank() ^ 1;
    let even = f.rank().is_multiple_of(2);
    let warm = (iters / 10).max(2);
    f.barrier()?;
    let mut t0 = Instant::now();
    for i in 0..warm + iters {
        if i == warm {
            t0 = Instant::now();
        }
        if even {
            f.send(s, peer, TAG)?;
            f.recv(r, Source::Rank(peer), TagSel::Tag(TAG))?;
        } else {
            f.recv(r, Source::Rank(peer), TagSel::Tag(TAG))?;
            f.send(s, peer, TAG)?;
        }
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64);
    verify(f, r, s.len())?;
    Ok(Row {
        size: s.len(),
        latency_us: Some(us),
        mb_per_s: s.len() as f64 / us,
    })
}

fn verify(f: &Fabric, r: &[u8], n: usize) -> Result<(), Error> {
    if let Some(i) = (0..n).find(|&i| r[i] != (i % 251) as u8) {
        return Err(Error::Setup {
            rank: f.rank(),
            op: vmf_core::Op::Recv,
            why: format!("payload mismatch at byte {i}"),
        });
    }
    Ok(())
}

/// Windowed bandwidth. The receive buffer is shared by the whole window, as in OSU (contents are not
/// checked inside the window; the last message is verified).
fn bandwidth(
    f: &Fabric,
    s: &[u8],
    r: &mut [u8],
    iters: usize,
    window: usize,
    bidir: bool,
) -> Result<Row, Error> {
    let peer = f.rank() ^ 1;
    let sender = f.rank().is_multiple_of(2);
    let warm = (iters / 10).max(2);
    let n = s.len();
    let mut ack = [0u8; 4];
    let mut ids = Vec::with_capacity(2 * window);
    f.barrier()?;
    let mut t0 = Instant::now();
    for i in 0..warm + iters {
        if i == warm {
            t0 = Instant::now();
        }
        let mut e = f.engine();
        ids.clear();
        if bidir || !sender {
            for _ in 0..window {
                // SAFETY: r outlives the requests, which are all completed below before it is touched again.
                ids.push(unsafe { e.irecv(r.as_mut_ptr(), n, peer as i64, TAG, 0)? });
            }
        }
        if bidir || sender {
            for _ in 0..window {
                // SAFETY: s outlives the requests (completed below).
                ids.push(unsafe {
                    e.isend(s.as_ptr(), n, peer as i64, TAG, 0, SendMode::Standard)?
                });
            }
        }
        e.wait_until(vmf_core::Op::Wait, |e| ids.iter().all(|&id| e.is_done(id)))?;
        for &id in &ids {
            e.take(id)?;
        }
        drop(e);
        if !bidir {
            if sender {
                f.recv(&mut ack, Source::Rank(peer), TagSel::Tag(TAG + 1))?;
            } else {
                f.send(&ack, peer, TAG + 1)?;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    if bidir || !sender {
        verify(f, r, n)?;
    }
    let dirs = if bidir { 2.0 } else { 1.0 };
    let mbps = dirs * (n * window * iters) as f64 / secs / 1e6;
    // The sender's view is authoritative for bw; share it with the pair's receiver for reporting.
    Ok(Row {
        size: n,
        latency_us: None,
        mb_per_s: mbps,
    })
}
