//! `vmfabric bench put|get|atomic`: one-sided benchmarks over the native API (`vmf_rma::Win`).
//!
//! Ranks are paired (0,1), (2,3), …: the even rank of each pair is the origin, the odd one the target,
//! which takes no part (it waits in a barrier inside the library, or with `--target-busy` computes without
//! calling it at all). Latency is one operation followed by a flush (remote completion), as OSU's
//! `-s flush` measures it; bandwidth is `--window` operations, then one flush.
use std::time::Instant;
use vmf_core::{Error, Fabric};
use vmf_rma::layout::{contig_run, Layout};
use vmf_rma::{Done, Elem, ROp, Win};

/// Which one-sided benchmark.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rma {
    /// MPI_Put-like writes.
    Put,
    /// MPI_Get-like reads.
    Get,
    /// 8-byte atomics: fetch-and-add, compare-and-swap, swap.
    Atomic,
}

/// Options shared with the other benchmarks.
pub struct Opts {
    pub sizes: Vec<usize>,
    pub iters: usize,
    pub window: usize,
    pub json: Option<std::path::PathBuf>,
    pub target_busy: bool,
}

struct Row {
    op: &'static str,
    size: usize,
    latency_us: f64,
    mb_per_s: f64,
}

fn err(f: &Fabric, e: vmf_rma::RmaError) -> Error {
    Error::Setup {
        rank: f.rank(),
        op: vmf_core::Op::Progress,
        why: e.to_string(),
    }
}

pub fn run(kind: Rma, o: Opts) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmfabric bench: {e}");
            return 1;
        }
    };
    if f.size() < 2 || f.size() % 2 != 0 {
        eprintln!(
            "vmfabric bench: needs an even number of ranks (got {}); run it as `vmfabric run -n 2 vmfabric bench {} ...`",
            f.size(),
            format!("{kind:?}").to_lowercase()
        );
        return 2;
    }
    match body(&f, kind, &o) {
        Ok(()) => match f.finalize() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("vmfabric bench: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("vmfabric bench: rank {}: {e}", f.rank());
            1
        }
    }
}

fn body(f: &Fabric, kind: Rma, o: &Opts) -> Result<(), Error> {
    let origin = f.rank().is_multiple_of(2);
    let peer = f.rank() ^ 1;
    let sizes: Vec<usize> = if kind == Rma::Atomic { vec![8] } else { o.sizes.clone() };
    let maxsz = sizes.iter().copied().max().unwrap_or(8).max(64);
    // The data, then 64 bytes whose last word is the flag that releases a computing target.
    let mut w = Win::allocate(f, maxsz + 64).map_err(|e| err(f, e))?;
    let route = w.raw().routes()[peer];
    let mut buf = vec![0u8; maxsz];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut rows = Vec::new();
    let ops: &[&'static str] = match kind {
        Rma::Put => &["put"],
        Rma::Get => &["get"],
        Rma::Atomic => &["fetch_add", "compare_swap", "swap"],
    };
    for &op in ops {
        for &size in &sizes {
            let it = crate::bench::iters_for(size, o.iters);
            let window = if kind == Rma::Atomic { 1 } else { o.window };
            w.fence().map_err(|e| err(f, e))?;
            let r = if origin {
                Some(measure(f, &mut w, op, peer, &mut buf[..size], it, window)?)
            } else {
                target_wait(f, &mut w, o.target_busy)?;
                None
            };
            w.fence().map_err(|e| err(f, e))?;
            if let Some((lat, mbps)) = r {
                rows.push(Row {
                    op,
                    size,
                    latency_us: lat,
                    mb_per_s: mbps,
                });
            }
        }
    }
    if f.rank() == 0 {
        let name = match kind {
            Rma::Put => "put",
            Rma::Get => "get",
            Rma::Atomic => "atomic",
        };
        println!(
            "# vmfabric {} — one-sided {name}, {} ranks, pairs (0,1){}, target {} ({}), op + flush",
            env!("CARGO_PKG_VERSION"),
            f.size(),
            if f.size() > 2 { ", (2,3), … concurrently" } else { "" },
            if o.target_busy { "computing, no library calls" } else { "idle in the library" },
            route
        );
        println!("{:>12}  {:>10}  {:>14}  {:>14}", "op", "size(B)", "latency(us)", "MB/s");
        for r in &rows {
            println!("{:>12}  {:>10}  {:>14.3}  {:>14.1}", r.op, r.size, r.latency_us, r.mb_per_s);
        }
        if let Some(path) = &o.json {
            let results: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({"op": r.op, "size": r.size, "latency_us": r.latency_us,
                        "mb_per_s": r.mb_per_s})
                })
                .collect();
            let doc = serde_json::json!({"benchmark": name, "transport": format!("vmfabric-{route}"),
                "ranks": f.size(), "target": if o.target_busy { "busy" } else { "idle" },
                "results": results});
            if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n") {
                eprintln!("vmfabric bench: unable to write {} since {e}", path.display());
                std::process::exit(1);
            }
        }
    }
    drop(w);
    Ok(())
}

/// The target's side of one measurement: wait in the library (a barrier), or compute until the origin
/// raises the flag at the end of the window's memory.
fn target_wait(f: &Fabric, w: &mut Win, busy: bool) -> Result<(), Error> {
    if !busy {
        return f.barrier();
    }
    let base = w.local_ptr();
    let n = w.raw().local_size();
    // SAFETY: our own window memory; the last 8 bytes are the stop flag the origin sets.
    let flag = unsafe { &*(base.add(n - 8) as *const std::sync::atomic::AtomicU64) };
    let mut x = 1.0f64;
    while flag.load(std::sync::atomic::Ordering::Acquire) == 0 {
        for _ in 0..100 {
            x = (x * 1.000_001).sqrt() + 1e-9;
        }
    }
    std::hint::black_box(x);
    flag.store(0, std::sync::atomic::Ordering::Release);
    f.barrier()
}

fn measure(
    f: &Fabric,
    w: &mut Win,
    op: &str,
    t: usize,
    buf: &mut [u8],
    iters: usize,
    window: usize,
) -> Result<(f64, f64), Error> {
    let size = buf.len();
    let r = contig_run(size);
    let layout = Layout::contig(&r);
    let warm = (iters / 10).max(2);
    // Latency: one operation, then flush.
    let mut t0 = Instant::now();
    for i in 0..warm + iters {
        if i == warm {
            t0 = Instant::now();
        }
        one(f, w, op, t, &layout, buf)?;
        w.flush(t).map_err(|e| err(f, e))?;
    }
    let lat = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    // Bandwidth: a window of operations, then one flush.
    let mbps = if op == "put" || op == "get" {
        let rounds = (iters / window).max(4);
        let t0 = Instant::now();
        for _ in 0..rounds {
            for _ in 0..window {
                one(f, w, op, t, &layout, buf)?;
            }
            w.flush(t).map_err(|e| err(f, e))?;
        }
        (size * window * rounds) as f64 / t0.elapsed().as_secs_f64() / 1e6
    } else {
        size as f64 / lat
    };
    // Check what the target holds: the last put (or the pattern a get brought back).
    if op == "put" || op == "get" {
        let mut back = vec![0u8; size];
        w.get(t, 0, &mut back).map_err(|e| err(f, e))?;
        if op == "get" {
            buf.copy_from_slice(&back);
        }
        if back != buf {
            return Err(Error::Setup {
                rank: f.rank(),
                op: vmf_core::Op::Recv,
                why: format!("{op}: the target's memory differs from what was moved ({size} bytes)"),
            });
        }
    }
    // Release a computing target.
    let n = w.raw().member(t).map_or(0, |m| m.0 as usize);
    w.put(t, n - 8, &1u64.to_ne_bytes()).map_err(|e| err(f, e))?;
    w.flush(t).map_err(|e| err(f, e))?;
    f.barrier()?;
    Ok((lat, mbps))
}

fn one(f: &Fabric, w: &mut Win, op: &str, t: usize, layout: &Layout, buf: &mut [u8]) -> Result<(), Error> {
    let raw = w.raw();
    // SAFETY: buf lives until the flush that completes the operation (the caller's loop).
    let d = unsafe {
        match op {
            "put" => raw.put(t, 0, layout, buf.as_ptr()),
            "get" => raw.get(t, 0, layout, buf.as_mut_ptr()),
            _ => {
                let one = 1u64.to_ne_bytes();
                let mut old = [0u8; 8];
                let d = match op {
                    "fetch_add" => raw.accumulate(t, 0, layout, Elem::U64, ROp::Sum, one.as_ptr(), Some(old.as_mut_ptr())),
                    "swap" => raw.accumulate(t, 0, layout, Elem::U64, ROp::Replace, one.as_ptr(), Some(old.as_mut_ptr())),
                    _ => raw.compare_and_swap(t, 0, Elem::U64, one.as_ptr(), one.as_ptr(), old.as_mut_ptr()),
                };
                // The result buffer is local: complete now.
                if let Ok(Done::Later { .. }) = d {
                    raw.flush(t).map_err(|e| err(f, e))?;
                }
                d
            }
        }
    }
    .map_err(|e| err(f, e))?;
    let _ = d;
    Ok(())
}
