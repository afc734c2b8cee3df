//! One-sided rank programs of `vmfabric selftest` (hidden): atomics under contention and a passive
//! target, over whatever paths the job's placement gives (shared memory, single copy, agents over TCP).
use std::time::{Duration, Instant};
use vmf_core::{Error, Fabric};
use vmf_rma::{Elem, ROp, Win};

fn rma(f: &Fabric, e: vmf_rma::RmaError) -> Error {
    Error::Setup {
        rank: f.rank(),
        op: vmf_core::Op::Progress,
        why: e.to_string(),
    }
}

fn die(f: &Fabric, what: String) -> ! {
    eprintln!("selftest: rank {}: FAILED: {what}", f.rank());
    std::process::exit(1)
}

/// Every rank increments counters on rank 0 and on the last rank `count` times each by fetch-and-add,
/// compare-and-swap loops and accumulates, in a window the fabric allocates and in one over private
/// memory; the totals must be exact.
pub fn atomics(f: &Fabric, count: usize) -> Result<(), Error> {
    let (me, n) = (f.rank(), f.size());
    let last = n - 1;
    let mut private = vec![0u8; 64];
    for kind in ["allocate", "create"] {
        let mut w = match kind {
            "allocate" => Win::allocate(f, 64),
            // SAFETY: `private` outlives the window (dropped at the end of this iteration).
            _ => unsafe { Win::create(f, private.as_mut_ptr(), private.len()) },
        }
        .map_err(|e| rma(f, e))?;
        w.fence().map_err(|e| rma(f, e))?;
        if me == 0 {
            let routes = w.raw().routes();
            println!("selftest: {kind} window routes {routes:?}");
        }
        for i in 0..count {
            for t in [0, last] {
                let old = w.fetch_add_u64(t, 0, 1).map_err(|e| rma(f, e))?;
                if old >= (n * count) as u64 {
                    die(f, format!("fetch-and-add on rank {t} returned {old} at step {i}"));
                }
                // CAS increment of word 1.
                let mut cur = w.compare_swap_u64(t, 8, u64::MAX, u64::MAX).map_err(|e| rma(f, e))?;
                loop {
                    let got = w.compare_swap_u64(t, 8, cur, cur + 1).map_err(|e| rma(f, e))?;
                    if got == cur {
                        break;
                    }
                    cur = got;
                }
                // Accumulate of two i64 (+me, -1) into words 2 and 3.
                let v: Vec<u8> = [me as i64, -1i64].iter().flat_map(|x| x.to_ne_bytes()).collect();
                w.accumulate(t, 16, Elem::I64, ROp::Sum, &v).map_err(|e| rma(f, e))?;
            }
        }
        w.fence().map_err(|e| rma(f, e))?;
        if me == 0 || me == last {
            let mut b = [0u8; 32];
            w.get(me, 0, &mut b).map_err(|e| rma(f, e))?;
            let word = |k: usize| u64::from_ne_bytes(b[8 * k..8 * k + 8].try_into().unwrap());
            let total = (n * count) as u64 * if n == 1 { 2 } else { 1 };
            let sum_me = (0..n as u64).sum::<u64>() * count as u64 * if n == 1 { 2 } else { 1 };
            let want = [total, total, sum_me, (total as i64).wrapping_neg() as u64];
            for (k, &x) in want.iter().enumerate() {
                if word(k) != x {
                    die(f, format!("{kind} window word {k} is {} where {x} was due", word(k)));
                }
            }
            println!("selftest: rank {me}: {kind} window: {total} fetch-and-adds, {total} CAS increments, exact");
        }
        w.fence().map_err(|e| rma(f, e))?;
    }
    Ok(())
}

/// Rank 1 computes without calling the library until rank 0 sets a flag in its window; meanwhile rank 0
/// gets, puts and fetch-and-adds on rank 1's window. Every operation must complete while the target
/// computes (the target counts its loop turns to prove it never stopped), and rank 0 reports the get
/// latency against an idle target's.
pub fn passive(f: &Fabric, count: usize) -> Result<(), Error> {
    if f.size() != 2 {
        die(f, "run with 2 ranks".into());
    }
    let mut w = Win::allocate(f, 4096).map_err(|e| rma(f, e))?;
    let base = w.local_ptr();
    w.fence().map_err(|e| rma(f, e))?;
    let lat = |w: &mut Win, n: usize| -> Result<f64, Error> {
        let mut b = [0u8; 8];
        let t0 = Instant::now();
        for _ in 0..n {
            w.get(1, 64, &mut b).map_err(|e| rma(f, e))?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    // Idle target: rank 1 waits in a barrier (inside the library).
    let idle = if f.rank() == 0 { lat(&mut w, count)? } else { 0.0 };
    f.barrier()?;
    if f.rank() == 1 {
        // SAFETY: our own window memory; word 0 is the stop flag rank 0 sets, word 1 its progress.
        let flag = unsafe { &*(base as *const std::sync::atomic::AtomicU64) };
        let mut turns = 0u64;
        let mut x = 1.0f64;
        let t0 = Instant::now();
        while flag.load(std::sync::atomic::Ordering::Acquire) == 0 {
            for _ in 0..1000 {
                x = (x * 1.000_001).sqrt() + 1e-9;
            }
            turns += 1;
            if t0.elapsed() > Duration::from_secs(60) {
                die(f, "rank 0 never set the stop flag".into());
            }
        }
        std::hint::black_box(x);
        // SAFETY: as above (word 1).
        let done = unsafe { std::ptr::read_volatile((base as *const u64).add(1)) };
        println!("selftest: rank 1 computed {turns} rounds without a library call; rank 0 completed {done} operations meanwhile");
        if done < 3 * count as u64 {
            die(f, format!("only {done} operations completed while the target computed"));
        }
    } else {
        // Let the target enter its loop.
        std::thread::sleep(Duration::from_millis(50));
        let busy = lat(&mut w, count)?;
        let mut ops = count as u64;
        for i in 0..count {
            w.put(1, 128, &(i as u64).to_ne_bytes()).map_err(|e| rma(f, e))?;
            w.fetch_add_u64(1, 256, 1).map_err(|e| rma(f, e))?;
            ops += 2;
        }
        w.flush(1).map_err(|e| rma(f, e))?;
        let old = w.fetch_add_u64(1, 256, 0).map_err(|e| rma(f, e))?;
        if old != count as u64 {
            die(f, format!("the counter reads {old} after {count} fetch-and-adds"));
        }
        w.put(1, 8, &ops.to_ne_bytes()).map_err(|e| rma(f, e))?;
        w.flush(1).map_err(|e| rma(f, e))?;
        w.put(1, 0, &1u64.to_ne_bytes()).map_err(|e| rma(f, e))?;
        w.flush(1).map_err(|e| rma(f, e))?;
        println!(
            "selftest: passive target over {}: get latency {busy:.2} us while it computes, {idle:.2} us while it waits in the library",
            w.raw().routes()[1]
        );
    }
    f.barrier()?;
    drop(w);
    Ok(())
}
