//! `vmfabric bench mtx` and `vmfabric bench barrier` (run inside a job: `vmfabric run -n N vmfabric bench
//! mtx`): 002_*'s increment-counter microbenchmark (one counter per process; no, medium and high
//! contention as the thesis defines them) for a spin lock and for minitransactions, and its barrier
//! microbenchmark for each barrier kind. The store and barrier files are made by rank 0 in the region
//! directory and unlinked once every rank has them open.
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;
use vmf_core::{Fabric, Source, TagSel};
use vmf_mtx::{Barrier, BarrierKind, Mode, Outcome, Store, StoreOptions};

const TAG: i32 = 0x6d74;

fn fail(what: impl std::fmt::Display) -> i32 {
    eprintln!("vmfabric bench: {what}");
    1
}

/// Rank 0 names a file; everyone learns it.
fn shared_path(f: &Fabric, what: &str) -> Result<PathBuf, String> {
    let dir = std::env::var("VMF_REGION_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let mut name = [0u8; 64];
    if f.rank() == 0 {
        let s = format!("vmf-bench-{what}-{}", std::process::id());
        name[..s.len()].copy_from_slice(s.as_bytes());
        for r in 1..f.size() {
            f.send(&name, r, TAG).map_err(|e| e.to_string())?;
        }
    } else {
        f.recv(&mut name, Source::Rank(0), TagSel::Tag(TAG)).map_err(|e| e.to_string())?;
    }
    let n = name.iter().position(|&b| b == 0).unwrap_or(64);
    Ok(PathBuf::from(dir).join(String::from_utf8_lossy(&name[..n]).into_owned()))
}

/// A shared file every rank attaches: rank 0 names it and `create`s it (keeping what that returns, else
/// opening it like the others), every rank `open`s it, and rank 0 unlinks the name once all have it.
fn shared_file<T>(
    f: &Fabric,
    what: &str,
    create: impl FnOnce(&std::path::Path) -> vmf_mtx::Result<Option<T>>,
    open: impl FnOnce(&std::path::Path) -> vmf_mtx::Result<T>,
) -> Result<T, String> {
    let path = shared_path(f, what)?;
    let made = if f.rank() == 0 { create(&path).map_err(|e| e.to_string())? } else { None };
    f.barrier().map_err(|e| e.to_string())?;
    let t = match made {
        Some(t) => t,
        None => open(&path).map_err(|e| e.to_string())?,
    };
    f.barrier().map_err(|e| e.to_string())?;
    if f.rank() == 0 {
        let _ = std::fs::remove_file(&path);
    }
    Ok(t)
}

/// Sum `v` over ranks at rank 0 (others get their own value back).
fn sum_at_0(f: &Fabric, v: u64) -> Result<u64, String> {
    if f.rank() == 0 {
        let mut t = v;
        for r in 1..f.size() {
            let mut b = [0u8; 8];
            f.recv(&mut b, Source::Rank(r), TagSel::Tag(TAG + 1)).map_err(|e| e.to_string())?;
            t += u64::from_le_bytes(b);
        }
        Ok(t)
    } else {
        f.send(&v.to_le_bytes(), 0, TAG + 1).map_err(|e| e.to_string())?;
        Ok(v)
    }
}

fn write_json(path: &Option<PathBuf>, doc: serde_json::Value) -> i32 {
    if let Some(p) = path {
        if let Err(e) = std::fs::write(p, serde_json::to_string_pretty(&doc).unwrap() + "\n") {
            return fail(format!("cannot write {}: {e}", p.display()));
        }
    }
    0
}

/// The increment-counter microbenchmark.
pub fn run_mtx(iters: usize, json: Option<PathBuf>) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let (me, n) = (f.rank(), f.size());
    // Counters 64 bytes apart on node 0 (one stripe each); the spin lock in a stripe of its own.
    let lock_off = 64 * n;
    let opts = StoreOptions { slots: 2 * n + 4, ..Default::default() };
    let store = match shared_file(
        &f,
        "mtx",
        |p| Store::create(p, 1, 64 * (n + 1), &opts).map(Some),
        Store::open,
    ) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let counter = |i: usize| store.word_at(0, 64 * i).expect("in the store");
    let lock = store.word_at(0, lock_off).expect("in the store");
    let mut results = Vec::new();
    // One prepared minitransaction per counter (compare-old + write-new at its place); each update only
    // sets the two values (Mtx::set_compare / set_write) and commits.
    let mut txs = Vec::with_capacity(n);
    for i in 0..n {
        let mut t = store.begin();
        let prepared = t.compare(&store, 0, 64 * i, &[0; 8]).and_then(|_| t.write(&store, 0, 64 * i, &[0; 8]));
        if let Err(e) = prepared {
            return fail(e);
        }
        txs.push(t);
    }
    for contention in ["none", "medium", "high"] {
        for imp in ["spinlock", "minitransaction"] {
            if me == 0 {
                for i in 0..n {
                    counter(i).store(0, Ordering::Relaxed);
                }
            }
            if let Err(e) = f.barrier() {
                return fail(e);
            }
            let mut idx = me;
            let mut aborts = 0u64;
            let t0 = Instant::now();
            for _ in 0..iters {
                let c = match contention {
                    "none" => me,
                    "medium" => {
                        idx = (idx + 1) % n;
                        idx
                    }
                    _ => 0,
                };
                if imp == "spinlock" {
                    // 002_*'s coarse-grained test-and-test-and-set lock over all counters (it yields after
                    // a while, as ours must to be usable with more processes than CPUs).
                    let mut spins = 0u32;
                    while lock.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
                        while lock.load(Ordering::Relaxed) != 0 {
                            spins += 1;
                            if spins.is_multiple_of(256) {
                                vmf_pal::yield_now();
                            } else {
                                vmf_pal::cpu_relax();
                            }
                        }
                    }
                    let w = counter(c);
                    w.store(w.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                    lock.store(0, Ordering::Release);
                } else {
                    // 002_*'s pattern: read the counter, commit compare-old + write-new, retry on failure
                    // after a short exponential backoff (as the spin lock's waiters back off: without it
                    // two ranks on one counter keep failing each other's compares).
                    let mut backoff = 16u32;
                    let w = counter(c);
                    let tx = &mut txs[c];
                    loop {
                        let v = w.load(Ordering::Acquire);
                        let _ = tx.set_compare(0, &v.to_le_bytes());
                        let _ = tx.set_write(0, &(v + 1).to_le_bytes());
                        match tx.commit(&store, Mode::Blocking) {
                            Ok(Outcome::Committed) => break,
                            Ok(_) => {
                                aborts += 1;
                                for _ in 0..backoff {
                                    vmf_pal::cpu_relax();
                                }
                                backoff = (backoff * 2).min(4096);
                            }
                            Err(e) => return fail(e),
                        }
                    }
                }
            }
            let mine = t0.elapsed().as_secs_f64();
            if let Err(e) = f.barrier() {
                return fail(e);
            }
            let el = t0.elapsed().as_secs_f64().max(mine);
            let aborts = match sum_at_0(&f, aborts) {
                Ok(a) => a,
                Err(e) => return fail(e),
            };
            if me == 0 {
                let total: u64 = (0..n).map(|i| counter(i).load(Ordering::Acquire)).sum();
                if total != (n * iters) as u64 {
                    return fail(format!("{imp} at {contention} contention: counters sum to {total}, not {}", n * iters));
                }
                let rate = (n * iters) as f64 / el;
                println!(
                    "mtx {imp:>15} {contention:>6} contention, {n} ranks: {rate:>12.0} updates/s, {aborts} aborts"
                );
                results.push(serde_json::json!({"impl": imp, "contention": contention, "ranks": n,
                    "updates_per_s": rate, "aborts": aborts, "updates": n * iters}));
            }
        }
    }
    if me == 0 {
        return write_json(&json, serde_json::json!({"benchmark": "mtx", "results": results}));
    }
    0
}

/// The barrier microbenchmark: barriers per second for each kind.
pub fn run_barrier(iters: usize, json: Option<PathBuf>) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let (me, n) = (f.rank(), f.size());
    let mut results = Vec::new();
    for kind in [BarrierKind::Spin, BarrierKind::Block, BarrierKind::Adaptive] {
        let mut b = match shared_file(&f, kind.name(), |p| Barrier::create(p, n).map(|_| None), |p| Barrier::open(p, me, kind)) {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        for _ in 0..iters.min(1000) {
            if let Err(e) = b.wait() {
                return fail(e);
            }
        }
        // Timed between two fabric barriers: the rate is every participant's, not the first one out's.
        if let Err(e) = f.barrier() {
            return fail(e);
        }
        let t0 = Instant::now();
        for _ in 0..iters {
            if let Err(e) = b.wait() {
                return fail(e);
            }
        }
        if let Err(e) = f.barrier() {
            return fail(e);
        }
        let el = t0.elapsed().as_secs_f64();
        if me == 0 {
            let rate = iters as f64 / el;
            println!("barrier {:>8}, {n} ranks: {rate:>12.0} barriers/s", kind.name());
            results.push(serde_json::json!({"kind": kind.name(), "ranks": n, "barriers_per_s": rate}));
        }
    }
    if me == 0 {
        return write_json(&json, serde_json::json!({"benchmark": "barrier", "results": results}));
    }
    0
}
