//! `vmfabric bench wakeup`: how fast a rank asleep in a blocking receive is woken by its peer, and what
//! its waiting costs. Rank 1 waits in `recv`; rank 0 lets it fall asleep (`--gap-ms`), sends 8 bytes and
//! busy-polls for the answer rank 1 sends as soon as it wakes. The round trip is the wake-up latency
//! plus two message latencies (microseconds next to a wake-up), measured on one clock, rank 0's, so it
//! also works between VMs. Rank 1 reports its sleeps per wait and the CPU time it used while waiting.
//!
//! Between processes the sleeper is woken by a futex; between ranks in VMs sharing an ivshmem-doorbell
//! device by an interrupt (MSI-X through VFIO); without a doorbell it polls in bounded steps.
use std::time::{Duration, Instant};
use vmf_core::{Error, Fabric, Source, TagSel};

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

pub fn run(iters: usize, gap_ms: u64, json: Option<std::path::PathBuf>) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmfabric bench: {e}");
            return 1;
        }
    };
    if f.size() != 2 {
        eprintln!("vmfabric bench wakeup: needs exactly 2 ranks (got {})", f.size());
        return 2;
    }
    match measure(&f, iters.max(3), gap_ms, json.as_deref()) {
        Ok(()) => match f.finalize() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("vmfabric bench: rank {}: {e}", f.rank());
                1
            }
        },
        Err(e) => {
            eprintln!("vmfabric bench: rank {}: {e}", f.rank());
            1
        }
    }
}

fn measure(f: &Fabric, iters: usize, gap_ms: u64, json: Option<&std::path::Path>) -> Result<(), Error> {
    let mut b = [0u8; 8];
    f.barrier()?;
    if f.rank() == 0 {
        let mut rtt = Vec::with_capacity(iters);
        for i in 0..iters as u64 {
            std::thread::sleep(Duration::from_millis(gap_ms));
            let mut r = [0u8; 8];
            let t0 = Instant::now();
            f.send(&i.to_le_bytes(), 1, 7)?;
            let mut req = f.irecv(&mut r, Source::Rank(1), TagSel::Tag(8))?;
            // Busy-poll: only rank 1's wake-up is measured, not ours.
            while f.test(&mut req)?.is_none() {}
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
            drop(req);
            if u64::from_le_bytes(r) != i {
                return Err(Error::Setup { rank: 0, op: vmf_core::Op::Recv, why: format!("answer {} where {i} was due", u64::from_le_bytes(r)) });
            }
        }
        f.recv(&mut b, Source::Rank(1), TagSel::Tag(9))?;
        let sleeps = f64::from_le_bytes(b);
        f.recv(&mut b, Source::Rank(1), TagSel::Tag(9))?;
        let cpu = f64::from_le_bytes(b);
        rtt.sort_by(|a, b| a.total_cmp(b));
        let med = rtt[rtt.len() / 2];
        let p90 = rtt[(rtt.len() * 9) / 10];
        let route = format!("{:?}", f.channel(1)).to_lowercase();
        println!("# vmfabric wakeup ({route}): {iters} wake-ups after {gap_ms} ms asleep");
        println!("median {med:.1} us, min {:.1} us, p90 {p90:.1} us; sleeps per wait {sleeps:.1}; waiting CPU {:.2} %", rtt[0], cpu * 100.0);
        if let Some(p) = json {
            let v = serde_json::json!({
                "benchmark": "wakeup", "transport": route, "gap_ms": gap_ms, "iters": iters,
                "results": [{"size": 8, "latency_us": med, "min_us": rtt[0], "p90_us": p90}],
                "sleeps_per_wait": sleeps, "cpu_fraction": cpu,
            });
            if let Err(e) = std::fs::write(p, format!("{v:#}\n")) {
                eprintln!("vmfabric bench: cannot write {}: {e}", p.display());
            }
        }
    } else {
        let (mut sleeps, mut busy, mut waited) = (0u64, Duration::ZERO, Duration::ZERO);
        for _ in 0..iters {
            let (s0, c0, t0) = (f.engine().waiter().sleeps, cpu_time(), Instant::now());
            f.recv(&mut b, Source::Rank(0), TagSel::Tag(7))?;
            f.send(&b, 0, 8)?;
            sleeps += f.engine().waiter().sleeps - s0;
            busy += cpu_time() - c0;
            waited += t0.elapsed();
        }
        f.send(&(sleeps as f64 / iters as f64).to_le_bytes(), 0, 9)?;
        f.send(&(busy.as_secs_f64() / waited.as_secs_f64().max(1e-9)).to_le_bytes(), 0, 9)?;
    }
    f.barrier()
}
